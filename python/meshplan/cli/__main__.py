"""``python -m meshplan.cli``: the ``meshplan`` command."""

import sys

from . import main

sys.exit(main())
