#!/usr/bin/env python3
"""Load test of ``meshplan serve``: N concurrent clients for T seconds, on loopback only.

    python benchmarks/grpc_load.py                          # 1, 4 and 16 clients, 60 s each
    python benchmarks/grpc_load.py --clients 16 --duration-s 60 --query full
    python benchmarks/grpc_load.py --query constrained --clients 1,4,16 --duration-s 30

It starts its own server (``python -m meshplan.cli serve --port 0``, a separate process, so that
the clients' Python does not share the server's GIL) on 127.0.0.1, runs every client count
against it, stops it with SIGTERM, and prints per run: requests/s, p50/p99/max latency, errors
by status code, and where the time went:

- ``core``: the search's own time in the Rust core (``stats.elapsed_s`` of each response);
- ``convert``: Python around the core (dicts → objects → protobuf → bytes on the server, bytes →
  objects on the client), measured once per query without concurrency;
- ``wait``: the rest of the latency, i.e. time in the server's queue plus transport.

Under concurrency the core's time stretches too: N searches share the machine's cores.

Bounded by construction: at most 64 clients, 600 s per run and ``--max-requests`` in all; the
only address it ever talks to is the loopback server it started.

The query is the 1,024-GPU llama3-70b search of the README (h100-sxm, global batch 1024,
sequence 8192): ``full`` leaves every knob open (the default space, ~1.2 M candidates);
``constrained`` is what a scheduler that already knows its framework asks (tp=8, ZeRO-1, selective
recompute, sequence parallel on, interleaved 1F1B; ~2 k candidates). ``mix`` is a realistic
stream of scheduler questions: each call draws one of 360 distinct problems (4 models x 2 GPU
types x 5 GPU counts x 3 batches x 3 lengths, every knob open) from a Zipf law (exponent
``--zipf-s``, 1.1 by default; seeded per client), so a few problems are asked often and most
rarely. ``--cache both`` runs every client count against a server with its response cache
(``--cache-size``) and one without (``--cache-size 0``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import grpc

import meshplan as mp
from meshplan import wire
from meshplan.v1 import planner_pb2 as pb
from meshplan.v1 import planner_pb2_grpc as pb_grpc

MAX_CLIENTS = 64
MAX_DURATION_S = 600.0

QUERIES = {
    "full": mp.SearchSpace(),
    "constrained": mp.SearchSpace(
        tp=8, zero=[1], recompute=["selective"], sequence_parallel=[True],
        schedules=["interleaved-1f1b"],
    ),
}


MIX_MODELS = ("llama3-8b", "llama3-70b", "mixtral-8x7b", "qwen3-30b-a3b")
MIX_GPUS = ("h100-sxm", "b200")
MIX_COUNTS = (64, 128, 256, 512, 1024)
MIX_BATCHES = (256, 512, 1024)
MIX_LENGTHS = (2048, 4096, 8192)


def mix_requests() -> list[pb.SearchRequest]:
    """The distinct problems of the ``mix`` query, most popular first (the Zipf ranks)."""
    problems = [
        (model, gpu, count, batch, length)
        for count in MIX_COUNTS for batch in MIX_BATCHES for length in MIX_LENGTHS
        for model in MIX_MODELS for gpu in MIX_GPUS
    ]
    random.Random(15).shuffle(problems)
    return [
        pb.SearchRequest(
            model=wire.model_message(model),
            cluster=wire.cluster_message(mp.Cluster(gpu, count)),
            workload=wire.workload_message(mp.Workload(global_batch=batch, seq_len=length)),
            space=wire.space_message(mp.SearchSpace()),
        )
        for model, gpu, count, batch, length in problems
    ]


class Zipf:
    """Draws ranks 0..n-1 with probability proportional to 1 / (rank + 1) ** s."""

    def __init__(self, n: int, s: float, seed: int):
        weights = [1.0 / (k + 1) ** s for k in range(n)]
        total = sum(weights)
        self.cumulative = []
        acc = 0.0
        for w in weights:
            acc += w / total
            self.cumulative.append(acc)
        self.rng = random.Random(seed)

    def draw(self) -> int:
        import bisect

        return min(bisect.bisect_left(self.cumulative, self.rng.random()),
                   len(self.cumulative) - 1)


def request_for(query: str) -> pb.SearchRequest:
    if query == "mix":
        return mix_requests()[0]
    return pb.SearchRequest(
        model=wire.model_message("llama3-70b"),
        cluster=wire.cluster_message(mp.Cluster("h100-sxm", 1024)),
        workload=wire.workload_message(mp.Workload(global_batch=1024, seq_len=8192)),
        space=wire.space_message(QUERIES[query]),
    )


@dataclass
class Run:
    clients: int
    duration_s: float
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies_s: list[float] = field(default_factory=list)
    core_s: list[float] = field(default_factory=list)

    def summary(self, convert_s: float) -> dict[str, Any]:
        lat = sorted(self.latencies_s)

        def pct(p: float) -> float:
            return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else float("nan")

        mean_lat = statistics.fmean(lat) if lat else float("nan")
        mean_core = statistics.fmean(self.core_s) if self.core_s else float("nan")
        return {
            "clients": self.clients,
            "duration_s": round(self.duration_s, 1),
            "requests": self.requests,
            "ok": len(lat),
            "errors": dict(self.errors),
            "requests_per_s": round(len(lat) / self.duration_s, 3),
            "p50_ms": round(1e3 * pct(0.50), 1),
            "p99_ms": round(1e3 * pct(0.99), 1),
            "max_ms": round(1e3 * lat[-1], 1) if lat else float("nan"),
            "mean_ms": round(1e3 * mean_lat, 1),
            "mean_core_ms": round(1e3 * mean_core, 1),
            "convert_ms": round(1e3 * convert_s, 2),
            "mean_wait_ms": round(1e3 * (mean_lat - mean_core - convert_s), 1),
        }


def start_server(
    workers: Optional[int], threads: Optional[int], cache_size: Optional[int] = None
) -> tuple[subprocess.Popen[str], str, str, Optional[str]]:
    """Starts ``meshplan serve`` on loopback: (process, address, the features it announced,
    its metrics address or None)."""
    cmd = [sys.executable, "-m", "meshplan.cli", "serve", "--host", "127.0.0.1", "--port", "0",
           "--grace-s", "5", "--metrics-port", "0"]
    if cache_size is not None:
        cmd += ["--cache-size", str(cache_size)]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stderr is not None
    line = proc.stderr.readline()
    match = re.search(r" on (127\.0\.0\.1:\d+) \((.*)\)$", line.strip())
    if match is None:
        proc.kill()
        raise SystemExit(f"grpc_load: the server did not start: {line!r}")
    # The server logs a line per request: read them, or the pipe fills and the server blocks.
    threading.Thread(target=lambda: proc.stderr and proc.stderr.read(), daemon=True).start()
    metrics = re.search(r"metrics on (127\.0\.0\.1:\d+)", match.group(2))
    return proc, match.group(1), match.group(2), metrics.group(1) if metrics else None


def scrape(metrics_address: str) -> dict[str, Any]:
    """The server's ``/metrics`` of the Search calls and the cache: request, error and latency
    counts, the latency sum (s) and histogram buckets (upper bound s → cumulative count), cache
    hits, misses and shared answers. All cumulative: subtract two scrapes for a run."""
    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://{metrics_address}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def value(name: str, **labels: str) -> float:
        return sum(s.value for s in samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    return {
        "requests": value("meshplan_requests_total", method="Search"),
        "errors": value("meshplan_errors_total", method="Search"),
        "latency_count": value("meshplan_request_duration_seconds_count", method="Search"),
        "latency_sum_s": value("meshplan_request_duration_seconds_sum", method="Search"),
        "buckets": {float(s.labels["le"]): s.value for s in samples
                    if s.name == "meshplan_request_duration_seconds_bucket"
                    and s.labels.get("method") == "Search"},
        "cache_hits": value("meshplan_cache_hits_total"),
        "cache_misses": value("meshplan_cache_misses_total"),
        "cache_shared": value("meshplan_cache_shared_total"),
    }


def metrics_of_run(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """What the server's metrics say of the calls between two scrapes: counts, the mean latency
    and the histogram bucket the 99th percentile falls in (its upper bound, ms)."""
    delta = {k: after[k] - before[k] for k in after if k not in ("buckets", "latency_sum_s")}
    count = delta["latency_count"]
    buckets = sorted((le, n - before["buckets"].get(le, 0)) for le, n in after["buckets"].items())
    p99_le_s = next((le for le, n in buckets if count and n >= 0.99 * count), float("inf"))
    delta["latency_mean_ms"] = round(1e3 * (after["latency_sum_s"] - before["latency_sum_s"])
                                     / max(count, 1), 1)
    delta["latency_p99_bucket_le_ms"] = 1e3 * p99_le_s
    return delta


def run(address: str, requests: list[pb.SearchRequest], clients: int, duration_s: float,
        max_requests: int, timeout_s: float, zipf_s: float = 1.1) -> Run:
    """``clients`` threads calling Search for ``duration_s``; each draws its requests from
    ``requests`` by a Zipf law (a single request: always that one)."""
    result = Run(clients, duration_s)
    lock = threading.Lock()
    started = time.monotonic()
    stop_at = started + duration_s
    issued = 0

    def client(seed: int) -> None:
        nonlocal issued
        zipf = Zipf(len(requests), zipf_s, seed)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.PlannerStub(channel)
            while True:
                with lock:
                    if time.monotonic() >= stop_at or issued >= max_requests:
                        return
                    issued += 1
                request = requests[zipf.draw()]
                began = time.monotonic()
                try:
                    reply = stub.Search(request, timeout=timeout_s)
                    took = time.monotonic() - began
                    with lock:
                        result.requests += 1
                        result.latencies_s.append(took)
                        result.core_s.append(reply.stats.elapsed_s)
                except grpc.RpcError as e:
                    code = e.code().name if isinstance(e, grpc.Call) else "UNKNOWN"
                    with lock:
                        result.requests += 1
                        result.errors[code] = result.errors.get(code, 0) + 1

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Requests in flight at the deadline finish; throughput counts the whole span.
    result.duration_s = time.monotonic() - started
    return result


def conversion_s(query: str, repeats: int = 5) -> tuple[float, float]:
    """(Python conversion around one search, core time of it), measured in this process."""
    request = request_for(query)
    convert, core = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        res = mp.search(wire.model_from(request.model), wire.cluster_from(request.cluster),
                        wire.workload_from(request.workload), wire.space_from(request.space))
        data = wire.search_response(res).SerializeToString()
        wire.search_result(pb.SearchResponse.FromString(data))
        total = time.perf_counter() - began
        convert.append(total - res.stats.elapsed_s)
        core.append(res.stats.elapsed_s)
    return statistics.median(convert), statistics.median(core)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,4,16", help="comma-separated client counts")
    parser.add_argument("--duration-s", type=float, default=60.0, help="seconds per run")
    parser.add_argument("--query", choices=sorted([*QUERIES, "mix"]), default="full")
    parser.add_argument("--zipf-s", type=float, default=1.1, help="Zipf exponent of --query mix")
    parser.add_argument("--cache", choices=("on", "off", "both"), default="on",
                        help="the server's response cache (both: one run with, one without)")
    parser.add_argument("--cache-size", type=int, default=1024, help="the cache's entries")
    parser.add_argument("--workers", type=int, help="server workers (default: the server's)")
    parser.add_argument("--threads", type=int,
                        help="core threads per planning call (default: the server's)")
    parser.add_argument("--max-requests", type=int, default=100_000, help="cap per run")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="each call's deadline")
    parser.add_argument("--json", action="store_true", help="print JSON lines")
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",") if c.strip()]
    if not counts or any(not 1 <= c <= MAX_CLIENTS for c in counts):
        raise SystemExit(f"grpc_load: client counts must be 1..{MAX_CLIENTS}")
    if not 0 < args.duration_s <= MAX_DURATION_S:
        raise SystemExit(f"grpc_load: --duration-s must be in (0, {MAX_DURATION_S:g}]")
    if not 0 < args.zipf_s <= 10:
        raise SystemExit("grpc_load: --zipf-s must be in (0, 10]")

    requests = mix_requests() if args.query == "mix" else [request_for(args.query)]
    convert, core_alone = conversion_s(args.query)
    caches = {"on": [args.cache_size], "off": [0], "both": [args.cache_size, 0]}[args.cache]
    for cache_size in caches:
        proc, address, features, metrics_address = start_server(args.workers, args.threads,
                                                                cache_size)
        header = (f"query={args.query}"
                  + (f" ({len(requests)} problems, zipf s={args.zipf_s:g})"
                     if args.query == "mix" else "")
                  + f"  server={address} ({features})  "
                  f"cores={os.cpu_count()}  one search alone: core {1e3 * core_alone:.1f} ms + "
                  f"convert {1e3 * convert:.2f} ms")
        try:
            stub = pb_grpc.PlannerStub(grpc.insecure_channel(address))
            stub.Search(request_for(args.query), timeout=args.timeout_s)  # warm-up
            if not args.json:
                print(header)
                print(f"{'clients':>7} {'req':>6} {'err':>4} {'req/s':>8} {'p50 ms':>9} "
                      f"{'p99 ms':>9} {'max ms':>9} {'core ms':>9} {'wait ms':>9}")
            for clients in counts:
                load_before = os.getloadavg()[0]
                before = scrape(metrics_address) if metrics_address else {}
                r = run(address, requests, clients, args.duration_s, args.max_requests,
                        args.timeout_s, args.zipf_s)
                s = r.summary(convert)
                after = scrape(metrics_address) if metrics_address else {}
                server = metrics_of_run(before, after) if after else {}
                load = {"load_1min_before": load_before, "load_1min_after": os.getloadavg()[0]}
                if args.json:
                    print(json.dumps({"query": args.query, "cache_size": cache_size,
                                      "cores": os.cpu_count(), **s, "server_metrics": server,
                                      **load}))
                else:
                    errors = sum(s["errors"].values())
                    print(f"{clients:>7} {s['requests']:>6} {errors:>4} "
                          f"{s['requests_per_s']:>8.2f} {s['p50_ms']:>9.1f} {s['p99_ms']:>9.1f} "
                          f"{s['max_ms']:>9.1f} {s['mean_core_ms']:>9.1f} "
                          f"{s['mean_wait_ms']:>9.1f}"
                          + (f"  errors: {s['errors']}" if errors else ""))
                    print(f"        load (1 min) {load['load_1min_before']:.2f} -> "
                          f"{load['load_1min_after']:.2f};  server /metrics: "
                          + ", ".join(f"{k}={v:g}" for k, v in server.items()))
                sys.stdout.flush()
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
