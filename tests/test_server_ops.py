"""A server operations can run (issue 15): Prometheus metrics scraped over HTTP, the response
cache (identical answers, hits, eviction, calibration invalidation, no cached deadlines), and
JSON access logs. Real servers on 127.0.0.1, port 0."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.wrappers_pb2 import StringValue

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import meshplan as mp  # noqa: E402
from meshplan import server as server_module  # noqa: E402
from meshplan import wire  # noqa: E402
from meshplan.errors import DeadlineExceededError  # noqa: E402
from meshplan.server import PlannerServer, ServerConfig  # noqa: E402
from meshplan.server_cache import ResponseCache, request_key  # noqa: E402
from meshplan.v1 import planner_pb2 as pb  # noqa: E402
from meshplan.v1 import planner_pb2_grpc as pb_grpc  # noqa: E402

SERVING = re.compile(r"^meshplan: serving meshplan\.v1\.Planner on (\S+) ")


def search_request(gpus: int = 64, **space: Any) -> pb.SearchRequest:
    return pb.SearchRequest(
        model=wire.model_message("llama3-8b"),
        cluster=wire.cluster_message(mp.Cluster("h100-sxm", gpus)),
        workload=wire.workload_message(mp.Workload(global_batch=256, seq_len=4096)),
        space=wire.space_message(mp.SearchSpace(**space)),
    )


def evaluate_request(plan: str) -> pb.EvaluateRequest:
    return pb.EvaluateRequest(
        model=wire.model_message("llama3-8b"),
        cluster=wire.cluster_message(mp.Cluster("h100-sxm", 64)),
        workload=wire.workload_message(mp.Workload(global_batch=256, seq_len=4096)),
        plan=wire.plan_message(plan),
    )


@pytest.fixture
def served() -> Iterator[tuple[PlannerServer, pb_grpc.PlannerStub]]:
    server = PlannerServer(ServerConfig(host="127.0.0.1", port=0, metrics_port=0,
                                        cache_size=3)).start()
    channel = grpc.insecure_channel(server.address)
    try:
        yield server, pb_grpc.PlannerStub(channel)
    finally:
        channel.close()
        server.stop(0)
        server.drain(1.0)


def scrape(server: PlannerServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of ``/metrics``: (name, sorted labels) → value."""
    assert server.metrics_port is not None
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_metrics_endpoint_shows_requests_latencies_errors_and_the_cache(
    served: tuple[PlannerServer, pb_grpc.PlannerStub]
) -> None:
    server, stub = served
    before = scrape(server)
    assert before[("meshplan_cache_hits_total", ())] == 0
    assert before[("meshplan_planning_calls_running", ())] == 0
    stub.Search(search_request(), timeout=30)
    stub.Search(search_request(), timeout=30)  # a hit
    stub.Evaluate(evaluate_request("dp=8,tp=8,pp=1"), timeout=30)
    with pytest.raises(grpc.RpcError) as bad:
        stub.Evaluate(evaluate_request("dp=3,tp=8,pp=1"), timeout=30)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stub.ListPresets(pb.ListPresetsRequest(), timeout=30)

    after = scrape(server)
    assert after[("meshplan_requests_total", (("method", "Search"),))] == 2
    assert after[("meshplan_requests_total", (("method", "Evaluate"),))] == 2
    assert after[("meshplan_requests_total", (("method", "ListPresets"),))] == 1
    assert after[("meshplan_request_duration_seconds_count", (("method", "Search"),))] == 2
    latency_sum = after[("meshplan_request_duration_seconds_sum", (("method", "Search"),))]
    assert 0 < latency_sum < 60
    # Every observation falls in some bucket up to +Inf.
    assert after[("meshplan_request_duration_seconds_bucket",
                  (("le", "+Inf"), ("method", "Search")))] == 2
    assert after[("meshplan_errors_total",
                  (("code", "INVALID_ARGUMENT"), ("method", "Evaluate")))] == 1
    assert ("meshplan_errors_total", (("code", "OK"), ("method", "Search"))) not in after
    assert after[("meshplan_cache_hits_total", ())] == 1
    assert after[("meshplan_cache_misses_total", ())] == 3  # two searches' first, two evaluates
    assert after[("meshplan_cache_entries", ())] == 2
    assert after[("meshplan_cache_bytes", ())] > 0


def test_the_cache_answers_identically_and_counts_hits(
    served: tuple[PlannerServer, pb_grpc.PlannerStub]
) -> None:
    server, stub = served
    first = stub.Search(search_request(), timeout=30)
    second = stub.Search(search_request(), timeout=30)
    # Byte for byte, the search's own elapsed time included: the second is the stored answer.
    assert first.SerializeToString(deterministic=True) == \
        second.SerializeToString(deterministic=True)
    stats = server.cache.stats()
    assert (stats.hits, stats.misses, stats.entries) == (1, 1, 1)
    # A request that spells the preset out is the same question.
    spelled = search_request()
    spelled.model.CopyFrom(wire.model_message(mp.Model.preset("llama3-8b")))
    third = stub.Search(spelled, timeout=30)
    assert third == first and server.cache.stats().hits == 2


def test_the_cache_evicts_the_least_recently_used_at_its_size(
    served: tuple[PlannerServer, pb_grpc.PlannerStub]
) -> None:
    server, stub = served  # cache_size=3
    for gpus in (8, 16, 32, 64):
        stub.Search(search_request(gpus), timeout=30)
    stats = server.cache.stats()
    assert (stats.entries, stats.evictions, stats.misses) == (3, 1, 4)
    stub.Search(search_request(64), timeout=30)  # still there
    stub.Search(search_request(8), timeout=30)   # evicted: computed again, evicting 16
    stats = server.cache.stats()
    assert (stats.hits, stats.misses, stats.entries, stats.evictions) == (1, 5, 3, 2)


def test_a_calibration_change_invalidates_the_cache(
    served: tuple[PlannerServer, pb_grpc.PlannerStub]
) -> None:
    server, stub = served
    request = evaluate_request("dp=64,tp=1,pp=1,zero=1")  # dp across 8 nodes: the network counts
    base = stub.Evaluate(request, timeout=30)
    assert stub.Evaluate(request, timeout=30) == base
    server.servicer.set_calibration({"h100-sxm": {"network_bus_efficiency": 0.2}})
    assert server.cache.stats().entries == 0
    slower = stub.Evaluate(request, timeout=30)
    assert slower.evaluation.step_time_s > base.evaluation.step_time_s
    stats = server.cache.stats()
    assert (stats.hits, stats.misses) == (1, 2)
    server.servicer.set_calibration(None)
    assert stub.Evaluate(request, timeout=30) == base


def test_a_deadline_is_never_cached(served: tuple[PlannerServer, pb_grpc.PlannerStub],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    server, stub = served
    original = server_module.search
    late = {"calls": 0}

    def deadline_then_search(*args: Any, **kwargs: Any) -> mp.SearchResult:
        # What the core raises when the call's time runs out, for the first two calls.
        late["calls"] += 1
        if late["calls"] <= 2:
            raise DeadlineExceededError("deadline exceeded after 10 ms")
        return original(*args, **kwargs)

    monkeypatch.setattr(server_module, "search", deadline_then_search)
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as error:
            stub.Search(search_request(), timeout=30)
        assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert server.cache.stats().entries == 0
    stub.Search(search_request(), timeout=30)
    stats = server.cache.stats()
    assert (stats.hits, stats.misses, stats.entries) == (0, 3, 1)
    # And a real deadline that expires before the search can run: refused, nothing stored.
    with pytest.raises(grpc.RpcError) as error:
        stub.Search(search_request(128), timeout=0.001)
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert server.drain(5.0)
    assert server.cache.stats().entries == 1


def test_the_cache_stores_no_exception_and_stays_bounded_under_threads() -> None:
    cache = ResponseCache(4)

    def late() -> pb.ListPresetsResponse:
        raise DeadlineExceededError("deadline")

    with pytest.raises(DeadlineExceededError):
        cache.answer(request_key("Search", n=0), late)
    assert len(cache) == 0

    def worker(offset: int) -> None:
        for i in range(300):
            key = request_key("Search", n=(offset + i) % 11)
            reply, _ = cache.answer(key, lambda: pb.ListPresetsResponse())
            assert reply == pb.ListPresetsResponse()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    stats = cache.stats()
    assert stats.entries == len(cache) <= 4
    assert stats.hits + stats.misses + stats.shared == 8 * 300 + 1


class Gated:
    """A compute that blocks until released, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> StringValue:
        self.calls += 1
        self.started.set()
        assert self.release.wait(30)
        return StringValue(value=f"computed {self.calls}")


def test_identical_calls_in_flight_share_one_computation() -> None:
    cache = ResponseCache(4)
    key = request_key("Search", n=1)
    compute = Gated()
    joined = threading.Event()
    answers: list[tuple[StringValue, bool]] = []

    def wait(done: threading.Event) -> None:
        joined.set()
        assert done.wait(30)

    leader = threading.Thread(target=lambda: answers.append(cache.answer(key, compute)))
    leader.start()
    assert compute.started.wait(30)
    assert cache.in_flight() == 1
    waiter = threading.Thread(target=lambda: answers.append(cache.answer(key, compute, wait)))
    waiter.start()
    assert joined.wait(30)
    compute.release.set()
    leader.join(30)
    waiter.join(30)
    assert compute.calls == 1
    assert sorted(hit for _, hit in answers) == [False, True]
    assert answers[0][0] == answers[1][0] == StringValue(value="computed 1")
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.shared, stats.entries) == (0, 1, 1, 1)
    assert cache.in_flight() == 0


def test_a_waiter_computes_itself_when_the_leader_fails_on_its_own_deadline() -> None:
    cache = ResponseCache(4)
    key = request_key("Search", n=2)
    leader_started, leader_fail, joined = threading.Event(), threading.Event(), threading.Event()
    calls = {"n": 0}

    def compute() -> StringValue:
        calls["n"] += 1
        if calls["n"] == 1:  # the leader: its own deadline runs out
            leader_started.set()
            assert leader_fail.wait(30)
            raise DeadlineExceededError("deadline exceeded after 10 ms")
        return StringValue(value="recomputed")

    def wait(done: threading.Event) -> None:
        joined.set()
        assert done.wait(30)

    errors: list[BaseException] = []
    answers: list[tuple[StringValue, bool]] = []

    def lead() -> None:
        try:
            cache.answer(key, compute)
        except DeadlineExceededError as e:
            errors.append(e)

    leader = threading.Thread(target=lead)
    leader.start()
    assert leader_started.wait(30)
    waiter = threading.Thread(target=lambda: answers.append(cache.answer(key, compute, wait)))
    waiter.start()
    assert joined.wait(30)
    leader_fail.set()
    leader.join(30)
    waiter.join(30)
    assert len(errors) == 1
    assert answers == [(StringValue(value="recomputed"), False)]
    stats = cache.stats()
    assert (calls["n"], stats.misses, stats.shared, stats.entries) == (2, 2, 0, 1)


def blocking_search(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, int], threading.Event,
                                                              threading.Event]:
    """Replaces the server's search by one that blocks until released: (calls, started,
    release)."""
    original = server_module.search
    calls = {"n": 0}
    started, release = threading.Event(), threading.Event()

    def search(*args: Any, **kwargs: Any) -> mp.SearchResult:
        calls["n"] += 1
        started.set()
        assert release.wait(30)
        return original(*args, **kwargs)

    monkeypatch.setattr(server_module, "search", search)
    return calls, started, release


def wait_until(condition: Any, timeout_s: float = 10.0) -> None:
    until = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < until, "condition not met in time"
        time.sleep(0.005)


def search_in_thread(
    stub: pb_grpc.PlannerStub, replies: list[pb.SearchResponse]
) -> threading.Thread:
    """A started thread that sends :func:`search_request` and appends the answer to ``replies``."""
    thread = threading.Thread(
        target=lambda: replies.append(stub.Search(search_request(), timeout=30))
    )
    thread.start()
    return thread


def test_two_identical_concurrent_searches_run_the_core_once(
    served: tuple[PlannerServer, pb_grpc.PlannerStub], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, stub = served
    calls, started, release = blocking_search(monkeypatch)
    replies: list[pb.SearchResponse] = []
    first = search_in_thread(stub, replies)
    assert started.wait(30)
    second = search_in_thread(stub, replies)
    # The second call waits for the first's answer (the gate counts it as waiting).
    wait_until(lambda: server.gate.counts() == (1, 1))
    release.set()
    first.join(30)
    second.join(30)
    assert calls["n"] == 1
    assert len(replies) == 2 and replies[0] == replies[1] and replies[0].plans
    stats = server.cache.stats()
    assert (stats.misses, stats.shared, stats.hits) == (1, 1, 0)
    samples = scrape(server)
    assert samples[("meshplan_cache_misses_total", ())] == 1
    assert samples[("meshplan_cache_shared_total", ())] == 1
    assert samples[("meshplan_requests_total", (("method", "Search"),))] == 2


def test_a_waiter_gets_deadline_exceeded_at_its_own_deadline(
    served: tuple[PlannerServer, pb_grpc.PlannerStub], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, stub = served
    calls, started, release = blocking_search(monkeypatch)
    replies: list[pb.SearchResponse] = []
    first = search_in_thread(stub, replies)
    assert started.wait(30)
    began = time.monotonic()
    with pytest.raises(grpc.RpcError) as error:
        stub.Search(search_request(), timeout=0.3)
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - began < 5.0  # not held until the leader finishes
    wait_until(lambda: server.gate.counts() == (1, 0))  # the waiter left the gate
    release.set()
    first.join(30)
    assert calls["n"] == 1 and len(replies) == 1 and replies[0].plans
    stats = server.cache.stats()
    assert (stats.misses, stats.shared, stats.entries) == (1, 0, 1)
    assert stub.Search(search_request(), timeout=30) == replies[0]
    assert server.cache.stats().hits == 1


def test_a_cancelled_waiter_leaves_and_the_leader_still_answers(
    served: tuple[PlannerServer, pb_grpc.PlannerStub], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, stub = served
    calls, started, release = blocking_search(monkeypatch)
    replies: list[pb.SearchResponse] = []
    first = search_in_thread(stub, replies)
    assert started.wait(30)
    future = stub.Search.future(search_request(), timeout=30)
    wait_until(lambda: server.gate.counts() == (1, 1))
    future.cancel()
    wait_until(lambda: server.gate.counts() == (1, 0))
    release.set()
    first.join(30)
    assert calls["n"] == 1 and len(replies) == 1
    assert server.cache.stats().shared == 0


def test_cache_size_bounds_are_named() -> None:
    for bad in (-1, 2**31, 2**64 - 1, True):
        with pytest.raises(ValueError, match="cache_size"):
            ResponseCache(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="metrics_port"):
        PlannerServer(ServerConfig(port=0, metrics_port=2**32))


def test_cache_size_zero_disables_the_cache() -> None:
    server = PlannerServer(ServerConfig(host="127.0.0.1", port=0, cache_size=0)).start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.PlannerStub(channel)
            stub.Search(search_request(), timeout=30)
            stub.Search(search_request(), timeout=30)
        stats = server.cache.stats()
        assert (stats.hits, stats.entries) == (0, 0)
    finally:
        server.stop(0)


def test_serve_logs_one_json_line_per_request_and_serves_metrics_on_loopback() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "meshplan.cli", "serve", "--port", "0", "--metrics-port", "0",
         "--log-format", "json", "--grace-s", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()
        match = SERVING.match(banner)
        assert match is not None, banner
        metrics = re.search(r"metrics on (127\.0\.0\.1):(\d+)", banner)
        assert metrics is not None, banner
        with grpc.insecure_channel(match.group(1)) as channel:
            stub = pb_grpc.PlannerStub(channel)
            stub.Search(search_request(), timeout=30)
            stub.Search(search_request(), timeout=30)
            with pytest.raises(grpc.RpcError):
                stub.Evaluate(evaluate_request("dp=3,tp=8,pp=1"), timeout=30)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics.group(2)}/metrics",
                                    timeout=5) as reply:
            assert 'meshplan_requests_total{method="Search"} 2.0' in reply.read().decode()
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()
    records = [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    requests = [r for r in records if r["logger"] == "meshplan.access"]
    assert [(r["method"], r["status"], r["cache_hit"]) for r in requests] == [
        ("Search", "OK", False), ("Search", "OK", True), ("Evaluate", "INVALID_ARGUMENT", False),
    ]
    for r in requests:
        assert r["level"] == "info" and r["latency_ms"] >= 0 and r["peer"].startswith("ipv")
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", r["time"])


@pytest.mark.parametrize("flags, message", [
    (["--cache-size", "-1"], "invalid cache_size: -1"),
    (["--cache-size", str(2**64 - 1)], "invalid cache_size"),
    (["--metrics-port", "70000"], "invalid metrics_port: 70000"),
    (["--log-format", "xml"], "argument --log-format: invalid choice"),
    (["--calibration", "/nonexistent.toml"], "--calibration: no such file"),
])
def test_bad_operations_flags_are_one_line_errors(flags: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "meshplan.cli", "serve", "--port", "0", *flags],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_planning_threads_default_to_one_when_the_workers_fill_the_cores(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from meshplan.server import planning_threads
    monkeypatch.delenv("MESHPLAN_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert planning_threads(ServerConfig(workers=2)) == 1
    assert planning_threads(ServerConfig(workers=4)) == 1
    assert planning_threads(ServerConfig(workers=1)) is None  # fewer workers than cores
    assert planning_threads(ServerConfig(workers=4, threads=2)) == 2  # the flag wins
    monkeypatch.setenv("MESHPLAN_THREADS", "2")
    assert planning_threads(ServerConfig(workers=4)) is None  # the core reads the variable
