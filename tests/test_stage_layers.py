"""The first and last pipeline rank's layers as a plan fixes them (``Plan.first_stage_layers``,
``Plan.last_stage_layers``: Megatron's ``--decoder-first/last-pipeline-num-layers`` or what a
``--pipeline-model-parallel-layout`` gives those ranks): the split the cost model times, the
one-line errors, explain, the wire and the exports (docs/costmodel.md §2.5)."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan import wire
from meshplan.errors import InvalidInputError
from meshplan.export import export, rank_layers

MODEL = "deepseek-v3"
CLUSTER = mp.Cluster("b200", 256)
WORKLOAD = mp.Workload(2048, 4096, precision="fp8")
BASE = "dp=2,tp=1,pp=16,ep=8,zero=1,recompute=selective"
#: Megatron-Bridge's DeepSeek-V3 layout for pp 16: [E + 4] + [4] x 14 + [1 + mtp + loss].
RECIPE = BASE + ",first_stage_layers=4,last_stage_layers=1"


def test_the_fixed_split_is_the_one_timed_and_explained() -> None:
    default = mp.evaluate(MODEL, CLUSTER, WORKLOAD, BASE)
    fixed = mp.evaluate(MODEL, CLUSTER, WORKLOAD, RECIPE)
    assert default.feasible and fixed.feasible
    # Both splits put at most 4 MoE layers on a rank: the same bottleneck, the same step.
    assert fixed.step_time_s == pytest.approx(default.step_time_s)
    text = mp.explain(MODEL, CLUSTER, WORKLOAD, RECIPE).to_text()
    assert "(" + " / ".join(["4"] * 15 + ["1"]) + " layers)" in text
    # With an MTP depth on the last rank, the recipe's light last rank keeps the step near the
    # default split's, where the even split would make its 3-layer last rank the bottleneck.
    mtp = mp.Model.preset(MODEL)
    mtp.mtp_layers = 1
    with_mtp = mp.evaluate(mtp, CLUSTER, WORKLOAD, RECIPE).step_time_s
    even_mtp = mp.evaluate(mtp, CLUSTER, WORKLOAD, BASE).step_time_s
    assert with_mtp < even_mtp


def test_counts_that_leave_no_equal_share_are_one_line_errors() -> None:
    with pytest.raises(InvalidInputError, match=r"plan\.first_stage_layers.*15 pipeline ranks"):
        mp.evaluate(MODEL, CLUSTER, WORKLOAD, BASE + ",first_stage_layers=4")
    with pytest.raises(InvalidInputError, match=r"plan\.first_stage_layers.*at most the model's 61"):
        mp.evaluate(MODEL, CLUSTER, WORKLOAD, BASE + ",first_stage_layers=60,last_stage_layers=5")
    with pytest.raises(InvalidInputError, match=r"plan\.last_stage_layers.*pp = 1"):
        mp.evaluate(MODEL, mp.Cluster("b200", 8), WORKLOAD, "dp=1,tp=1,pp=1,ep=8,last_stage_layers=3")
    with pytest.raises(InvalidInputError, match=r"plan\.first_stage_layers"):
        mp.Plan.parse(BASE + ",first_stage_layers=four")


def test_plans_carry_the_counts_over_the_wire_and_into_the_exports() -> None:
    plan = mp.Plan.parse(RECIPE)
    assert (plan.first_stage_layers, plan.last_stage_layers) == (4, 1)
    assert str(plan).endswith(",first_stage_layers=4,last_stage_layers=1")
    assert mp.Plan.from_dict(plan.to_dict()) == plan
    assert "first_stage_layers" not in mp.Plan.parse(BASE).to_dict()
    assert wire.plan_from(wire.plan_message(plan)) == plan
    assert wire.plan_from(wire.plan_message(mp.Plan.parse(BASE))).first_stage_layers is None
    assert rank_layers(61, 16, 4, 1) == [4] * 15 + [1]
    assert rank_layers(61, 8, 7, 6) == [7] + [8] * 6 + [6]
    flags = export(plan, "megatron", model=MODEL, workload=WORKLOAD)
    assert "--pipeline-model-parallel-layout E" + "t" * 4 + "|" in flags
    assert "|tL" in flags
    with pytest.raises(InvalidInputError, match="first/last stage layers"):
        export(mp.Plan.parse("dp=128,tp=1,pp=2,last_stage_layers=30"), "deepspeed",
               workload=mp.Workload(2048, 4096))
