"""Megatron-Core's fine-grained selective recompute as a plan knob (``Plan.recompute_modules``):
what each module stops storing and replays, the stack rule, the search, the wire and the
exports (docs/costmodel.md §2.4.5, §5.4)."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan import wire
from meshplan.errors import InvalidInputError
from meshplan.export import export, parse

MODEL = "qwen3-30b-a3b"
CLUSTER = mp.Cluster("h100-sxm", 8)
WORKLOAD = mp.Workload(64, 4096)
BASE = "dp=1,tp=1,pp=1,ep=8,zero=1,recompute=selective"


def evaluate(extra: str = "") -> mp.Evaluation:
    return mp.evaluate(MODEL, CLUSTER, WORKLOAD, BASE + extra)


def test_core_attn_alone_is_selective_and_other_modules_trade_memory_for_time() -> None:
    plain = evaluate()
    assert evaluate(",recompute_modules=core_attn").step_time_s == plain.step_time_s
    norm_act = evaluate(",recompute_modules=layernorm+moe_act")
    block = evaluate(",recompute_modules=layernorm+moe")
    # Fewer stored activations, the whole block fewer still ...
    acts = [e.memory_gib["activations"] for e in (plain, norm_act, block)]
    assert acts[0] > acts[1] > acts[2]
    # ... and the block's replay (GEMMs, dispatch and combine again) costs more time than the
    # norm and activation replay; neither replays core attention, which selective alone does.
    assert block.step_time_s > norm_act.step_time_s
    assert block.hardware_tflops_per_gpu * block.step_time_s > norm_act.hardware_tflops_per_gpu * norm_act.step_time_s


def test_modules_need_selective_and_mla_up_proj_needs_mla() -> None:
    with pytest.raises(InvalidInputError, match="plan.recompute_modules"):
        mp.evaluate(MODEL, CLUSTER, WORKLOAD, "dp=1,tp=1,pp=1,ep=8,recompute=full,recompute_modules=moe")
    with pytest.raises(InvalidInputError, match="plan.recompute_modules"):
        mp.Plan.parse(BASE + ",recompute_modules=attention")
    ev = evaluate(",recompute_modules=mla_up_proj")
    assert not ev.feasible
    assert ev.reasons[0].rule == "stack_recompute"
    assert "latent attention" in ev.reasons[0].message
    titan = mp.Workload(64, 4096, stack="torchtitan")
    ev = mp.evaluate(MODEL, CLUSTER, titan, "dp=1,tp=1,pp=1,ep=8,zero=1,recompute=selective,recompute_modules=moe")
    assert not ev.feasible and "stack_recompute" in {r.rule for r in ev.reasons}


def test_plans_name_modules_in_megatrons_order_and_carry_them_everywhere() -> None:
    plan = mp.Plan.parse(BASE + ",recompute_modules=layernorm+moe_act")
    assert plan.recompute_modules == "moe_act+layernorm"
    assert "recompute_modules=moe_act+layernorm" in str(plan)
    assert plan.to_dict()["recompute_modules"] == ["moe_act", "layernorm"]
    assert mp.Plan.from_dict(plan.to_dict()) == plan
    assert mp.Plan(dp=8, tp=1, pp=1, recompute="selective", recompute_modules=["moe", "layernorm"]).recompute_modules == "layernorm+moe"
    assert wire.plan_from(wire.plan_message(plan)) == plan
    assert wire.plan_from(wire.plan_message(mp.Plan.parse(BASE))).recompute_modules is None
    msg = wire.space_message(mp.SearchSpace(recompute_modules=["layernorm+moe_act", "moe"]))
    assert list(msg.recompute_modules) == ["moe_act+layernorm", "moe"]
    assert wire.space_from(msg).recompute_modules == ["moe_act+layernorm", "moe"]
    # The evaluation echoes the plan with its modules.
    assert evaluate(",recompute_modules=moe").plan.recompute_modules == "moe"


def test_the_search_tries_the_module_sets_asked_for_and_nothing_new_by_default() -> None:
    space = dict(dp=1, tp=1, pp=1, ep=8, zero=[1], max_micro_batch=1, top_k=50, distinct=False)
    default = mp.search(MODEL, CLUSTER, WORKLOAD, mp.SearchSpace(**space))
    assert default.plans and all(e.plan.recompute_modules is None for e in default.plans)
    both = mp.search(MODEL, CLUSTER, WORKLOAD, mp.SearchSpace(
        **space, recompute_modules=["core_attn", "layernorm+moe_act", "mla_up_proj"]))
    named = {e.plan.recompute_modules for e in both.plans if e.plan.recompute == "selective"}
    # core_attn is the plan without modules; mla_up_proj is pruned (no MLA) by the stack rule.
    assert named == {None, "moe_act+layernorm"}
    assert both.stats.pruned.get("stack_recompute", 0) > 0


def test_explain_lists_each_module() -> None:
    x = mp.explain(MODEL, CLUSTER, WORKLOAD, BASE + ",recompute_modules=layernorm+moe")
    names = [m["module"] for m in x["recompute_modules"]]
    assert names == ["layernorm", "moe"]
    text = x.to_text()
    assert "recompute modules" in text and "the whole MoE block" in text
    assert "recompute_modules" not in mp.explain(MODEL, CLUSTER, WORKLOAD, BASE).to_dict()
    notes = list(wire.explain_response(x).notes)
    assert len(notes) == 2 and notes[0].startswith("layernorm")


def test_megatron_exports_the_modules_and_reads_them_back_other_stacks_refuse() -> None:
    plan = BASE + ",recompute_modules=layernorm+moe_act"
    text = export(plan, "megatron", model=MODEL, workload=WORKLOAD)
    assert "--recompute-granularity selective" in text
    assert "--recompute-modules moe_act layernorm" in text
    assert parse(text, "megatron", model=MODEL, workload=WORKLOAD).recompute_modules == "moe_act+layernorm"
    plain = export(BASE, "megatron", model=MODEL, workload=WORKLOAD)
    assert "--recompute-modules" not in plain
    assert parse(plain, "megatron", model=MODEL, workload=WORKLOAD).recompute_modules is None
    for fmt in ("torchtitan", "deepspeed", "maxtext"):
        with pytest.raises(InvalidInputError):
            export(plan, fmt, model=MODEL, workload=WORKLOAD)


def test_the_feasible_space_codes_the_module_set() -> None:
    space = mp.SearchSpace(dp=1, tp=1, pp=1, ep=8, zero=[1], max_micro_batch=1,
                           recompute=["selective"], recompute_modules=["layernorm+moe_act"])
    fs = mp.feasible_space(MODEL, CLUSTER, WORKLOAD, space)
    assert fs.num_plans > 0
    labels = set(fs.decode("recompute_modules").tolist())
    assert labels == {"moe_act+layernorm"}
    assert fs.plan(0).recompute_modules == "moe_act+layernorm"
    assert fs.categories["recompute_modules"][0] == "default"
