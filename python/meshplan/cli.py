"""The ``meshplan`` command: ``search`` (``--all`` for every feasible plan), ``sweep``,
``evaluate``, ``models``, ``gpus``, ``validate``,
``serve`` (the gRPC service; ``search --server HOST:PORT`` asks one), ``explain``, ``export``
and ``plot`` (one plan taken apart, turned into framework configuration, or drawn).

Exit codes: 0 success; 2 bad input (one line ``meshplan: error: <message naming the field>`` on
stderr, no traceback) or no command at all (``meshplan`` alone prints its usage and the commands
on stderr); 1 any other meshplan failure (deadline, space too large, ...); 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from typing import Any, Callable, Mapping, NoReturn, Optional, Sequence, TextIO

from . import __version__, _core
from .api import as_model, evaluate, search
from .errors import InvalidInputError, MeshplanError
from .export import FORMATS as EXPORT_FORMATS
from .hardware import Cluster, Gpu
from .model import Model, read_text
from .plan import DEFAULT_ORDER, Plan
from .report import Evaluation, SearchResult, SearchStats
from .space import DEGREES, SearchSpace, why_no_candidates
from .validation import ValidationReport, calibrated, validate
from .workload import Workload

PLAN_COLUMNS = (
    "rank",
    "dp",
    "tp",
    "pp",
    "ep",
    "cp",
    "vpp",
    "micro_batch",
    "zero",
    "recompute",
    "sequence_parallel",
    "schedule",
    "order",
)
METRIC_COLUMNS = (
    "feasible",
    "step_time_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "model_tflops_per_gpu",
    "hardware_tflops_per_gpu",
    "peak_memory_gib",
    "micro_batches",
    "worst_stage",
)


class UsageError(Exception):
    """A command line that argparse rejects (reported like any other bad input)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _list_of(kind: Callable[[str], Any], what: str) -> Callable[[str], list[Any]]:
    """An argparse type for comma-separated lists such as ``--zero 0,1,2``."""

    def parse(text: str) -> list[Any]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}")
        try:
            return [kind(t) for t in items]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {what}, got {text!r}"
            ) from None

    return parse


def _problem_flags() -> _Parser:
    p = _Parser(add_help=False)
    g = p.add_argument_group("model, cluster and workload")
    g.add_argument(
        "--model", required=True, metavar="NAME|config.json",
        help="a model preset (see `meshplan models`) or a Hugging Face config.json",
    )
    g.add_argument("--model-name", help="name for a model read from a config.json")
    g.add_argument("--gpu", metavar="NAME", help="a GPU preset (see `meshplan gpus`)")
    g.add_argument(
        "--gpu-set", action="append", metavar="FIELD=V,...",
        help="what-if hardware: change the GPU's fields, e.g. memory_gib=141,scaleup_domain=72 "
        "(labelled hypothetical)",
    )
    g.add_argument("--gpu-file", metavar="hw.toml", help="what-if hardware from a file (instead of --gpu)")
    g.add_argument("--gpus", required=True, type=int, metavar="N", help="number of GPUs")
    g.add_argument("--gpus-per-node", type=int, metavar="N", help="default: the GPU preset's")
    g.add_argument("--nvlink-domain", type=int, metavar="N", help="GPUs per NVLink domain (default: the preset's)")
    g.add_argument("--global-batch", required=True, type=int, metavar="B", help="sequences per step")
    g.add_argument("--seq-len", required=True, type=int, metavar="S", help="tokens per sequence")
    g.add_argument("--precision", default="bf16", help="bf16 (default), fp16, fp8, mxfp8 or nvfp4")
    g.add_argument("--optimizer", default="adam", help="adam (default) or sgd-momentum")
    g.add_argument("--grad-bytes", type=int, default=4, help="gradient bytes per element, 4 (default) or 2")
    g.add_argument("--lora", action="store_true", help="LoRA fine-tuning: frozen base weights")
    g.add_argument(
        "--no-flash-attention", dest="flash_attention", action="store_false",
        help="model unfused attention (stores the attention scores)",
    )
    g.add_argument(
        "--unfused-cross-entropy", dest="fused_cross_entropy", action="store_false",
        help="model an eager fp32 loss (torchtitan): 14 bytes per logit instead of 8",
    )
    g.add_argument(
        "--calibration", metavar="FILE",
        help="calibration overrides (TOML or JSON; see docs/calibration.md)",
    )
    return p


def _space_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "search space",
        "Everything is open by default. Fix a degree with --dp/--tp/--pp/--ep/--cp/--vpp/"
        "--micro-batch N, or bound it with --min-X N / --max-X N (e.g. --max-pp 16).",
    )
    for name in DEGREES:
        flag = name.replace("_", "-")
        g.add_argument(f"--{flag}", type=int, metavar="N", help=f"fix {name}")
        g.add_argument(f"--min-{flag}", type=int, metavar="N", help=argparse.SUPPRESS)
        g.add_argument(f"--max-{flag}", type=int, metavar="N", help=argparse.SUPPRESS)
    g.add_argument("--zero", type=_list_of(int, "ZeRO stages"), metavar="0,1,2,3")
    g.add_argument("--recompute", type=_list_of(str, "modes"), metavar="none,selective,full,selective-op")
    g.add_argument("--sequence-parallel", choices=("on", "off", "both"))
    g.add_argument("--schedules", type=_list_of(str, "schedules"), metavar="1f1b,interleaved-1f1b,zb-h1")
    orders = g.add_mutually_exclusive_group()
    orders.add_argument(
        "--orders", type=_list_of(str, "rank orders"), metavar="tp-cp-ep-dp-pp,tp-dp-...",
        help="rank orders to try, innermost axis first (default: tp-cp-ep-dp-pp); an order is "
        "only tried where it moves some group to another fabric",
    )
    orders.add_argument("--all-orders", action="store_true", help="try all 120 rank orders (same rule)")
    g.add_argument("--memory-headroom-gib", type=float, metavar="GIB", help="kept free per GPU (default 1)")
    g.add_argument("--allow-tp-cross-domain", action="store_true", help="let TP groups leave the NVLink domain")
    g.add_argument("--cp-within-domain", action="store_true", help="keep CP groups inside one NVLink domain")
    g.add_argument("--ep-within-domain", action="store_true", help="keep EP groups inside one NVLink domain")
    g.add_argument("--top-k", type=int, metavar="K", help="plans shown (default 10)")
    g.add_argument("--max-candidates", type=int, metavar="N", help="refuse larger spaces")
    g.add_argument("--threads", type=int, metavar="N", help="default: MESHPLAN_THREADS, else all cores")
    g.add_argument("--timeout-s", type=float, metavar="S", help="give up after S seconds")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``meshplan``."""
    parser = _Parser(prog="meshplan", description="Parallelism planner for large-model training.")
    parser.add_argument("--version", action="version", version=f"meshplan {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = _problem_flags()

    s = sub.add_parser("search", parents=[common], help="rank the best parallel plans")
    _space_flags(s)
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

    m = sub.add_parser("models", help="list the model presets")
    m.add_argument("--json", action="store_true", help="print the full presets as JSON")
    m.set_defaults(run=_models)

    g = sub.add_parser("gpus", help="list the GPU presets")
    g.add_argument("--json", action="store_true", help="print the full presets as JSON")
    g.set_defaults(run=_gpus)

    v = sub.add_parser("validate", help="hold the cost model against published training runs")
    v.add_argument("cases", metavar="FILE", help="a case file (shared/validation/cases.json schema)")
    v.add_argument("--search", action="store_true", help="also search each case: rank, regret, feasible recall")
    v.add_argument("--calibration", metavar="FILE", help="calibration overrides (TOML or JSON)")
    v.add_argument("--threads", type=int, metavar="N", help="search threads (default: all cores)")
    v.add_argument("--worst", type=int, default=10, metavar="K", help="largest errors listed (default 10)")
    v.add_argument("--json", action="store_true", help="print the full report as JSON")
    v.set_defaults(run=_validate)

    sv = sub.add_parser("serve", help="run the gRPC planning service (meshplan.v1.Planner)")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    sv.add_argument("--port", type=int, default=50051, help="0 picks a free port (default 50051)")
    sv.add_argument("--workers", type=int, metavar="N",
                    help="planning calls served at once (default: max(4, cores))")
    sv.add_argument("--queue", type=int, default=64, metavar="N",
                    help="planning calls that may wait for a worker; more get RESOURCE_EXHAUSTED "
                    "(default 64)")
    sv.add_argument("--max-response-bytes", type=int, default=4 * 1024 * 1024, metavar="N",
                    help="larger responses get RESOURCE_EXHAUSTED (default 4 MiB, gRPC's "
                    "default client limit)")
    sv.add_argument("--threads", type=int, metavar="N", help="core threads per search (default: all cores)")
    sv.add_argument("--max-candidates", type=int, metavar="N", help="refuse larger search spaces (RESOURCE_EXHAUSTED)")
    sv.add_argument("--tls-cert", metavar="PEM", help="certificate chain; with --tls-key, serve TLS")
    sv.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    sv.add_argument("--token-file", metavar="F", help="require `authorization: Bearer <token in F>`")
    sv.add_argument("--grace-s", type=float, default=10.0, metavar="S", help="in-flight calls may finish for S seconds on SIGTERM/SIGINT (default 10)")
    sv.set_defaults(run=_serve)
    rp = sub.add_parser("report", parents=[common],
                        help="an interactive HTML report of a search (Pareto front, plans, details)")
    _space_flags(rp)
    rp.add_argument("--html", required=True, metavar="FILE.html", help="the self-contained report")
    rp.set_defaults(run=_report)
    _plan_commands(sub, common)
    _sweep_command(sub)
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
        return _fail(e, 2)
    except MeshplanError as e:
        return _fail(e, 1)
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


def _remaining_s(args: argparse.Namespace) -> Optional[float]:
    """What is left of ``--timeout-s`` (None: no timeout): the clock starts with the command, so
    that the time spent building the inputs counts too."""
    timeout_s: Optional[float] = args.timeout_s
    if timeout_s is None or not 0 <= timeout_s < float("inf"):
        return timeout_s  # the core names a bad one
    started_s: float = args.started_s
    return max(0.0, timeout_s - (time.monotonic() - started_s))


def _fail(error: Exception, code: int) -> int:
    message = " ".join(str(error).split("\n")) or type(error).__name__
    print(f"meshplan: error: {message}", file=sys.stderr)
    return code


# --- building inputs ---------------------------------------------------------------------------


def _model(args: argparse.Namespace) -> Model:
    model = as_model(args.model)
    if args.model_name:
        model.name = args.model_name
    return model


def _base_gpu(args: argparse.Namespace) -> Gpu:
    """``--gpu`` or ``--gpu-file`` (exactly one), with the calibration file applied."""
    if (args.gpu is None) == (getattr(args, "gpu_file", None) is None):
        raise UsageError("give one of --gpu NAME or --gpu-file FILE")
    if args.gpu is not None:
        gpu = Gpu.preset(args.gpu)
    else:
        gpu = Gpu.from_file(_readable(args.gpu_file, "--gpu-file"))
    if getattr(args, "calibration", None):
        # Calibration first: the file names the preset, not the what-if label.
        gpu = calibrated(Cluster(gpu, 1), _readable(args.calibration, "--calibration")).resolved_gpu()
    return gpu


def _gpu_overrides(args: argparse.Namespace) -> dict[str, str]:
    from .whatif import parse_assignments

    changes: dict[str, str] = {}
    for text in getattr(args, "gpu_set", None) or []:
        changes.update(parse_assignments(text))
    return changes


def _cluster(args: argparse.Namespace) -> Cluster:
    gpu = _base_gpu(args)
    changes = _gpu_overrides(args)
    if changes:
        gpu = gpu.with_overrides(changes)
    return Cluster(gpu, args.gpus, args.gpus_per_node, args.nvlink_domain)


def _readable(path: str, flag: str) -> str:
    """``path`` if it is a readable file, else a usage error naming ``flag``."""
    if not os.path.isfile(path):
        raise UsageError(f"{flag}: no such file: {path}")
    return path


def _workload(args: argparse.Namespace) -> Workload:
    return Workload(
        args.global_batch, args.seq_len, args.precision, args.optimizer, args.grad_bytes,
        args.lora, args.flash_attention, args.fused_cross_entropy,
    )


def _space(args: argparse.Namespace) -> SearchSpace:
    degrees = {
        attr: getattr(args, attr)
        for name in DEGREES
        for attr in (name, f"min_{name}", f"max_{name}")
    }
    return SearchSpace(
        **degrees,
        zero=args.zero,
        recompute=args.recompute,
        schedules=args.schedules,
        sequence_parallel={"on": [True], "off": [False], "both": [False, True], None: None}[
            args.sequence_parallel
        ],
        memory_headroom_gib=args.memory_headroom_gib,
        tp_within_domain=False if args.allow_tp_cross_domain else None,
        cp_within_domain=True if args.cp_within_domain else None,
        ep_within_domain=True if args.ep_within_domain else None,
        top_k=args.top_k,
        max_candidates=args.max_candidates,
        orders=_core.rank_orders() if getattr(args, "all_orders", False) else getattr(args, "orders", None),
    )


# --- commands ----------------------------------------------------------------------------------


def _search(args: argparse.Namespace, out: TextIO) -> int:
    model, cluster, workload = _model(args), _cluster(args), _workload(args)
    if args.all:
        return _search_all(args, model, cluster, workload, out)
    if args.server:
        PlannerClient = _grpc_extra("search --server", "client").PlannerClient
        token = _secret(args.server_token_file, "server token file")
        ca = None if args.server_ca is None else _pem(args.server_ca, "server CA")
        with PlannerClient(args.server, token=token, root_certificates=ca,
                           timeout_s=_remaining_s(args)) as client:
            result = client.search(model, cluster, workload, _space(args))
    else:
        result = search(
            model, cluster, workload, _space(args),
            threads=args.threads, timeout_s=_remaining_s(args),
        )
    if args.json:
        json.dump(_labelled(search_json(result), cluster), out, indent=2)
        out.write("\n")
    elif args.csv:
        write_csv(result.plans, out, cluster)
    else:
        out.write(_title(model, cluster, workload) + "\n\n")
        if result.plans:
            out.write(plans_table(result.plans) + "\n\n")
        elif result.stats.candidates == 0:
            why = why_no_candidates(_space(args).to_dict(), cluster.num_gpus,
                                    moe=model.moe is not None, global_batch=workload.global_batch)
            out.write(f"no plan to consider: {why}\n\n")
        else:
            out.write("no feasible plan (see what was pruned below)\n\n")
        out.write(stats_block(result.stats) + "\n")
    return 0


def _report(args: argparse.Namespace, out: TextIO) -> int:
    """``report --html``: the search (top 200 plans unless --top-k) as an interactive page."""
    from dataclasses import replace

    from .report_html import write_search_html

    model, cluster, workload = _model(args), _cluster(args), _workload(args)
    space = _space(args)
    if args.top_k is None:
        space = replace(space, top_k=200)
    result = search(model, cluster, workload, space, threads=args.threads,
                    timeout_s=_remaining_s(args))
    try:
        write_search_html(model, cluster, workload, result, _title(model, cluster, workload),
                          args.html)
    except OSError as e:
        raise InvalidInputError(f"invalid --html: {args.html} ({e.strerror})") from None
    out.write(f"wrote {args.html} ({len(result.plans)} plans)\n")
    return 0


def _search_all(
    args: argparse.Namespace, model: Model, cluster: Cluster, workload: Workload, out: TextIO
) -> int:
    """``search --all``: every feasible plan as CSV rows or JSON columns."""
    from .feasible import DEFAULT_MAX_PLANS, feasible_space

    if args.server:
        raise UsageError("--all searches here, not on a --server")
    if not (args.csv or args.json):
        raise UsageError("--all writes every feasible plan: add --csv or --json")
    space = feasible_space(
        model, cluster, workload, _space(args),
        max_plans=DEFAULT_MAX_PLANS if args.max_plans is None else args.max_plans,
        threads=args.threads, timeout_s=_remaining_s(args),
    )
    if args.csv:
        space.write_csv(out)
    else:
        columns = {name: space.decode(name).tolist() for name in space}
        json.dump({"columns": columns, "stats": space.stats.to_dict()}, out)
        out.write("\n")
    return 0


def _sweep_command(sub: Any) -> None:
    sw = sub.add_parser(
        "sweep", help="the best plan over a grid of GPU counts, GPU types, models, batches, lengths",
        description="Searches the cartesian product of the listed values (one batch, in "
        "parallel) and reports the best plan of each point.",
    )
    g = sw.add_argument_group("swept variables (comma-separated lists)")
    g.add_argument("--model", required=True, type=_list_of(str, "models"), metavar="A,B")
    g.add_argument("--gpu", required=True, type=_list_of(str, "GPU presets"), metavar="h100-sxm,b200")
    g.add_argument("--gpus", required=True, type=_list_of(int, "GPU counts"), metavar="64,128")
    g.add_argument("--global-batch", required=True, type=_list_of(int, "batch sizes"), metavar="B,...")
    g.add_argument("--seq-len", required=True, type=_list_of(int, "sequence lengths"), metavar="S,...")
    g.add_argument(
        "--gpu-sweep", action="append", metavar="FIELD=V1,V2",
        help="what-if hardware axis, e.g. memory_gib=80,141,192 (repeat for more axes; rows "
        "are labelled hypothetical)",
    )
    w = sw.add_argument_group("cluster and workload (fixed)")
    w.add_argument("--gpu-set", action="append", metavar="FIELD=V,...",
                   help="what-if hardware for every point, e.g. network_bandwidth_gbps=100")
    w.add_argument("--gpus-per-node", type=int, metavar="N", help="default: the GPU preset's")
    w.add_argument("--nvlink-domain", type=int, metavar="N", help="GPUs per NVLink domain")
    w.add_argument("--precision", default="bf16", help="bf16 (default), fp16, fp8, mxfp8 or nvfp4")
    w.add_argument("--optimizer", default="adam", help="adam (default) or sgd-momentum")
    w.add_argument("--grad-bytes", type=int, default=4, help="4 (default) or 2")
    w.add_argument("--lora", action="store_true", help="LoRA fine-tuning: frozen base weights")
    w.add_argument("--no-flash-attention", dest="flash_attention", action="store_false")
    w.add_argument("--unfused-cross-entropy", dest="fused_cross_entropy", action="store_false")
    w.add_argument("--calibration", metavar="FILE", help="calibration overrides (TOML or JSON)")
    _space_flags(sw)
    o = sw.add_argument_group("output")
    fmt = o.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="JSON: a list of rows")
    fmt.add_argument("--csv", action="store_true", help="CSV, one row per point")
    o.add_argument("--out", metavar="FILE", help="write the rows here instead of stdout")
    o.add_argument("--plot", metavar="FILE.png", help="plot best tokens/s/GPU and MFU against the swept variable")
    o.add_argument("--x", choices=("model", "gpu", "gpus", "global_batch", "seq_len"), help="the plot's x axis")
    o.add_argument("--html", metavar="FILE.html", help="also write an interactive HTML report")
    x = sw.add_argument_group("execution")
    x.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="search on a Ray cluster (ADDRESS: 'auto', ray://host:10001; none: a "
                   "local Ray); pip install 'meshplan[ray]'")
    x.add_argument("--chunk-size", type=int, metavar="N", help="queries per Ray task (default: "
                   "about four tasks per cluster CPU)")
    prog = o.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="a progress bar on stderr (default: only on a terminal)")
    prog.add_argument("--no-progress", dest="progress", action="store_false")
    sw.set_defaults(run=_sweep)


def _sweep(args: argparse.Namespace, out: TextIO) -> int:
    from . import sweep

    from .whatif import parse_sweep

    hardware: dict[str, list[str]] = {}
    for text in args.gpu_sweep or []:
        field, values = parse_sweep(text)
        if field in hardware:
            raise UsageError(f"--gpu-sweep: {field} given twice")
        hardware[field] = values
    points = sweep.grid(args.model, args.gpu, args.gpus, args.global_batch, args.seq_len, hardware)
    workload = Workload(
        1, 1, args.precision, args.optimizer, args.grad_bytes, args.lora, args.flash_attention,
        args.fused_cross_entropy,
    )
    calibration = None if args.calibration is None else _readable(args.calibration, "--calibration")
    rows = sweep.sweep(
        points, workload, _space(args), gpus_per_node=args.gpus_per_node,
        nvlink_domain=args.nvlink_domain, calibration=calibration, threads=args.threads,
        progress=args.progress, timeout_s=_remaining_s(args),
        gpu_overrides=_gpu_overrides(args),
        executor="local" if args.ray is None else "ray", ray_address=args.ray or None,
        chunk_size=args.chunk_size,
    )
    if args.html:
        from .report_html import write_sweep_html

        try:
            write_sweep_html(rows, args.html)
        except OSError as e:
            raise InvalidInputError(f"invalid --html: {args.html} ({e.strerror})") from None
    if args.plot:
        sweep.plot(rows, args.plot, args.x)
    try:
        target = open(args.out, "w", newline="") if args.out else out
    except OSError as e:
        raise InvalidInputError(f"invalid --out: {args.out} ({e.strerror})") from None
    try:
        if args.json:
            json.dump(rows, target, indent=2)
            target.write("\n")
        elif args.csv:
            sweep.write_csv(rows, target)
        else:
            header = ["model", "gpu", "gpus", "batch", "seq", "status", "tok/s/GPU", "MFU %", "step s", "plan"]
            table_rows = [
                [r["model"], r["gpu"], r["gpus"], r["global_batch"], r["seq_len"], r["status"],
                 "-" if r["tokens_per_s_per_gpu"] is None else f"{r['tokens_per_s_per_gpu']:,.0f}",
                 "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}",
                 "-" if r["step_time_s"] is None else f"{r['step_time_s']:.3f}",
                 r["plan"] or r["error"] or "-"]
                for r in rows
            ]
            if any(r["hypothetical"] for r in rows):
                target.write("HYPOTHETICAL HARDWARE: rows marked what-if:... use GPUs that "
                             "do not exist (preset fields overridden)\n\n")
            target.write(table(header, table_rows) + "\n")
    finally:
        if target is not out:
            target.close()
    return 0


def _secret(path: Optional[str], what: str) -> Optional[str]:
    """The stripped text of ``path`` (None when no path); empty or unreadable is bad input."""
    if path is None:
        return None
    text = read_text(path, what).strip()
    if not text:
        raise InvalidInputError(f"invalid {what} {path!r}: empty")
    return text


def _pem(path: str, what: str) -> bytes:
    return read_text(path, what).encode()


def _grpc_extra(command: str, module: str) -> Any:
    """``meshplan.<module>``, which needs the ``grpc`` extra; without it, a usage error that
    says which ``pip install`` fixes it."""
    import importlib

    try:
        return importlib.import_module(f".{module}", __package__)
    except ImportError as e:
        missing = e.name or "grpc"
        raise UsageError(
            f"{command} needs the grpc extra (missing module {missing}): "
            "pip install 'meshplan[grpc]'"
        ) from None


def _serve(args: argparse.Namespace, out: TextIO) -> int:
    server = _grpc_extra("serve", "server")
    ServerConfig, serve = server.ServerConfig, server.serve

    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    config = ServerConfig(
        host=args.host, port=args.port, threads=args.threads, max_candidates=args.max_candidates,
        queue=args.queue, max_response_bytes=args.max_response_bytes,
        token=_secret(args.token_file, "token file"), grace_s=args.grace_s,
        tls_cert=None if args.tls_cert is None else _pem(args.tls_cert, "TLS certificate"),
        tls_key=None if args.tls_key is None else _pem(args.tls_key, "TLS key"),
    )
    if args.workers is not None:
        config.workers = args.workers
    try:
        code: int = serve(config)
        return code
    except ValueError as e:
        raise InvalidInputError(str(e)) from None
    except (OSError, RuntimeError) as e:
        raise MeshplanError(f"cannot serve on {args.host}:{args.port}: {e}") from None


def _evaluate(args: argparse.Namespace, out: TextIO) -> int:
    model, cluster, workload = _model(args), _cluster(args), _workload(args)
    ev = evaluate(model, cluster, workload, Plan.parse(args.plan))
    if args.json:
        json.dump(_labelled(ev.to_flat_dict(), cluster), out, indent=2)
        out.write("\n")
    else:
        out.write(_title(model, cluster, workload) + "\n\n")
        out.write(evaluation_block(ev) + "\n")
    return 0


def _models(args: argparse.Namespace, out: TextIO) -> int:
    models = [Model.preset(name) for name in Model.presets()]
    if args.json:
        json.dump([m.to_dict() for m in models], out, indent=2)
        out.write("\n")
        return 0
    rows = []
    for m in models:
        experts = "-" if m.moe is None else f"{m.moe.num_experts} (top {m.moe.top_k})"
        attention = "MLA" if m.mla is not None else ("MHA" if m.kv_heads == m.heads else "GQA")
        rows.append([
            m.name, m.layers, m.hidden, m.heads, m.kv_heads, attention,
            m.ffn_hidden, m.vocab, m.activation, experts,
        ])
    header = ["name", "layers", "hidden", "heads", "kv", "attn", "ffn", "vocab", "act", "experts"]
    out.write(table(header, rows) + "\n")
    return 0


def _gpus(args: argparse.Namespace, out: TextIO) -> int:
    gpus = [Gpu.preset(name) for name in Gpu.presets()]
    if args.json:
        json.dump([g.to_dict() for g in gpus], out, indent=2)
        out.write("\n")
        return 0
    rows = []
    for g in gpus:
        peak = g.peak_tflops
        rows.append([
            g.name,
            f"{g.memory_gib:g}",
            *(f"{peak[p]:g}" if p in peak else "-" for p in ("bf16", "fp8", "nvfp4")),
            f"{g.memory_bandwidth_gbps:g}",
            f"{g.scaleup_bandwidth_gbps:g} x{g.scaleup_domain}",
            f"{g.network_bandwidth_gbps:g}",
            g.description,
        ])
    header = [
        "name", "HBM GiB", "bf16 TF/s", "fp8 TF/s", "nvfp4 TF/s", "HBM GB/s",
        "NVLink GB/s x domain", "net GB/s", "description",
    ]
    out.write(table(header, rows) + "\n")
    return 0


# --- rendering ---------------------------------------------------------------------------------


def search_json(result: SearchResult) -> dict[str, Any]:
    """``{"plans": [flat plan records], "stats": {...}}`` (the ``search --json`` shape)."""
    return {"plans": [p.to_flat_dict() for p in result.plans], "stats": result.stats.to_dict()}


def flat_row(ev: Evaluation) -> dict[str, Any]:
    """One CSV row: the plan, the metrics, and ``memory_gib.*`` / ``time_s.*`` columns."""
    flat = ev.to_flat_dict()
    row = {k: flat[k] for k in PLAN_COLUMNS + METRIC_COLUMNS}
    row.update({f"memory_gib.{k}": v for k, v in ev.memory_gib.items()})
    row.update({f"time_s.{k}": v for k, v in ev.time_s.items()})
    return row


def _labelled(data: dict[str, Any], cluster: Cluster) -> dict[str, Any]:
    """``data`` with a ``hardware`` entry when the GPU is hypothetical (a what-if)."""
    if cluster.resolved_gpu().hypothetical:
        data = {"hardware": hardware_json(cluster), **data}
    return data


def write_csv(plans: Sequence[Evaluation], out: TextIO, cluster: Optional[Cluster] = None) -> None:
    """The plans as CSV with a header row (``gpu`` and ``hypothetical`` columns first when
    ``cluster``'s GPU is a what-if)."""
    rows = [flat_row(p) for p in plans]
    if cluster is not None and cluster.resolved_gpu().hypothetical:
        rows = [{"gpu": cluster.resolved_gpu().name, "hypothetical": True, **r} for r in rows]
    header = list(rows[0]) if rows else list(PLAN_COLUMNS + METRIC_COLUMNS)
    writer = csv.DictWriter(out, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An aligned text table: text columns left-aligned, numbers right-aligned."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    numeric = [
        all(_is_number(r[i]) or r[i] == "-" for r in cells[1:])
        and any(_is_number(r[i]) for r in cells[1:])
        for i in range(len(header))
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric)]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) or (
        isinstance(value, str) and value.replace(",", "").replace(".", "", 1).isdigit()
    )


def plans_table(plans: Sequence[Evaluation]) -> str:
    """The ranked plans as an aligned table (with an ``order`` column when some plan does not
    use the default rank order)."""
    header = [
        "rank", "dp", "tp", "pp", "ep", "cp", "vpp", "mb", "zero", "recompute", "sp",
        "schedule", "step s", "tok/s/GPU", "MFU %", "mem GiB",
    ]
    orders = any(ev.plan.order != DEFAULT_ORDER for ev in plans)
    if orders:
        header.insert(12, "order")
    rows = []
    for ev in plans:
        p = ev.plan
        row: list[Any] = [
            ev.rank if ev.rank is not None else "-", p.dp, p.tp, p.pp, p.ep, p.cp, p.vpp,
            p.micro_batch, p.zero, p.recompute, "on" if p.sequence_parallel else "off",
            p.schedule or "-", f"{ev.step_time_s:.3f}", f"{ev.tokens_per_s_per_gpu:,.0f}",
            f"{100 * ev.mfu:.1f}", f"{ev.peak_memory_gib:.1f}",
        ]
        if orders:
            row.insert(12, p.order)
        rows.append(row)
    return table(header, rows)


def stats_block(stats: SearchStats) -> str:
    """What was searched and what was pruned, largest reason first."""
    lines = [
        f"candidates  {stats.candidates:,}",
        f"feasible    {stats.feasible:,}",
        f"elapsed     {stats.elapsed_s:.2f} s" + (f" ({stats.threads} threads)" if stats.threads else ""),
    ]
    if stats.pruned:
        lines.append("pruned")
        reasons = sorted(stats.pruned.items(), key=lambda kv: (-kv[1], kv[0]))
        width = max(len(r) for r, _ in reasons)
        count_width = max(len(f"{c:,}") for _, c in reasons)
        lines += [f"  {r.ljust(width)}  {f'{c:,}'.rjust(count_width)}" for r, c in reasons]
    return "\n".join(lines)


def evaluation_block(ev: Evaluation) -> str:
    """One evaluated plan: feasibility with reasons, throughput, and both breakdowns."""
    p = ev.plan
    lines = [
        f"plan        {p}  (rank order {p.order})",
        f"feasible    {'yes' if ev.feasible else 'NO'}",
    ]
    lines += [f"  - {r.rule}: {r.message}" for r in ev.reasons]
    lines += [
        f"step time   {ev.step_time_s:.3f} s  ({ev.micro_batches} micro-batches per pipeline)",
        f"throughput  {ev.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {100 * ev.mfu:.1f} %, "
        f"{ev.model_tflops_per_gpu:.0f} model TFLOP/s per GPU",
        f"peak memory {ev.peak_memory_gib:.1f} GiB per GPU (stage {ev.worst_stage})",
        "",
        "memory GiB  " + "  ".join(f"{k} {v:.2f}" for k, v in ev.memory_gib.items()),
        "time s      " + "  ".join(f"{k} {v:.4f}" for k, v in ev.time_s.items()),
    ]
    return "\n".join(lines)


def _title(model: Model, cluster: Cluster, workload: Workload) -> str:
    gpu = cluster.gpu.name if isinstance(cluster.gpu, Gpu) else cluster.gpu
    title = (
        f"{model.name} on {cluster.num_gpus} x {gpu}, global batch {workload.global_batch} x "
        f"{workload.seq_len} tokens, {workload.precision}"
    )
    if isinstance(cluster.gpu, Gpu) and cluster.gpu.hypothetical:
        title = f"HYPOTHETICAL HARDWARE: {cluster.gpu.description}\n{title}"
    return title


def hardware_json(cluster: Cluster) -> dict[str, Any]:
    """``{"gpu": name, "hypothetical": bool, "description": ...}`` for JSON outputs."""
    gpu = cluster.resolved_gpu()
    return {"gpu": gpu.name, "hypothetical": gpu.hypothetical, "description": gpu.description}


# --- validate ----------------------------------------------------------------------------------


def _validate(args: argparse.Namespace, out: TextIO) -> int:
    cases = _readable(args.cases, "FILE")
    calibration = None if args.calibration is None else _readable(args.calibration, "--calibration")
    report = validate(cases, search=args.search, calibration=calibration, threads=args.threads)
    if args.json:
        json.dump(report.to_dict(), out, indent=2)
        out.write("\n")
    else:
        out.write(validation_text(report, args.worst))
    return 0


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _stats_row(name: str, s: Mapping[str, Any]) -> list[Any]:
    return [
        name, s["n"], _pct(s["median_ape"]), _pct(s["p90_ape"]), _pct(s["within_10pct"]),
        _pct(s["within_20pct"]), _pct(s["median_signed_error"]),
    ]


def validation_text(report: ValidationReport, worst: int) -> str:
    """The human report of ``meshplan validate``."""
    rows = report.cases
    ok = [r for r in rows if r["status"] == "ok"]
    skipped = [r for r in rows if r["status"] == "unrepresentable"]
    failed = [r for r in rows if r["status"] == "error"]
    s = report.summary
    lines = [
        f"{len(rows)} cases: {len(ok)} evaluated, {len(skipped)} not representable, "
        f"{len(failed)} failed. Throughput compared as tokens/s per GPU; APE = |predicted/measured - 1|.",
        "",
    ]
    header = ["throughput", "n", "median APE", "p90 APE", "within 10%", "within 20%", "median signed"]
    body = [_stats_row("all", s["throughput"])]
    body += [_stats_row(f"gpu {k}", v) for k, v in s["by_gpu"].items()]
    body += [_stats_row(f"arch {k}", v) for k, v in s["by_arch"].items()]
    lines += [table(header, body), ""]
    lines.append(f"memory: n={s['memory']['n']}, median APE {_pct(s['memory']['median_ape'])}")
    if "feasible_recall" in s:
        regret = s["regret"]
        lines.append(
            f"search: published plans judged feasible {_pct(s['feasible_recall'])}; "
            f"regret median {_pct(regret['median'])}, p90 {_pct(regret['p90'])} (n={regret['n']})"
        )
    scored = sorted((r for r in ok if r.get("ape") is not None), key=lambda r: -r["ape"])[:worst]
    if scored:
        lines += ["", f"largest errors (top {len(scored)}):"]
        lines.append(table(
            ["case", "gpu", "measured tok/s/GPU", "predicted", "error", "feasible"],
            [[r["id"], r["gpu"], round(r["measured_tokens_per_s_per_gpu"], 1),
              round(r["predicted_tokens_per_s_per_gpu"], 1), _pct(r["signed_error"]),
              "yes" if r["feasible"] else "no"] for r in scored],
        ))
    defaults: dict[str, int] = {}
    for r in ok:
        for d in r["defaults"]:
            defaults[d] = defaults.get(d, 0) + 1
    if defaults:
        lines += ["", "defaults filled in for unknown fields (cases): " + ", ".join(
            f"{k} ({v})" for k, v in sorted(defaults.items(), key=lambda kv: -kv[1])
        )]
    for title, group in (("not representable", skipped), ("failed", failed)):
        if group:
            lines += ["", f"{title}:"] + [f"  {r['id']}: {r['reason']}" for r in group]
    return "\n".join(lines) + "\n"


# --- explain, export, plot ---------------------------------------------------------------------


def _plan_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """The subcommands that take one plan apart: ``explain``, ``export`` and ``plot``."""
    plan_help = "e.g. dp=8,tp=8,pp=4,micro_batch=1,zero=1,recompute=selective,order=tp-cp-ep-dp-pp"
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

    p = sub.add_parser("plot", help="draw the Pareto front, a pipeline schedule or the mesh layout")
    kinds = p.add_subparsers(dest="picture", metavar="PICTURE", required=True)
    pareto = kinds.add_parser("pareto", parents=[common], help="step time vs peak memory of feasible plans")
    _space_flags(pareto)
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


def _explain(args: argparse.Namespace, out: TextIO) -> int:
    from .explain import explain

    model, cluster, workload = _model(args), _cluster(args), _workload(args)
    x = explain(model, cluster, workload, Plan.parse(args.plan))
    if args.json:
        json.dump(_labelled(x.to_dict(), cluster), out, indent=2)
        out.write("\n")
    else:
        out.write(_title(model, cluster, workload) + "\n\n" + x.to_text() + "\n")
    return 0


def _export(args: argparse.Namespace, out: TextIO) -> int:
    from .export import export

    model, cluster, workload = _model(args), _cluster(args), _workload(args)
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


def _plot(args: argparse.Namespace, out: TextIO) -> int:
    try:
        from . import plot
    except ImportError as e:  # matplotlib is the optional `plot` extra
        missing = e.name or "matplotlib"
        raise UsageError(
            f"plot needs the plot extra (missing module {missing}): pip install 'meshplan[plot]'"
        ) from None
    model, cluster, workload = _model(args), _cluster(args), _workload(args)
    if args.picture == "pareto":
        plot.pareto(model, cluster, workload, _space(args), label=args.label,
                    threads=args.threads, timeout_s=_remaining_s(args), out=args.out)
    elif args.picture == "schedule":
        plot.schedule(model, cluster, workload, Plan.parse(args.plan), out=args.out)
    else:
        plot.mesh(model, cluster, workload, Plan.parse(args.plan), axis=args.axis, out=args.out)
    out.write(f"wrote {args.out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
