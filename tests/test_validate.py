"""``meshplan.validate`` / ``meshplan validate``: the validator itself, on small hand-made case
files whose answers are known (the accuracy on the published runs is a benchmark, not a test)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import meshplan as mp
from meshplan.cli import main
from meshplan.errors import InvalidCaseError, InvalidInputError

from conftest import REPO_CASES

BASE_CASE: dict[str, Any] = {
    "id": "hand-llama2-7b-8xa100",
    "source": "hand-made test case",
    "task": "pretrain",
    "model": {
        "name": "Llama-2-7B", "arch": "dense", "layers": 32, "hidden": 4096, "heads": 32,
        "kv_heads": 32, "head_dim": None, "ffn_hidden": 11008, "vocab": 32000,
        "activation": "swiglu", "moe": None, "mla": None,
    },
    "cluster": {"gpu": "a100-sxm-80g", "num_gpus": 8, "gpus_per_node": 8, "nvlink_domain": 8},
    "training": {"global_batch": 64, "seq_len": 4096, "precision": "bf16"},
    "plan": {
        "dp": 8, "tp": 1, "pp": 1, "ep": 1, "cp": 1, "vpp": 1, "micro_batch": 1, "zero": 1,
        "recompute": "none", "sequence_parallel": False,
    },
    "measured": {
        "tokens_per_s_per_gpu": None, "step_time_s": None, "model_tflops_per_gpu": None,
        "hardware_tflops_per_gpu": None, "mfu": None, "peak_memory_gib": None,
    },
    "representable": True,
    "unrepresentable_reason": None,
}


def predicted_model(case: dict[str, Any]) -> mp.Model:
    m = case["model"]
    return mp.Model(
        name=m["name"], layers=m["layers"], hidden=m["hidden"], heads=m["heads"],
        kv_heads=m["kv_heads"], ffn_hidden=m["ffn_hidden"], vocab=m["vocab"],
        activation=m["activation"],
    )


def predicted(case: dict[str, Any]) -> mp.Evaluation:
    """What meshplan predicts for ``case``'s plan, through the ordinary API."""
    p = case["plan"]
    model = predicted_model(case)
    c, t = case["cluster"], case["training"]
    cluster = mp.Cluster(c["gpu"], c["num_gpus"], c["gpus_per_node"], c["nvlink_domain"])
    workload = mp.Workload(t["global_batch"], t["seq_len"], t["precision"], grad_bytes=4)
    plan = mp.Plan(
        dp=p["dp"], tp=p["tp"], pp=p["pp"], micro_batch=p["micro_batch"], zero=p["zero"],
        recompute=p["recompute"],
    )
    return mp.evaluate(model, cluster, workload, plan)


def case_with(**measured: float) -> dict[str, Any]:
    case = copy.deepcopy(BASE_CASE)
    case["measured"].update(measured)
    return case


def test_known_throughput_error_and_summary_statistics() -> None:
    exact = predicted(BASE_CASE).tokens_per_s_per_gpu
    fast = case_with(tokens_per_s_per_gpu=exact / 1.25)  # meshplan 25% above the measurement
    fast["id"] = "fast"
    slow = case_with(tokens_per_s_per_gpu=exact / 0.9)  # meshplan 10% below
    slow["id"] = "slow"
    report = mp.validate([fast, slow])
    assert report.case("fast")["signed_error"] == pytest.approx(0.25)
    assert report.case("slow")["signed_error"] == pytest.approx(-0.1)
    assert report.case("fast")["metric"] == "tokens_per_s_per_gpu"
    t = report.summary["throughput"]
    assert t["n"] == 2
    assert t["median_ape"] == pytest.approx((0.25 + 0.1) / 2)
    assert t["p90_ape"] == pytest.approx(0.1 + 0.9 * 0.15)
    assert t["within_10pct"] == pytest.approx(0.5)
    assert t["within_20pct"] == pytest.approx(0.5)
    assert t["median_signed_error"] == pytest.approx(0.075)
    assert report.summary["by_gpu"]["a100-sxm-80g"]["n"] == 2
    assert report.summary["by_arch"]["dense"]["n"] == 2


def test_summary_has_exactly_the_documented_keys() -> None:
    report = mp.validate([case_with(tokens_per_s_per_gpu=3000.0)])
    assert set(report.summary) == {"throughput", "memory", "by_gpu", "by_arch", "by_stack"}
    assert set(report.summary["throughput"]) == {
        "n", "median_ape", "p90_ape", "within_10pct", "within_20pct", "median_signed_error",
    }
    assert set(report.summary["memory"]) == {"n", "median_ape"}
    searched = mp.validate([case_with(tokens_per_s_per_gpu=3000.0)], search=True)
    assert set(searched.summary) == {
        "throughput", "memory", "by_gpu", "by_arch", "by_stack", "feasible_recall", "regret",
    }
    assert set(searched.summary["regret"]) == {"n", "median", "p90"}


def test_step_time_and_tflops_are_converted_to_tokens_per_second() -> None:
    ev = predicted(BASE_CASE)
    tokens_per_step = 64 * 4096
    by_step = case_with(step_time_s=ev.step_time_s)
    row = mp.validate([by_step]).cases[0]
    assert row["metric"] == "step_time_s"
    assert row["measured_tokens_per_s_per_gpu"] == pytest.approx(tokens_per_step / (ev.step_time_s * 8))
    assert row["ape"] == pytest.approx(0.0, abs=1e-9)
    # Model TFLOP/s of a non-Megatron-Bridge source count attention at full s (6N + 12·L·h·s).
    model = predicted(BASE_CASE)
    matmul_params = 32 * (4 * 4096**2 + 3 * 4096 * 11008) + 32000 * 4096  # layers + LM head
    flops_per_token = 6 * matmul_params + 6 * 32 * 32 * (128 + 128) * 4096
    by_tflops = case_with(model_tflops_per_gpu=model.tokens_per_s_per_gpu * flops_per_token / 1e12)
    row = mp.validate([by_tflops]).cases[0]
    assert row["metric"] == "model_tflops_per_gpu"
    assert row["ape"] == pytest.approx(0.0, abs=1e-6)


def test_memory_is_compared_when_measured() -> None:
    ev = predicted(BASE_CASE)
    row = mp.validate([case_with(peak_memory_gib=ev.peak_memory_gib * 0.8)]).cases[0]
    assert row["memory"]["ape"] == pytest.approx(0.25)


def test_unknown_knobs_get_documented_defaults_and_are_reported() -> None:
    case = case_with(tokens_per_s_per_gpu=3000.0)
    case["plan"].update({"zero": None, "recompute": None, "micro_batch": None})
    row = mp.validate([case]).cases[0]
    assert set(row["defaults"]) >= {"plan.zero", "plan.recompute", "plan.micro_batch"}
    assert "zero=1" in row["plan"] and "micro_batch=1" in row["plan"]
    # The least recompute that fits: this plan fits without any.
    assert "recompute=none" in row["plan"]


def test_torchtitan_runs_get_its_checkpointing_policy_and_its_eager_loss() -> None:
    # The same run under a torchtitan source: "selective" is its op-level policy and the loss
    # holds fp32 logits, so the prediction is that of the API with those two settings.
    case = case_with(peak_memory_gib=50.0)
    case["source"] = "torchtitan (hand-made test case)"
    case["plan"].update({"zero": 3, "recompute": "selective"})
    row = mp.validate([case]).cases[0]
    assert "recompute=selective-op" in row["plan"]
    assert row["stack"] == "torchtitan"  # and it is timed as torchtitan runs it
    c, t = case["cluster"], case["training"]
    expected = mp.evaluate(
        predicted_model(case), mp.Cluster(c["gpu"], c["num_gpus"]),
        mp.Workload(t["global_batch"], t["seq_len"], fused_cross_entropy=False,
                    stack="torchtitan"),
        "dp=8,tp=1,pp=1,zero=3,recompute=selective-op",
    )
    assert row["memory"]["predicted_gib"] == pytest.approx(expected.peak_memory_gib, rel=1e-12)
    assert row["predicted_tokens_per_s_per_gpu"] == pytest.approx(
        expected.tokens_per_s_per_gpu, rel=1e-12)


def test_llama3_fsdp_variant_reduces_gradients_once_per_step() -> None:
    # Llama 3 accumulates fp32 gradients over the micro-batches and reduce-scatters them once:
    # its "ZeRO-2-like" plan is evaluated as ZeRO-1, and the row says so.
    case = case_with(tokens_per_s_per_gpu=3000.0)
    case["source"] = "Llama Team, AI @ Meta 2024 (hand-made test case)"
    case["plan"]["zero"] = 2
    row = mp.validate([case]).cases[0]
    assert "zero=1" in row["plan"]
    assert any(d.startswith("plan.zero=1 (Llama 3") for d in row["defaults"])
    case["source"] = "hand-made test case"
    assert "zero=2" in mp.validate([case]).cases[0]["plan"]


def test_unrepresentable_cases_are_listed_with_their_reason() -> None:
    case = copy.deepcopy(BASE_CASE)
    case.update(representable=False, unrepresentable_reason="hybrid Mamba layers")
    case["plan"]["dp"] = None  # unrepresentable cases may leave required fields unknown
    row = mp.validate([case]).cases[0]
    assert row["status"] == "unrepresentable"
    assert row["reason"] == "hybrid Mamba layers"


def test_search_reports_rank_regret_and_feasibility() -> None:
    report = mp.validate([case_with(tokens_per_s_per_gpu=3000.0)], search=True)
    row = report.cases[0]
    assert row["feasible"] is True
    assert row["rank"] >= 1
    assert row["regret"] >= 0
    assert row["best_tokens_per_s_per_gpu"] >= row["predicted_tokens_per_s_per_gpu"]
    assert report.summary["feasible_recall"] == 1.0


def test_calibration_overrides_change_the_prediction() -> None:
    case = case_with(tokens_per_s_per_gpu=3000.0)
    base = mp.validate([case]).cases[0]["predicted_tokens_per_s_per_gpu"]
    slower = mp.validate([case], calibration={"a100-sxm-80g": {"gemm_efficiency": {"bf16": 0.3}}})
    assert slower.cases[0]["predicted_tokens_per_s_per_gpu"] < base
    wildcard = mp.validate([case], calibration={"*": {"gemm_efficiency": {"bf16": 0.3}}})
    assert wildcard.cases[0]["predicted_tokens_per_s_per_gpu"] == pytest.approx(
        slower.cases[0]["predicted_tokens_per_s_per_gpu"]
    )


def test_calibrated_cluster_carries_the_overrides(tmp_path: Path) -> None:
    path = tmp_path / "cal.toml"
    path.write_text("[a100-sxm-80g]\nfixed_memory_gib = 3.5\n")
    cluster = mp.calibrated(mp.Cluster("a100-sxm-80g", 8), path)
    assert isinstance(cluster.gpu, mp.Gpu)
    assert cluster.gpu.calibration["fixed_memory_gib"] == 3.5


@pytest.mark.parametrize(
    "mutate, names",
    [
        (lambda c: c["model"].pop("layers"), ["case 0", "layers"]),
        (lambda c: c["plan"].update(tp="eight"), ["case 0", "plan.tp"]),
        (lambda c: c["training"].update(precision="fp6"), ["case 0", "training.precision"]),
    ],
)
def test_schema_errors_name_the_case_and_field(mutate: Any, names: list[str]) -> None:
    case = copy.deepcopy(BASE_CASE)
    mutate(case)
    with pytest.raises(InvalidCaseError) as info:
        mp.validate([case])
    for name in names:
        assert name in str(info.value)
    assert BASE_CASE["id"] in str(info.value)


def test_a_file_that_is_not_a_list_of_cases_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "cases.json"
    path.write_text('{"id": "not a list"}')
    with pytest.raises(InvalidInputError, match="cases"):
        mp.validate(path)


@pytest.mark.parametrize(
    "calibration, field",
    [
        ({"h100-sxmm": {"tp_overlap": 0.5}}, "h100-sxmm"),
        ({"h100-sxm": {"tp_overlapp": 0.5}}, "tp_overlapp"),
        ({"h100-sxm": {"tp_overlap": 1.5}}, "tp_overlap"),
    ],
)
def test_bad_calibration_names_the_field(calibration: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError, match=field):
        mp.validate([case_with(tokens_per_s_per_gpu=3000.0)], calibration=calibration)
    with pytest.raises(InvalidInputError, match=field):
        mp.calibrated(mp.Cluster("h100-sxm", 8), calibration)


def test_cli_prints_the_summary_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([case_with(tokens_per_s_per_gpu=3000.0)]))
    assert main(["validate", str(path)]) == 0
    text = capsys.readouterr().out
    assert "1 cases: 1 evaluated" in text and "median APE" in text
    assert main(["validate", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"cases", "summary"}
    assert data["cases"][0]["id"] == BASE_CASE["id"]


def test_cli_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("meshplan: error:") and "missing.json" in err[0]
    bad = tmp_path / "bad.json"
    case = copy.deepcopy(BASE_CASE)
    case["plan"]["dp"] = "x"
    bad.write_text(json.dumps([case]))
    assert main(["validate", str(bad)]) == 2
    assert "plan.dp" in capsys.readouterr().err


def test_cli_calibration_flag_applies_to_search(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["evaluate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
            "--global-batch", "64", "--seq-len", "4096", "--plan", "dp=8,tp=1,pp=1,zero=1", "--json"]
    assert main(args) == 0
    base = json.loads(capsys.readouterr().out)["step_time_s"]
    cal = tmp_path / "slow.toml"
    cal.write_text("[h100-sxm]\ngemm_efficiency = { bf16 = 0.3 }\n")
    assert main([*args, "--calibration", str(cal)]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] > base


def test_every_published_case_file_row_is_accounted_for() -> None:
    """The shipped copy of the published runs: every case is evaluated or listed with a reason."""
    report = mp.validate(REPO_CASES)
    statuses = {row["status"] for row in report.cases}
    assert statuses <= {"ok", "unrepresentable"}
    assert all(row.get("reason") for row in report.cases if row["status"] == "unrepresentable")
    # Every evaluated row with a measured throughput is in the throughput summary, every one
    # with a measured peak memory in the memory summary (torchtune's LoRA rows have only memory).
    ok = [row for row in report.cases if row["status"] == "ok"]
    assert report.summary["throughput"]["n"] == sum("metric" in row for row in ok)
    assert report.summary["memory"]["n"] == sum("memory" in row for row in ok)
    assert all("metric" in row or "memory" in row for row in ok)


def test_each_case_is_timed_and_summarised_under_its_stack() -> None:
    # The same run from four sources: megatron-core by default, torchtitan, the SC21 DeepSpeed
    # ZeRO-3 runs (by case id) and a MaxText recipe; each row names its stack, each prediction
    # is the API's under that stack, and the summary has one group per stack.
    cases = []
    for source, ident, stack in [
        ("hand-made test case", "hand-a", "megatron-core"),
        ("torchtitan (hand-made test case)", "hand-b", "torchtitan"),
        ("hand-made test case", "narayanan21-t2-ZeRO-3-hand", "deepspeed"),
        ("NVIDIA DGX Cloud Benchmarking recipe, MaxText (JAX) hand", "hand-d", "maxtext"),
    ]:
        case = case_with(tokens_per_s_per_gpu=3000.0)
        case.update(id=ident, source=source)
        # Two nodes, so that the ZeRO-3 collectives cross the network.
        case["cluster"]["num_gpus"] = 16
        case["plan"].update({"dp": 16, "zero": 3, "recompute": "full"})
        cases.append((case, stack))
    report = mp.validate([c for c, _ in cases])
    assert [r["stack"] for r in report.cases] == [s for _, s in cases]
    assert set(report.summary["by_stack"]) == {s for _, s in cases}
    assert all(v["n"] == 1 for v in report.summary["by_stack"].values())
    deepspeed = report.case("narayanan21-t2-ZeRO-3-hand")
    megatron = report.case("hand-a")
    # DeepSpeed's 2021 ZeRO-3 moves each rank's bytes over its own NIC and hides half of them
    # (zero3_per_rank_nic, dp_overlap 0.5 in its profile): slower across nodes.
    assert deepspeed["predicted_tokens_per_s_per_gpu"] < megatron["predicted_tokens_per_s_per_gpu"]


def test_a_case_states_its_dispatcher_and_ep_overlap() -> None:
    """``plan.dispatcher`` / ``plan.ep_overlap`` of a case reach the evaluated plan; unset, the
    stack's defaults (megatron-core: flex, no overlap) are used; EP overlap hides exchange time."""
    case = copy.deepcopy(BASE_CASE)
    case["id"] = "hand-mixtral-16xh100"
    case["model"].update(
        name="Mixtral-8x7B", arch="moe", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
        moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden": 14336},
    )
    case["cluster"] = {"gpu": "h100-sxm", "num_gpus": 16, "gpus_per_node": 8, "nvlink_domain": 8}
    case["plan"].update(dp=1, tp=1, pp=2, ep=8, vpp=4, micro_batch=1, zero=1, recompute="selective")
    plain = mp.validate([case]).cases[0]
    stated = copy.deepcopy(case)
    stated["plan"].update(dispatcher="alltoall", ep_overlap=True)
    row = mp.validate([stated]).cases[0]
    assert row["status"] == "ok" and plain["status"] == "ok"
    assert "dispatcher=alltoall,ep_overlap=true" in row["plan"]
    assert "dispatcher" not in plain["plan"] and "ep_overlap" not in plain["plan"]
    assert row["predicted_tokens_per_s_per_gpu"] > plain["predicted_tokens_per_s_per_gpu"]
