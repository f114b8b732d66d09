"""Activation offloading to host memory as a plan knob (``Plan.offload_layers``: Megatron-Core's
``cpu_offloading_num_layers`` with ``cpu_offloading_weights=False``): what it takes off the GPU,
what its copies over the host link cost, the one-line errors, explain, the wire and the exports
(docs/costmodel.md §2.4.6, §5.6)."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan import wire
from meshplan.errors import InvalidInputError
from meshplan.export import export, parse

MODEL = "llama3-70b"
CLUSTER = mp.Cluster("gb200-nvl72", 64)
WORKLOAD = mp.Workload(256, 8192, precision="fp8")
#: Megatron-Bridge's Llama-3-70B GB200 FP8-CS recipe: Megatron-FSDP, mbs 2, 40 layers offloaded.
BASE = "dp=64,tp=1,pp=1,micro_batch=2,zero=3,recompute=none"
RECIPE = BASE + ",offload_layers=40"


def test_offloading_takes_the_offloaded_layers_off_the_gpu_at_no_hidden_cost() -> None:
    plain = mp.evaluate(MODEL, CLUSTER, WORKLOAD, BASE)
    off = mp.evaluate(MODEL, CLUSTER, WORKLOAD, RECIPE)
    # 39 of 80 layers' activations leave at the peak (the last group reloaded stays); the LM
    # head's input and logits stay too. One micro-batch in flight (pp = 1).
    layer_gib = mp.explain(MODEL, CLUSTER, WORKLOAD, RECIPE)["offload"]["layer_gib"]
    saved = plain.memory_gib["activations"] - off.memory_gib["activations"]
    assert saved == pytest.approx(39 * layer_gib, rel=1e-9)
    assert saved == pytest.approx(plain.memory_gib["activations"] * 39 / 80, rel=0.05)
    assert off.peak_memory_gib < plain.peak_memory_gib - 100
    # At NVLink-C2C rates each layer's copy hides behind its window of two layers.
    assert off.step_time_s == pytest.approx(plain.step_time_s)
    # Over a 5 GB/s link the copies outlast their windows: the step slows.
    slow = mp.Cluster(mp.Gpu.preset("gb200-nvl72").with_overrides(host_bandwidth_gbps=5.0), 64)
    assert mp.evaluate(MODEL, slow, WORKLOAD, RECIPE).step_time_s > 1.2 * off.step_time_s


def test_explain_says_what_offloading_saves_and_costs() -> None:
    x = mp.explain(MODEL, CLUSTER, WORKLOAD, RECIPE)
    o = x["offload"]
    assert o["layers"] == 40 and o["window_layers"] == 2 and o["host_gbps"] == 225.0
    assert o["copy_s_per_layer"] == pytest.approx(o["layer_gib"] * 2**30 / 225e9)
    assert o["saved_gib_per_micro_batch"] == pytest.approx(39 * o["layer_gib"])
    assert o["exposed_fwd_s_per_micro_batch"] == 0.0
    text = x.to_text()
    assert "activation offloading" in text and "40 layers per chunk" in text
    assert "offload" not in mp.explain(MODEL, CLUSTER, WORKLOAD, BASE)
    notes = wire.explain_response(x).notes
    assert any("40 layers per chunk to host memory" in n for n in notes)


def test_bad_counts_and_stacks_without_it_are_refused() -> None:
    with pytest.raises(InvalidInputError, match=r"plan\.offload_layers: 80 .*0\.\.79"):
        mp.evaluate(MODEL, CLUSTER, WORKLOAD, BASE + ",offload_layers=80")
    with pytest.raises(InvalidInputError, match=r"plan\.offload_layers"):
        mp.Plan.parse(BASE + ",offload_layers=many")
    # Megatron-Core offloads only without pipelining and without recompute.
    full = mp.evaluate(MODEL, CLUSTER, WORKLOAD, RECIPE.replace("recompute=none", "recompute=full"))
    assert not full.feasible
    assert any("recompute = none" in r.message for r in full.reasons)
    tt = mp.Workload(256, 8192, precision="bf16", stack="torchtitan")
    e = mp.evaluate(MODEL, CLUSTER, tt, RECIPE)
    assert any("no activation offloading" in r.message for r in e.reasons)


def test_plans_carry_the_count_over_the_wire_and_into_the_exports() -> None:
    plan = mp.Plan.parse(RECIPE)
    assert plan.offload_layers == 40
    assert str(plan).endswith(",offload_layers=40")
    assert mp.Plan.parse(str(plan)) == plan
    assert mp.Plan.from_dict(plan.to_dict()) == plan
    assert "offload_layers" not in mp.Plan.parse(BASE).to_dict()
    msg = wire.plan_message(plan)
    assert msg.HasField("offload_layers") and msg.offload_layers == 40
    assert wire.plan_from(msg) == plan
    assert not wire.plan_message(mp.Plan.parse(BASE)).HasField("offload_layers")
    flags = export(plan, "megatron", model=MODEL, workload=WORKLOAD)
    assert "--cpu-offloading \\" in flags and "--cpu-offloading-num-layers 40" in flags
    assert parse(flags, "megatron", model=MODEL).offload_layers == 40
    with pytest.raises(InvalidInputError, match="pp = 1 and recompute none"):
        export(mp.Plan.parse("dp=32,tp=1,pp=2,recompute=none,offload_layers=4"), "megatron")
    with pytest.raises(InvalidInputError, match="torchtitan: it has no activation offloading"):
        export(plan, "torchtitan")
    with pytest.raises(InvalidInputError, match="offload_layers = 40"):
        export(plan, "deepspeed", workload=mp.Workload(256, 8192))
