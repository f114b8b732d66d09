"""Cross-validation of the fitted constants (``meshplan validate --cross-validate``) and the
GEMM-efficiency fit it reuses, on the repository's published runs (validation/cases.json)."""

from __future__ import annotations

import json
import statistics
from typing import Any

import pytest
from conftest import REPO_CASES

import meshplan as mp
from meshplan.cli import main
from meshplan.validation import balanced_median, fit_gemm_efficiency, source_family, summarize

CASES: list[dict[str, Any]] = json.loads(REPO_CASES.read_text())


def test_summarize_reproduces_the_core_summary_bit_for_bit() -> None:
    """The Python statistics used for cross-validation are the core's (same percentiles)."""
    report = mp.validate(REPO_CASES)
    s = summarize(report.cases)
    assert s["throughput"] == report.summary["throughput"]
    assert s["by_gpu"] == report.summary["by_gpu"]
    assert s["by_arch"] == report.summary["by_arch"]
    assert s["by_stack"] == report.summary["by_stack"]


def test_fit_recovers_a_perturbed_efficiency_and_zeroes_the_median_error() -> None:
    """Starting from an h100-sxm bf16 efficiency 20 % too low, the fit comes back near the
    shipped value and its dense runs' median signed error is about zero."""
    dgxc = [c for c in CASES if source_family(c) == "dgxc"]
    shipped = fit_gemm_efficiency(dgxc)
    worse = {"h100-sxm": {"gemm_efficiency": {"bf16": 0.5}}}
    refit = fit_gemm_efficiency(dgxc, worse)
    key = ("h100-sxm", "bf16")
    assert key in shipped and key in refit
    assert abs(refit[key] - shipped[key]) < 0.01
    cal = {"h100-sxm": {"gemm_efficiency": {"bf16": refit[key]}}}
    rows = [r for r in mp.validate(dgxc, calibration=cal).cases if r["status"] == "ok" and r["arch"] == "dense"]
    signed = sorted(r["signed_error"] for r in rows)
    assert abs(signed[len(signed) // 2]) < 0.02


def test_the_fit_gives_each_source_one_vote() -> None:
    """A source with many runs does not outvote the others: the median is over per-source medians."""
    many = [("big", 0.30)] * 100
    assert balanced_median(many + [("a", -0.02), ("b", 0.0)]) == pytest.approx(0.0)
    assert balanced_median([("a", -0.1), ("a", 0.1), ("a", 0.5), ("b", 0.2)]) == pytest.approx(0.15)
    # Run-weighted, the same errors would have a median of 0.30.
    errors = sorted(e for _, e in many + [("a", -0.02), ("b", 0.0)])
    assert errors[len(errors) // 2] == pytest.approx(0.30)


def test_the_shipped_a100_efficiency_zeroes_the_median_source() -> None:
    """a100-sxm-80g fp16 is fitted on three sources (SC21, Korthikanti 2022, vTrain): at the shipped
    value the median of their median signed errors is about zero, although vTrain has 109 of the
    137 runs."""
    rows = [
        r
        for r in mp.validate(REPO_CASES).cases
        if r["status"] == "ok" and r["arch"] == "dense" and r.get("signed_error") is not None
    ]
    a100 = [(source_family(r), r["signed_error"]) for r in rows if r["gpu"] == "a100-sxm-80g"]
    assert {s for s, _ in a100} == {"narayanan21", "korthikanti22", "vtrain"}
    assert abs(balanced_median(a100)) < 0.02


def test_leave_one_gpu_out_never_uses_the_held_out_gpus_own_fit() -> None:
    cv = mp.cross_validate(REPO_CASES, "gpu")
    assert {f["group"] for f in cv.folds} == {c["cluster"]["gpu"] for c in CASES}
    scored = {r["group"] for r in cv.cases if r["status"] == "ok"}
    assert len(scored) >= 5
    for fold in (f for f in cv.folds if f["group"] in scored):
        # The held-out GPU has no runs in its training set: its efficiency comes from its own
        # matmul microbenchmark where one is on record, else from the fleet median.
        origins = set(fold["origin"].values())
        assert origins and origins <= {"matmul fact", "fleet median"}, fold
        has_fact = mp.validation.matmul_fact(fold["group"], {}) is not None
        assert ("matmul fact" in origins) == has_fact, fold
        assert all(k.startswith(fold["group"] + "/") for k in fold["gemm_efficiency"])
    # Every case is predicted exactly once, by the fold that held it out.
    assert sorted(r["id"] for r in cv.cases) == sorted(c["id"] for c in CASES)
    assert all(r["group"] == r["gpu"] for r in cv.cases if r["status"] == "ok")
    in_sample = mp.validate(REPO_CASES).summary["throughput"]
    assert cv.summary["throughput"]["n"] == in_sample["n"]
    # Out of sample is worse than in sample on these runs (the constants were fitted to them).
    assert cv.summary["throughput"]["median_ape"] > in_sample["median_ape"]


def test_a_held_out_gpu_is_predicted_from_its_microbenchmark() -> None:
    """The prior is the GPU's measured BF16 matmul fraction times the median, over the fitted
    groups of the same precision whose GPU has a fact, of fitted / fact (16-bit pooled)."""
    from meshplan.validation import matmul_fact, matmul_prior

    h100, a100, b200 = (matmul_fact(g, {}) for g in ("h100-sxm", "a100-sxm-80g", "b200"))
    assert h100 == pytest.approx(0.803) and a100 == pytest.approx(0.869) and b200 == pytest.approx(0.734)
    assert matmul_fact("h100-sxm-96g", {}) is None  # 500 W cap: no microbenchmark on record
    fitted = {("a100-sxm-80g", "fp16"): 0.80, ("h100-sxm", "bf16"): 0.75, ("h100-sxm", "fp8"): 0.69,
              ("h100-sxm-96g", "bf16"): 0.40}
    # 16-bit: ratios 0.80/0.869 and 0.75/0.803 (h100-sxm-96g has no fact and does not vote).
    expected = b200 * statistics.median([0.80 / a100, 0.75 / h100])
    assert matmul_prior(("b200", "bf16"), fitted, {}) == pytest.approx(expected, abs=1e-4)
    assert matmul_prior(("b200", "fp8"), fitted, {}) == pytest.approx(b200 * 0.69 / h100, abs=1e-4)
    assert matmul_prior(("b200", "mxfp8"), fitted, {}) is None  # no fitted group at MXFP8
    assert matmul_prior(("h100-sxm-96g", "bf16"), fitted, {}) is None
    # A calibration override states a user's own microbenchmark.
    base = {"h100-sxm-96g": {"matmul_efficiency": {"bf16": 0.7}}}
    assert matmul_fact("h100-sxm-96g", base) == 0.7
    assert matmul_prior(("h100-sxm-96g", "bf16"), fitted, base) is not None


def test_leave_one_source_out_groups_by_id_prefix() -> None:
    cv = mp.cross_validate(CASES, "source")
    assert "mbridge" in cv.summary["by_group"] and "narayanan21" in cv.summary["by_group"]
    n = sum(s["n"] for s in cv.summary["by_group"].values())
    assert n == cv.summary["throughput"]["n"]


def test_unknown_group_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="allowed gpu, model, source, stack"):
        mp.cross_validate(CASES[:3], "vendor")


def test_cli_cross_validate_prints_both_columns_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(REPO_CASES), "--cross-validate", "gpu"]) == 0
    out = capsys.readouterr().out
    assert "median in" in out and "median LO-gpu-O" in out
    assert "(matmul fact)" in out and "(fleet median)" in out
    assert main(["validate", str(REPO_CASES), "--cross-validate", "gpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cross_validation"]["by"] == "gpu"
    assert doc["in_sample"]["throughput"] == mp.validate(REPO_CASES).summary["throughput"]


def test_cli_rejects_search_with_cross_validate(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["validate", str(REPO_CASES), "--cross-validate", "gpu", "--search"])
    err = capsys.readouterr().err
    assert code != 0 and "--search" in err and "\n" == err[-1] and err.count("\n") == 1


def test_cli_rejects_an_unknown_group(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(REPO_CASES), "--cross-validate", "vendor"]) != 0
    assert "invalid choice: 'vendor'" in capsys.readouterr().err


def test_leave_one_stack_out_groups_by_the_stack_that_ran_each_case() -> None:
    """Each case's stack comes from its source (data/sources.toml in the core): torchtitan's
    runs, SC21's DeepSpeed ZeRO-3 runs and the MaxText recipe each form a fold of their own."""
    cv = mp.cross_validate(CASES, "stack")
    groups = cv.summary["by_group"]
    assert set(groups) == {"megatron-core", "torchtitan", "deepspeed", "maxtext"}
    assert all(r["group"] == r["stack"] for r in cv.cases)
    assert groups["deepspeed"]["n"] == 6
    assert groups["maxtext"]["n"] == 5
    assert sum(s["n"] for s in groups.values()) == cv.summary["throughput"]["n"]
    # A held-out stack's GEMM efficiencies are fitted without its runs: the megatron-core fold
    # trains on the other stacks' few runs only, so most of its efficiencies are fleet medians.
    fold = next(f for f in cv.folds if f["group"] == "megatron-core")
    assert "fleet median" in fold["origin"].values()
    assert cv.summary["by_stack"].keys() == groups.keys()


def test_cli_cross_validates_by_stack(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(REPO_CASES), "--cross-validate", "stack"]) == 0
    out = capsys.readouterr().out
    assert "median LO-stack-O" in out and "stack torchtitan" in out
