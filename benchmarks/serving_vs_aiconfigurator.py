"""meshplan's serving model side by side with NVIDIA's aiconfigurator on the published runs of
``validation/serving.json`` (issue 14): the same inputs (model, GPU, precision, TP/PP, ISL/OSL,
and the batch meshplan's memory model lets the engine run), both predictions of output
throughput, the measurement, and the time each tool takes.

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
}
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
            r = cli_estimate(q["model"], q["system"], backend_name="trtllm", isl=q["isl"], osl=q["osl"],
                             batch_size=q["batch"], tp_size=q["tp"], pp_size=q["pp"],
                             gemm_quant_mode=q["gemm"], kvcache_quant_mode=q["kv"])
            out.append({"id": q["id"], "tokens_per_s": float(r.raw["tokens/s"]), "ttft_s": r.ttft / 1e3,
                        "tpot_s": r.tpot / 1e3, "seconds": time.perf_counter() - started, "error": None})
        except Exception as e:  # noqa: BLE001 - report, do not stop the comparison
            out.append({"id": q["id"], "tokens_per_s": None, "seconds": time.perf_counter() - started,
                        "error": f"{type(e).__name__}: {e}"[:200]})
    json.dump(out, sys.stdout)


def aiconfigurator_available(python: str) -> bool:
    done = subprocess.run([python, "-c", "import aiconfigurator"], capture_output=True)
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
    # The max-throughput runs (no concurrency, measured throughput) of the models and GPUs both
    # tools cover; the file's other sources measure latencies or use models aiconfigurator lacks.
    compared = [c for c in data["cases"] if c["measured"].get("output_tokens_per_s")
                and c["traffic"].get("concurrency") is None
                and c["model"] in AIC_MODELS and c["gpu"] in AIC_SYSTEMS]
    cases = compared[: args.limit] if args.limit else compared
    started = time.perf_counter()
    report = validate_serving(json.dumps({**data, "cases": cases}))
    meshplan_s = time.perf_counter() - started
    rows = {r["id"]: r for r in report.rows}

    aic: dict[str, dict[str, Any]] = {}
    if aiconfigurator_available(args.aic_python):
        queries = [{"id": c["id"], "model": AIC_MODELS[c["model"]], "system": AIC_SYSTEMS[c["gpu"]],
                    "isl": c["traffic"]["input_len"], "osl": c["traffic"]["output_len"],
                    "batch": rows[c["id"]]["batch"], "tp": c["plan"]["tp"], "pp": c["plan"].get("pp", 1),
                    "gemm": AIC_GEMM[c["weight_precision"]], "kv": "fp8"}
                   for c in cases if c["model"] in AIC_MODELS and c["gpu"] in AIC_SYSTEMS]
        done = subprocess.run([args.aic_python, __file__, "--child"], input=json.dumps(queries),
                              capture_output=True, text=True, timeout=3600)
        if done.returncode == 0:
            aic = {r["id"]: r for r in json.loads(done.stdout)}
        else:
            print(f"aiconfigurator failed: {done.stderr[-500:]}", file=sys.stderr)
    else:
        print("aiconfigurator not installed: meshplan only (pip install aiconfigurator)", file=sys.stderr)

    def ape(p: Any, m: float) -> Any:
        return None if p is None else abs(p - m) / m

    table = []
    for c in cases:
        r, a = rows[c["id"]], aic.get(c["id"], {})
        m = c["measured"]["output_tokens_per_s"]
        table.append({"id": c["id"], "gpu": c["gpu"], "batch": r["batch"], "measured": m,
                      "meshplan": r["predicted"]["output_tokens_per_s"], "aiconfigurator": a.get("tokens_per_s"),
                      "meshplan_ape": ape(r["predicted"]["output_tokens_per_s"], m),
                      "aic_ape": ape(a.get("tokens_per_s"), m), "aic_s": a.get("seconds"),
                      "aic_error": a.get("error")})

    def med(key: str, subset: list[dict[str, Any]]) -> str:
        values = [t[key] for t in subset if t[key] is not None]
        return "-" if not values else f"{100 * statistics.median(values):.1f}% (n={len(values)})"

    sep = " | " if args.markdown else "  "
    print(sep.join(["group", "meshplan median APE", "aiconfigurator median APE"]))
    if args.markdown:
        print("|".join(["---"] * 3))
    for gpu in [None, *sorted({t["gpu"] for t in table})]:
        subset = [t for t in table if gpu is None or t["gpu"] == gpu]
        print(sep.join([gpu or "all", med("meshplan_ape", subset), med("aic_ape", subset)]))
    aic_times = [t["aic_s"] for t in table if t["aic_s"] is not None]
    print(f"\nmeshplan: {len(table)} cases in {meshplan_s:.2f} s"
          + (f"; aiconfigurator: {len(aic_times)} cases in {sum(aic_times):.1f} s "
             f"(median {statistics.median(aic_times):.2f} s per case)" if aic_times else ""))
    errors = [t for t in table if t["aic_error"]]
    if errors:
        print(f"aiconfigurator errors on {len(errors)} cases, e.g. {errors[0]['id']}: {errors[0]['aic_error']}")
    print("\nper case (output tokens/s):")
    print(sep.join(["case", "batch", "measured", "meshplan", "aiconfigurator"]))
    for t in table:
        a = "-" if t["aiconfigurator"] is None else f"{t['aiconfigurator']:.0f}"
        print(sep.join([t["id"], str(t["batch"]), f"{t['measured']:.0f}", f"{t['meshplan']:.0f}", a]))


if __name__ == "__main__":
    main()
