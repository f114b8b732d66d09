"""CUDA graphs as a workload field (``Workload.cuda_graphs``, docs/costmodel.md §5.5): an eager or
partially graphed dropless MoE layer lasts at least the host's issue of its kernels; graphs that
cover the MoE block remove that floor. Python, CLI and gRPC take the field, dense layers ignore
it, and a bad value gets one line naming it."""

from __future__ import annotations

import json
from typing import Any

import pytest

import meshplan as mp
from meshplan.cli import main
from meshplan.client import PlannerClient
from meshplan.errors import InvalidInputError
from meshplan.server import PlannerServer

MOE = "qwen3-30b-a3b"
DENSE = "llama3-8b"
CLUSTER = mp.Cluster("b200", 8)
MOE_PLAN = "dp=1,tp=1,pp=1,ep=8,micro_batch=1,zero=1,recompute=none,dispatcher=alltoall"
DENSE_PLAN = "dp=8,tp=1,pp=1,micro_batch=1,zero=1,recompute=none"


def workload(**extra: Any) -> mp.Workload:
    return mp.Workload(512, 4096, "mxfp8", **extra)


def test_default_is_none_and_round_trips() -> None:
    w = workload()
    assert w.cuda_graphs == "none"
    assert "cuda_graphs" not in w.to_dict()
    assert mp.Workload.from_dict(workload(cuda_graphs="full").to_dict()).cuda_graphs == "full"


def test_only_full_graphs_lift_the_host_floor_of_a_small_moe_layer() -> None:
    # Qwen3-30B-A3B at micro-batch 1 on B200: the GPU's layer is shorter than the host's issue.
    t = {g: mp.evaluate(MOE, CLUSTER, workload(cuda_graphs=g), MOE_PLAN).step_time_s
         for g in ("none", "partial", "full")}
    assert t["none"] == t["partial"] > 1.5 * t["full"]
    dense = [mp.evaluate(DENSE, CLUSTER, workload(cuda_graphs=g), DENSE_PLAN) for g in ("none", "full")]
    assert dense[0] == dense[1]


@pytest.mark.parametrize("value", ["yes", "", "FULL", None, True])
def test_python_rejects_bad_values_naming_the_field(value: Any) -> None:
    with pytest.raises(InvalidInputError) as info:
        workload(cuda_graphs=value)
    message = str(info.value)
    assert "workload.cuda_graphs" in message and "\n" not in message, message


CLI = ["evaluate", "--model", MOE, "--gpu", "b200", "--gpus", "8", "--global-batch", "512",
       "--seq-len", "4096", "--precision", "mxfp8", "--plan", MOE_PLAN, "--json"]


def test_cli_flag_reaches_the_core(capsys: pytest.CaptureFixture[str]) -> None:
    times = {}
    for value in ("none", "full"):
        assert main([*CLI, "--cuda-graphs", value]) == 0
        times[value] = json.loads(capsys.readouterr().out)["step_time_s"]
    assert main(CLI) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == times["none"] > times["full"]


def test_grpc_carries_the_field(planner: PlannerServer) -> None:
    with PlannerClient(planner.address, timeout_s=60) as client:
        for value in ("none", "full"):
            w = workload(cuda_graphs=value)
            assert client.evaluate(MOE, CLUSTER, w, MOE_PLAN) == mp.evaluate(MOE, CLUSTER, w, MOE_PLAN)
