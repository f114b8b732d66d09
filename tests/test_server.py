"""The gRPC service against real servers on 127.0.0.1, port 0: every RPC, every status code of
the error table, deadlines and cancellation, token auth, TLS, health and reflection, graceful
stop, and the CLI's ``search --server``."""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import HF_CONFIGS, llama2_7b
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

import meshplan as mp
from meshplan import _core, cli, errors, server, wire
from meshplan.client import PlannerClient, RemoteError
from meshplan.server import PlannerServer, ServerConfig
from meshplan.v1 import planner_pb2 as pb
from meshplan.v1 import planner_pb2_grpc as pb_grpc

CLUSTER = mp.Cluster("a100-sxm-40g", 8)
WORKLOAD = mp.Workload(global_batch=64, seq_len=4096)
SMALL = mp.SearchSpace(
    max_micro_batch=2, recompute=["none", "full"], zero=[0, 1, 3], schedules=["1f1b"],
)
FSDP = "dp=8,tp=1,pp=1,micro_batch=1,zero=3,recompute=none"
# A search that stays in flight for seconds: every knob open at the server's largest bounds (all
# 120 rank orders, TP across domains, vpp and micro-batch up to 4,096) on 2^20 GPUs: ~3e12
# candidates, about two seconds on two cores. The search counts pruned sub-spaces in bulk, so only
# bounds this large keep it busy; if the search gets faster still, widen it (or pick a larger
# cluster). (On 16,384 GPUs it took under half a second once the default stack's rules removed
# the 118 rank orders Megatron cannot build.)
HUGE = ("llama3.1-405b", mp.Cluster("h100-sxm", 1 << 20), mp.Workload(1 << 16, 8192))
HUGE_SPACE = mp.SearchSpace(max_vpp=4096, max_micro_batch=4096, tp_within_domain=False,
                            orders=_core.rank_orders())
# In flight when a server is told to stop.
LONG_SPACE = HUGE_SPACE


def start(**config: Any) -> PlannerServer:
    return PlannerServer(ServerConfig(host="127.0.0.1", port=0, **config)).start()


@pytest.fixture(scope="module")
def planner() -> Iterator[PlannerServer]:
    s = start(workers=4)
    yield s
    s.stop(0).wait()


@pytest.fixture
def client(planner: PlannerServer) -> Iterator[PlannerClient]:
    with PlannerClient(planner.address, timeout_s=60) as c:
        yield c


def same_result(a: mp.SearchResult, b: mp.SearchResult) -> bool:
    """Equal but for the wall-clock time and the thread count (the server runs one core thread
    per call when its workers fill the cores; the answer never depends on it)."""
    a.stats.elapsed_s = b.stats.elapsed_s = 0.0
    a.stats.threads = b.stats.threads
    return a == b


# --- every RPC ---------------------------------------------------------------------------------


def test_search_returns_what_the_local_search_returns(client: PlannerClient) -> None:
    remote = client.search(llama2_7b(), CLUSTER, WORKLOAD, SMALL)
    local = mp.search(llama2_7b(), CLUSTER, WORKLOAD, SMALL)
    assert remote.plans and remote.stats.pruned
    assert [p.rank for p in remote.plans] == list(range(1, len(remote.plans) + 1))
    assert same_result(remote, local)


def test_search_by_preset_name_and_by_hf_config_text(planner: PlannerServer) -> None:
    stub = pb_grpc.PlannerStub(grpc.insecure_channel(planner.address))
    text = (HF_CONFIGS / "Qwen3-30B-A3B.json").read_text()
    space = wire.space_message(mp.SearchSpace(max_micro_batch=1, zero=[1], recompute=["full"],
                                              schedules=["1f1b"], top_k=3))
    request = pb.SearchRequest(
        model=pb.Model(hf_config_json=text, name="qwen"),
        cluster=wire.cluster_message(mp.Cluster("h100-sxm", 16)),
        workload=wire.workload_message(mp.Workload(64, 4096)),
        space=space,
    )
    response = stub.Search(request, timeout=60)
    local = mp.search(mp.Model.from_hf_config(text, name="qwen"), mp.Cluster("h100-sxm", 16),
                      mp.Workload(64, 4096), wire.space_from(space))
    assert same_result(wire.search_result(response), local)
    assert len(response.plans) == 3

    request.model.Clear()
    request.model.preset = "llama3-8b"
    response = stub.Search(request, timeout=60)
    local = mp.search("llama3-8b", mp.Cluster("h100-sxm", 16), mp.Workload(64, 4096),
                      wire.space_from(space))
    assert same_result(wire.search_result(response), local)


def test_answers_on_a_derived_gpu_carry_the_calibration_note(planner: PlannerServer) -> None:
    # h200-sxm has no runs of its own: its GEMM efficiency is derived from h100-sxm's fit, and
    # every planning answer says so, as the CLI's `note:` lines do; h100-sxm's answers say nothing.
    stub = pb_grpc.PlannerStub(grpc.insecure_channel(planner.address))
    space = wire.space_message(mp.SearchSpace(max_micro_batch=1, zero=[1], recompute=["full"],
                                              schedules=["1f1b"], top_k=1))
    workload = wire.workload_message(mp.Workload(64, 4096))
    for gpu, noted in (("h200-sxm", True), ("h100-sxm", False)):
        cluster = wire.cluster_message(mp.Cluster(gpu, 16))
        model = pb.Model(preset="llama3-8b")
        want = mp.hardware.calibration_notes(gpu, "bf16")
        assert bool(want) is noted
        found = stub.Search(pb.SearchRequest(model=model, cluster=cluster, workload=workload,
                                             space=space), timeout=60)
        assert list(found.notes) == want
        plan = found.plans[0].plan
        ev = stub.Evaluate(pb.EvaluateRequest(model=model, cluster=cluster, workload=workload,
                                              plan=plan), timeout=60)
        x = stub.Explain(pb.ExplainRequest(model=model, cluster=cluster, workload=workload,
                                           plan=plan), timeout=60)
        assert list(ev.notes) == want and list(x.notes) == want
        if noted:
            assert "h200-sxm" in want[0] and "derived" in want[0]


def test_space_constraints_travel_exactly(client: PlannerClient) -> None:
    space = mp.SearchSpace(
        tp=2, max_pp=2, vpp=mp.Degree(min=1, max=None), micro_batch=mp.Degree(fixed=1),
        zero=[1, 2], recompute=["selective"], sequence_parallel=[True],
        schedules=["1f1b", "zb-h1"], memory_headroom_gib=2.5, tp_within_domain=False,
        cp_within_domain=True, ep_within_domain=True, top_k=4, max_candidates=10**6,
    )
    assert wire.space_from(wire.space_message(space)).to_dict() == space.to_dict()
    eager = mp.Workload(64, 4096, fused_cross_entropy=False, flash_attention=False)
    assert wire.workload_from(wire.workload_message(eager)) == eager
    remote = client.search("llama3-8b", mp.Cluster("h100-sxm", 16), WORKLOAD, space)
    local = mp.search("llama3-8b", mp.Cluster("h100-sxm", 16), WORKLOAD, space)
    assert len(remote.plans) == 4 and all(p.plan.tp == 2 for p in remote.plans)
    assert same_result(remote, local)


def test_evaluate_feasible_and_infeasible(client: PlannerClient) -> None:
    ok = client.evaluate(llama2_7b(), CLUSTER, WORKLOAD, FSDP)
    assert ok == mp.evaluate(llama2_7b(), CLUSTER, WORKLOAD, FSDP)
    assert ok.feasible and ok.rank is None
    bad_plan = "dp=1,tp=8,pp=1,micro_batch=16,zero=0,recompute=none"
    bad = client.evaluate(llama2_7b(), CLUSTER, mp.Workload(64, 4096), bad_plan)
    assert not bad.feasible and bad.reasons
    assert bad == mp.evaluate(llama2_7b(), CLUSTER, mp.Workload(64, 4096), bad_plan)


def test_model_dims_round_trip_with_moe_and_mla() -> None:
    for name in mp.Model.presets():
        model = mp.Model.preset(name)
        assert wire.model_from(pb.Model(dims=wire.dims_message(model))) == model
    tiny = mp.Model("tiny", 4, 1024, 16, 4, 2048, 32000, head_dim=64, norm="layernorm",
                    activation="gelu", tied_embeddings=True,
                    moe=mp.Moe(8, 2, 512, shared_experts=1, first_dense_layers=1),
                    mla=mp.Mla(128, 32, 64, 64, q_lora_rank=256))
    assert wire.model_from(pb.Model(dims=wire.dims_message(tiny))) == tiny


def test_list_presets(client: PlannerClient) -> None:
    presets = client.list_presets()
    assert [m.name for m in presets.models] == mp.Model.presets()
    assert presets.models == [mp.Model.preset(n) for n in mp.Model.presets()]
    assert [g.name for g in presets.gpus] == mp.Gpu.presets()
    h100 = next(g for g in presets.gpus if g.name == "h100-sxm")
    local = mp.Gpu.preset("h100-sxm")
    assert h100.peak_tflops == local.peak_tflops and h100.memory_gib == local.memory_gib
    # The host link activation offloading copies over: set for every preset that states one.
    for g in presets.gpus:
        assert g.host_bandwidth_gbps == mp.Gpu.preset(g.name).host_bandwidth_gbps
        assert g.architecture is not None and g.architecture == mp.Gpu.preset(g.name).architecture
    assert next(g for g in presets.gpus if g.name == "gb200-nvl72").host_bandwidth_gbps == 225


# --- the error table ---------------------------------------------------------------------------


def code_of(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    error = info.value
    assert isinstance(error, grpc.Call)
    code: grpc.StatusCode = error.code()
    return code


def test_status_table_covers_every_error_class() -> None:
    # One row per class the core raises; subclasses of InvalidInputError inherit its row.
    for cls, code in [
        (errors.InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.UnknownPresetError, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.HfConfigError, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.SpaceTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
        (errors.CancelledError, grpc.StatusCode.CANCELLED),
        (errors.DataFileError, grpc.StatusCode.INTERNAL),
        (errors.MeshplanError, grpc.StatusCode.INTERNAL),
        (RuntimeError, grpc.StatusCode.INTERNAL),
    ]:
        assert wire.status_code(cls("x")) == code, cls
    for cls, code in wire.STATUS_CODES:
        assert wire.error_class(code) is cls
    assert wire.error_class(grpc.StatusCode.UNAUTHENTICATED) is None


def test_bad_field_is_invalid_argument_naming_it(planner: PlannerServer,
                                                 client: PlannerClient) -> None:
    with pytest.raises(errors.InvalidInputError, match=r"workload\.global_batch: 0"):
        client.search(llama2_7b(), CLUSTER, mp.Workload(0, 4096))
    with pytest.raises(errors.InvalidInputError, match=r"plan"):
        client.evaluate(llama2_7b(), CLUSTER, WORKLOAD, "dp=4,tp=1,pp=1")
    with pytest.raises(errors.InvalidInputError, match=r"unknown gpu preset 'h1000'"):
        client.search(llama2_7b(), mp.Cluster("h1000", 8), WORKLOAD)
    stub = pb_grpc.PlannerStub(grpc.insecure_channel(planner.address))
    empty = pb.SearchRequest()
    assert code_of(lambda: stub.Search(empty, timeout=10)) == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        stub.Search(empty, timeout=10)
    assert "missing model" in info.value.details()  # type: ignore[attr-defined]


def test_the_server_never_reads_a_path_from_a_request(planner: PlannerServer,
                                                      tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text((HF_CONFIGS / "Qwen3-30B-A3B.json").read_text())
    stub = pb_grpc.PlannerStub(grpc.insecure_channel(planner.address))
    base = dict(cluster=wire.cluster_message(CLUSTER), workload=wire.workload_message(WORKLOAD))
    for model in (pb.Model(preset=str(config)), pb.Model(hf_config_json=str(config)),
                  pb.Model(preset=str(tmp_path))):
        with pytest.raises(grpc.RpcError) as info:
            stub.Search(pb.SearchRequest(model=model, **base), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]


def test_bytes_that_are_not_a_message_are_invalid_argument(planner: PlannerServer) -> None:
    channel = grpc.insecure_channel(planner.address)
    for method in ("Search", "Evaluate", "Explain", "ListPresets"):
        raw = channel.unary_unary(f"/meshplan.v1.Planner/{method}")
        code = code_of(lambda: raw(b"\x0a\xff\xff\xff\xff\x0f", timeout=10))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, method


def test_server_limits_on_absurd_knob_bounds(planner: PlannerServer,
                                             client: PlannerClient) -> None:
    # Values the core allows but a server does not (a Python client would send them as they
    # are); and one beyond the core's own limit.
    stub = pb_grpc.PlannerStub(grpc.insecure_channel(planner.address))
    base = dict(model=wire.model_message("llama3-8b"), cluster=wire.cluster_message(CLUSTER),
                workload=wire.workload_message(WORKLOAD))
    for space, message in [
        (pb.SearchSpace(vpp=pb.DegreeConstraint(max=5000)),
         "invalid space.vpp.max: 5000 (allowed: at most 4096 on a meshplan server)"),
        (pb.SearchSpace(top_k=100_000),
         "invalid space.top_k: 100000 (allowed: at most 1000 on a meshplan server)"),
        (pb.SearchSpace(micro_batch=pb.DegreeConstraint(fixed=2**31)),
         "invalid space.micro_batch.fixed: 2147483648 (allowed: at most 4096"),
    ]:
        with pytest.raises(grpc.RpcError) as info:
            stub.Search(pb.SearchRequest(space=space, **base), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert message in info.value.details()  # type: ignore[attr-defined]
    for domain, message in [
        (65537, "invalid cluster.nvlink_domain: 65537 (allowed: at most 65536 on a meshplan"),
        (2**31, "invalid cluster.nvlink_domain: 2147483648"),
    ]:
        request = pb.EvaluateRequest(plan=wire.plan_message(FSDP), **base)
        request.cluster.nvlink_domain = domain
        with pytest.raises(grpc.RpcError) as info:
            stub.Evaluate(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert message in info.value.details()  # type: ignore[attr-defined]
    # At the limits the answers are the local ones.
    at_limit = mp.SearchSpace(max_vpp=4096, max_micro_batch=4096, top_k=1000)
    big_domain = mp.Cluster("a100-sxm-40g", 8, gpus_per_node=65536, nvlink_domain=65536)
    assert same_result(client.search(llama2_7b(), big_domain, WORKLOAD, at_limit),
                       mp.search(llama2_7b(), big_domain, WORKLOAD, at_limit))


def test_space_beyond_the_cap_is_resource_exhausted() -> None:
    capped = start(max_candidates=1000)
    try:
        with PlannerClient(capped.address) as c:
            with pytest.raises(errors.SpaceTooLargeError, match="exceed the limit of 1000"):
                c.search(llama2_7b(), CLUSTER, WORKLOAD)
            # The request's own cap cannot lift the server's.
            with pytest.raises(errors.SpaceTooLargeError, match="limit of 1000"):
                c.search(llama2_7b(), CLUSTER, WORKLOAD, mp.SearchSpace(max_candidates=10**9))
            tiny = mp.SearchSpace(dp=8, micro_batch=1, zero=[3], recompute=["none"],
                                  sequence_parallel=[False], schedules=["1f1b"])
            assert c.search(llama2_7b(), CLUSTER, WORKLOAD, tiny).plans
    finally:
        capped.stop(0).wait()


def test_unexpected_errors_are_internal_and_logged(
    planner: PlannerServer, client: PlannerClient, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> mp.Evaluation:
        raise ZeroDivisionError("a bug")

    planner.cache.clear()  # an earlier test's answer to the same question would be served

    monkeypatch.setattr(server, "evaluate", broken)
    with caplog.at_level(logging.ERROR, logger="meshplan.server"):
        with pytest.raises(RemoteError) as info:
            client.evaluate(llama2_7b(), CLUSTER, WORKLOAD, FSDP)
    assert info.value.code == grpc.StatusCode.INTERNAL
    assert "ZeroDivisionError: a bug" in info.value.details
    assert any("ZeroDivisionError" in (r.exc_text or "") for r in caplog.records)


# --- deadlines and cancellation ----------------------------------------------------------------


def test_deadline_stops_the_search_and_frees_the_worker() -> None:
    # One worker: if the expired search kept it busy, the next call would wait for minutes.
    single = start(workers=1)
    try:
        with PlannerClient(single.address) as c:
            began = time.monotonic()
            with pytest.raises(errors.DeadlineExceededError):
                c.search(*HUGE, HUGE_SPACE, timeout_s=0.05)
            assert time.monotonic() - began < 5
            began = time.monotonic()
            result = c.search(llama2_7b(), CLUSTER, WORKLOAD, SMALL, timeout_s=30)
            assert result.plans
            assert time.monotonic() - began < 10
            assert c.health() == "SERVING"
    finally:
        single.stop(0).wait()


def test_the_server_side_deadline_is_passed_to_the_core(client: PlannerClient) -> None:
    # With a deadline the core itself raises DeadlineExceededError (the message says so), rather
    # than the search running on after gRPC gave up on the call.
    seen: list[BaseException] = []
    original = server.search

    def spy(*args: Any, **kwargs: Any) -> mp.SearchResult:
        # gRPC encodes the deadline as a rounded-up `grpc-timeout` header, so the server may see
        # a hair more than the client's 0.5 s; never a missing or a much larger one.
        assert kwargs["timeout_s"] is not None and 0 < kwargs["timeout_s"] <= 0.5 + 0.05
        try:
            return original(*args, **kwargs)
        except BaseException as e:
            seen.append(e)
            raise

    mp_patch = pytest.MonkeyPatch()
    mp_patch.setattr(server, "search", spy)
    try:
        with pytest.raises(errors.DeadlineExceededError):
            client.search(*HUGE, HUGE_SPACE, timeout_s=0.5)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        mp_patch.undo()
    assert seen and isinstance(seen[0], (errors.DeadlineExceededError, errors.CancelledError))


def test_no_deadline_means_no_core_timeout(planner: PlannerServer, client: PlannerClient,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    given: list[Any] = []
    original = server.search

    def spy(*args: Any, **kwargs: Any) -> mp.SearchResult:
        given.append(kwargs["timeout_s"])
        return original(*args, **kwargs)

    monkeypatch.setattr(server, "search", spy)
    planner.cache.clear()  # the same question again must reach the search, not the cache
    client.search(llama2_7b(), CLUSTER, WORKLOAD, SMALL, timeout_s=None)
    planner.cache.clear()
    no_deadline = PlannerClient(client.target, timeout_s=None)
    no_deadline.search(llama2_7b(), CLUSTER, WORKLOAD, SMALL)
    assert given[0] is not None and 0 < given[0] <= 61  # the client's 60 s, give or take clocks
    assert given[1] is None


def test_cancel_stops_the_search_and_frees_the_worker() -> None:
    single = start(workers=1)
    try:
        channel = grpc.insecure_channel(single.address)
        stub = pb_grpc.PlannerStub(channel)
        request = pb.SearchRequest(
            model=wire.model_message(HUGE[0]),
            cluster=wire.cluster_message(HUGE[1]),
            workload=wire.workload_message(HUGE[2]),
            space=wire.space_message(HUGE_SPACE),
        )
        future = stub.Search.future(request, timeout=600)
        time.sleep(0.3)  # the search is running in the one worker
        assert not future.done()
        assert future.cancel()
        with pytest.raises(grpc.FutureCancelledError):
            future.result()
        assert future.code() == grpc.StatusCode.CANCELLED
        with PlannerClient(single.address) as c:
            began = time.monotonic()
            assert c.search(llama2_7b(), CLUSTER, WORKLOAD, SMALL, timeout_s=30).plans
            assert time.monotonic() - began < 10
    finally:
        single.stop(0).wait()


def test_concurrent_searches_agree_with_the_local_one(planner: PlannerServer) -> None:
    # Four searches at once on the four workers return the same answers as a local search.
    outcomes: list[mp.SearchResult] = []

    def one() -> None:
        with PlannerClient(planner.address) as c:
            outcomes.append(c.search(llama2_7b(), CLUSTER, WORKLOAD, SMALL))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    local = mp.search(llama2_7b(), CLUSTER, WORKLOAD, SMALL)
    assert len(outcomes) == 4 and all(same_result(o, local) for o in outcomes)


# --- auth, TLS, health, reflection, shutdown ---------------------------------------------------


def test_token_auth() -> None:
    secured = start(token="s3cret")
    try:
        for token in (None, "wrong", "s3cret "):
            with PlannerClient(secured.address, token=token) as c:
                with pytest.raises(RemoteError) as info:
                    c.evaluate(llama2_7b(), CLUSTER, WORKLOAD, FSDP)
                assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(RemoteError):
                    c.list_presets()
                assert c.health() == "SERVING"  # probes need no secret
        with PlannerClient(secured.address, token="s3cret") as c:
            assert c.evaluate(llama2_7b(), CLUSTER, WORKLOAD, FSDP).feasible
            assert c.list_presets().models
        # Reflection (a bidirectional stream) is behind the token too.
        reflect = reflection_pb2_grpc.ServerReflectionStub(grpc.insecure_channel(secured.address))
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.RpcError) as denied:
            list(reflect.ServerReflectionInfo(iter([ask]), timeout=10))
        assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
        replies = list(reflect.ServerReflectionInfo(
            iter([ask]), timeout=10, metadata=(("authorization", "Bearer s3cret"),)))
        names = {s.name for s in replies[0].list_services_response.service}
        assert "meshplan.v1.Planner" in names
    finally:
        secured.stop(0).wait()


def self_signed(tmp_path: Path) -> tuple[bytes, bytes]:
    """A certificate for 127.0.0.1 and localhost, and its key (PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "meshplan test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            ]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert_pem, key_pem


def test_tls_with_a_generated_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    secured = start(tls_cert=cert, tls_key=key, token="t0k")
    try:
        with PlannerClient(secured.address, root_certificates=cert, token="t0k") as c:
            assert c.health() == "SERVING"
            assert c.evaluate(llama2_7b(), CLUSTER, WORKLOAD, FSDP).feasible
        # Plain text to a TLS port, or TLS that does not trust the certificate, never connects.
        other, _ = self_signed(tmp_path)
        for kwargs in ({}, {"root_certificates": other}):
            with PlannerClient(secured.address, token="t0k", timeout_s=5, **kwargs) as c:
                with pytest.raises(RemoteError) as info:
                    c.evaluate(llama2_7b(), CLUSTER, WORKLOAD, FSDP)
                assert info.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        secured.stop(0).wait()


def test_health_and_reflection(planner: PlannerServer) -> None:
    channel = grpc.insecure_channel(planner.address)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "meshplan.v1.Planner"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert {"meshplan.v1.Planner", "grpc.health.v1.Health"} <= services
    found = database.FindFileContainingSymbol("meshplan.v1.Planner")
    assert found.name == "meshplan/v1/planner.proto" and found.package == "meshplan.v1"


def test_stop_drains_in_flight_calls_and_reports_not_serving() -> None:
    s = start(workers=2)
    channel = grpc.insecure_channel(s.address)
    statuses: list[int] = []
    watch = health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest(service="meshplan.v1.Planner"), timeout=60
    )

    def follow() -> None:
        try:
            for reply in watch:
                statuses.append(reply.status)
                if reply.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                    watch.cancel()  # an open watch would hold the shutdown for the whole grace
        except grpc.RpcError:
            pass

    watcher = threading.Thread(target=follow)
    watcher.start()
    stub = pb_grpc.PlannerStub(channel)
    request = pb.SearchRequest(
        model=wire.model_message(HUGE[0]),
        cluster=wire.cluster_message(HUGE[1]),
        workload=wire.workload_message(HUGE[2]),
        space=wire.space_message(LONG_SPACE),
    )
    in_flight = stub.Search.future(request, timeout=120)
    time.sleep(0.3)
    assert not in_flight.done()
    done = s.stop(grace_s=60)
    # New calls are refused while the running one finishes.
    assert code_of(lambda: stub.Evaluate(pb.EvaluateRequest(), timeout=10)) in (
        grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
    )
    assert in_flight.result(timeout=120).plans
    assert done.wait(30)
    watcher.join(30)
    serving, not_serving = (health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.NOT_SERVING)
    assert statuses[0] == serving and not_serving in statuses


# --- the command line --------------------------------------------------------------------------


SEARCH_ARGS = [
    "search", "--model", "llama2-7b", "--gpu", "a100-sxm-40g", "--gpus", "8",
    "--global-batch", "64", "--seq-len", "4096", "--max-micro-batch", "2",
    "--recompute", "none,full", "--zero", "0,1,3", "--schedules", "1f1b",
]


def without_elapsed(text: str) -> str:
    """The output without the run's wall-clock time and thread count (the server runs one core
    thread per call when its workers fill the cores)."""
    lines = text.splitlines()
    return "\n".join(x for x in lines if not x.startswith("elapsed") and '"elapsed_s"' not in x
                     and '"threads"' not in x)


@pytest.mark.parametrize("output", [[], ["--json"], ["--csv"]])
def test_cli_search_through_a_server_prints_what_the_local_one_prints(
    planner: PlannerServer, capsys: pytest.CaptureFixture[str], output: list[str]
) -> None:
    assert cli.main(SEARCH_ARGS + output) == 0
    local = capsys.readouterr().out
    assert cli.main(SEARCH_ARGS + output + ["--server", planner.address]) == 0
    remote = capsys.readouterr().out
    assert without_elapsed(remote) == without_elapsed(local)
    assert "rank" in remote
    if output == ["--json"]:
        assert json.loads(remote)["plans"]


def test_cli_search_through_a_server_reports_errors_like_the_local_one(
    planner: PlannerServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = [a if a != "64" else "0" for a in SEARCH_ARGS]
    assert cli.main(bad) == 2
    local = capsys.readouterr().err
    assert cli.main(bad + ["--server", planner.address]) == 2
    assert capsys.readouterr().err == local
    token = tmp_path / "token"
    token.write_text("nope\n")
    secured = start(token="right")
    try:
        args = SEARCH_ARGS + ["--server", secured.address, "--server-token-file", str(token)]
        assert cli.main(args) == 1
        assert "UNAUTHENTICATED" in capsys.readouterr().err
        token.write_text("right\n")
        assert cli.main(args) == 0
        assert "rank" in capsys.readouterr().out
    finally:
        secured.stop(0).wait()


# --- explain -----------------------------------------------------------------------------------


@pytest.mark.parametrize("model, cluster, workload, plan", [
    ("mixtral-8x7b", mp.Cluster("h100-sxm", 64), mp.Workload(128, 4096),
     "dp=2,tp=4,pp=2,ep=2,cp=2,zero=1,vpp=2"),
    ("llama3-70b", mp.Cluster("h100-sxm", 64), mp.Workload(128, 8192),
     "dp=2,tp=8,pp=4,zero=3,sp=on,order=tp-dp-cp-ep-pp"),
    ("llama2-7b", CLUSTER, WORKLOAD, "dp=1,tp=8,pp=1,micro_batch=16"),  # infeasible
])
def test_explain_returns_what_the_local_explain_returns(
    client: PlannerClient, model: str, cluster: mp.Cluster, workload: mp.Workload, plan: str
) -> None:
    remote = client.explain(model, cluster, workload, plan)
    local = mp.explain(model, cluster, workload, plan)
    assert remote.to_dict() == local.to_dict()
    assert remote.to_text() == local.to_text()
    assert remote.mesh["groups"] and remote.mesh["order"] == remote.plan.order
    # Ints stay ints and floats stay floats through the wire.
    for r, lo in zip(remote.axes, local.axes):
        for rc, lc in zip(r["collectives"], lc_ := lo["collectives"]):
            assert type(rc["count_per_step"]) is type(lc["count_per_step"])
        assert len(r["collectives"]) == len(lc_)


def test_explain_errors_name_the_field(client: PlannerClient) -> None:
    with pytest.raises(errors.InvalidInputError, match=r"plan\.order"):
        client.explain("llama2-7b", CLUSTER, WORKLOAD, "dp=8,tp=1,pp=1,order=tp-tp-cp-ep-dp")
