"""``SearchServing``, ``EvaluateServing`` and ``ExplainServing`` against a real server on
127.0.0.1, port 0, directly and through :class:`~meshplan.client.PlannerClient`: the answers
equal the Python API's, bad fields are INVALID_ARGUMENT naming the field, deadlines
are DEADLINE_EXCEEDED."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

import meshplan as mp
from meshplan import serving_wire
from meshplan.client import PlannerClient
from meshplan.errors import InvalidInputError
from meshplan.server import PlannerServer, ServerConfig
from meshplan.v1 import planner_pb2 as pb
from meshplan.v1 import planner_pb2_grpc as pb_grpc


@pytest.fixture(scope="module")
def stub() -> Iterator[pb_grpc.PlannerStub]:
    server = PlannerServer(ServerConfig(host="127.0.0.1", port=0, workers=2)).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield pb_grpc.PlannerStub(channel)
    finally:
        channel.close()
        server.stop(0)


def problem(**traffic: object) -> pb.ServingProblem:
    t = {"input_len": 1024, "output_len": 256, **traffic}
    return pb.ServingProblem(model=pb.Model(preset="llama3-8b"),
                             cluster=pb.Cluster(gpu="h100-sxm", num_gpus=8),
                             traffic=pb.ServingTraffic(**t))  # type: ignore[arg-type]


def test_search_serving_matches_the_python_api(stub: pb_grpc.PlannerStub) -> None:
    response = stub.SearchServing(pb.SearchServingRequest(problem=problem(),
                                                          space=pb.ServingSpace(top_k=3)), timeout=60)
    local = mp.search_serving("llama3-8b", mp.Cluster("h100-sxm", 8), input_len=1024, output_len=256,
                              space={"top_k": 3})
    assert [e.label for e in response.plans] == [e["label"] for e in local.plans]
    assert [e.label for e in response.pareto] == [e["label"] for e in local.pareto]
    best = response.plans[0]
    assert best.tpot_s == pytest.approx(local.plans[0]["time"]["tpot_s"])
    assert best.tokens_per_s_per_gpu == pytest.approx(local.plans[0]["tokens_per_s_per_gpu"])
    assert response.stats.candidates == local.stats["candidates"]
    assert json.loads(best.extra_json)["time"]["decode"]["linear_s"] > 0
    assert serving_wire.evaluation_from(best)["label"] == best.label


def test_evaluate_serving_round_trips_a_disaggregated_plan(stub: pb_grpc.PlannerStub) -> None:
    plan = pb.ServingPlan(worker=pb.ServingWorker(tp=2, max_sequences=64), replicas=3,
                          prefill=pb.ServingWorker(tp=2, max_sequences=4))
    response = stub.EvaluateServing(pb.EvaluateServingRequest(problem=problem(), plan=plan), timeout=60)
    ev = response.evaluation
    assert ev.plan.replicas == 3 and ev.plan.prefill_replicas == 1 and ev.gpus == 8
    assert ev.plan.worker.expert_tp == 2 and ev.kv_transfer_s > 0
    local = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 8), "tp=2,batch=64,replicas=3",
                                prefill="tp=2,batch=4", input_len=1024, output_len=256)
    assert ev.ttft_s == pytest.approx(local["time"]["ttft_s"])


def test_the_output_lag_travels_over_grpc(stub: pb_grpc.PlannerStub) -> None:
    # vLLM V0 returns a step's tokens when the next step ends (output_lag_steps 1): over gRPC as
    # in Python, and back in the evaluation's plan; unset stays unset.
    plan = pb.ServingPlan(worker=pb.ServingWorker(tp=2, max_sequences=64, max_batched_tokens=16384,
                                                  output_lag_steps=1), replicas=4)
    traffic = {"concurrency": 256, "arrival": "waves", "num_requests": 512}
    ev = stub.EvaluateServing(pb.EvaluateServingRequest(problem=problem(**traffic), plan=plan),
                              timeout=60).evaluation
    local = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 8), "tp=2,batch=64,replicas=4,tokens=16384,lag=1",
                                input_len=1024, output_len=256, **traffic)
    none = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 8), "tp=2,batch=64,replicas=4,tokens=16384",
                               input_len=1024, output_len=256, **traffic)
    assert ev.ttft_s == pytest.approx(local["time"]["ttft_s"]) and ev.ttft_s > none["time"]["ttft_s"]
    assert ev.plan.worker.output_lag_steps == 1
    assert serving_wire.evaluation_from(ev)["plan"]["worker"]["output_lag_steps"] == 1
    assert "output_lag_steps" not in none["plan"]["worker"]


def test_the_arrival_process_travels_over_grpc(stub: pb_grpc.PlannerStub) -> None:
    plan = pb.ServingPlan(worker=pb.ServingWorker(tp=2, max_sequences=64), replicas=4)
    for traffic, local_kw in (
        ({"concurrency": 512, "arrival": "waves", "num_requests": 1000},
         {"concurrency": 512, "arrival": "waves", "num_requests": 1000}),
        ({"request_rate": 3.0}, {"request_rate": 3.0}),
    ):
        response = stub.EvaluateServing(pb.EvaluateServingRequest(problem=problem(**traffic), plan=plan), timeout=60)
        local = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 8), "tp=2,batch=64,replicas=4",
                                    input_len=1024, output_len=256, **local_kw)
        ev = response.evaluation
        assert ev.ttft_s == pytest.approx(local["time"]["ttft_s"])
        assert ev.requests_per_s == pytest.approx(local["requests_per_s"])
        assert json.loads(ev.extra_json)["queue_s"] == pytest.approx(local["queue_s"])


@pytest.mark.parametrize("value", [0, 2**31, 2**32, 2**63 - 1])
def test_bad_integers_are_invalid_argument_naming_the_field(stub: pb_grpc.PlannerStub, value: int) -> None:
    with pytest.raises(grpc.RpcError) as e:
        stub.SearchServing(pb.SearchServingRequest(problem=problem(input_len=value)), timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == f"invalid traffic.input_len: {value} (allowed: 1..=16777216)"
    plan = pb.ServingPlan(worker=pb.ServingWorker(tp=value, max_sequences=1))
    with pytest.raises(grpc.RpcError) as e:
        stub.EvaluateServing(pb.EvaluateServingRequest(problem=problem(), plan=plan), timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("invalid serving_plan.worker.tp: ")
    with pytest.raises(grpc.RpcError) as e:
        stub.SearchServing(pb.SearchServingRequest(problem=problem(),
                                                   space=pb.ServingSpace(top_k=max(value, 1001))), timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "serving_space.top_k" in e.value.details()


def test_a_passed_deadline_is_deadline_exceeded(stub: pb_grpc.PlannerStub) -> None:
    big = pb.ServingProblem(model=pb.Model(preset="deepseek-v3"),
                            cluster=pb.Cluster(gpu="h200-sxm", num_gpus=1 << 16, nvlink_domain=64),
                            weight_precision="fp8",
                            traffic=pb.ServingTraffic(input_len=4096, output_len=1024))
    with pytest.raises(grpc.RpcError) as e:
        stub.SearchServing(pb.SearchServingRequest(problem=big), timeout=0.05)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def plausible(method: str) -> Any:
    """A request a careful client would send (dense model on 8 GPUs, MoE fields present)."""
    p = pb.ServingProblem(model=pb.Model(preset="mixtral-8x7b"),
                          cluster=pb.Cluster(gpu="h100-sxm", num_gpus=8),
                          traffic=pb.ServingTraffic(input_len=512, output_len=64, concurrency=16))
    if method == "SearchServing":
        return pb.SearchServingRequest(problem=p, space=pb.ServingSpace(top_k=3, max_tp=8, max_pp=2,
                                                                       max_attention_dp=8, max_sequences=64))
    worker = pb.ServingWorker(tp=2, pp=1, attention_dp=2, ep=4, expert_tp=1, max_sequences=16)
    plan = pb.ServingPlan(worker=worker, replicas=1, prefill=worker, prefill_replicas=1)
    return pb.EvaluateServingRequest(problem=p, plan=plan)


def test_every_integer_field_at_every_edge_gets_a_clean_answer(stub: pb_grpc.PlannerStub) -> None:
    from grpc_fuzz import _int_edges, int_paths, set_path

    calls = 0
    for method in ("SearchServing", "EvaluateServing"):
        call = getattr(stub, method)
        descriptor = plausible(method).DESCRIPTOR
        for path in int_paths(descriptor):
            field_descriptor = descriptor
            for name in path[:-1]:
                field_descriptor = field_descriptor.fields_by_name[name].message_type
            for value in _int_edges(field_descriptor.fields_by_name[path[-1]]):
                msg = plausible(method)
                set_path(msg, path, value)
                calls += 1
                try:
                    call(msg, timeout=30)
                except grpc.RpcError as e:
                    where = f"{method} {'.'.join(path)}={value}"
                    assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                        grpc.StatusCode.RESOURCE_EXHAUSTED), (where, e.code(), e.details())
                    assert "\n" not in e.details() and "Traceback" not in e.details(), where
                    if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                        assert e.details().startswith("invalid ") or e.details().startswith("unknown "), \
                            (where, e.details())
    assert calls > 100



def test_explain_serving_over_grpc_equals_the_python_api(planner_client: PlannerClient) -> None:
    kw: dict[str, Any] = {"input_len": 2048, "output_len": 512}
    local = mp.explain_serving("mixtral-8x7b", mp.Cluster("h100-sxm", 8), "tp=2,adp=2,ep=4,batch=64",
                               **kw)
    remote = planner_client.explain_serving("mixtral-8x7b", mp.Cluster("h100-sxm", 8),
                                    "tp=2,adp=2,ep=4,batch=64", **kw)
    assert remote["axes"] == local["axes"]
    assert remote["ridge_flops_per_byte"] == local["ridge_flops_per_byte"]
    ev, want = remote["evaluation"], local["evaluation"]
    assert ev["time"] == want["time"] and ev["memory"] == want["memory"]
    assert ev["label"] == want["label"] and ev["tpot_s"] == want["time"]["tpot_s"]
    assert {a["axis"] for a in remote["axes"]} >= {"tp", "ep"}


def test_weight_scaling_travels_over_grpc(planner_client: PlannerClient) -> None:
    kw: dict[str, Any] = {"input_len": 3200, "output_len": 8, "weight_precision": "fp8", "concurrency": 4,
                          "arrival": "waves", "num_requests": 4}
    h200 = mp.Cluster("h200-sxm", 8)
    for scaling in ("tensor", "block"):
        local = mp.evaluate_serving("deepseek-v3", h200, "tp=8,batch=4", weight_scaling=scaling, **kw)
        remote = planner_client.evaluate_serving("deepseek-v3", h200, "tp=8,batch=4", weight_scaling=scaling, **kw)
        assert remote["time"] == local["time"]
    with pytest.raises(InvalidInputError, match="weight_scaling: block"):
        planner_client.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 8), "tp=1,batch=4",
                                        weight_scaling="block", input_len=8, output_len=8)


def test_the_client_searches_and_evaluates_serving_as_the_python_api(planner_client: PlannerClient) -> None:
    kw: dict[str, Any] = {"input_len": 1024, "output_len": 256, "tpot_s": 0.05}
    local = mp.search_serving("llama3-8b", mp.Cluster("h100-sxm", 8), space={"top_k": 3}, **kw)
    remote = planner_client.search_serving("llama3-8b", mp.Cluster("h100-sxm", 8), space={"top_k": 3}, **kw)
    assert [e["label"] for e in remote.plans] == [e["label"] for e in local.plans]
    assert remote.plans[0]["time"] == local.plans[0]["time"]
    assert remote.stats["candidates"] == local.stats["candidates"]
    one = planner_client.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 8), "tp=2,batch=16,replicas=2",
                                  prefill="tp=2,batch=4", **kw)
    want = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 8), "tp=2,batch=16,replicas=2",
                               prefill="tp=2,batch=4", **kw)
    assert one["time"] == want["time"] and one["plan"] == want["plan"]


@pytest.mark.parametrize("bad", [0, 2**31, 2**32, 2**64 - 1])
def test_explain_serving_refuses_bad_integers_naming_the_field(
    stub: pb_grpc.PlannerStub, bad: int
) -> None:
    plan = pb.ServingPlan(worker=pb.ServingWorker(tp=1, max_sequences=bad % 2**63))
    with pytest.raises(grpc.RpcError) as e:
        stub.ExplainServing(pb.ExplainServingRequest(problem=problem(), plan=plan), timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_sequences" in (e.value.details() or "")


def test_the_client_refuses_an_unknown_serving_space_key(planner_client: PlannerClient) -> None:
    with pytest.raises(InvalidInputError, match="serving_space.top"):
        planner_client.search_serving("llama3-8b", mp.Cluster("h100-sxm", 8), space={"top": 3},
                              input_len=1024, output_len=256)


def test_the_attention_kernel_travels_over_grpc(stub: pb_grpc.PlannerStub) -> None:
    # SGLang 0.4's Triton MLA backend on DeepSeek: over gRPC as in Python, back in the plan.
    traffic = {"concurrency": 8, "arrival": "waves", "num_requests": 64}
    req = pb.EvaluateServingRequest(
        problem=pb.ServingProblem(model=pb.Model(preset="deepseek-v3"),
                                  cluster=pb.Cluster(gpu="h100-sxm", num_gpus=8),
                                  traffic=pb.ServingTraffic(input_len=1024, output_len=256, **traffic)),  # type: ignore[arg-type]
        plan=pb.ServingPlan(worker=pb.ServingWorker(tp=1, attention_dp=8, expert_tp=8, max_sequences=8,
                                                    attention_kernel="triton-mla")))
    ev = stub.EvaluateServing(req, timeout=60).evaluation
    local = mp.evaluate_serving("deepseek-v3", mp.Cluster("h100-sxm", 8), "tp=1,adp=8,etp=8,batch=8,attn=triton-mla",
                                input_len=1024, output_len=256, **traffic)
    assert ev.ttft_s == pytest.approx(local["time"]["ttft_s"])
    assert ev.plan.worker.attention_kernel == "triton-mla"
    assert serving_wire.evaluation_from(ev)["plan"]["worker"]["attention_kernel"] == "triton-mla"
    bad = pb.EvaluateServingRequest(problem=problem(**traffic),
                                    plan=pb.ServingPlan(worker=pb.ServingWorker(tp=2, max_sequences=8,
                                                                                attention_kernel="triton-mla")))
    with pytest.raises(grpc.RpcError) as err:
        stub.EvaluateServing(bad, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "serving_plan.worker.attention_kernel" in (err.value.details() or "")


def test_the_spaces_attention_kernel_travels_over_grpc(stub: pb_grpc.PlannerStub) -> None:
    req = pb.SearchServingRequest(
        problem=pb.ServingProblem(model=pb.Model(preset="deepseek-v3"), cluster=pb.Cluster(gpu="h200-sxm", num_gpus=8),
                                  traffic=pb.ServingTraffic(input_len=4096, output_len=256),
                                  weight_precision="fp8"),
        space=pb.ServingSpace(top_k=3, attention_kernel="triton-mla"))
    response = stub.SearchServing(req, timeout=60)
    local = mp.search_serving("deepseek-v3", mp.Cluster("h200-sxm", 8), input_len=4096, output_len=256,
                              weight_precision="fp8", space={"top_k": 3, "attention_kernel": "triton-mla"})
    assert [e.label for e in response.plans] == [e["label"] for e in local.plans]
    assert all(e.plan.worker.attention_kernel == "triton-mla" for e in response.plans)
    assert serving_wire.space_message({"attention_kernel": "triton-mla"}).attention_kernel == "triton-mla"


def test_the_sliding_kv_pool_travels_over_grpc(stub: pb_grpc.PlannerStub) -> None:
    # SGLang's KV pool for gpt-oss (every token of the sliding-window layers), on a plan and on a
    # search space: over gRPC as in Python, back in the plan.
    problem = mp.serving.serving_problem("gpt-oss-120b", mp.Cluster("h200-sxm", 2), input_len=32768,
                                         output_len=1024, expert_weights="mxfp4", concurrency=16)
    plan = mp.serving.parse_serving_plan("tp=2,batch=16,swa=full")
    ev = stub.EvaluateServing(pb.EvaluateServingRequest(problem=serving_wire.problem_message(problem),
                                                        plan=serving_wire.plan_message(plan)), timeout=60).evaluation
    local = mp.evaluate_serving("gpt-oss-120b", mp.Cluster("h200-sxm", 2), plan, input_len=32768, output_len=1024,
                                expert_weights="mxfp4", concurrency=16)
    assert ev.plan.worker.sliding_kv == "full"
    back = serving_wire.evaluation_from(ev)
    assert back["plan"]["worker"]["sliding_kv"] == "full"
    assert back["memory"]["max_sequences_fit"] == local["memory"]["max_sequences_fit"]
    assert serving_wire.space_message({"sliding_kv": "full"}).sliding_kv == "full"
    bad = pb.EvaluateServingRequest(problem=serving_wire.problem_message(problem),
                                    plan=pb.ServingPlan(worker=pb.ServingWorker(tp=2, max_sequences=8, sliding_kv="half")))
    with pytest.raises(grpc.RpcError) as err:
        stub.EvaluateServing(bad, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "serving_plan.worker.sliding_kv" in (err.value.details() or "")


def test_expert_weights_travel_over_grpc(stub: pb_grpc.PlannerStub) -> None:
    problem = mp.serving.serving_problem("gpt-oss-120b", mp.Cluster("h100-sxm", 1), input_len=1024,
                                         output_len=256, expert_weights="mxfp4")
    msg = serving_wire.problem_message(problem)
    assert msg.expert_weights == "mxfp4"
    ev = stub.EvaluateServing(pb.EvaluateServingRequest(
        problem=msg, plan=pb.ServingPlan(worker=pb.ServingWorker(tp=1, max_sequences=8))), timeout=60).evaluation
    local = mp.evaluate_serving("gpt-oss-120b", mp.Cluster("h100-sxm", 1), "tp=1,batch=8", input_len=1024,
                                output_len=256, expert_weights="mxfp4")
    assert ev.feasible and ev.tpot_s == pytest.approx(local["time"]["tpot_s"])


def test_the_cached_fraction_travels_over_grpc(stub: pb_grpc.PlannerStub) -> None:
    traffic = {"concurrency": 64, "cached_fraction": 0.75}
    req = pb.EvaluateServingRequest(
        problem=pb.ServingProblem(model=pb.Model(preset="llama3-70b"),
                                  cluster=pb.Cluster(gpu="h100-sxm", num_gpus=8),
                                  traffic=pb.ServingTraffic(input_len=4096, output_len=256, **traffic)),  # type: ignore[arg-type]
        plan=pb.ServingPlan(worker=pb.ServingWorker(tp=8, max_sequences=64)))
    ev = stub.EvaluateServing(req, timeout=60).evaluation
    local = mp.evaluate_serving("llama3-70b", mp.Cluster("h100-sxm", 8), "tp=8,batch=64",
                                input_len=4096, output_len=256, **traffic)
    assert ev.ttft_s == pytest.approx(local["time"]["ttft_s"])
    local_problem = mp.serving.serving_problem("llama3-70b", mp.Cluster("h100-sxm", 8), input_len=4096,
                                               output_len=256, **traffic)  # type: ignore[arg-type]
    assert serving_wire.problem_message(local_problem).traffic.cached_fraction == 0.75
    bad = pb.EvaluateServingRequest(problem=problem(cached_fraction=2.0),
                                    plan=pb.ServingPlan(worker=pb.ServingWorker(tp=8, max_sequences=64)))
    with pytest.raises(grpc.RpcError) as err:
        stub.EvaluateServing(bad, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "traffic.cached_fraction: 2" in str(err.value.details())


def test_a_length_distribution_travels_over_grpc(stub: pb_grpc.PlannerStub) -> None:
    classes = [(512, 128, 3.0), (4096, 512, 1.0)]
    traffic = pb.ServingTraffic(concurrency=64, lengths=[
        pb.LengthClass(input_len=i, output_len=o, weight=w) for i, o, w in classes])
    req = pb.EvaluateServingRequest(
        problem=pb.ServingProblem(model=pb.Model(preset="llama3-70b"),
                                  cluster=pb.Cluster(gpu="h100-sxm", num_gpus=8), traffic=traffic),
        plan=pb.ServingPlan(worker=pb.ServingWorker(tp=8, max_sequences=64)))
    ev = stub.EvaluateServing(req, timeout=60).evaluation
    local = mp.evaluate_serving("llama3-70b", mp.Cluster("h100-sxm", 8), "tp=8,batch=64",
                                lengths=classes, concurrency=64)
    assert ev.ttft_s == pytest.approx(local["time"]["ttft_s"])
    assert ev.tpot_s == pytest.approx(local["time"]["tpot_s"])
    assert ev.e2e_s == pytest.approx(local["time"]["e2e_s"])
    # The client sends what Python built: a class without a weight travels without one.
    local_problem = mp.serving.serving_problem("llama3-70b", mp.Cluster("h100-sxm", 8),
                                               lengths=[(512, 128), (4096, 512, 2.0)], concurrency=64)
    msg = serving_wire.problem_message(local_problem).traffic
    assert (msg.input_len, msg.output_len) == (0, 0)
    assert not msg.lengths[0].HasField("weight") and msg.lengths[1].weight == 2.0
    # Bad classes are one line naming the field, at every edge of the integers on the wire.
    for value in (0, 2**31, 2**32, 2**63 - 1, -1):
        bad = pb.ServingTraffic(lengths=[pb.LengthClass(input_len=value, output_len=64)])
        request = pb.EvaluateServingRequest(
            problem=pb.ServingProblem(model=pb.Model(preset="llama3-8b"),
                                      cluster=pb.Cluster(gpu="h100-sxm", num_gpus=8), traffic=bad),
            plan=pb.ServingPlan(worker=pb.ServingWorker(tp=8, max_sequences=64)))
        with pytest.raises(grpc.RpcError) as err:
            stub.EvaluateServing(request, timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"invalid traffic.lengths.input_len: {value} (allowed: 1..=16777216)" == err.value.details()
    both = pb.ServingTraffic(input_len=512, output_len=64, lengths=[pb.LengthClass(input_len=512, output_len=64)])
    with pytest.raises(grpc.RpcError) as err:
        stub.SearchServing(pb.SearchServingRequest(problem=pb.ServingProblem(
            model=pb.Model(preset="llama3-8b"), cluster=pb.Cluster(gpu="h100-sxm", num_gpus=8), traffic=both)),
            timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "traffic.input_len: 512 (allowed: unset (0) with traffic.lengths" in str(err.value.details())
