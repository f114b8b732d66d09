"""The MoE routing imbalance λ as a workload field (``Workload.moe_imbalance``): Python, CLI and
gRPC take it, it changes MoE times and nothing else, and bad values get one line naming it."""

from __future__ import annotations

import math
from typing import Any

import grpc
import pytest

import meshplan as mp
from meshplan import _core
from meshplan.cli import main
from meshplan.client import PlannerClient
from meshplan.errors import InvalidInputError
from meshplan.server import PlannerServer
from meshplan.v1 import planner_pb2 as pb
from meshplan.v1 import planner_pb2_grpc as pb_grpc

MOE = "mixtral-8x7b"
DENSE = "llama2-7b"
CLUSTER = mp.Cluster("h100-sxm", 16)
MOE_PLAN = "dp=2,tp=2,pp=1,ep=4,micro_batch=1,zero=1,recompute=full"
DENSE_PLAN = "dp=16,tp=1,pp=1,micro_batch=1,zero=1,recompute=full"
BAD = [0, 0.5, 2**31, 2**32, 2**64 - 1, math.nan, math.inf, -math.inf, 101]
"""Values the field must refuse: below 1, absurd, not finite."""


def workload(**extra: Any) -> mp.Workload:
    return mp.Workload(256, 4096, **extra)


def test_default_is_stated_and_round_trips() -> None:
    w = workload()
    assert w.moe_imbalance == 1.1
    assert w.to_dict()["moe_imbalance"] == 1.1
    assert mp.Workload.from_dict(workload(moe_imbalance=1.0).to_dict()).moe_imbalance == 1.0


def test_python_default_is_the_cores_default() -> None:
    # A workload dict without the field takes the core's default: the same numbers as Python's.
    stated = mp.evaluate(MOE, CLUSTER, workload(), MOE_PLAN)
    problem = {
        "model": mp.Model.preset(MOE).to_dict(),
        "cluster": CLUSTER.to_dict(),
        "workload": {k: v for k, v in workload().to_dict().items() if k != "moe_imbalance"},
    }
    omitted = _core.evaluate(problem, mp.Plan.parse(MOE_PLAN).to_dict())
    assert omitted["step_time_s"] == stated.step_time_s
    # And a core default other than Python's would show here.
    other = _core.evaluate({**problem, "workload": {**problem["workload"], "moe_imbalance": 1.0}},
                           mp.Plan.parse(MOE_PLAN).to_dict())
    assert other["step_time_s"] != stated.step_time_s


def test_imbalance_slows_moe_and_leaves_dense_alone() -> None:
    balanced = mp.evaluate(MOE, CLUSTER, workload(moe_imbalance=1.0), MOE_PLAN)
    default = mp.evaluate(MOE, CLUSTER, workload(), MOE_PLAN)
    skewed = mp.evaluate(MOE, CLUSTER, workload(moe_imbalance=1.5), MOE_PLAN)
    assert balanced.step_time_s < default.step_time_s < skewed.step_time_s
    assert balanced.peak_memory_gib < skewed.peak_memory_gib
    dense = [mp.evaluate(DENSE, CLUSTER, workload(moe_imbalance=x), DENSE_PLAN) for x in (1.0, 3.0)]
    assert dense[0] == dense[1]


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_python_rejects_bad_values_naming_the_field(value: Any) -> None:
    with pytest.raises(InvalidInputError) as info:
        mp.evaluate(MOE, CLUSTER, workload(moe_imbalance=value), MOE_PLAN)
    message = str(info.value)
    assert "workload.moe_imbalance" in message and "\n" not in message, message


@pytest.mark.parametrize("value", ["a", None, True])
def test_python_rejects_non_numbers(value: Any) -> None:
    with pytest.raises(InvalidInputError, match=r"workload\.moe_imbalance"):
        workload(moe_imbalance=value)


CLI = ["evaluate", "--model", MOE, "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "256",
       "--seq-len", "4096", "--plan", MOE_PLAN, "--json"]


def test_cli_flag_reaches_the_core(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    times = []
    for value in ("1.0", "1.1"):
        assert main([*CLI, "--moe-imbalance", value]) == 0
        times.append(json.loads(capsys.readouterr().out)["step_time_s"])
    assert main(CLI) == 0
    default = json.loads(capsys.readouterr().out)["step_time_s"]
    assert times[0] < times[1] == default


@pytest.mark.parametrize("value", ["0", "2147483648", "4294967296", "18446744073709551615",
                                   "nan", "inf", "0.99"])
def test_cli_bad_values_exit_2_with_one_line(capsys: pytest.CaptureFixture[str],
                                             value: str) -> None:
    code = main([*CLI, "--moe-imbalance", value])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("meshplan: error: ") and err.count("\n") == 1, err
    assert "moe_imbalance" in err or "--moe-imbalance" in err, err


def test_grpc_carries_the_field(planner: PlannerServer) -> None:
    with PlannerClient(planner.address, timeout_s=60) as client:
        for value in (1.0, 1.3):
            w = workload(moe_imbalance=value)
            assert client.evaluate(MOE, CLUSTER, w, MOE_PLAN) == mp.evaluate(MOE, CLUSTER, w, MOE_PLAN)


@pytest.mark.parametrize("value", [0.0, float(2**31), float(2**32), float(2**64 - 1), math.nan,
                                   math.inf])
def test_grpc_bad_values_are_invalid_argument_naming_the_field(planner: PlannerServer,
                                                               value: float) -> None:
    stub = pb_grpc.PlannerStub(grpc.insecure_channel(planner.address))
    request = pb.EvaluateRequest(
        model=pb.Model(preset=MOE),
        cluster=pb.Cluster(gpu="h100-sxm", num_gpus=16),
        workload=pb.Workload(global_batch=256, seq_len=4096, moe_imbalance=value),
        plan=pb.Plan(dp=2, tp=2, pp=1, ep=4),
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.Evaluate(request, timeout=30)
    error = info.value
    assert isinstance(error, grpc.Call)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = error.details() or ""
    assert "workload.moe_imbalance" in details and "\n" not in details, details
