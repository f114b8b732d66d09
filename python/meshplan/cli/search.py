"""The commands about one problem: ``search`` (here, on a ``--server``, or ``--all``),
``evaluate``, ``explain`` and ``export``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from ..api import evaluate, search
from ..export import FORMATS as EXPORT_FORMATS
from ..hardware import Cluster
from ..model import Model
from ..plan import Plan
from ..space import why_no_candidates
from ..workload import Workload
from ._common import (
    UsageError, cluster_from, grpc_extra, model_from, pem, remaining_s, secret, space_flags,
    space_from, workload_from,
)
from ._render import evaluation_block, labelled, plans_table, search_json, stats_block, title, write_csv

PLAN_HELP = "e.g. dp=8,tp=8,pp=4,micro_batch=1,zero=1,recompute=selective,order=tp-cp-ep-dp-pp"


def add_search(sub: Any, common: argparse.ArgumentParser) -> None:
    """``search`` and ``evaluate``."""
    s = sub.add_parser("search", parents=[common], help="rank the best parallel plans")
    space_flags(s)
    out = s.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--csv", action="store_true", help="print CSV, one row per plan")
    s.add_argument(
        "--all", action="store_true",
        help="every feasible plan, ranked (with --csv or --json; see meshplan.feasible_space)",
    )
    s.add_argument(
        "--max-plans", type=int, metavar="N",
        help="with --all: refuse spaces with more feasible plans (default 5,000,000)",
    )
    r = s.add_argument_group("remote", "Ask a running `meshplan serve` instead of searching here.")
    r.add_argument("--server", metavar="HOST:PORT", help="search on this server (--threads is its own)")
    r.add_argument("--server-token-file", metavar="F", help="file holding the server's bearer token")
    r.add_argument("--server-ca", metavar="PEM", help="use TLS, trusting this CA certificate")
    s.set_defaults(run=_search)

    e = sub.add_parser("evaluate", parents=[common], help="score one plan, feasible or not")
    e.add_argument(
        "--plan", required=True, metavar="dp=..,tp=..,pp=..",
        help="e.g. dp=8,tp=8,pp=4,ep=1,cp=1,micro_batch=1,zero=1,recompute=selective,vpp=1,sequence_parallel=true",
    )
    e.add_argument("--json", action="store_true", help="print JSON")
    e.set_defaults(run=_evaluate)


def add_explain_export(sub: Any, common: argparse.ArgumentParser) -> None:
    """``explain`` and ``export``: one plan taken apart or turned into framework configuration."""
    plan_help = PLAN_HELP
    x = sub.add_parser(
        "explain", parents=[common],
        help="per axis: what is sharded, which collectives, bytes per token/step, which fabric",
    )
    x.add_argument("--plan", required=True, metavar="dp=..,tp=..,pp=..", help=plan_help)
    x.add_argument("--json", action="store_true", help="print JSON")
    x.set_defaults(run=_explain)

    e = sub.add_parser("export", parents=[common], help="a plan as Megatron/torchtitan/DeepSpeed/device-mesh config")
    e.add_argument("--plan", required=True, metavar="dp=..,tp=..,pp=..", help=plan_help)
    e.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    e.add_argument("--out", metavar="FILE", help="write here instead of standard output")
    e.set_defaults(run=_export)


def _search(args: argparse.Namespace, out: TextIO) -> int:
    model, cluster, workload = model_from(args), cluster_from(args), workload_from(args)
    if args.all:
        return _search_all(args, model, cluster, workload, out)
    if args.server:
        PlannerClient = grpc_extra("search --server", "client").PlannerClient
        token = secret(args.server_token_file, "server token file")
        ca = None if args.server_ca is None else pem(args.server_ca, "server CA")
        with PlannerClient(args.server, token=token, root_certificates=ca,
                           timeout_s=remaining_s(args)) as client:
            result = client.search(model, cluster, workload, space_from(args))
    else:
        result = search(
            model, cluster, workload, space_from(args),
            threads=args.threads, timeout_s=remaining_s(args),
        )
    if args.json:
        json.dump(labelled(search_json(result), cluster, workload.precision), out, indent=2)
        out.write("\n")
    elif args.csv:
        write_csv(result.plans, out, cluster)
    else:
        out.write(title(model, cluster, workload) + "\n\n")
        if result.plans:
            out.write(plans_table(result.plans) + "\n\n")
        elif result.stats.candidates == 0:
            why = why_no_candidates(space_from(args).to_dict(), cluster.num_gpus,
                                    moe=model.moe is not None, global_batch=workload.global_batch)
            out.write(f"no plan to consider: {why}\n\n")
        else:
            out.write("no feasible plan (see what was pruned below)\n\n")
        out.write(stats_block(result.stats) + "\n")
    return 0


def _search_all(
    args: argparse.Namespace, model: Model, cluster: Cluster, workload: Workload, out: TextIO
) -> int:
    """``search --all``: every feasible plan as CSV rows or JSON columns."""
    from ..feasible import DEFAULT_MAX_PLANS, feasible_space

    if args.server:
        raise UsageError("--all searches here, not on a --server")
    if not (args.csv or args.json):
        raise UsageError("--all writes every feasible plan: add --csv or --json")
    space = feasible_space(
        model, cluster, workload, space_from(args),
        max_plans=DEFAULT_MAX_PLANS if args.max_plans is None else args.max_plans,
        threads=args.threads, timeout_s=remaining_s(args),
    )
    if args.csv:
        space.write_csv(out)
    else:
        columns = {name: space.decode(name).tolist() for name in space}
        json.dump({"columns": columns, "stats": space.stats.to_dict()}, out)
        out.write("\n")
    return 0


def _evaluate(args: argparse.Namespace, out: TextIO) -> int:
    model, cluster, workload = model_from(args), cluster_from(args), workload_from(args)
    ev = evaluate(model, cluster, workload, Plan.parse(args.plan))
    if args.json:
        json.dump(labelled(ev.to_flat_dict(), cluster, workload.precision), out, indent=2)
        out.write("\n")
    else:
        out.write(title(model, cluster, workload) + "\n\n")
        out.write(evaluation_block(ev) + "\n")
    return 0


def _explain(args: argparse.Namespace, out: TextIO) -> int:
    from ..explain import explain

    model, cluster, workload = model_from(args), cluster_from(args), workload_from(args)
    x = explain(model, cluster, workload, Plan.parse(args.plan))
    if args.json:
        json.dump(labelled(x.to_dict(), cluster, workload.precision), out, indent=2)
        out.write("\n")
    else:
        out.write(title(model, cluster, workload) + "\n\n" + x.to_text() + "\n")
    return 0


def _export(args: argparse.Namespace, out: TextIO) -> int:
    from ..export import export

    model, cluster, workload = model_from(args), cluster_from(args), workload_from(args)
    plan = Plan.parse(args.plan)
    ev = evaluate(model, cluster, workload, plan)  # rejects a malformed plan
    if not ev.feasible:
        why = "; ".join(r.message for r in ev.reasons)
        print(f"meshplan: warning: the plan does not fit: {why}", file=sys.stderr)
    text = export(ev.plan, args.format, model=model, workload=workload)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        out.write(text)
    return 0
