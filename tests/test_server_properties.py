"""Random and malformed requests against a real server: whatever arrives, the answer is OK,
INVALID_ARGUMENT (with a message) or RESOURCE_EXHAUSTED, promptly, and the server stays healthy.

Clusters stay small (at most 64 GPUs) and the server caps spaces at 20,000 candidates, so every
example is quick; the integers still reach the edges (0, negative, 2^31, 2^32, 2^63 - 1) and the
server's own limits (4096 for vpp and micro-batch bounds, 65536 for node and domain sizes).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshplan as mp
from meshplan.client import PlannerClient
from meshplan.server import PlannerServer, ServerConfig
from meshplan.v1 import planner_pb2 as pb

HF_CONFIGS = Path(__file__).parent / "fixtures" / "hf"
ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT,
           grpc.StatusCode.RESOURCE_EXHAUSTED}
EDGES = [0, -1, 2**31, 2**32, 2**63 - 1, -(2**63)]


@pytest.fixture(scope="module")
def server() -> Iterator[PlannerServer]:
    s = PlannerServer(ServerConfig(host="127.0.0.1", port=0, workers=2,
                                   max_candidates=20_000)).start()
    yield s
    s.stop(0).wait()


@pytest.fixture(scope="module")
def channel(server: PlannerServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as c:
        yield c


def small(lo: int = -2, hi: int = 70) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(lo, hi), st.sampled_from(EDGES))


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Optional[Any]]:
    return st.one_of(st.none(), strategy)


def words(*good: str) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(good), st.text(max_size=12))


def hf_texts() -> st.SearchStrategy[str]:
    real = [p.read_text() for p in sorted(HF_CONFIGS.glob("*.json"))][:4]
    garbage_json = st.dictionaries(
        st.sampled_from(["hidden_size", "num_hidden_layers", "num_attention_heads",
                         "vocab_size", "intermediate_size", "model_type", "x"]),
        st.one_of(st.integers(-5, 5000), st.text(max_size=5), st.none(), st.floats()),
        max_size=6,
    ).map(json.dumps)
    return st.one_of(st.sampled_from(real), garbage_json, st.text(max_size=40),
                     st.just("/etc/hostname"))


@st.composite
def models(draw: st.DrawFn) -> pb.Model:
    kind = draw(st.sampled_from(["preset", "hf", "dims", "none"]))
    if kind == "preset":
        return pb.Model(preset=draw(st.one_of(st.sampled_from(mp.Model.presets()),
                                              st.text(max_size=12), st.just("/etc/passwd"))))
    if kind == "hf":
        return pb.Model(hf_config_json=draw(hf_texts()), name=draw(maybe(st.text(max_size=8))))
    if kind == "none":
        return pb.Model()
    dims = pb.ModelDims(
        name=draw(st.text(max_size=8)), layers=draw(small()), hidden=draw(small(-2, 8192)),
        heads=draw(small()), kv_heads=draw(small()), ffn_hidden=draw(small(-2, 30000)),
        vocab=draw(small(-2, 50000)), activation=draw(maybe(words("swiglu", "gelu"))),
        head_dim=draw(maybe(small())), norm=draw(maybe(words("rmsnorm", "layernorm"))),
        tied_embeddings=draw(st.booleans()),
    )
    if draw(st.booleans()):
        dims.moe.CopyFrom(pb.Moe(
            num_experts=draw(small()), top_k=draw(small()), expert_ffn_hidden=draw(small()),
            shared_experts=draw(small()), shared_expert_ffn_hidden=draw(maybe(small())),
            first_dense_layers=draw(small()),
        ))
    if draw(st.booleans()):
        dims.mla.CopyFrom(pb.Mla(
            kv_lora_rank=draw(small()), qk_rope_head_dim=draw(small()),
            qk_nope_head_dim=draw(small()), v_head_dim=draw(small()),
            q_lora_rank=draw(maybe(small())),
        ))
    return pb.Model(dims=dims)


def clusters() -> st.SearchStrategy[pb.Cluster]:
    per = maybe(st.one_of(st.integers(-2, 80), st.sampled_from(EDGES + [65536, 65537])))
    return st.builds(
        pb.Cluster,
        gpu=words(*mp.Gpu.presets()),
        num_gpus=st.one_of(st.sampled_from([1, 2, 4, 8, 16, 32, 64]), small(-2, 64)),
        gpus_per_node=per,
        nvlink_domain=per,
    )


def workloads() -> st.SearchStrategy[pb.Workload]:
    return st.builds(
        pb.Workload,
        global_batch=small(-2, 512), seq_len=small(-2, 16384),
        precision=maybe(words("bf16", "fp16", "fp8", "mxfp8", "nvfp4")),
        optimizer=maybe(words("adam", "sgd-momentum")),
        grad_bytes=maybe(small(-1, 5)), lora=st.booleans(), flash_attention=maybe(st.booleans()),
        fused_cross_entropy=maybe(st.booleans()),
    )


def degrees() -> st.SearchStrategy[Optional[pb.DegreeConstraint]]:
    bound = maybe(st.one_of(st.integers(-2, 70), st.sampled_from(EDGES + [4096, 4097])))
    return maybe(st.builds(pb.DegreeConstraint, fixed=bound, min=bound, max=bound))


def spaces() -> st.SearchStrategy[Optional[pb.SearchSpace]]:
    return maybe(st.builds(
        pb.SearchSpace,
        dp=degrees(), tp=degrees(), pp=degrees(), ep=degrees(), cp=degrees(), vpp=degrees(),
        micro_batch=degrees(),
        zero=st.lists(small(-1, 4), max_size=4),
        recompute=st.lists(words("none", "selective", "full", "selective-op"), max_size=3),
        sequence_parallel=st.lists(st.booleans(), max_size=2),
        schedules=st.lists(words("1f1b", "interleaved-1f1b", "zb-h1"), max_size=3),
        orders=st.lists(words("tp-cp-ep-dp-pp", "dp-tp-cp-ep-pp", "tp-tp-ep-dp-pp"), max_size=2),
        memory_headroom_gib=maybe(st.floats(allow_nan=True, allow_infinity=True)),
        tp_within_domain=maybe(st.booleans()), cp_within_domain=maybe(st.booleans()),
        ep_within_domain=maybe(st.booleans()), top_k=maybe(small(-2, 50)),
        max_candidates=maybe(small(-2, 100_000)),
    ))


def plans() -> st.SearchStrategy[pb.Plan]:
    return st.builds(
        pb.Plan,
        dp=small(), tp=small(), pp=small(), ep=maybe(small()), cp=maybe(small()),
        vpp=maybe(small()), micro_batch=maybe(small()), zero=maybe(small(-1, 4)),
        recompute=maybe(words("none", "selective", "full", "selective-op")),
        sequence_parallel=maybe(st.booleans()),
        schedule=maybe(words("1f1b", "interleaved-1f1b", "zb-h1")),
        order=maybe(words("tp-cp-ep-dp-pp", "pp-dp-ep-cp-tp", "tp-cp")),
    )


@st.composite
def plausible(draw: st.DrawFn) -> tuple[str, bytes]:
    """Valid-looking requests (presets, powers of two, known words): many succeed, some are too
    large for the cap or do not fit, a few are still invalid."""
    n = draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
    common = dict(
        model=pb.Model(preset=draw(st.sampled_from(mp.Model.presets()))),
        cluster=pb.Cluster(gpu=draw(st.sampled_from(mp.Gpu.presets())), num_gpus=n),
        workload=pb.Workload(
            global_batch=draw(st.sampled_from([8, 64, 256])),
            seq_len=draw(st.sampled_from([2048, 4096, 8192])),
            precision=draw(st.sampled_from(["bf16", "fp16", "fp8"])),
        ),
    )
    if draw(st.booleans()):
        tp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if n % d == 0]))
        pp = draw(st.sampled_from([d for d in (1, 2, 4) if (n // tp) % d == 0]))
        plan = pb.Plan(dp=n // tp // pp, tp=tp, pp=pp, zero=draw(st.integers(0, 3)),
                       recompute=draw(st.sampled_from(["none", "selective", "full"])),
                       micro_batch=draw(st.sampled_from([1, 2, 4])))
        method = draw(st.sampled_from(["Evaluate", "Explain"]))
        cls = pb.EvaluateRequest if method == "Evaluate" else pb.ExplainRequest
        return method, cls(plan=plan, **common).SerializeToString()
    space = pb.SearchSpace(
        tp=pb.DegreeConstraint(max=draw(st.sampled_from([1, 2, 8]))),
        micro_batch=pb.DegreeConstraint(max=draw(st.sampled_from([1, 2, 4]))),
        zero=draw(st.lists(st.integers(0, 3), min_size=1, max_size=2)),
        recompute=draw(st.lists(st.sampled_from(["none", "selective", "full"]), min_size=1,
                                max_size=2)),
        top_k=draw(st.integers(1, 20)),
    )
    return "Search", pb.SearchRequest(space=space, **common).SerializeToString()


def requests() -> st.SearchStrategy[tuple[str, bytes]]:
    search = st.builds(pb.SearchRequest, model=models(), cluster=maybe(clusters()),
                       workload=maybe(workloads()), space=spaces())
    evaluate = st.builds(pb.EvaluateRequest, model=models(), cluster=maybe(clusters()),
                         workload=maybe(workloads()), plan=maybe(plans()))
    explain = st.builds(pb.ExplainRequest, model=models(), cluster=maybe(clusters()),
                        workload=maybe(workloads()), plan=maybe(plans()))
    return st.one_of(
        plausible(),
        search.map(lambda r: ("Search", r.SerializeToString())),
        evaluate.map(lambda r: ("Evaluate", r.SerializeToString())),
        explain.map(lambda r: ("Explain", r.SerializeToString())),
        st.just(("ListPresets", b"")),
        # Bytes that may not even be a message, to any method.
        st.tuples(st.sampled_from(["Search", "Evaluate", "Explain", "ListPresets"]),
                  st.binary(max_size=48)),
    )


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(call=requests())
def test_random_requests_get_only_ok_or_a_client_error(
    channel: grpc.Channel, call: tuple[str, bytes]
) -> None:
    method, body = call
    rpc = channel.unary_unary(f"/meshplan.v1.Planner/{method}")
    try:
        rpc(body, timeout=20)
        code, details = grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        assert isinstance(e, grpc.Call)
        code, details = e.code(), e.details() or ""
    assert code in ALLOWED, (method, code, details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert details.strip(), "an INVALID_ARGUMENT without a message"


def test_the_server_is_still_healthy_afterwards(server: PlannerServer) -> None:
    # Runs after the property test (file order): still SERVING, still answering.
    with PlannerClient(server.address) as client:
        assert client.health() == "SERVING"
        assert client.health("meshplan.v1.Planner") == "SERVING"
        plan = "dp=8,tp=1,pp=1,micro_batch=1,zero=3,recompute=none"
        assert client.evaluate("llama2-7b", mp.Cluster("a100-sxm-40g", 8),
                               mp.Workload(64, 4096), plan).feasible
