"""Every published training run marked representable can be expressed and evaluated.

``validation/cases.json`` is the repository's copy of the published runs (see validation/README.md). This
test checks the foundation, not fidelity: each run must map onto a Plan that ``evaluate``
accepts (it may still come back infeasible; how close the numbers are is the fidelity work's).

Unknown (null) values are filled with framework defaults, as the cases' README asks:
``head_dim`` null → hidden/heads (omitted); ``activation`` null → swiglu; ``vpp`` null → 1;
``zero`` null → 1 (Megatron's distributed optimizer); ``recompute`` null → none;
``micro_batch`` null → 1; ``sequence_parallel`` null → on when tp > 1 (Megatron-Bridge's default
with TP); ``ffn_hidden`` null on an all-MoE model → the expert size (no dense FFN is used);
``vocab`` null → 51200 (the padded GPT-2 vocabulary of the Megatron GPT runs that lack it);
``global_batch`` null → dp·ep·micro_batch·pp (pp micro-batches, the least that fills the
pipeline).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import REPO_CASES

import meshplan as mp

CASES: list[dict[str, Any]] = json.loads(REPO_CASES.read_text())
REPRESENTABLE = [c for c in CASES if c["representable"]]
MEGATRON_GPT_VOCAB = 51200


def model_of(case: dict[str, Any]) -> mp.Model:
    m = case["model"]
    moe = m["moe"]
    ffn = m["ffn_hidden"]
    if ffn is None:
        assert moe is not None and moe["first_dense_layers"] == 0, case["id"]
        ffn = moe["expert_ffn_hidden"]
    return mp.Model(
        name=case["id"],
        layers=m["layers"],
        hidden=m["hidden"],
        heads=m["heads"],
        kv_heads=m["kv_heads"],
        head_dim=m["head_dim"],
        ffn_hidden=ffn,
        vocab=m["vocab"] if m["vocab"] is not None else MEGATRON_GPT_VOCAB,
        activation=m["activation"] or "swiglu",
        moe=None if moe is None else mp.Moe(
            num_experts=moe["num_experts"],
            top_k=moe["top_k"],
            expert_ffn_hidden=moe["expert_ffn_hidden"],
            shared_experts=moe["shared_experts"] or 0,
            first_dense_layers=moe["first_dense_layers"] or 0,
        ),
        mla=None if m["mla"] is None else mp.Mla(**m["mla"]),
    )


def plan_of(case: dict[str, Any]) -> mp.Plan:
    p = case["plan"]
    vpp = p["vpp"] or 1
    return mp.Plan(
        dp=p["dp"], tp=p["tp"], pp=p["pp"], ep=p["ep"], cp=p["cp"],
        vpp=vpp,
        micro_batch=p["micro_batch"] or 1,
        zero=1 if p["zero"] is None else p["zero"],
        recompute=p["recompute"] or "none",
        sequence_parallel=p["tp"] > 1 if p["sequence_parallel"] is None else p["sequence_parallel"],
        schedule="interleaved-1f1b" if vpp > 1 else None,
        etp=p.get("etp"),
    )


def workload_of(case: dict[str, Any], plan: mp.Plan) -> mp.Workload:
    t = case["training"]
    batch = t["global_batch"]
    if batch is None:
        batch = plan.dense_dp * plan.micro_batch * plan.pp
    return mp.Workload(global_batch=batch, seq_len=t["seq_len"], precision=t["precision"])


def cluster_of(case: dict[str, Any]) -> mp.Cluster:
    c = case["cluster"]
    return mp.Cluster(c["gpu"], c["num_gpus"], c["gpus_per_node"], c["nvlink_domain"])


def test_there_are_representable_cases() -> None:
    assert len(REPRESENTABLE) >= 200
    assert len({c["id"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", REPRESENTABLE, ids=[c["id"] for c in REPRESENTABLE])
def test_case_evaluates(case: dict[str, Any]) -> None:
    plan = plan_of(case)
    ev = mp.evaluate(model_of(case), cluster_of(case), workload_of(case, plan), plan)
    assert ev.plan.dp == plan.dp and ev.plan.vpp == plan.vpp
    assert ev.step_time_s > 0 and ev.peak_memory_gib > 0
    assert ev.feasible or ev.reasons  # an infeasible plan always says why

