"""MoE token exchange knobs (``Plan.dispatcher``, ``Plan.ep_overlap``): priced per dispatcher,
searched when asked for, refused with the stack's reason where a framework does not offer them,
and carried by the exports."""

from __future__ import annotations

import json

import pytest

import meshplan as mp
from meshplan.cli import main
from meshplan.errors import InvalidInputError
from meshplan.export import export, parse

MODEL = "qwen3-30b-a3b"
CLUSTER = mp.Cluster("h100-sxm", 64)
WORKLOAD = mp.Workload(256, 4096)
PLAN = mp.Plan(dp=1, tp=1, pp=2, ep=32, vpp=2, zero=1, schedule="interleaved-1f1b")


def _with(**fields: object) -> mp.Plan:
    return mp.Plan.from_dict({**PLAN.to_dict(), **fields})


def test_node_deduplication_is_what_flex_buys_across_nodes() -> None:
    ep = {d: mp.evaluate(MODEL, CLUSTER, WORKLOAD, _with(dispatcher=d)).time_s["ep"]
          for d in ("alltoall", "allgather", "flex")}
    # EP 32 spans four 8-GPU nodes: every copy on the wire (alltoall) costs more than one per
    # remote node (flex); gathering every rank's tokens (allgather) rides the rings over all
    # of a node's NICs, between the two at top-8.
    assert ep["flex"] < ep["allgather"] < ep["alltoall"]
    # The stack's default is flex (megatron-core): the plan without a dispatcher prices the same.
    assert mp.evaluate(MODEL, CLUSTER, WORKLOAD, PLAN).time_s["ep"] == ep["flex"]


def test_overlap_hides_exchange_and_has_megatrons_constraints() -> None:
    off = mp.evaluate(MODEL, CLUSTER, WORKLOAD, PLAN)
    on = mp.evaluate(MODEL, CLUSTER, WORKLOAD, _with(ep_overlap=True))
    assert on.feasible and on.time_s["ep"] < off.time_s["ep"]
    for fields, rule in [({"recompute": "full"}, "stack_recompute"),
                         ({"dispatcher": "allgather"}, "stack_parallelism"),
                         ({"vpp": 1, "schedule": "1f1b"}, "stack_schedule")]:
        ev = mp.evaluate(MODEL, CLUSTER, WORKLOAD, _with(ep_overlap=True, **fields))
        assert not ev.feasible and rule in {r.rule for r in ev.reasons}, fields
    titan = mp.Workload(1024, 4096, stack="torchtitan")
    ev = mp.evaluate(MODEL, CLUSTER, titan, _with(dispatcher="flex"))
    assert any("no flex token dispatcher" in r.message for r in ev.reasons)


def test_a_bad_dispatcher_is_one_line_naming_the_field() -> None:
    with pytest.raises(InvalidInputError) as e:
        mp.evaluate(MODEL, CLUSTER, WORKLOAD, _with(dispatcher="nccl"))
    assert "plan.dispatcher" in str(e.value) and "alltoall" in str(e.value)
    with pytest.raises(InvalidInputError) as e:
        mp.Plan.parse("dp=1,tp=1,pp=8,ep=32,ep_overlap=maybe")
    assert "plan.ep_overlap" in str(e.value)


def test_the_search_tries_what_the_space_lists(capsys: pytest.CaptureFixture[str]) -> None:
    space = mp.SearchSpace(top_k=200, distinct=False, max_pp=8)
    default = mp.search("mixtral-8x7b", mp.Cluster("h100-sxm", 32), mp.Workload(256, 4096), space)
    assert {e.plan.dispatcher for e in default.plans if e.plan.ep > 1} == {"flex"}
    assert not any(e.plan.ep_overlap for e in default.plans)
    both = mp.search("mixtral-8x7b", mp.Cluster("h100-sxm", 32), mp.Workload(256, 4096),
                     mp.SearchSpace(top_k=200, distinct=False, max_pp=8,
                                    dispatchers=["alltoall", "flex"], ep_overlap=[False, True]))
    assert both.stats.candidates > default.stats.candidates
    assert any(e.plan.ep_overlap for e in both.plans)
    args = ["search", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "32",
            "--global-batch", "256", "--seq-len", "4096", "--max-pp", "8", "--top-k", "20",
            "--ep-overlap", "on", "--dispatchers", "alltoall", "--json"]
    assert main(args) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    moe = [p for p in plans if p["ep"] > 1]
    assert moe and all(p["dispatcher"] == "alltoall" and p["ep_overlap"] for p in moe)


def test_exports_carry_the_exchange_or_refuse_it() -> None:
    plan = _with(dispatcher="alltoall", ep_overlap=True)
    text = export(plan, "megatron", model=MODEL, workload=WORKLOAD)
    assert "--moe-token-dispatcher-type alltoall" in text
    assert "--overlap-moe-expert-parallel-comm" in text
    assert parse(text, "megatron", model=MODEL, workload=WORKLOAD) == plan
    flex = export(PLAN, "megatron", model=MODEL, workload=WORKLOAD)
    assert "--moe-token-dispatcher-type flex" in flex and "--moe-flex-dispatcher-backend" in flex
    with pytest.raises(InvalidInputError, match="all-to-all only"):
        export(_with(dispatcher="flex"), "torchtitan", model=MODEL, workload=WORKLOAD)
