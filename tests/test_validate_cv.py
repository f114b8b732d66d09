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
    """The prior is the core's rule for a GPU without fits (``device::gemm_efficiency``): the GPU's
    matmul fraction at the precision (else at BF16), measured or derived, times the realisation:
    the median, over the fitted groups whose fraction is *measured at that precision* (a BF16 MAMF
    serves FP16), of fitted / fraction, all precisions pooled (within the GPU's realisation class
    when the fold has two or more of its groups, below)."""
    from meshplan.validation import matmul_fact, matmul_prior, matmul_realisation

    a100, h100, h100_fp8 = matmul_fact("a100-sxm-80g", {}), matmul_fact("h100-sxm", {}), matmul_fact("h100-sxm", {}, "fp8")
    b200, b200_fp8, b200_mx = (matmul_fact("b200", {}, p) for p in ("bf16", "fp8", "mxfp8"))
    assert (a100, h100, h100_fp8) == pytest.approx((0.869, 0.803, 0.709))
    assert (b200, b200_fp8, b200_mx) == pytest.approx((0.776, 0.763, 0.711))
    assert matmul_fact("gb200-nvl72", {}, "mxfp8") == pytest.approx(0.674)  # derived from b200's ratio
    assert matmul_fact("b300", {}, "nvfp4") == pytest.approx(0.786)  # no FP4 figure: its BF16 one
    assert matmul_fact("h100-sxm-96g", {}) is None  # 500 W cap: no microbenchmark on record
    fitted = {("a100-sxm-80g", "fp16"): 0.80, ("h100-sxm", "bf16"): 0.75, ("h100-sxm", "fp8"): 0.69,
              ("b200", "fp8"): 0.60, ("gb200-nvl72", "mxfp8"): 0.53, ("h100-sxm-96g", "bf16"): 0.40}
    # Voters: A100 FP16 against its BF16 MAMF, H100 BF16 and FP8, B200 FP8, each at its own
    # precision; GB200's MXFP8 fraction is derived and h100-sxm-96g has none: they do not vote.
    r = statistics.median([0.80 / a100, 0.75 / h100, 0.69 / h100_fp8, 0.60 / b200_fp8])
    assert matmul_realisation(fitted, {}) == pytest.approx(r)
    assert matmul_prior(("b200", "bf16"), fitted, {}) == pytest.approx(b200 * r, abs=1e-4)
    # FP8 takes the FP8 fraction and the pooled realisation; the old per-precision rule (BF16
    # fraction x the FP8 groups' fitted / BF16 fraction) gave 0.776 x 0.816 = 0.633 here.
    assert matmul_prior(("b200", "fp8"), fitted, {}) == pytest.approx(b200_fp8 * r, abs=1e-4)
    assert matmul_prior(("b200", "fp8"), fitted, {}) == pytest.approx(0.7075, abs=1e-3)
    # A precision no fitted group has is still priced from the GPU's own fraction there.
    assert matmul_prior(("b200", "mxfp8"), fitted, {}) == pytest.approx(b200_mx * r, abs=1e-4)
    assert matmul_prior(("gb200-nvl72", "mxfp8"), fitted, {}) == pytest.approx(0.674 * r, abs=1e-4)
    assert matmul_prior(("b300", "nvfp4"), fitted, {}) == pytest.approx(0.786 * r, abs=1e-4)
    assert matmul_prior(("h100-sxm-96g", "bf16"), fitted, {}) is None
    assert matmul_realisation({("h100-sxm-96g", "bf16"): 0.40}, {}) is None
    # A calibration override states a user's own microbenchmark: measured, so it votes too.
    base = {"h100-sxm-96g": {"matmul_efficiency": {"bf16": 0.7}}}
    assert matmul_fact("h100-sxm-96g", base) == 0.7
    r_user = statistics.median([0.80 / a100, 0.75 / h100, 0.69 / h100_fp8, 0.60 / b200_fp8, 0.40 / 0.7])
    assert matmul_realisation(fitted, base) == pytest.approx(r_user)
    # Hopper's class (default) has four measured groups here: the prior takes their median.
    r_default = statistics.median([0.80 / a100, 0.75 / h100, 0.69 / h100_fp8, 0.40 / 0.7])
    assert matmul_prior(("h100-sxm-96g", "bf16"), fitted, base) == pytest.approx(0.7 * r_default, abs=1e-4)


def test_the_shipped_realisation_is_the_median_of_the_measured_pairs() -> None:
    """data/device.toml ``matmul_realisation`` follows its stated rule on the shipped presets: per
    realisation class, the median, over the (GPU, precision) whose gemm_efficiency is fitted and
    whose matmul_efficiency is measured at that precision (16-bit pooled), of the ratio of the
    two; and the core serves each class's value to the GPUs of its architecture."""
    import tomllib

    from meshplan import _core
    from meshplan.validation import realisation_class

    ratios: dict[str, list[float]] = {}
    for gpu in _core.gpu_presets():
        cal = _core.gpu_preset(gpu)["calibration"]
        kinds = _core.gpu_provenance(gpu)["constants"]
        kind = lambda key: (kinds.get(key) or {}).get("kind")  # noqa: E731
        for precision, value in (cal.get("gemm_efficiency") or {}).items():
            if value is None or kind(f"gemm_efficiency.{precision}") != "fitted":
                continue
            same = ("bf16", "fp16") if precision in ("bf16", "fp16") else (precision,)
            facts = [(cal.get("matmul_efficiency") or {}).get(p) for p in same
                     if kind(f"matmul_efficiency.{p}") == "measured"]
            if facts and facts[0] is not None:
                ratios.setdefault(realisation_class(gpu), []).append(value / facts[0])
    device = tomllib.loads((REPO_CASES.parent.parent / "rust" / "meshplan-core" / "data" / "device.toml").read_text())
    table = device["matmul_realisation"]
    assert set(ratios) == set(table) == {"default", "blackwell"}
    for name, values in ratios.items():
        assert len(values) >= 4, name  # each class rests on several GPUs and sources
        assert table[name] == pytest.approx(statistics.median(values), abs=0.005), name
        assert _core.matmul_realisation(name) == (name, table[name])
    assert table["blackwell"] < table["default"]
    assert realisation_class("gb200-nvl72") == "blackwell" and realisation_class("h100-sxm") == "default"
    assert _core.matmul_realisation(None) == ("default", table["default"])


def test_a_held_out_gpu_takes_its_own_classes_realisation() -> None:
    """Partial pooling by class: a GPU whose class has at least two measured fitted groups in the
    fold takes their median; with fewer, the median of every group."""
    from meshplan.validation import matmul_fact, matmul_prior, matmul_realisation

    h100, h100_fp8, a100 = matmul_fact("h100-sxm", {}), matmul_fact("h100-sxm", {}, "fp8"), matmul_fact("a100-sxm-80g", {})
    b200, b200_fp8, gb200_fp8 = matmul_fact("b200", {}), matmul_fact("b200", {}, "fp8"), matmul_fact("gb200-nvl72", {}, "fp8")
    fitted = {("h100-sxm", "bf16"): 0.75, ("h100-sxm", "fp8"): 0.69, ("b200", "fp8"): 0.60,
              ("gb200-nvl72", "fp8"): 0.60}
    blackwell = statistics.median([0.60 / b200_fp8, 0.60 / gb200_fp8])
    default = statistics.median([0.75 / h100, 0.69 / h100_fp8])
    assert matmul_realisation(fitted, {}, "b300") == pytest.approx(blackwell)
    assert matmul_realisation(fitted, {}, "a100-sxm-80g") == pytest.approx(default)
    assert matmul_prior(("b200", "bf16"), fitted, {}) == pytest.approx(b200 * blackwell, abs=1e-4)
    assert matmul_prior(("a100-sxm-80g", "fp16"), fitted, {}) == pytest.approx(a100 * default, abs=1e-4)
    # One Blackwell group is too few for a class median: every group's median serves.
    del fitted[("gb200-nvl72", "fp8")]
    pooled = statistics.median([0.75 / h100, 0.69 / h100_fp8, 0.60 / b200_fp8])
    assert matmul_realisation(fitted, {}, "b300") == pytest.approx(pooled)
    assert matmul_realisation(fitted, {}) == pytest.approx(pooled)


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
    # trains on the other stacks' few runs only, so most of its efficiencies are priors from
    # hardware facts (every GPU it runs on has a matmul microbenchmark on record).
    fold = next(f for f in cv.folds if f["group"] == "megatron-core")
    origins = list(fold["origin"].values())
    assert origins.count("matmul fact") > len(origins) / 2, fold["origin"]
    assert set(origins) <= {"fitted", "matmul fact", "fleet median"}
    assert cv.summary["by_stack"].keys() == groups.keys()


def test_cli_cross_validates_by_stack(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(REPO_CASES), "--cross-validate", "stack"]) == 0
    out = capsys.readouterr().out
    assert "median LO-stack-O" in out and "stack torchtitan" in out
