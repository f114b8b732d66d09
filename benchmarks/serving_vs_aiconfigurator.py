"""meshplan's serving model side by side with NVIDIA's aiconfigurator on the published runs of
``validation/serving.json`` (issue 14): the same inputs (model, GPU, precision, TP/PP, ISL/OSL,
and the batch meshplan's memory model lets the engine run), both predictions, the measurement,
and the time each tool takes. Two tables: output throughput on the max-throughput runs, and TTFT
and TPOT on the runs that measure them (aggregated and disaggregated deployments of the models
both tools cover).

aiconfigurator is optional (``pip install aiconfigurator``, skipped when absent); it may live in
another environment: ``--aic-python /path/to/venv/bin/python`` runs its half there, in a child
process fed the cases as JSON. Not a test: it prints a table (``--markdown`` for the docs) and
never fails on the numbers.

    python benchmarks/serving_vs_aiconfigurator.py [--aic-python PY] [--limit N] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "validation" / "serving.json"

# meshplan presets → aiconfigurator's bundled model configs (same architectures).
AIC_MODELS = {
    "llama3-8b": "meta-llama/Meta-Llama-3.1-8B",
    "llama3-70b": "meta-llama/Meta-Llama-3.1-70B",
    "llama3.1-405b": "meta-llama/Meta-Llama-3.1-405B",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "gpt-oss-120b": "openai/gpt-oss-120b",
}
# A case's engine → aiconfigurator's backend of the same name.
AIC_BACKENDS = {"trtllm": "trtllm", "vllm": "vllm", "sglang": "sglang"}
AIC_KV = {"bf16": "bfloat16", "fp16": "float16", "fp8": "fp8"}
AIC_SYSTEMS = {"h100-sxm": "h100_sxm", "h200-sxm": "h200_sxm", "b200": "b200_sxm", "gb200-nvl72": "gb200"}
AIC_GEMM = {"fp8": "fp8", "nvfp4": "nvfp4", "bf16": "bfloat16"}


def child() -> None:
    """aiconfigurator's half: reads ``[{id, model, system, ...}]`` on stdin, writes predictions."""
    import logging

    logging.disable(logging.WARNING)
    from aiconfigurator.cli.api import cli_estimate

    out = []
    for q in json.load(sys.stdin):
        started = time.perf_counter()
        try:
            r = cli_estimate(q["model"], q["system"], **q["estimate"])
            out.append({"id": q["id"], "tokens_per_s": float(r.tokens_per_second), "ttft_s": r.ttft / 1e3,
                        "tpot_s": r.tpot / 1e3, "seconds": time.perf_counter() - started, "error": None})
        except Exception as e:  # noqa: BLE001 - report, do not stop the comparison
            out.append({"id": q["id"], "tokens_per_s": None, "seconds": time.perf_counter() - started,
                        "error": f"{type(e).__name__}: {e}"[:200]})
    json.dump(out, sys.stdout)


def throughput_query(c: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """aiconfigurator's inputs for a max-throughput run: TensorRT-LLM at meshplan's batch."""
    return {"backend_name": "trtllm", "isl": c["traffic"]["input_len"], "osl": c["traffic"]["output_len"],
            "batch_size": row["batch"], "tp_size": c["plan"]["tp"], "pp_size": c["plan"].get("pp", 1),
            "gemm_quant_mode": AIC_GEMM[c["weight_precision"]], "kvcache_quant_mode": "fp8"}


def latency_query(c: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """aiconfigurator's inputs for a run that measures TTFT and TPOT: the case's engine, its
    workers' TP, attention-DP and expert split (expert TP × EP = TP × attention-DP), meshplan's
    running batch (per attention-DP rank, as aiconfigurator counts it), and for a disaggregated
    deployment both pools; the weights in the checkpoint's own format (aiconfigurator's default)."""
    plan, t = c["plan"], c["traffic"]
    common = {"backend_name": AIC_BACKENDS[c["engine"]], "isl": t["input_len"], "osl": round(t["output_len"]),
              "kvcache_quant_mode": AIC_KV[c.get("kv_precision", "bf16")]}

    def worker(w: dict[str, Any]) -> tuple[int, int, int, int]:
        adp = int(w.get("attention_dp", 1))
        ep = int(w.get("ep", 1))
        return int(w["tp"]), adp, int(w["tp"]) * adp // ep, ep

    tp, adp, moe_tp, ep = worker(plan)
    batch = max(1, -(-int(row["batch"]) // adp))
    if plan.get("prefill") is None:
        return {**common, "batch_size": batch, "tp_size": tp, "pp_size": int(plan.get("pp", 1)),
                "attention_dp_size": adp, "moe_tp_size": moe_tp, "moe_ep_size": ep}
    ptp, padp, pmoe_tp, pep = worker(plan["prefill"])
    return {**common, "mode": "disagg",
            "prefill_tp_size": ptp, "prefill_attention_dp_size": padp, "prefill_moe_tp_size": pmoe_tp,
            "prefill_moe_ep_size": pep, "prefill_batch_size": int(plan["prefill"].get("max_sequences", 1)),
            "prefill_num_workers": int(plan.get("prefill_replicas", 1)),
            "decode_tp_size": tp, "decode_attention_dp_size": adp, "decode_moe_tp_size": moe_tp,
            "decode_moe_ep_size": ep, "decode_batch_size": batch, "decode_num_workers": int(plan.get("replicas", 1))}


def aiconfigurator_available(python: str) -> bool:
    try:
        done = subprocess.run([python, "-c", "import aiconfigurator"], capture_output=True)
    except OSError:  # no such interpreter
        return False
    return done.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aic-python", default=sys.executable, help="interpreter with aiconfigurator")
    parser.add_argument("--limit", type=int, help="first N cases only")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child()
        return

    from meshplan.serving_validation import validate_serving

    data = json.loads(CASES.read_text())
    covered = [c for c in data["cases"] if c["model"] in AIC_MODELS and c["gpu"] in AIC_SYSTEMS]
    # The max-throughput runs (no concurrency, measured throughput) and the runs that measure TTFT
    # or TPOT on an engine aiconfigurator models; the file's other cases use models or GPUs it
    # lacks.
    throughput = [c for c in covered if c["measured"].get("output_tokens_per_s")
                  and c["traffic"].get("concurrency") is None and c["model"].startswith("llama")]
    latency = [c for c in covered if c["engine"] in AIC_BACKENDS
               and (c["measured"].get("ttft_s") or c["measured"].get("tpot_s"))]
    if args.limit:
        throughput, latency = throughput[: args.limit], latency[: args.limit]
    started = time.perf_counter()
    report = validate_serving(json.dumps({**data, "cases": throughput}))
    meshplan_s = time.perf_counter() - started
    started = time.perf_counter()
    latency_report = validate_serving(json.dumps({**data, "cases": latency}))
    meshplan_latency_s = time.perf_counter() - started
    rows = {r["id"]: r for r in [*report.rows, *latency_report.rows]}

    def aic_model(c: dict[str, Any]) -> str:
        # DeepSeek-R1 runs name R1 (DeepSeek-V3's architecture, meshplan's deepseek-v3 preset).
        return "deepseek-ai/DeepSeek-R1" if "deepseek-r1" in c["id"] else AIC_MODELS[c["model"]]

    aic: dict[str, dict[str, Any]] = {}
    if aiconfigurator_available(args.aic_python):
        queries = [{"id": c["id"], "model": aic_model(c), "system": AIC_SYSTEMS[c["gpu"]],
                    "estimate": throughput_query(c, rows[c["id"]])} for c in throughput]
        queries += [{"id": c["id"], "model": aic_model(c), "system": AIC_SYSTEMS[c["gpu"]],
                     "estimate": latency_query(c, rows[c["id"]])} for c in latency]
        done = subprocess.run([args.aic_python, __file__, "--child"], input=json.dumps(queries),
                              capture_output=True, text=True, timeout=3600)
        if done.returncode == 0:
            aic = {r["id"]: r for r in json.loads(done.stdout)}
        else:
            print(f"aiconfigurator failed: {done.stderr[-500:]}", file=sys.stderr)
    else:
        print("aiconfigurator not installed: meshplan only (pip install aiconfigurator)", file=sys.stderr)

    def ape(p: Any, m: Any) -> Any:
        return None if p is None or not m else abs(p - m) / m

    def med(values: list[Any]) -> str:
        values = [v for v in values if v is not None]
        return "-" if not values else f"{100 * statistics.median(values):.1f}% (n={len(values)})"

    sep = " | " if args.markdown else "  "

    def header(*names: str) -> None:
        print(sep.join(names))
        if args.markdown:
            print("|".join(["---"] * len(names)))

    table = []
    for c in throughput:
        r, a = rows[c["id"]], aic.get(c["id"], {})
        m = c["measured"]["output_tokens_per_s"]
        table.append({"id": c["id"], "gpu": c["gpu"], "batch": r["batch"], "measured": m,
                      "meshplan": r["predicted"]["output_tokens_per_s"], "aiconfigurator": a.get("tokens_per_s"),
                      "meshplan_ape": ape(r["predicted"]["output_tokens_per_s"], m),
                      "aic_ape": ape(a.get("tokens_per_s"), m), "aic_s": a.get("seconds"),
                      "aic_error": a.get("error")})
    header("group", "meshplan median APE", "aiconfigurator median APE")
    for gpu in [None, *sorted({t["gpu"] for t in table})]:
        subset = [t for t in table if gpu is None or t["gpu"] == gpu]
        print(sep.join([gpu or "all", med([t["meshplan_ape"] for t in subset]),
                        med([t["aic_ape"] for t in subset])]))
    aic_times = [t["aic_s"] for t in table if t["aic_s"] is not None]
    print(f"\nmeshplan: {len(table)} cases in {meshplan_s:.2f} s"
          + (f"; aiconfigurator: {len(aic_times)} cases in {sum(aic_times):.1f} s "
             f"(median {statistics.median(aic_times):.2f} s per case)" if aic_times else ""))
    errors = [t for t in table if t["aic_error"]]
    if errors:
        print(f"aiconfigurator errors on {len(errors)} cases, e.g. {errors[0]['id']}: {errors[0]['aic_error']}")
    print("\nper case (output tokens/s):")
    header("case", "batch", "measured", "meshplan", "aiconfigurator")
    for t in table:
        a = "-" if t["aiconfigurator"] is None else f"{t['aiconfigurator']:.0f}"
        print(sep.join([t["id"], str(t["batch"]), f"{t['measured']:.0f}", f"{t['meshplan']:.0f}", a]))
    if latency:
        print_latency(latency, rows, aic, meshplan_latency_s, sep, header, ape, med)


def print_latency(latency: list[dict[str, Any]], rows: dict[str, Any], aic: dict[str, Any], meshplan_s: float,
                  sep: str, header: Any, ape: Any, med: Any) -> None:
    """The TTFT/TPOT table: median APE of each tool by source group, then every case."""
    def group(c: dict[str, Any]) -> str:
        kind = "PD" if c["plan"].get("prefill") else "aggregated"
        return f"{c['gpu']} {c['engine']} {c['model']} {kind}"

    lines = []
    for c in latency:
        r, a, m = rows[c["id"]], aic.get(c["id"], {}), c["measured"]
        lines.append({"id": c["id"], "group": group(c), "m_ttft": m.get("ttft_s"), "m_tpot": m.get("tpot_s"),
                      "p_ttft": r["predicted"]["ttft_s"], "p_tpot": r["predicted"]["tpot_s"],
                      "a_ttft": a.get("ttft_s"), "a_tpot": a.get("tpot_s"), "error": a.get("error"),
                      "seconds": a.get("seconds")})
    print("\nTTFT and TPOT (median APE; aiconfigurator at the same workers and batch):")
    header("group", "meshplan TTFT", "aiconfigurator TTFT", "meshplan TPOT", "aiconfigurator TPOT")
    for g in [None, *sorted({x["group"] for x in lines})]:
        subset = [x for x in lines if g is None or x["group"] == g]
        print(sep.join([g or "all",
                        med([ape(x["p_ttft"], x["m_ttft"]) for x in subset]),
                        med([ape(x["a_ttft"], x["m_ttft"]) for x in subset]),
                        med([ape(x["p_tpot"], x["m_tpot"]) for x in subset]),
                        med([ape(x["a_tpot"], x["m_tpot"]) for x in subset])]))
    times = [x["seconds"] for x in lines if x["seconds"] is not None]
    print(f"\nmeshplan: {len(lines)} cases in {meshplan_s:.2f} s"
          + (f"; aiconfigurator: {len(times)} cases in {sum(times):.1f} s" if times else ""))
    errors = [x for x in lines if x["error"]]
    if errors:
        print(f"aiconfigurator errors on {len(errors)} cases, e.g. {errors[0]['id']}: {errors[0]['error']}")

    def ms(v: Any) -> str:
        return "-" if v is None else f"{v * 1e3:.1f}"

    print("\nper case (ms; measured / meshplan / aiconfigurator):")
    header("case", "TTFT", "TPOT")
    for x in lines:
        print(sep.join([x["id"], f"{ms(x['m_ttft'])} / {ms(x['p_ttft'])} / {ms(x['a_ttft'])}",
                        f"{ms(x['m_tpot'])} / {ms(x['p_tpot'])} / {ms(x['a_tpot'])}"]))


if __name__ == "__main__":
    main()
