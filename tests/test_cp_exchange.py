"""Context parallelism's exchange as a plan knob (``Plan.cp_exchange``): ring, all-gather,
Ulysses all-to-all and the hierarchical a2a+p2p, priced by the collective model, constrained
as Megatron/TransformerEngine constrain them, searched when asked for, carried by the wire and
the exports (docs/costmodel.md §3.8)."""

from __future__ import annotations

import json

import pytest

import meshplan as mp
from meshplan import wire
from meshplan.cli import main
from meshplan.errors import InvalidInputError
from meshplan.export import export, parse

MODEL = "llama3-8b"
ONE_NODE = mp.Cluster("h100-sxm", 8)
TWO_NODES = mp.Cluster("h100-sxm", 16)


def test_ulysses_exposes_four_all_to_alls_per_pass_and_the_default_is_the_ring() -> None:
    workload = mp.Workload(8, 16384)
    ring = mp.evaluate(MODEL, ONE_NODE, workload, "dp=1,tp=1,pp=1,cp=8,zero=1")
    named = mp.evaluate(MODEL, ONE_NODE, workload, "dp=1,tp=1,pp=1,cp=8,zero=1,cp_exchange=ring")
    assert named.step_time_s == ring.step_time_s and named.time_s == ring.time_s
    a2a = mp.evaluate(MODEL, ONE_NODE, workload, "dp=1,tp=1,pp=1,cp=8,zero=1,cp_exchange=a2a")
    assert a2a.feasible
    # Attention's FLOPs are the same, but Ulysses calls the kernel over the whole 16,384 tokens
    # (the ring per 2,048-token block), where flash attention runs faster (docs/costmodel.md
    # §5.2); the all-to-alls cannot hide behind it.
    assert 0.9 * ring.time_s["compute"] < a2a.time_s["compute"] < ring.time_s["compute"]
    assert a2a.time_s["cp"] > ring.time_s["cp"]
    x = mp.explain(MODEL, ONE_NODE, workload, "dp=1,tp=1,pp=1,cp=8,zero=1,cp_exchange=a2a")
    cp = next(a for a in x.axes if a["axis"] == "cp")
    ops = [c["op"] for c in cp["collectives"]]
    assert ops == ["all-to-all"] * 8
    # 2048 local tokens: Q (and the output) 2048·32·128·2 B, K and V 2048·8·128·2 B.
    assert [c["message_bytes"] for c in cp["collectives"][:4]] == [
        16_777_216, 4_194_304, 4_194_304, 16_777_216]
    assert abs(sum(c["seconds_per_step"] for c in cp["collectives"]) - a2a.time_s["cp"]) < 1e-9


def test_a2a_needs_heads_and_kv_groups_divisible_and_the_stack_to_offer_it() -> None:
    workload = mp.Workload(16, 32768)
    ev = mp.evaluate(MODEL, TWO_NODES, workload, "dp=1,tp=2,pp=1,cp=8,zero=1,cp_exchange=a2a")
    assert not ev.feasible
    assert any(r.rule == "stack_parallelism" and "tp·cp = 16" in r.message for r in ev.reasons)
    titan = mp.Workload(16, 32768, stack="torchtitan")
    ev = mp.evaluate(MODEL, TWO_NODES, titan, "dp=2,tp=1,pp=1,cp=8,zero=1,cp_exchange=a2a")
    assert any("no a2a context-parallel exchange" in r.message for r in ev.reasons)
    with pytest.raises(InvalidInputError) as e:
        mp.evaluate(MODEL, ONE_NODE, mp.Workload(8, 16384),
                    "dp=1,tp=1,pp=1,cp=8,zero=1,cp_exchange=ulysses")
    assert "plan.cp_exchange" in str(e.value) and "a2a" in str(e.value)


def test_hierarchical_a2a_stays_in_the_node_and_rings_across() -> None:
    workload = mp.Workload(16, 32768)
    x = mp.explain(MODEL, TWO_NODES, workload, "dp=1,tp=1,pp=1,cp=16,zero=1,cp_exchange=a2a+p2p")
    assert x.evaluation.feasible
    cp = next(a for a in x.axes if a["axis"] == "cp")
    ops = [c["op"] for c in cp["collectives"]]
    assert ops.count("all-to-all") == 8 and ops.count("send-recv") == 2
    assert any("--hierarchical-context-parallel-sizes 8 2" in n for n in cp["notes"])


@pytest.mark.parametrize("model,gpus", [("llama3-8b", 64), ("llama3-70b", 128)])
def test_a_million_tokens_with_cp_8_to_16_finds_a_feasible_plan(model: str, gpus: int) -> None:
    cluster = mp.Cluster("h100-sxm", gpus)
    workload = mp.Workload(gpus // 16, 1 << 20)
    space = mp.SearchSpace(min_cp=8, max_cp=16, top_k=5,
                           cp_exchanges=["ring", "allgather", "a2a", "a2a+p2p"])
    result = mp.search(model, cluster, workload, space)
    assert result.plans, result
    best = result.plans[0]
    assert best.feasible and 8 <= best.plan.cp <= 16 and best.plan.cp_exchange is not None
    x = mp.explain(model, cluster, workload, best.plan)
    cp = next(a for a in x.axes if a["axis"] == "cp")
    assert cp["collectives"] and cp["notes"]
    # The exchange the plan names is the one explain prices.
    ops = {c["op"] for c in cp["collectives"]}
    expected = {"ring": {"send-recv"}, "allgather": {"all-gather", "reduce-scatter"},
                "a2a": {"all-to-all"}, "a2a+p2p": {"all-to-all", "send-recv"}}
    assert ops <= expected[best.plan.cp_exchange] | {"send-recv"}, (best.plan, ops)


def test_the_search_names_the_exchange_only_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    workload = mp.Workload(16, 65536)
    default = mp.search(MODEL, TWO_NODES, workload, mp.SearchSpace(min_cp=2, top_k=50,
                                                                   distinct=False))
    assert default.plans and all(e.plan.cp_exchange is None for e in default.plans)
    both = mp.search(MODEL, TWO_NODES, workload,
                     mp.SearchSpace(min_cp=2, top_k=50, distinct=False,
                                    cp_exchanges=["ring", "a2a"]))
    assert both.stats.candidates > default.stats.candidates
    assert {e.plan.cp_exchange for e in both.plans} <= {"ring", "a2a"}
    args = ["search", "--model", MODEL, "--gpu", "h100-sxm", "--gpus", "16", "--global-batch",
            "16", "--seq-len", "65536", "--min-cp", "2", "--cp-exchanges", "a2a", "--json"]
    assert main(args) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and all(p["cp_exchange"] == "a2a" for p in plans)


def test_wire_and_exports_carry_the_exchange() -> None:
    plan = mp.Plan.parse("dp=1,tp=1,pp=1,cp=8,zero=1,schedule=1f1b,cp_exchange=a2a")
    assert plan.cp_exchange == "a2a" and "cp_exchange=a2a" in str(plan)
    assert wire.plan_from(wire.plan_message(plan)) == plan
    msg = wire.space_message(mp.SearchSpace(cp_exchanges=["ring", "a2a+p2p"]))
    assert list(msg.cp_exchanges) == ["ring", "a2a+p2p"]
    assert wire.space_from(msg).cp_exchanges == ["ring", "a2a+p2p"]
    workload = mp.Workload(8, 16384)
    text = export(plan, "megatron", model=MODEL, workload=workload)
    assert "--cp-comm-type a2a" in text
    assert parse(text, "megatron", model=MODEL, workload=workload) == plan
    ring = export("dp=1,tp=1,pp=1,cp=8,zero=1,cp_exchange=ring", "megatron", model=MODEL,
                  workload=workload)
    assert "--cp-comm-type p2p" in ring
    # Unnamed: the stack's default, Megatron's own (no flag; the plan reads back unnamed).
    default = export("dp=1,tp=1,pp=1,cp=8,zero=1", "megatron", model=MODEL, workload=workload)
    assert "--cp-comm-type" not in default
    assert parse(default, "megatron", model=MODEL, workload=workload).cp_exchange is None
    with pytest.raises(InvalidInputError, match="hierarchical-context-parallel-sizes"):
        export("dp=1,tp=1,pp=1,cp=8,zero=1,cp_exchange=a2a+p2p", "megatron", model=MODEL,
               workload=workload)
    titan = mp.Workload(8, 16384, stack="torchtitan")
    with pytest.raises(InvalidInputError, match="no a2a context-parallel exchange"):
        export("dp=1,tp=1,pp=1,cp=8,zero=2,cp_exchange=a2a", "torchtitan", model=MODEL,
               workload=titan)


def test_ulysses_stores_the_attention_output_in_both_layouts() -> None:
    # 2048 local tokens × 32 heads × 128 × 2 B × 32 layers = 0.5 GiB more without recompute.
    workload = mp.Workload(8, 16384)
    ring = mp.evaluate(MODEL, ONE_NODE, workload, "dp=1,tp=1,pp=1,cp=8,zero=1,recompute=none")
    a2a = mp.evaluate(MODEL, ONE_NODE, workload,
                      "dp=1,tp=1,pp=1,cp=8,zero=1,recompute=none,cp_exchange=a2a")
    assert abs(a2a.memory_gib["activations"] - ring.memory_gib["activations"] - 0.5) < 1e-9


def test_an_in_place_fused_loss_keeps_2_bytes_per_logit() -> None:
    # Long context makes the logits large: 16384 local tokens × 128256 / 1 × (4 + 2·2 − 2) B.
    workload = mp.Workload(8, 131072)
    in_place = mp.Workload(8, 131072, cross_entropy_in_place=True)
    plan = "dp=1,tp=1,pp=1,cp=8,zero=1,recompute=full"
    a = mp.evaluate(MODEL, ONE_NODE, workload, plan)
    b = mp.evaluate(MODEL, ONE_NODE, in_place, plan)
    saved = 16384 * 128256 * 6 / 2**30
    fragmentation = 1.05  # the GPU's calibration.fragmentation over activations and transients
    assert abs((a.peak_memory_gib - b.peak_memory_gib) - saved * fragmentation) < 1e-6
    assert wire.workload_from(wire.workload_message(in_place)) == in_place
    with pytest.raises(InvalidInputError, match="workload.cross_entropy_in_place"):
        mp.evaluate(MODEL, ONE_NODE, mp.Workload(8, 131072, fused_cross_entropy=False,
                                                 cross_entropy_in_place=True), plan)
