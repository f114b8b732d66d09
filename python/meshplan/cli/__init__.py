"""The ``meshplan`` command: ``search`` (``--all`` for every feasible plan), ``sweep``,
``evaluate``, ``models``, ``gpus``, ``validate``, ``calibrate`` (fit a GPU's constants to
nccl-tests logs and microbenchmarks),
``serve`` (the gRPC service; ``search --server HOST:PORT`` asks one), ``explain``, ``export``
and ``plot`` (one plan taken apart, turned into framework configuration, or drawn).

Exit codes: 0 success; 2 bad input (one line ``meshplan: error: <message naming the field>`` on
stderr, no traceback) or no command at all (``meshplan`` alone prints its usage and the commands
on stderr); 1 any other meshplan failure (deadline, space too large, ...); 130 Ctrl-C.

One module per command group: :mod:`.search` (search, evaluate, explain, export),
:mod:`.presets` (models, gpus), :mod:`.validate`, :mod:`.calibrate`, :mod:`.serve`, :mod:`.report`, :mod:`.plot`
and :mod:`.sweep`; :mod:`._common` holds the shared argument groups and input building,
:mod:`._render` the tables and CSV.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Optional, Sequence

from .. import __version__
from ..errors import InvalidInputError, MeshplanError
from . import calibrate, inference, plot, presets, report, search, serve, sweep, validate
from ._common import Parser, UsageError, fail, problem_flags
from ._render import (
    METRIC_COLUMNS,
    PLAN_COLUMNS,
    evaluation_block,
    flat_row,
    hardware_json,
    plans_table,
    search_json,
    stats_block,
    table,
    write_csv,
)
from .validate import validation_text

__all__ = [
    "METRIC_COLUMNS", "PLAN_COLUMNS", "UsageError", "build_parser", "evaluation_block", "flat_row",
    "hardware_json", "main", "plans_table", "search_json", "stats_block", "table",
    "validation_text", "write_csv",
]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``meshplan``."""
    parser = Parser(prog="meshplan", description="Parallelism planner for large-model training.")
    parser.add_argument("--version", action="version", version=f"meshplan {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = problem_flags()
    # The order of the commands in `meshplan --help`.
    search.add_search(sub, common)
    presets.add(sub)
    validate.add(sub)
    serve.add(sub)
    report.add(sub, common)
    search.add_explain_export(sub, common)
    plot.add(sub, common)
    sweep.add(sub)
    inference.add(sub)
    calibrate.add(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs ``meshplan`` with ``argv`` (default: the process arguments); returns the exit code."""
    started = time.monotonic()
    try:
        parser = build_parser()
        arguments = sys.argv[1:] if argv is None else list(argv)
        if not arguments:
            sys.stderr.write(parser.format_help())
            return 2
        args = parser.parse_args(arguments)
        args.started_s = started
        code: int = args.run(args, sys.stdout)
        return code
    except (UsageError, InvalidInputError) as e:
        return fail(e, 2)
    except MeshplanError as e:
        return fail(e, 1)
    except KeyboardInterrupt:
        print("meshplan: interrupted", file=sys.stderr)
        return 130
    except SystemExit as e:  # --help and --version
        return e.code if isinstance(e.code, int) else 0
    except BrokenPipeError:
        # The reader (`| head`) went away: stop quietly, and keep Python from complaining again
        # when it flushes stdout at exit.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
