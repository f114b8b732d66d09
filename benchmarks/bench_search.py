"""Search speed through the Python API (issue 6): the core's criterion benches repeated from
Python, so that the price of the binding (dict conversion, GIL release, result objects) shows.

For each reference problem (every knob open, the criterion problems) a fresh subprocess imports
meshplan, runs the search ``--repeat`` times and reports candidates, feasible plans, the best
wall time of ``meshplan.search`` against the core's own ``stats.elapsed_s``, candidates per
second per core, and the process's peak resident memory (``ru_maxrss``, with the RSS after
``import meshplan`` for reference). Then:

- ``feasible_space``: every feasible plan of a problem with full breakdowns, in evaluated plans
  per second per core (each row is a complete evaluation, bit for bit ``meshplan.evaluate``);
- ``evaluate``: single-plan calls per second through ``meshplan.evaluate``;
- ``sweep``: a 10,000-query ``search_many`` (5 models × 4 GPU types × 10 GPU counts × 5 batch
  sizes × 10 sequence lengths, every knob open, top 1).

Not a test: it prints numbers (a markdown table with ``--markdown``) and never fails on them.
Usage::

    python benchmarks/bench_search.py [--quick] [--threads N] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

PROBLEMS = [
    # (label, model, gpu, GPUs, global batch, sequence length)
    ("llama3.1-405b / 16,384 h100-sxm", "llama3.1-405b", "h100-sxm", 16384, 2048, 8192),
    ("deepseek-v3 / 2,048 h800-sxm", "deepseek-v3", "h800-sxm", 2048, 4096, 4096),
    ("llama3-70b / 1,024 h100-sxm", "llama3-70b", "h100-sxm", 1024, 1024, 8192),
    ("gpt3-175b / 4,096 a100-sxm-80g", "gpt3-175b", "a100-sxm-80g", 4096, 1536, 2048),
]

CHILD = r"""
import json, resource, sys, time
args = json.loads(sys.argv[1])
import meshplan as mp
base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model, gpu, n, gb, s = args["problem"]
cluster, workload = mp.Cluster(gpu, n), mp.Workload(gb, s)
walls, cores = [], []
for _ in range(args["repeat"]):
    t = time.perf_counter()
    r = mp.search(model, cluster, workload, threads=args["threads"])
    walls.append(time.perf_counter() - t)
    cores.append(r.stats.elapsed_s)
print(json.dumps({
    "candidates": r.stats.candidates, "feasible": r.stats.feasible, "threads": r.stats.threads,
    "wall_s": min(walls), "core_s": min(cores),
    "rss_import_mib": base_kib / 1024,
    "rss_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def child(problem: tuple[Any, ...], repeat: int, threads: int) -> dict[str, Any]:
    """Runs one problem in a fresh interpreter (so ``ru_maxrss`` is this search's own)."""
    arg = json.dumps({"problem": problem, "repeat": repeat, "threads": threads})
    done = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True,
                          check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def bench_searches(repeat: int, threads: int, quick: bool) -> list[dict[str, Any]]:
    rows = []
    for label, *problem in PROBLEMS[2:3] if quick else PROBLEMS:
        r = child(tuple(problem), repeat, threads)
        r["label"] = label
        r["per_core"] = r["candidates"] / (r["wall_s"] * r["threads"])
        rows.append(r)
        print(f"search    {label}: {r['candidates']:,} candidates, {r['feasible']:,} feasible, "
              f"{r['wall_s'] * 1e3:.1f} ms wall ({r['core_s'] * 1e3:.1f} ms in the core, "
              f"{r['threads']} threads) = {r['per_core'] / 1e6:.1f} M candidates/s/core; "
              f"peak RSS {r['rss_peak_mib']:.0f} MiB ({r['rss_import_mib']:.0f} MiB after import)",
              flush=True)
    return rows


def bench_feasible(threads: int) -> dict[str, Any]:
    import meshplan as mp

    cluster, workload = mp.Cluster("h100-sxm", 1024), mp.Workload(1024, 8192)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        fs = mp.feasible_space("llama3-70b", cluster, workload, threads=threads)
        best = min(best, time.perf_counter() - t)
    rate = fs.num_plans / (best * fs.stats.threads)
    print(f"feasible  llama3-70b / 1,024 h100-sxm: {fs.num_plans:,} plans evaluated in full in "
          f"{best * 1e3:.0f} ms = {rate / 1e6:.2f} M plans/s/core "
          f"(of {fs.stats.candidates:,} candidates)", flush=True)
    return {"plans": fs.num_plans, "wall_s": best, "per_core": rate, "threads": fs.stats.threads}


def bench_evaluate(seconds: float) -> float:
    import meshplan as mp

    cluster, workload = mp.Cluster("h100-sxm", 1024), mp.Workload(1024, 8192)
    plan = mp.Plan.parse("dp=32,tp=8,pp=4,vpp=5,zero=1,sequence_parallel=true")
    model = mp.Model.preset("llama3-70b")
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        mp.evaluate(model, cluster, workload, plan)
        n += 1
    rate = n / (time.perf_counter() - start)
    print(f"evaluate  meshplan.evaluate, one plan per call: {rate:,.0f} calls/s", flush=True)
    return rate


def bench_sweep(threads: int, quick: bool) -> dict[str, Any]:
    import meshplan as mp

    models = ["llama3-8b", "llama3-70b", "mixtral-8x7b", "qwen3-30b-a3b", "gpt3-175b"]
    gpus = ["h100-sxm", "b200", "a100-sxm-80g", "gb200-nvl72"]
    counts = [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    batches = [256, 512, 1024, 2048, 4096]
    seqs = [1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768]
    if quick:
        counts, seqs = counts[:2], seqs[:5]
    top1 = mp.SearchSpace(top_k=1)
    queries = [mp.Query(m, mp.Cluster(g, n), mp.Workload(b, s), top1)
               for m in models for g in gpus for n in counts for b in batches for s in seqs]
    t = time.perf_counter()
    results = mp.search_many(queries, threads=threads, progress=False)
    wall = time.perf_counter() - t
    ok = [r for r in results if isinstance(r, mp.SearchResult)]
    candidates = sum(r.stats.candidates for r in ok)
    print(f"sweep     {len(queries):,} queries ({len(queries) - len(ok)} errors, "
          f"{sum(1 for r in ok if r.best is None):,} with no feasible plan), "
          f"{candidates:,} candidates in {wall:.1f} s", flush=True)
    return {"queries": len(queries), "wall_s": wall, "candidates": candidates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one search, a small sweep")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=5, help="searches per problem (best kept)")
    parser.add_argument("--markdown", action="store_true", help="also print the docs table")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores (nproc), {args.threads} threads", flush=True)
    searches = bench_searches(1 if args.quick else args.repeat, args.threads, args.quick)
    feasible = bench_feasible(args.threads)
    evaluate = bench_evaluate(0.5 if args.quick else 2.0)
    sweep = bench_sweep(args.threads, args.quick)
    if args.markdown:
        print()
        print("| search (every knob open) | candidates | feasible | wall | in the core "
              "| candidates/s/core | peak RSS |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in searches:
            print(f"| {r['label']} | {r['candidates']:,} | {r['feasible']:,} | "
                  f"{r['wall_s'] * 1e3:.0f} ms | {r['core_s'] * 1e3:.0f} ms | "
                  f"{r['per_core'] / 1e6:.0f} M | {r['rss_peak_mib']:.0f} MiB |")
        print()
        print(f"- feasible_space: {feasible['plans']:,} full evaluations in "
              f"{feasible['wall_s'] * 1e3:.0f} ms = {feasible['per_core'] / 1e6:.2f} M/s/core")
        print(f"- meshplan.evaluate: {evaluate:,.0f} calls/s")
        print(f"- sweep: {sweep['queries']:,} queries in {sweep['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
