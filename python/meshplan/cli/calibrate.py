"""``calibrate``: fit a GPU preset's calibration constants to one's own cluster (nccl-tests logs
and, where PyTorch sees a GPU, microbenchmarks) and write the file ``--calibration`` reads."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO

from ..calibrate import KINDS, run_calibration


def add(sub: Any) -> None:
    """``calibrate``."""
    c = sub.add_parser(
        "calibrate",
        help="fit calibration constants to nccl-tests logs and GPU microbenchmarks",
        description="Reads nccl-tests/rccl-tests output (all_reduce_perf, all_gather_perf, "
        "reduce_scatter_perf, alltoall_perf) and fits the collective constants of a GPU preset "
        "by least squares of meshplan's own collective model; where PyTorch sees a GPU, also "
        "times GEMM, grouped GEMM, flash attention and element-wise kernels. Writes the "
        "calibration TOML that --calibration reads and a markdown report.",
    )
    c.add_argument("logs", nargs="*", metavar="LOG|DIR", help="nccl-tests output files or directories")
    c.add_argument("--gpu", required=True, metavar="NAME", help="the GPU preset to calibrate")
    c.add_argument("--out", metavar="FILE.toml", help="write the calibration here (default: stdout)")
    c.add_argument("--report", metavar="FILE.md", help="write the markdown report here")
    c.add_argument("--kind", choices=[*KINDS, "alltoall"],
                   help="the collective of logs that do not say (default: from the log or file name)")
    c.add_argument("--ranks", type=int, metavar="N", help="ranks of logs without device lines")
    c.add_argument("--nodes", type=int, metavar="N", help="hosts of logs without device lines")
    c.add_argument("--ranks-per-domain", type=int, metavar="N",
                   help="ranks per NVLink/xGMI domain (default: per host, or the rack on NVL72)")
    c.add_argument("--model", metavar="NAME|config.json",
                   help="model whose GEMM shapes the microbenchmarks time")
    c.add_argument("--precision", default="bf16", help="GEMM precision of the microbenchmarks")
    c.add_argument("--no-microbenchmarks", action="store_true", help="fit the logs only")
    c.add_argument("--json", action="store_true", help="print the fit as JSON")
    c.set_defaults(run=_calibrate)


def _calibrate(args: argparse.Namespace, out: TextIO) -> int:
    result = run_calibration(
        args.gpu, args.logs, kind=args.kind, ranks=args.ranks, nodes=args.nodes,
        ranks_per_domain=args.ranks_per_domain, model=args.model, precision=args.precision,
        microbenchmarks=not args.no_microbenchmarks,
    )
    text = result.toml_text()
    if args.out:
        _write(args.out, text)
    if args.report:
        _write(args.report, result.report_markdown())
    if args.json:
        json.dump(result.to_dict(), out, indent=2)
        out.write("\n")
    elif not args.out:
        out.write(text)
    if result.microbenchmarks.skipped is not None and not args.no_microbenchmarks:
        print(f"meshplan: GPU microbenchmarks skipped: {result.microbenchmarks.skipped}",
              file=sys.stderr)
    if args.out:
        s = result.summary()
        fitted = ", ".join(f"{v.name}={v.value:.4g}" for v in result.values if v.determined)
        print(f"meshplan: wrote {args.out} ({fitted or 'nothing determined'})", file=sys.stderr)
        if s["rows"]:
            print(f"meshplan: {s['rows']} rows, median |error| {s['median_abs_error_preset']:.1%}"
                  f" with the preset, {s['median_abs_error_fitted']:.1%} fitted", file=sys.stderr)
    return 0


def _write(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        from ..errors import InvalidInputError

        raise InvalidInputError(f"invalid output path: {path!r} (its directory does not exist)")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
