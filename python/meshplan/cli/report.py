"""``report --html``: a search as an interactive, self-contained HTML page."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..api import search
from ..errors import InvalidInputError
from ._common import cluster_from, model_from, remaining_s, space_flags, space_from, workload_from
from ._render import title


def add(sub: Any, common: argparse.ArgumentParser) -> None:
    """``report``."""
    rp = sub.add_parser("report", parents=[common],
                        help="an interactive HTML report of a search (Pareto front, plans, details)")
    space_flags(rp)
    rp.add_argument("--html", required=True, metavar="FILE.html", help="the self-contained report")
    rp.set_defaults(run=_report)


def _report(args: argparse.Namespace, out: TextIO) -> int:
    """``report --html``: the search (top 200 plans unless --top-k) as an interactive page."""
    from dataclasses import replace

    from ..report_html import write_search_html

    model, cluster, workload = model_from(args), cluster_from(args), workload_from(args)
    space = space_from(args)
    if args.top_k is None:
        space = replace(space, top_k=200)
    result = search(model, cluster, workload, space, threads=args.threads,
                    timeout_s=remaining_s(args))
    try:
        write_search_html(model, cluster, workload, result, title(model, cluster, workload),
                          args.html)
    except OSError as e:
        raise InvalidInputError(f"invalid --html: {args.html} ({e.strerror})") from None
    out.write(f"wrote {args.html} ({len(result.plans)} plans)\n")
    return 0
