"""Side by side with llm-analysis (PyPI ``llm-analysis``, optional): the same set of training
plans evaluated by both, and the ratio of evaluations per second (issue 6).

The set: GPT-3 175B (llm-analysis's ``facebook_opt-175b``, the same shape) on 64 A100-SXM-80GB,
global batch 1,536 × 2,048 tokens, every (tp, pp) with tp ≤ 8 and tp·pp ≤ 64 (dp the rest),
ZeRO 0-3, recompute none/selective/full, micro-batch 1, 2, 4, sequence parallel with TP: 684
plans. Each tool scores each plan once per call (llm-analysis ``train``; meshplan
``meshplan.evaluate``, one plan per call through the Python API), and meshplan also as the batch
it is built for (``meshplan.feasible_space`` over the space of these plans, with micro-batch 3
as well: 840 candidates, every feasible one evaluated in full, on one thread). The numbers of the two cost models differ (their models do);
this compares speed only.

Not a test. Skipped with a message when llm-analysis is not installed
(``pip install llm-analysis``). Usage::

    python benchmarks/bench_llm_analysis.py
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import time
import warnings
from typing import Any

import meshplan as mp

N, GLOBAL_BATCH, SEQ = 64, 1536, 2048
RECOMPUTE = {"none": 0, "selective": 1, "full": 2}  # llm-analysis ActivationRecomputation


def plan_set() -> list[dict[str, Any]]:
    plans = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8, 16):
            if tp * pp > N:
                continue
            for zero in (0, 1, 2, 3):
                for recompute in RECOMPUTE:
                    for b in (1, 2, 4):
                        plans.append(dict(dp=N // (tp * pp), tp=tp, pp=pp, zero=zero,
                                          recompute=recompute, micro_batch=b,
                                          sequence_parallel=tp > 1))
    return plans


def run_llm_analysis(plans: list[dict[str, Any]]) -> tuple[float, int]:
    from llm_analysis.analysis import train

    failed = 0
    start = time.perf_counter()
    for p in plans:
        try:
            train(model_name="facebook_opt-175b", gpu_name="a100-sxm-80gb", log_level="ERROR",
                  total_num_gpus=N, tp_size=p["tp"], pp_size=p["pp"], dp_size=p["dp"],
                  ds_zero=p["zero"], batch_size_per_gpu=p["micro_batch"],
                  global_batch_size=GLOBAL_BATCH, seq_len=SEQ,
                  activation_recomputation=RECOMPUTE[p["recompute"]], flash_attn=True)
        except Exception:  # noqa: BLE001 - count what it refuses, keep timing
            failed += 1
    return time.perf_counter() - start, failed


def run_meshplan(plans: list[dict[str, Any]]) -> float:
    model, cluster = mp.Model.preset("gpt3-175b"), mp.Cluster("a100-sxm-80g", N)
    workload = mp.Workload(GLOBAL_BATCH, SEQ)
    typed = [mp.Plan(**p) for p in plans]
    start = time.perf_counter()
    for plan in typed:
        mp.evaluate(model, cluster, workload, plan)
    return time.perf_counter() - start


def run_meshplan_batch() -> tuple[float, int, int]:
    space = mp.SearchSpace(max_tp=8, max_pp=16, max_micro_batch=4, sequence_parallel=[True],
                           schedules=["1f1b"], cp=1, max_vpp=1)
    cluster, workload = mp.Cluster("a100-sxm-80g", N), mp.Workload(GLOBAL_BATCH, SEQ)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        fs = mp.feasible_space("gpt3-175b", cluster, workload, space, threads=1)
        best = min(best, time.perf_counter() - start)
    return best, fs.stats.candidates, fs.num_plans


def main() -> int:
    if importlib.util.find_spec("llm_analysis") is None:
        print("llm-analysis is not installed (pip install llm-analysis): skipped")
        return 0
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    plans = plan_set()
    run_llm_analysis(plans[:5])  # warm-up: imports, config caches
    run_meshplan(plans[:5])
    la_s, la_failed = run_llm_analysis(plans)
    mp_s = run_meshplan(plans)
    batch_s, candidates, feasible = run_meshplan_batch()
    la_rate, mp_rate = len(plans) / la_s, len(plans) / mp_s
    print(f"plans: {len(plans)} (gpt3-175b on {N} x a100-sxm-80g, batch {GLOBAL_BATCH} x {SEQ})")
    print(f"llm-analysis train():       {la_rate:10,.0f} plans/s ({la_failed} refused)")
    print(f"meshplan.evaluate():        {mp_rate:10,.0f} plans/s   ratio {mp_rate / la_rate:6.1f}x")
    print(f"meshplan.feasible_space():  {candidates / batch_s:10,.0f} plans/s   ratio "
          f"{candidates / batch_s / la_rate:6.0f}x   ({candidates} candidates, {feasible} feasible "
          f"evaluated in full, one thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
