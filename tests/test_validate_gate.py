"""The fidelity regression gate (benchmarks/fidelity/gate.py): it passes on the shipped constants
against the committed baseline and fails, naming what moved, on a deliberately worsened one."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import meshplan as mp

ROOT = Path(__file__).resolve().parent.parent
GATE = ROOT / "benchmarks" / "fidelity" / "gate.py"
BASELINE = ROOT / "benchmarks" / "fidelity" / "baseline.json"


def _gate_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fidelity_gate", GATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GATE), *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


def _worse_h100(tmp_path: Path) -> Path:
    """A calibration file with h100-sxm's shipped GEMM efficiencies lowered by 20 %."""
    shipped = mp.Gpu.preset("h100-sxm").to_dict()["calibration"]["gemm_efficiency"]
    lines = ["[h100-sxm.gemm_efficiency]"]
    lines += [f"{prec} = {0.8 * value}" for prec, value in shipped.items() if value is not None]
    path = tmp_path / "worse.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_committed_baseline_has_every_section_and_group() -> None:
    doc = json.loads(BASELINE.read_text())
    assert set(doc["sections"]) == {"in_sample", "loo_gpu", "loo_source", "loo_model", "loo_stack"}
    in_sample = mp.validate(ROOT / "validation" / "cases.json").summary
    base = doc["sections"]["in_sample"]
    assert base["overall"]["n"] == in_sample["throughput"]["n"]
    assert set(base["by_gpu"]) == set(in_sample["by_gpu"]) and set(base["by_arch"]) == set(in_sample["by_arch"])
    assert set(base["by_stack"]) == set(in_sample["by_stack"]) == {
        "megatron-core", "torchtitan", "deepspeed", "maxtext"}


def test_gate_passes_on_the_shipped_constants() -> None:
    done = _run("--sections", "in_sample,loo_gpu")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gate: ok" in done.stdout


def test_gate_fails_on_a_worsened_gemm_efficiency(tmp_path: Path) -> None:
    done = _run("--sections", "in_sample", "--calibration", str(_worse_h100(tmp_path)))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gate: FAILED" in done.stdout
    # What moved is named: the H100 group and the overall figure, with before and after.
    assert "WORSE: in_sample by_gpu h100-sxm median_ape" in done.stdout
    assert "--update" in done.stdout


def test_update_writes_a_baseline_that_then_passes(tmp_path: Path) -> None:
    worse = _worse_h100(tmp_path)
    baseline = tmp_path / "baseline.json"
    # The dense H100 runs, which the H100 GEMM efficiency is fitted on: lowering it can only
    # hurt them (on the whole file, runs the model over-predicts would gain from it).
    cases = tmp_path / "cases.json"
    rows = json.loads((ROOT / "validation" / "cases.json").read_text())
    cases.write_text(json.dumps([r for r in rows if r["cluster"]["gpu"] == "h100-sxm"
                                 and r["model"]["arch"] == "dense"]))
    on = ("--sections", "in_sample", "--cases", str(cases), "--baseline", str(baseline))
    done = _run(*on, "--calibration", str(worse), "--update")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(baseline.read_text())["sections"].keys() == {"in_sample"}
    assert _run(*on, "--calibration", str(worse)).returncode == 0
    # Against that worse baseline the shipped constants are an improvement: still a pass.
    improved = _run(*on)
    assert improved.returncode == 0 and "moved:" in improved.stdout, improved.stdout


def test_unknown_section_is_a_one_line_error() -> None:
    done = _run("--sections", "in_sample,loo_vendor")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "loo_vendor" in done.stderr


def _section(overall: tuple[int, float, float], groups: dict[str, tuple[int, float, float]]) -> dict[str, Any]:
    def stats(t: tuple[int, float, float]) -> dict[str, Any]:
        return {"n": t[0], "median_ape": t[1], "p90_ape": t[2]}

    return {"overall": stats(overall), "by_gpu": {k: stats(v) for k, v in groups.items()}, "by_arch": {}}


def test_limits_are_one_point_overall_and_three_points_in_groups_of_ten() -> None:
    compare = _gate_module().compare
    base = {"s": _section((100, 0.05, 0.30), {"big": (10, 0.05, 0.20), "small": (9, 0.05, 0.20)})}
    # Within limits: +0.9 point overall, +2.9 points in a 10-case group, +20 points in a 9-case one.
    ok = {"s": _section((100, 0.059, 0.30), {"big": (10, 0.079, 0.20), "small": (9, 0.25, 0.20)})}
    failures, moves = compare(base, ok)
    assert failures == [] and len(moves) == 3
    # Beyond: +1.1 points of overall p90, +3.1 points of a 10-case group's median.
    bad = {"s": _section((100, 0.05, 0.311), {"big": (10, 0.081, 0.20), "small": (9, 0.05, 0.20)})}
    failures, _ = compare(base, bad)
    assert len(failures) == 2
    assert any("s overall all p90_ape" in f for f in failures)
    assert any("s by_gpu big median_ape" in f for f in failures)
    # A gated group that disappears fails; getting better never does.
    gone = {"s": _section((100, 0.01, 0.10), {"small": (9, 0.05, 0.20)})}
    failures, _ = compare(base, gone)
    assert failures == ["s by_gpu big: no longer scored (baseline n=10)"]
    # A scope the baseline lacks (an older baseline without by_stack) is reported, not failed.
    with_stacks = {"s": {**_section((100, 0.05, 0.30), {"big": (10, 0.05, 0.20)}),
                         "by_stack": {"torchtitan": {"n": 9, "median_ape": 0.5, "p90_ape": 0.9}}}}
    failures, moves = compare(base, with_stacks)
    assert not any("by_stack" in f for f in failures)
    assert "s by_stack: not in the baseline (run with --update to add it)" in moves
