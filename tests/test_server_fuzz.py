"""The standing fuzz harness: a client built from server reflection alone (``grpc_fuzz``) sends
over 10,000 generated requests — every integer field of every request at every boundary value,
plausible, random and malformed requests, long strings, unknown presets — to a real
``meshplan serve`` process on 127.0.0.1, from several clients at once. Every answer must be OK,
INVALID_ARGUMENT, RESOURCE_EXHAUSTED or DEADLINE_EXCEEDED with a one-line message, within its
deadline; the server's memory stays bounded and it is still SERVING at the end.

``MESHPLAN_FUZZ_SEED`` picks another seed (the default is fixed, so CI runs are reproducible);
``benchmarks/fuzz_grpc.py`` runs the same requests for longer.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator

import grpc
import pytest
from grpc_fuzz import MAX_RSS_MIB, Generator, Reflected, peak_rss_mib, presets, run

REQUESTS = 10_500
CLIENTS = 8
DEADLINE_S = 2.0
SLACK_S = 1.0
"""A call may end this long after its deadline (the client's own scheduling on a busy machine);
a server that kept working past the deadline would be seconds late, not this."""
SERVING = re.compile(r"^meshplan: serving meshplan\.v1\.Planner on (\S+) ")


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "meshplan.cli", "serve", "--port", "0", "--workers", "2",
         "--threads", "1", "--max-candidates", "20000", "--grace-s", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    match = SERVING.match(line)
    if match is None:
        proc.kill()
        pytest.fail(f"the server did not start: {line!r} {proc.stderr.read()[:2000]}")
    # Keep reading what the server logs (a full pipe would stall it).
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(proc.stderr or ()), daemon=True)
    reader.start()
    yield proc, match.group(1)
    if proc.poll() is None:
        proc.terminate()
    proc.wait(timeout=30)
    reader.join(10)
    proc.stderr.close()


def test_ten_thousand_generated_requests_get_clean_answers(
    server: tuple[subprocess.Popen[str], str]
) -> None:
    proc, address = server
    seed = int(os.environ.get("MESHPLAN_FUZZ_SEED", "9"))
    with grpc.insecure_channel(address) as channel:
        reflected = Reflected(channel)
        models, gpus = presets(reflected, channel)
    assert models and gpus and set(reflected.methods) == {
        "Search", "Evaluate", "Explain", "ListPresets", "SearchServing", "EvaluateServing",
        "ExplainServing"}
    generator = Generator(reflected, models, gpus, seed=seed)
    calls = list(generator.edge_sweep())
    sweep = len(calls)
    calls += list(generator.calls(REQUESTS - sweep))
    report = run(address, calls, clients=CLIENTS, deadline_s=DEADLINE_S)

    assert proc.poll() is None, f"the server died (seed {seed}): {proc.returncode}"
    assert len(report.outcomes) == len(calls) >= 10_000
    defects = report.defects(DEADLINE_S, SLACK_S)
    assert not defects, f"{len(defects)} defects (seed {seed}):\n" + "\n".join(defects[:20])
    codes = report.codes()
    # The mix reaches every kind of answer, so the test would notice a server that refused all.
    assert codes["OK"] > len(calls) // 10 and codes["INVALID_ARGUMENT"] > len(calls) // 10, codes
    assert codes["RESOURCE_EXHAUSTED"] > 0, codes
    rss = peak_rss_mib(proc.pid)
    assert rss < MAX_RSS_MIB, f"server peak RSS {rss:.0f} MiB"
    print(f"\nfuzz: {len(calls):,} calls ({sweep:,} edge sweep) in {report.wall_s:.1f} s, "
          f"{dict(codes)}, p50 {1000 * report.latency_quantile(0.5):.1f} ms, p99 "
          f"{1000 * report.latency_quantile(0.99):.1f} ms, max "
          f"{1000 * report.latency_quantile(1.0):.0f} ms, peak RSS {rss:.0f} MiB")


def test_the_server_is_serving_afterwards(server: tuple[subprocess.Popen[str], str]) -> None:
    # Runs after the fuzz test (file order): still up, still SERVING, still answering.
    proc, address = server
    assert proc.poll() is None
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflected = Reflected(channel)
        models, _ = presets(reflected, channel)
        assert "llama3-8b" in models
