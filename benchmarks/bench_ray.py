"""Co-design sweep throughput (issue 15): searches per second per core, locally (``search_many``
on one core, then on every core) and through Ray (a local Ray cluster with 1 and 2 worker CPUs),
on the same hardware co-design grid; then what a 10-million-point study costs on N cores.

Each point is one full search (every knob open, top 1) of a model × GPU count × HBM size ×
NVLink domain size; the grid is ``--points`` long (cycled over 3 models × 6 GPU counts × 4 HBM
sizes × 3 domain sizes). Ray runs on 127.0.0.1 only. Not a test: it prints numbers.

Usage::

    python benchmarks/bench_ray.py [--points 432] [--chunk-size 8]
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

import meshplan as mp
from meshplan import sweep


def grid(n: int) -> list[sweep.Point]:
    full = sweep.grid(["llama3-8b", "llama3-70b", "mixtral-8x7b"], ["h100-sxm"],
                      [64, 128, 256, 512, 1024, 2048], [1024], [4096],
                      {"memory_gib": [80, 141, 192, 288], "scaleup_domain": [8, 36, 72]})
    return list(itertools.islice(itertools.cycle(full), n))


def timed(label: str, cores: int, fn) -> tuple[float, list]:
    t = time.perf_counter()
    rows = fn()
    s = time.perf_counter() - t
    print(f"{label:<28} {len(rows):>6} searches  {s:7.2f} s  {len(rows) / s:8.1f}/s  "
          f"{len(rows) / s / cores:8.1f}/s/core")
    return len(rows) / s / cores, rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=432)
    ap.add_argument("--chunk-size", type=int, default=8)
    args = ap.parse_args()
    points = grid(args.points)
    cores = os.cpu_count() or 1
    per_core, local = timed("local, 1 thread", 1, lambda: sweep.sweep(points, threads=1, progress=False))
    timed(f"local, {cores} threads", cores, lambda: sweep.sweep(points, threads=cores, progress=False))
    import ray

    for workers in (1, 2):
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, _node_ip_address="127.0.0.1")
        try:
            sweep.sweep(points[:4], executor="ray", chunk_size=1, progress=False)  # warm the workers
            _, rows = timed(f"ray, {workers} worker CPU(s)", workers, lambda: sweep.sweep(
                points, executor="ray", chunk_size=args.chunk_size, progress=False))
            assert rows == local, "Ray gave different rows"
        finally:
            ray.shutdown()
    study = 10_000_000
    print(f"\n10,000,000-point study at {per_core:.0f} searches/s/core:")
    for n in (64, 512, 4096):
        hours = study / (per_core * n) / 3600
        print(f"  {n:>5} cores: {hours:7.2f} h  ({hours * n:,.0f} core-hours)")


if __name__ == "__main__":
    main()
