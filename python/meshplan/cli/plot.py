"""``plot``: the Pareto front, a pipeline schedule or the mesh layout as a picture (needs the
``plot`` extra)."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..plan import Plan
from ._common import UsageError, cluster_from, model_from, remaining_s, space_flags, space_from, workload_from
from .search import PLAN_HELP


def add(sub: Any, common: argparse.ArgumentParser) -> None:
    """``plot`` and its pictures."""
    plan_help = PLAN_HELP
    p = sub.add_parser("plot", help="draw the Pareto front, a pipeline schedule or the mesh layout")
    kinds = p.add_subparsers(dest="picture", metavar="PICTURE", required=True)
    pareto = kinds.add_parser("pareto", parents=[common], help="step time vs peak memory of feasible plans")
    space_flags(pareto)
    pareto.add_argument("--label", type=int, default=5, metavar="K", help="top plans labelled (default 5)")
    for name, helptext in (("schedule", "the pipeline timeline of a plan"),
                           ("mesh", "the ranks of a plan coloured by group")):
        k = kinds.add_parser(name, parents=[common], help=helptext)
        k.add_argument("--plan", required=True, metavar="dp=..,tp=..,pp=..", help=plan_help)
        if name == "mesh":
            k.add_argument("--axis", default="tp", help="tp (default), cp, ep, dp, pp, dense_dp or expert_dp")
    for k in kinds.choices.values():
        k.add_argument("--out", required=True, metavar="FILE.png|.svg", help="the picture")
    p.set_defaults(run=_plot)


def _plot(args: argparse.Namespace, out: TextIO) -> int:
    try:
        from .. import plot
    except ImportError as e:  # matplotlib is the optional `plot` extra
        missing = e.name or "matplotlib"
        raise UsageError(
            f"plot needs the plot extra (missing module {missing}): pip install 'meshplan[plot]'"
        ) from None
    model, cluster, workload = model_from(args), cluster_from(args), workload_from(args)
    if args.picture == "pareto":
        plot.pareto(model, cluster, workload, space_from(args), label=args.label,
                    threads=args.threads, timeout_s=remaining_s(args), out=args.out)
    elif args.picture == "schedule":
        plot.schedule(model, cluster, workload, Plan.parse(args.plan), out=args.out)
    else:
        plot.mesh(model, cluster, workload, Plan.parse(args.plan), axis=args.axis, out=args.out)
    out.write(f"wrote {args.out}\n")
    return 0
