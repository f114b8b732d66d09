"""MoE parallel folding (``Plan.etp``) through the Python API, the CLI, the exporters and a real
gRPC server on 127.0.0.1: a folded plan evaluates, explains its expert mesh, round-trips through
every format that can run it and is refused, with the reason, by those that cannot; the search
returns folded plans unless told not to."""

from __future__ import annotations

import json

import pytest

import meshplan as mp
from meshplan.explain import format_explanation
from meshplan.export import export as export_plan
from meshplan.export import parse as parse_export
from meshplan.cli import main
from meshplan.client import PlannerClient
from meshplan.errors import InvalidInputError

# Qwen3-235B-A22B as Megatron-Bridge runs it on 256 H100 (validation/cases.json): TP 2, PP 8,
# Megatron DP 16, EP 32 over the TP and DP ranks, expert TP 1.
QWEN = "qwen3-235b-a22b"
CLUSTER = mp.Cluster("h100-sxm", 256)
WORKLOAD = mp.Workload(8192, 4096, precision="fp8")
FOLDED = mp.Plan(dp=16, tp=2, pp=8, ep=32, etp=1, vpp=4, sequence_parallel=True, zero=1,
                 schedule="interleaved-1f1b")


def test_a_folded_plan_counts_its_gpus_without_ep() -> None:
    assert FOLDED.folded and FOLDED.num_gpus == 256
    assert (FOLDED.dense_dp, FOLDED.expert_tp, FOLDED.expert_dp) == (16, 1, 1)
    unfolded = mp.Plan(dp=2, tp=2, pp=8, ep=8, vpp=4)
    assert not unfolded.folded and unfolded.num_gpus == 256 and unfolded.dense_dp == 16
    assert mp.Plan.parse(str(FOLDED)) == FOLDED
    assert "etp=1" in str(FOLDED) and "etp" not in str(unfolded)
    assert mp.Plan.from_dict(FOLDED.to_dict()) == FOLDED


@pytest.mark.parametrize("bad", [0, 2**31, 2**32, 2**64 - 1])
def test_a_bad_etp_is_one_line_naming_the_field(bad: int) -> None:
    with pytest.raises(InvalidInputError) as e:
        mp.Plan(dp=16, tp=2, pp=8, ep=32, etp=bad)
    assert "plan.etp" in str(e.value) and "\n" not in str(e.value)


def test_etp_that_does_not_divide_a_stage_is_refused_by_the_core() -> None:
    plan = mp.Plan(dp=16, tp=2, pp=8, ep=32, etp=2, vpp=4, sequence_parallel=True)
    with pytest.raises(InvalidInputError) as e:
        mp.evaluate(QWEN, CLUSTER, WORKLOAD, plan)
    assert "plan.etp" in str(e.value) and "32 ranks" in str(e.value)


def test_the_published_folded_plan_evaluates_near_its_measured_throughput() -> None:
    ev = mp.evaluate(QWEN, CLUSTER, WORKLOAD, FOLDED)
    assert ev.feasible, ev.reasons
    assert ev.plan.etp == 1
    # Megatron-Bridge 26.04: 1,712 tokens/s per GPU (validation/cases.json).
    assert ev.tokens_per_s_per_gpu == pytest.approx(1712, rel=0.10)
    # Whole experts (etp = 1) hold twice the expert weights per GPU of experts split etp = 2.
    whole = mp.evaluate(QWEN, CLUSTER, WORKLOAD, mp.Plan(**{**FOLDED.to_dict(), "ep": 16}))
    halves = mp.evaluate(QWEN, CLUSTER, WORKLOAD, mp.Plan(**{**FOLDED.to_dict(), "ep": 16,
                                                             "etp": 2}))
    assert halves.memory_gib["weights"] < whole.memory_gib["weights"]


def test_explain_shows_the_expert_mesh_beside_the_dense_one() -> None:
    x = mp.explain(QWEN, CLUSTER, WORKLOAD, FOLDED)
    mesh = x.to_dict()["mesh"]
    dense = {a["axis"]: a["size"] for a in mesh["axes"]}
    expert = {a["axis"]: a["size"] for a in mesh["expert_axes"]}
    assert dense["ep"] == 1 and dense["dp"] == 16 and dense["tp"] == 2
    assert expert["tp"] == 1 and expert["ep"] == 32 and expert["dp"] == 1
    groups = {g["axis"]: g for g in mesh["groups"]}
    assert groups["ep"]["size"] == 32 and groups["ep"]["example_ranks"][:4] == [0, 1, 2, 3]
    ep = next(a for a in x.axes if a["axis"] == "ep")
    assert "Folded" in ep["state_sharded"] and "1 × 32 × 1 × 8" in ep["state_sharded"]
    assert any("expert mesh: EP group of 32" in n for n in ep["notes"])
    assert "expert mesh etp=1 (stride 1)  ep=32 (stride 1)" in format_explanation(x)


def test_an_expert_tp_group_carries_the_routed_copies() -> None:
    plan = mp.Plan(dp=16, tp=4, pp=4, ep=16, etp=2, vpp=2, sequence_parallel=True, zero=1)
    x = mp.explain(QWEN, CLUSTER, WORKLOAD, plan)
    tp = next(a for a in x.axes if a["axis"] == "tp")
    etp = [c for c in tp["collectives"] if "expert TP group (etp = 2)" in c["when"]]
    assert etp and all(c["count_per_step"] > 0 for c in etp)


def test_search_returns_folded_plans_unless_told_not_to() -> None:
    space = mp.SearchSpace(top_k=50, distinct=False)
    found = mp.search("mixtral-8x22b", mp.Cluster("h100-sxm", 96), mp.Workload(96, 16384), space)
    assert any(ev.plan.etp is not None for ev in found.plans)
    off = mp.search("mixtral-8x22b", mp.Cluster("h100-sxm", 96), mp.Workload(96, 16384),
                    mp.SearchSpace(top_k=50, distinct=False, fold=False))
    assert all(ev.plan.etp is None for ev in off.plans)
    assert off.stats.candidates < found.stats.candidates
    fixed = mp.search("mixtral-8x22b", mp.Cluster("h100-sxm", 96), mp.Workload(96, 16384),
                      mp.SearchSpace(top_k=20, etp=1))
    assert all(ev.plan.etp == 1 or (ev.plan.etp is None and ev.plan.tp == 1)
               for ev in fixed.plans)


def test_the_cli_shows_an_etp_column_and_honours_no_fold(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["search", "--model", "mixtral-8x22b", "--gpu", "h100-sxm", "--gpus", "96",
            "--global-batch", "96", "--seq-len", "16384", "--top-k", "5"]
    assert main(args) == 0
    assert " etp " in capsys.readouterr().out
    assert main([*args, "--no-fold", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and all(p["etp"] is None for p in plans)


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan", "torchtitan-toml"])
def test_exports_carry_etp_and_read_back(fmt: str) -> None:
    text = export_plan(FOLDED, fmt, model=QWEN, workload=WORKLOAD)
    assert "dp·tp·pp·cp" in text
    assert ("--expert-tensor-parallel-size 1" in text) if fmt == "megatron" else (
        "expert_tensor_parallel_degree" in text)
    back = parse_export(text, fmt, model=QWEN, workload=WORKLOAD)
    want = FOLDED.to_dict()
    if fmt == "megatron":
        want["dispatcher"] = "flex"  # the stack's default, made explicit by the export
    else:
        want["dispatcher"] = "alltoall"  # torchtitan's only exchange
        want["zero"] = back.zero  # torchtitan states ZeRO through FSDP's resharding
    assert back.to_dict() == want


def test_exports_that_cannot_fold_say_why() -> None:
    with pytest.raises(InvalidInputError, match="etp = 1"):
        export_plan(FOLDED, "deepspeed", workload=WORKLOAD)
    with pytest.raises(InvalidInputError, match="etp = 1"):
        export_plan(FOLDED, "maxtext", workload=WORKLOAD)
    with pytest.raises(InvalidInputError, match="sequence parallelism"):
        export_plan(mp.Plan(**{**FOLDED.to_dict(), "sequence_parallel": False}), "megatron")
    with pytest.raises(InvalidInputError, match="etp = 2"):
        export_plan(mp.Plan(dp=16, tp=4, pp=4, ep=16, etp=2, zero=1, sequence_parallel=True),
                      "torchtitan")
    mesh = export_plan(FOLDED, "device-mesh")
    assert "expert_mesh = init_device_mesh(" in mesh and "('pp', 'edp', 'ep', 'etp')" in mesh



def test_a_folded_plan_over_grpc_equals_the_python_api(planner_client: PlannerClient) -> None:
    local = mp.evaluate(QWEN, CLUSTER, WORKLOAD, FOLDED)
    remote = planner_client.evaluate(QWEN, CLUSTER, WORKLOAD, FOLDED)
    assert remote.plan == local.plan and remote.plan.etp == 1
    assert remote.step_time_s == pytest.approx(local.step_time_s)
    x = planner_client.explain(QWEN, CLUSTER, WORKLOAD, FOLDED)
    assert [a["axis"] for a in x.to_dict()["mesh"]["expert_axes"]] == ["tp", "cp", "ep", "dp", "pp"]
    found = planner_client.search("mixtral-8x22b", mp.Cluster("h100-sxm", 96), mp.Workload(96, 16384),
                          mp.SearchSpace(top_k=10, fold=False, distinct=False))
    assert all(ev.plan.etp is None for ev in found.plans)
