"""The low-precision recipe (``Workload.precision_recipe``) and multi-token prediction
(``Model.mtp_layers``/``mtp_pattern``): Python, CLI and gRPC take them, they slow the hybrid
runs they describe and leave bf16 runs alone, and bad values get one line naming the field
(docs/costmodel.md §1.4)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import meshplan as mp
from meshplan.cli import main
from meshplan.client import PlannerClient
from meshplan.errors import InvalidInputError
from meshplan.server import PlannerServer

NANO = "nemotron-3-nano-30b-a3b"
CLUSTER = mp.Cluster("gb200-nvl72", 8)
PLAN = "dp=1,tp=1,pp=1,ep=8,micro_batch=1,zero=1"


def workload(**extra: Any) -> mp.Workload:
    return mp.Workload(64, 8192, moe_imbalance=1.0, **extra)


def nano_with_mtp() -> mp.Model:
    return dataclasses.replace(mp.Model.preset(NANO), mtp_layers=2, mtp_pattern="*E")


def test_fields_round_trip_and_default_to_none() -> None:
    assert workload().precision_recipe is None
    assert "precision_recipe" not in workload().to_dict()
    w = workload(precision="nvfp4", precision_recipe="nemotron3-super-nvfp4")
    assert mp.Workload.from_dict(w.to_dict()) == w
    m = nano_with_mtp()
    assert mp.Model.from_dict(m.to_dict()) == m
    assert "mtp_layers" not in mp.Model.preset(NANO).to_dict()


def test_a_recipe_slows_an_nvfp4_run_and_not_a_bf16_one() -> None:
    plain = mp.evaluate(NANO, CLUSTER, workload(precision="nvfp4"), PLAN)
    recipe = mp.evaluate(
        NANO, CLUSTER, workload(precision="nvfp4", precision_recipe="nemotron3-super-nvfp4"), PLAN)
    assert recipe.step_time_s > plain.step_time_s
    bf16 = [mp.evaluate(NANO, CLUSTER, workload(precision_recipe=r), PLAN)
            for r in (None, "nemotron3-super-nvfp4")]
    assert bf16[0].step_time_s == bf16[1].step_time_s


def test_the_fused_expert_mlp_recipe_speeds_an_mxfp8_moe_run_and_needs_mxfp8() -> None:
    qwen, plan = "qwen3-30b-a3b", "dp=1,tp=1,pp=1,ep=8,micro_batch=4,zero=1"
    w = mp.Workload(512, 4096, precision="mxfp8", moe_imbalance=1.0)
    plain = mp.evaluate(qwen, CLUSTER, w, plan)
    fused = mp.evaluate(
        qwen, CLUSTER, dataclasses.replace(w, precision_recipe="mxfp8-fused-expert-mlp"), plan)
    assert fused.step_time_s < plain.step_time_s
    with pytest.raises(InvalidInputError, match="workload.precision_recipe.*mxfp8"):
        mp.evaluate(qwen, CLUSTER, dataclasses.replace(
            w, precision="fp8", precision_recipe="mxfp8-fused-expert-mlp"), plan)


def test_mtp_depths_add_time() -> None:
    w = workload(precision="mxfp8")
    plain = mp.evaluate(NANO, CLUSTER, w, PLAN)
    mtp = mp.evaluate(nano_with_mtp(), CLUSTER, w, PLAN)
    assert mtp.step_time_s > plain.step_time_s


def test_unknown_recipe_and_bad_mtp_name_the_field() -> None:
    with pytest.raises(InvalidInputError, match="workload.precision_recipe"):
        mp.evaluate(NANO, CLUSTER, workload(precision_recipe="fp3"), PLAN)
    bad = dataclasses.replace(nano_with_mtp(), mtp_pattern="*-")
    with pytest.raises(InvalidInputError, match="model.mtp_pattern"):
        mp.evaluate(bad, CLUSTER, workload(), PLAN)


def test_cli_flag_reaches_the_core(capsys: pytest.CaptureFixture[str]) -> None:
    cli = ["evaluate", "--model", NANO, "--gpu", "gb200-nvl72", "--gpus", "8", "--global-batch",
           "64", "--seq-len", "8192", "--precision", "nvfp4", "--moe-imbalance", "1", "--plan",
           PLAN, "--json"]
    assert main(cli) == 0
    plain = capsys.readouterr().out
    assert main([*cli, "--precision-recipe", "nemotron3-super-nvfp4"]) == 0
    assert capsys.readouterr().out != plain
    assert main([*cli, "--precision-recipe", "fp3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "precision_recipe" in err, err


def test_grpc_carries_the_fields(planner: PlannerServer) -> None:
    w = workload(precision="nvfp4", precision_recipe="nemotron3-super-nvfp4")
    with PlannerClient(planner.address, timeout_s=60) as client:
        assert client.evaluate(NANO, CLUSTER, w, PLAN) == mp.evaluate(NANO, CLUSTER, w, PLAN)
        m = nano_with_mtp()
        assert client.evaluate(m, CLUSTER, w, PLAN) == mp.evaluate(m, CLUSTER, w, PLAN)
