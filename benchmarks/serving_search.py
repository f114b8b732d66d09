"""Serving-search speed (issue 14): ``meshplan.search_serving`` on reference problems, best wall
time of ``--repeat`` runs, with the core's own ``stats.elapsed_s`` and the deployments it
considered. The issue's bound: a 64-GPU search for a 671 B MoE (DeepSeek-V3) under 1 s on two
cores.

Not a test: it prints numbers and never fails on them. Usage::

    python benchmarks/serving_search.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

import meshplan as mp

PROBLEMS = [
    # (label, model, gpu, GPUs, weight precision, ISL, OSL, TPOT SLO s)
    ("deepseek-v3 / 64 h200-sxm", "deepseek-v3", "h200-sxm", 64, "fp8", 4096, 1024, 0.05),
    ("deepseek-v3 / 64 gb200-nvl72", "deepseek-v3", "gb200-nvl72", 64, "nvfp4", 4096, 1024, 0.05),
    ("qwen3-235b-a22b / 64 h100-sxm", "qwen3-235b-a22b", "h100-sxm", 64, "fp8", 2048, 512, None),
    ("llama3.1-405b / 64 h100-sxm", "llama3.1-405b", "h100-sxm", 64, "fp8", 2048, 512, None),
    ("llama3-70b / 8 h100-sxm", "llama3-70b", "h100-sxm", 8, "bf16", 2048, 512, None),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'problem':34} {'considered':>10} {'feasible':>9} {'best wall s':>11} {'core s':>8}  best deployment")
    for label, model, gpu, n, precision, isl, osl, tpot in PROBLEMS:
        walls, result = [], None
        for _ in range(args.repeat):
            started = time.perf_counter()
            result = mp.search_serving(model, mp.Cluster(gpu, n), input_len=isl, output_len=osl,
                                       weight_precision=precision, tpot_s=tpot)
            walls.append(time.perf_counter() - started)
        assert result is not None
        best = result.best["label"] if result.best else "-"
        print(f"{label:34} {result.stats['candidates']:>10} {result.stats['feasible']:>9} "
              f"{min(walls):>11.3f} {result.stats['elapsed_s']:>8.3f}  {best}")


if __name__ == "__main__":
    main()
