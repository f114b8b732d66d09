"""``meshplan inference search|evaluate|explain``: serving deployments (docs/serving.md).

Named ``inference`` so that it cannot be confused with ``meshplan serve``, which starts the gRPC
server. Tables by default, ``--json`` or ``--csv`` for machines, ``--plot pareto --out F.png``
for the front of tokens/s per GPU against tokens/s per user, ``--export vllm|sglang|trtllm``
for launch commands.
"""

from __future__ import annotations

import argparse
import csv
import json
from typing import Any, Optional, TextIO

from .. import _core
from ..serving import (
    ENGINES,
    MAX_LENGTH_CLASSES,
    evaluate_serving,
    explain_serving,
    launch_commands,
    length_histogram,
    search_serving,
    serving_problem,
)
from ._common import Parser, UsageError, cluster_from, model_from, remaining_s
from ._render import table

PLAN_HELP = ("e.g. tp=8,pp=1,adp=1,ep=1,etp=8,batch=64,replicas=1; also tokens=, kv_tokens=, lag=, "
             "attn=flash|triton-mla, swa=window|full")

# Flat columns of one deployment (table, CSV).
COLUMNS = (
    "rank", "deployment", "gpus", "tp", "pp", "attention_dp", "ep", "expert_tp", "max_sequences",
    "replicas", "prefill", "prefill_replicas", "ttft_ms", "queue_ms", "tpot_ms", "e2e_s",
    "tokens_per_s_per_gpu", "tokens_per_s_per_user", "output_tokens_per_s", "requests_per_s",
    "memory_gib", "kv_capacity_sequences",
)


def _flags() -> Parser:
    """The serving-problem flags (a parent parser of the three commands)."""
    p = Parser(add_help=False)
    g = p.add_argument_group("model, cluster and traffic")
    g.add_argument("--model", required=True, metavar="NAME|config.json", help="a model preset or a config.json")
    g.add_argument("--model-name", help="name for a model read from a config.json")
    g.add_argument("--gpu", metavar="NAME", help="a GPU preset (see `meshplan gpus`)")
    g.add_argument("--gpu-set", action="append", metavar="FIELD=V,...", help="what-if GPU changes")
    g.add_argument("--gpu-file", metavar="hw.toml", help="what-if hardware from a file (instead of --gpu)")
    g.add_argument("--gpus", required=True, type=int, metavar="N", help="number of GPUs")
    g.add_argument("--gpus-per-node", type=int, metavar="N", help="default: the GPU preset's")
    g.add_argument("--nvlink-domain", type=int, metavar="N", help="GPUs per NVLink domain (default: the preset's)")
    g.add_argument("--weight-precision", default="bf16", help="bf16 (default), fp16, fp8, mxfp8 or nvfp4")
    g.add_argument("--kv-precision", default="bf16", help="KV-cache precision: bf16 (default), fp16, fp8 or nvfp4")
    g.add_argument("--weight-scaling", choices=("tensor", "block"),
                   help="FP8 weights' scaling (default: the checkpoint's: block for DeepSeek-V3/R1 or an HF config with "
                        "weight_block_size, else tensor)")
    g.add_argument("--expert-weights", metavar="FORMAT",
                   help="the routed experts' weight-only storage format: mxfp4 (gpt-oss; default: the HF "
                        "config's quant_method, else like the other layers)")
    g.add_argument("--input-len", type=int, metavar="T", help="prompt tokens per request (ISL)")
    g.add_argument("--output-len", type=int, metavar="T", help="output tokens per request (OSL)")
    g.add_argument("--lengths", metavar="FILE.csv|.json",
                   help="a length distribution instead of --input-len/--output-len: rows of input_len,output_len "
                        "(a trace, one request per row) or input_len,output_len,weight (a histogram); a trace of "
                        f"more than {MAX_LENGTH_CLASSES} requests is binned into 8 x 8 classes")
    g.add_argument("--prefix-fraction", type=float, default=0.0, metavar="F", help="shared, cached prompt prefix (0-0.99)")
    g.add_argument("--cached-fraction", type=float, default=0.0, metavar="F",
                   help="share of each prompt's own tokens already cached by earlier requests, e.g. a "
                        "conversation's history (0-1): not prefilled, held and handed over in full")
    g.add_argument("--concurrency", type=int, metavar="N", help="requests in flight across the deployment")
    g.add_argument("--request-rate", type=float, metavar="R",
                   help="requests/s the deployment must sustain; without --concurrency also the Poisson arrival rate")
    g.add_argument("--arrival", choices=("spread", "waves", "poisson"),
                   help="arrival process of the queue model: spread (closed loop, varied lengths), waves (closed "
                        "loop of equal lengths, or an offline batch), poisson (open loop at --request-rate); "
                        "default: poisson with a rate and no concurrency, else spread")
    g.add_argument("--num-requests", type=int, metavar="N", help="requests in the whole run (a benchmark's prompts)")
    g.add_argument("--ttft-ms", type=float, metavar="MS", help="SLO: time to first token")
    g.add_argument("--tpot-ms", type=float, metavar="MS", help="SLO: time per output token after the first")
    g.add_argument("--e2e-s", type=float, metavar="S", help="SLO: end-to-end latency")
    g.add_argument("--objective", default="throughput", help="throughput (default: tokens/s per GPU) or latency")
    g.add_argument("--timeout-s", type=float, metavar="S", help="give up after S seconds")
    return p


def add(sub: Any) -> None:
    """``inference`` and its three commands."""
    flags = _flags()
    inf = sub.add_parser("inference", help="plan serving deployments (TTFT, TPOT, KV cache)")
    cmds = inf.add_subparsers(dest="inference_command", metavar="COMMAND", required=True)
    s = cmds.add_parser("search", parents=[flags], help="rank the deployments meeting the SLOs")
    s.add_argument("--top-k", type=int, metavar="K", help="deployments shown (default 10)")
    s.add_argument("--no-disaggregation", action="store_true", help="aggregated workers only")
    s.add_argument("--max-tp", type=int, metavar="N")
    s.add_argument("--max-pp", type=int, metavar="N")
    s.add_argument("--max-attention-dp", type=int, metavar="N")
    s.add_argument("--max-sequences", type=int, metavar="N", help="most sequences per worker")
    s.add_argument("--allow-tp-cross-domain", action="store_true", help="let TP groups leave the NVLink domain")
    s.add_argument("--attention-kernel", metavar="NAME",
                   help="the engine's attention kernels for every deployment: flash (default) or "
                        "triton-mla (SGLang 0.4's Triton MLA backend)")
    s.add_argument("--sliding-kv", metavar="POOL",
                   help="what every deployment's KV pools keep of a sliding-window layer: window "
                        "(default) or full (SGLang's pool for gpt-oss: every token)")
    fmt = s.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON")
    fmt.add_argument("--csv", action="store_true", help="print CSV, one row per deployment")
    s.add_argument("--pareto", action="store_true", help="list the Pareto front instead of the ranking")
    s.add_argument("--plot", choices=("pareto",), help="draw the Pareto front (needs --out)")
    s.add_argument("--out", metavar="FILE.png|.svg", help="the picture of --plot")
    s.set_defaults(run=_search)
    for name, helptext in (("evaluate", "score one deployment, feasible or not"),
                           ("explain", "one deployment axis by axis")):
        c = cmds.add_parser(name, parents=[flags], help=helptext)
        c.add_argument("--plan", required=True, metavar="tp=..,batch=..", help=PLAN_HELP)
        c.add_argument("--prefill", metavar="tp=..,batch=..", help="the prefill pool of a disaggregated deployment")
        c.add_argument("--json", action="store_true", help="print JSON")
        c.add_argument("--export", choices=ENGINES, help="print the launch commands for this engine")
        c.add_argument("--model-path", help="model path or Hugging Face id in the launch commands")
        c.set_defaults(run=_evaluate if name == "evaluate" else _explain)


def read_lengths(path: str) -> list[Any]:
    """The classes of a ``--lengths`` file: a CSV (an optional header, then rows of
    ``input_len,output_len[,weight]``) or a JSON list of such rows or of class dicts. Rows
    without weights are a trace: as they are up to :data:`MAX_LENGTH_CLASSES` rows, binned by
    :func:`meshplan.serving.length_histogram` beyond."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise UsageError(f"--lengths: cannot read {path}: {e.strerror or e}") from None
    rows: list[Any]
    if path.endswith(".json"):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"--lengths {path}: not JSON ({e.msg}, line {e.lineno})") from None
        if not isinstance(rows, list):
            raise UsageError(f"--lengths {path}: a JSON list of [input_len, output_len(, weight)] rows")
    else:
        rows = []
        for line, cells in enumerate(csv.reader(text.splitlines()), 1):
            if not cells or not "".join(cells).strip():
                continue
            try:
                rows.append([_number(c) for c in cells])
            except ValueError:
                if rows or line > 1:
                    raise UsageError(f"--lengths {path} line {line}: {','.join(cells)[:60]!r} is not "
                                     "input_len,output_len[,weight]") from None
    if not rows:
        raise UsageError(f"--lengths {path}: no rows")
    weighted = any(isinstance(r, dict) or (isinstance(r, list) and len(r) == 3) for r in rows)
    if weighted or len(rows) <= MAX_LENGTH_CLASSES:
        return rows
    return length_histogram([tuple(r) if isinstance(r, list) else r for r in rows])


def _number(cell: str) -> Any:
    """A CSV cell as an int where it is one (lengths), else a float (weights)."""
    cell = cell.strip()
    try:
        return int(cell)
    except ValueError:
        return float(cell)


def _problem(args: argparse.Namespace) -> dict[str, Any]:
    ms = 1e-3
    if args.lengths is not None:
        if args.input_len is not None or args.output_len is not None:
            raise UsageError("--lengths gives the lengths: leave out --input-len and --output-len")
        lengths: dict[str, Any] = {"lengths": read_lengths(args.lengths)}
    elif args.input_len is None or args.output_len is None:
        raise UsageError("give --input-len and --output-len, or a length distribution in --lengths FILE")
    else:
        lengths = {"input_len": args.input_len, "output_len": args.output_len}
    return {
        **lengths,
        "weight_precision": args.weight_precision,
        "kv_precision": args.kv_precision,
        "weight_scaling": args.weight_scaling,
        "expert_weights": args.expert_weights,
        "prefix_fraction": args.prefix_fraction,
        "cached_fraction": args.cached_fraction,
        "concurrency": args.concurrency,
        "request_rate": args.request_rate,
        "arrival": args.arrival,
        "num_requests": args.num_requests,
        "ttft_s": None if args.ttft_ms is None else args.ttft_ms * ms,
        "tpot_s": None if args.tpot_ms is None else args.tpot_ms * ms,
        "e2e_s": args.e2e_s,
        "objective": args.objective,
    }


def row(ev: dict[str, Any], rank: Optional[int] = None) -> dict[str, Any]:
    """One deployment as a flat row of :data:`COLUMNS`."""
    plan, w, t = ev["plan"], ev["plan"]["worker"], ev["time"]
    pw = plan.get("prefill")
    return {
        "rank": rank if rank is not None else "",
        "deployment": ev["label"],
        "gpus": ev["gpus"],
        "tp": w["tp"], "pp": w["pp"], "attention_dp": w["attention_dp"], "ep": w["ep"],
        "expert_tp": w["expert_tp"], "max_sequences": w["max_sequences"], "replicas": plan["replicas"],
        "prefill": "" if pw is None else f"tp{pw['tp']}·adp{pw['attention_dp']}·ep{pw['ep']}·pp{pw['pp']} b{pw['max_sequences']}",
        "prefill_replicas": plan.get("prefill_replicas", 0),
        "ttft_ms": round(t["ttft_s"] * 1e3, 2),
        "queue_ms": round(ev.get("queue_s", 0.0) * 1e3, 2),
        "tpot_ms": round(t["tpot_s"] * 1e3, 2),
        "e2e_s": round(t["e2e_s"], 3),
        "tokens_per_s_per_gpu": round(ev["tokens_per_s_per_gpu"], 1),
        "tokens_per_s_per_user": round(ev["tokens_per_s_per_user"], 1),
        "output_tokens_per_s": round(ev["output_tokens_per_s"], 1),
        "requests_per_s": round(ev["requests_per_s"], 3),
        "memory_gib": round(ev["memory"]["total_gib"], 1),
        "kv_capacity_sequences": ev["memory"]["max_sequences_fit"],
    }


def _experts(phase: dict[str, Any]) -> str:
    """`` (routed experts N)`` where the linear layers hold routed experts."""
    seconds = phase.get("routed_expert_s", 0.0)
    return f" (routed experts {seconds * 1e3:.2f})" if seconds > 0 else ""


def deployments_table(evs: list[dict[str, Any]]) -> str:
    """The deployments as an aligned table."""
    header = ["#", "deployment", "GPUs", "TTFT ms", "TPOT ms", "tok/s/GPU", "tok/s/user", "mem GiB", "KV seqs"]
    rows = []
    for i, ev in enumerate(evs, 1):
        r = row(ev, i)
        rows.append([i, r["deployment"], r["gpus"], f"{r['ttft_ms']:.1f}", f"{r['tpot_ms']:.2f}",
                     f"{r['tokens_per_s_per_gpu']:.1f}", f"{r['tokens_per_s_per_user']:.1f}",
                     f"{r['memory_gib']:.1f}", r["kv_capacity_sequences"]])
    return table(header, rows)


def _search(args: argparse.Namespace, out: TextIO) -> int:
    if args.plot and not args.out:
        raise UsageError("--plot pareto needs --out FILE.png")
    space: dict[str, Any] = {"disaggregation": not args.no_disaggregation,
                             "allow_tp_cross_domain": args.allow_tp_cross_domain}
    for key in ("top_k", "max_tp", "max_pp", "max_attention_dp", "max_sequences", "attention_kernel",
                "sliding_kv"):
        value = getattr(args, key)
        if value is not None:
            space[key] = value
    result = search_serving(model_from(args), cluster_from(args), space=space,
                            timeout_s=remaining_s(args), **_problem(args))
    shown = result.pareto if args.pareto else result.plans
    if args.plot:
        _plot_pareto(result.pareto, args.out)
    if args.json:
        json.dump({"plans": result.plans, "pareto": result.pareto, "stats": result.stats}, out, indent=2)
        out.write("\n")
    elif args.csv:
        writer = csv.DictWriter(out, fieldnames=list(COLUMNS), lineterminator="\n")
        writer.writeheader()
        writer.writerows(row(ev, i) for i, ev in enumerate(shown, 1))
    else:
        if not shown:
            out.write("no deployment meets the SLOs and fits in memory\n")
        else:
            out.write(deployments_table(shown) + "\n")
        st = result.stats
        pruned = ", ".join(f"{k} {v}" for k, v in sorted(st["pruned"].items())) or "none"
        out.write(f"\n{st['candidates']} deployments considered, {st['feasible']} feasible "
                  f"({len(result.pareto)} on the Pareto front); pruned: {pruned}; {st['elapsed_s']:.3f} s\n")
    return 0


def _plot_pareto(front: list[dict[str, Any]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise UsageError(f"--plot needs the plot extra (missing module {e.name}): pip install 'meshplan[plot]'") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [ev["tokens_per_s_per_user"] for ev in front]
    ys = [ev["tokens_per_s_per_gpu"] for ev in front]
    ax.plot(xs, ys, marker="o")
    for ev, x, y in zip(front, xs, ys):
        ax.annotate(ev["label"], (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("tokens/s per user (1 / TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title("serving Pareto front")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _one(args: argparse.Namespace, explain: bool) -> dict[str, Any]:
    call = explain_serving if explain else evaluate_serving
    return call(model_from(args), cluster_from(args), args.plan, prefill=args.prefill,
                timeout_s=remaining_s(args), **_problem(args))


def _core_problem(args: argparse.Namespace) -> dict[str, Any]:
    """The core's serving-problem dict of the command line."""
    return serving_problem(model_from(args), cluster_from(args), **_problem(args))


def _export(args: argparse.Namespace, ev: dict[str, Any], out: TextIO) -> None:
    problem = _core_problem(args)
    for line in launch_commands(ev, problem, args.export, args.model_path):
        out.write(line + "\n")


def traffic_text(problem: dict[str, Any]) -> str:
    """The lengths an estimate assumed: the requests' lengths, or their distribution in brief
    (its means and longest request as the core reads them, ``_core.serving_lengths``)."""
    traffic = problem["traffic"]
    if not traffic.get("lengths"):
        return f"traffic: {traffic['input_len']} -> {traffic['output_len']} tokens per request"
    mix = _core.serving_lengths(problem)
    return (f"traffic: {len(mix['classes'])} length classes, mean {mix['mean_input']:,.0f} -> "
            f"{mix['mean_output']:,.0f} tokens, longest {mix['longest']:,.0f}; TTFT and e2e are the requests' "
            "medians")


def evaluation_text(ev: dict[str, Any], problem: Optional[dict[str, Any]] = None) -> str:
    """One deployment's figures and violations as text (``problem``: the core problem it scored,
    whose lengths it states)."""
    r = row(ev)
    m, t = ev["memory"], ev["time"]
    lines = [
        f"deployment  {ev['label']}  on {ev['gpus']} GPUs: {'feasible' if ev['feasible'] else 'NOT feasible'}",
        *([traffic_text(problem)] if problem else []),
        f"TTFT {r['ttft_ms']:.1f} ms (queueing {r['queue_ms']:.1f})   TPOT {r['tpot_ms']:.2f} ms   "
        f"e2e {r['e2e_s']:.3f} s",
        f"{r['tokens_per_s_per_gpu']:.1f} tok/s/GPU   {r['tokens_per_s_per_user']:.1f} tok/s/user   "
        f"{r['output_tokens_per_s']:.0f} tok/s   {r['requests_per_s']:.3f} req/s",
        f"memory per GPU {m['total_gib']:.1f} GiB of {m['budget_gib']:.1f}: weights {m['weights_gib']:.1f}, "
        f"KV {m['kv_cache_gib']:.1f}, workspace {m['workspace_gib']:.1f}, fixed {m['fixed_gib']:.1f}; "
        f"KV holds {m['max_sequences_fit']} sequences",
        f"decode step: linear {t['decode']['linear_s'] * 1e3:.2f} ms{_experts(t['decode'])}, "
        f"attention {t['decode']['attention_s'] * 1e3:.2f}, "
        f"TP {t['decode']['tp_comm_s'] * 1e3:.2f}, EP {t['decode']['ep_comm_s'] * 1e3:.2f}, "
        f"PP {t['decode']['pp_comm_s'] * 1e3:.2f}, overhead {t['decode']['overhead_s'] * 1e3:.2f}; "
        f"{t['decode']['arithmetic_intensity']:.1f} FLOP/byte "
        f"({'memory' if t['decode']['memory_bound'] else 'compute'}-bound)",
    ]
    if ev["plan"].get("prefill"):
        mean = " (mean)" if problem and problem["traffic"].get("lengths") else ""
        lines.append(f"KV transfer per request{mean} {t['kv_transfer_s'] * 1e3:.2f} ms")
    for v in ev["violations"]:
        lines.append(f"  x {v['rule']}: {v['message']}")
    return "\n".join(lines)


def _evaluate(args: argparse.Namespace, out: TextIO) -> int:
    ev = _one(args, explain=False)
    if args.export:
        _export(args, ev, out)
    elif args.json:
        json.dump(ev, out, indent=2)
        out.write("\n")
    else:
        out.write(evaluation_text(ev, _core_problem(args)) + "\n")
    return 0


def _explain(args: argparse.Namespace, out: TextIO) -> int:
    ex = _one(args, explain=True)
    if args.export:
        _export(args, ex["evaluation"], out)
        return 0
    if args.json:
        json.dump(ex, out, indent=2)
        out.write("\n")
        return 0
    out.write(evaluation_text(ex["evaluation"], _core_problem(args)) + "\n\n")
    header = ["axis", "degree", "collective", "fabric", "calls/step", "bytes/token/GPU", "ms/step", "bound", "what is sharded"]
    rows = []
    for a in ex["axes"]:
        bound = "-" if a["collective"] == "none" else ("latency" if a["latency_bound"] else "bandwidth")
        rows.append([a["axis"], a["degree"], a["collective"], a["fabric"], f"{a['calls_per_step']:g}",
                     f"{a['bytes_per_token_per_gpu']:.0f}", f"{a['seconds_per_step'] * 1e3:.3f}", bound,
                     a["state_sharded"]])
    out.write(table(header, rows) + "\n")
    out.write(f"\nridge point {ex['ridge_flops_per_byte']:.0f} FLOP/byte: decode below it is memory-bound\n")
    return 0
