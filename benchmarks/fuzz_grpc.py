"""A long fuzz run of ``meshplan serve``: the requests of ``tests/test_server_fuzz.py`` (a client
built from server reflection alone, see ``tests/grpc_fuzz.py``), as many as asked, from many
clients at once, against a server process on 127.0.0.1.

    python benchmarks/fuzz_grpc.py --requests 100000 --clients 16
    python benchmarks/fuzz_grpc.py --requests 20000 --clients 64 --seed 3 --workers 4

Prints the requests sent, the answers by status code and by request kind, latency (p50, p99,
max), the server's peak resident memory, and every defect: a status outside the allowed set, an
error message that is empty, multi-line or shows internals, or a call that outlived its
deadline. Exits 1 when there is a defect or the server died, else 0. The run is bounded: the
request count is fixed and every call has a deadline.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from grpc_fuzz import (  # noqa: E402 - after the path above
    Generator,
    Reflected,
    peak_rss_mib,
    presets,
    run,
)

SERVING = re.compile(r"^meshplan: serving meshplan\.v1\.Planner on (\S+) ")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=100_000, help="calls in all (default 100,000)")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    p.add_argument("--seed", type=int, default=9, help="the generator's seed (default 9)")
    p.add_argument("--deadline-s", type=float, default=2.0, help="each call's deadline (2 s)")
    p.add_argument("--workers", type=int, default=2, help="the server's --workers (default 2)")
    p.add_argument("--max-candidates", type=int, default=20_000,
                   help="the server's --max-candidates (default 20,000)")
    p.add_argument("--threads", type=int, default=1, help="the server's --threads (default 1)")
    args = p.parse_args()
    if not 1 <= args.requests <= 10_000_000 or not 1 <= args.clients <= 1024:
        p.error("--requests must be 1..10,000,000 and --clients 1..1,024")

    proc = subprocess.Popen(
        [sys.executable, "-m", "meshplan.cli", "serve", "--port", "0",
         "--workers", str(args.workers), "--threads", str(args.threads),
         "--max-candidates", str(args.max_candidates), "--grace-s", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    match = SERVING.match(line)
    if match is None:
        proc.kill()
        print(f"the server did not start: {line!r}", file=sys.stderr)
        return 1
    address = match.group(1)
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        with grpc.insecure_channel(address) as channel:
            reflected = Reflected(channel)
            models, gpus = presets(reflected, channel)
        generator = Generator(reflected, models, gpus, seed=args.seed)
        calls = list(generator.edge_sweep())
        sweep = len(calls)
        calls += list(generator.calls(max(0, args.requests - sweep)))
        print(f"server {address} (--workers {args.workers} --threads {args.threads} "
              f"--max-candidates {args.max_candidates}); {len(calls):,} calls "
              f"({sweep:,} edge sweep), {args.clients} clients, seed {args.seed}", flush=True)
        started = time.monotonic()

        def progress(done: int) -> None:
            if done % 10_000 == 0:
                print(f"  {done:,} calls, {time.monotonic() - started:.0f} s", flush=True)

        report = run(address, calls, clients=args.clients, deadline_s=args.deadline_s,
                     progress=progress)
        alive = proc.poll() is None
        rss = peak_rss_mib(proc.pid) if alive else float("nan")
        defects = report.defects(args.deadline_s, slack_s=1.0)
        by_kind: dict[str, Counter[str]] = {}
        for o in report.outcomes:
            by_kind.setdefault(o.call.kind, Counter())[o.code.name] += 1
        n = len(report.outcomes)
        print(f"\n{n:,} calls in {report.wall_s:.1f} s ({n / report.wall_s:,.0f} calls/s)")
        print("status   " + ", ".join(f"{k} {v:,}" for k, v in report.codes().most_common()))
        for kind, codes in sorted(by_kind.items()):
            print(f"  {kind:<10} " + ", ".join(f"{k} {v:,}" for k, v in codes.most_common()))
        print(f"latency  p50 {1000 * report.latency_quantile(0.5):.1f} ms, "
              f"p99 {1000 * report.latency_quantile(0.99):.1f} ms, "
              f"max {1000 * report.latency_quantile(1.0):.0f} ms")
        print(f"server   {'alive' if alive else f'DIED ({proc.returncode})'}, "
              f"peak RSS {rss:.0f} MiB")
        print(f"defects  {len(defects)}")
        for d in defects[:30]:
            print(f"  {d}")
        return 0 if alive and not defects else 1
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(30)
        reader.join(10)
        proc.stderr.close()


if __name__ == "__main__":
    sys.exit(main())
