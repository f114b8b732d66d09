"""Speed of meshplan seen from Python: the numbers that matter, and the cost of the FFI.

Runs the same queries as the core's criterion benches where they exist, from Python:

- ``evaluate``: calls per second through ``meshplan.evaluate`` (typed objects, dict conversion,
  binding, core) and through ``meshplan._core.evaluate`` with prebuilt dicts (binding + core), so
  the difference is the price of the Python layer;
- ``search``: candidates per second and wall time of full searches, with 1 thread and with all.

Not a test: it prints numbers and never fails on them. Usage::

    python benchmarks/bench_api.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Callable

import meshplan as mp
from meshplan import _core
from meshplan.api import problem_dict

SEARCHES = [
    ("llama3-70b", "h100-sxm", 512, 1024, 8192),
    ("deepseek-v3", "h100-sxm", 1024, 4096, 4096),
    ("llama3.1-405b", "h100-sxm", 16384, 2048, 8192),
]


def rate(call: Callable[[], object], seconds: float) -> float:
    """Calls per second of ``call``, measured for about ``seconds``."""
    n, start = 0, time.perf_counter()
    while True:
        call()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, smallest search only")
    args = parser.parse_args()
    seconds = 0.5 if args.quick else 2.0

    model, cluster, workload = "llama3-70b", mp.Cluster("h100-sxm", 64), mp.Workload(128, 8192)
    plan = mp.Plan.parse("dp=2,tp=4,pp=4,cp=2,vpp=5,zero=1,sequence_parallel=true")
    typed_model = mp.Model.preset(model)
    problem, plan_dict = problem_dict(typed_model, cluster, workload), plan.to_dict()
    api = rate(lambda: mp.evaluate(typed_model, cluster, workload, plan), seconds)
    raw = rate(lambda: _core.evaluate(problem, plan_dict), seconds)
    print(f"evaluate  meshplan.evaluate {api:10,.0f}/s   _core.evaluate {raw:10,.0f}/s   "
          f"Python layer {1e6 / api - 1e6 / raw:6.1f} us/call")

    for name, gpu, n, batch, seq in SEARCHES[:1] if args.quick else SEARCHES:
        for threads in (1, os.cpu_count() or 1):
            start = time.perf_counter()
            result = mp.search(name, mp.Cluster(gpu, n), mp.Workload(batch, seq), threads=threads)
            wall = time.perf_counter() - start
            s = result.stats
            print(f"search    {name} on {n} x {gpu}, {threads} thread(s): {s.candidates:,} "
                  f"candidates in {wall:.2f} s = {s.candidates / wall:,.0f} plans/s "
                  f"({s.feasible:,} feasible; core {s.elapsed_s:.2f} s)")


if __name__ == "__main__":
    main()
