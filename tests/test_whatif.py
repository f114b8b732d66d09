"""What-if hardware (issue 15): a preset with overrides, validated like a preset, labelled as
hypothetical in every output; hardware fields swept as axes."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

import meshplan as mp
from meshplan import sweep, whatif
from meshplan.cli import main

PROBLEM = ["--model", "llama3-8b", "--gpus", "64", "--global-batch", "512", "--seq-len", "4096"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_overrides_change_the_fields_and_label_the_gpu() -> None:
    base = mp.Gpu.preset("h100-sxm")
    g = base.with_overrides(memory_gib=141, scaleup_domain=72, network_bandwidth_gbps=100)
    assert (g.memory_gib, g.scaleup_domain, g.network_bandwidth_gbps) == (141, 72, 100)
    assert g.name == "what-if:h100-sxm{memory_gib=141,scaleup_domain=72,network_bandwidth_gbps=100}"
    assert g.hypothetical and not base.hypothetical
    assert g.peak_tflops == base.peak_tflops and g.calibration == base.calibration
    g2 = g.with_overrides({"peak_tflops.bf16": 1500.0, "calibration.tp_overlap": 0.9})
    assert g2.peak_tflops["bf16"] == 1500 and g2.calibration["tp_overlap"] == 0.9
    assert "memory_gib=141" in g2.name and "peak_tflops.bf16=1500" in g2.name


def test_more_memory_lets_a_plan_fit_that_did_not() -> None:
    work = mp.Workload(64, 4096)
    plan = mp.Plan(dp=8, tp=1, pp=1, micro_batch=8, zero=0, recompute="none")
    small = mp.evaluate("llama3-8b", mp.Cluster("h100-sxm", 8), work, plan)
    big = mp.evaluate("llama3-8b", mp.Cluster(mp.Gpu.preset("h100-sxm").with_overrides(
        memory_gib=1000), 8), work, plan)
    assert not small.feasible and big.feasible
    assert big.peak_memory_gib == pytest.approx(small.peak_memory_gib)


@pytest.mark.parametrize("changes, message", [
    ({"memory_gb": 1}, r"invalid gpu override 'memory_gb': unknown field \(allowed: memory_gib, "),
    ({"peak_tflops.bf17": 1}, "unknown field"),
    ({"calibration.nope": 1}, r"unknown calibration constant \(allowed: attention_efficiency"),
    ({"memory_gib": -1}, r"invalid gpu.memory_gib: -1 \(allowed: a finite number > 0\)"),
    ({"memory_gib": "lots"}, r"invalid gpu.memory_gib: 'lots' \(allowed: a number\)"),
    ({"scaleup_domain": 0}, r"invalid gpu.scaleup_domain: 0 \(allowed: 1..="),
    ({"scaleup_domain": 2**31}, r"invalid gpu.scaleup_domain: 2147483648 \(allowed: 1..="),
    ({"scaleup_domain": 2**32}, r"invalid gpu.scaleup_domain: 4294967296"),
    ({"gpus_per_node": 2**64 - 1}, r"invalid gpu.gpus_per_node: 18446744073709551615"),
    ({"sm_count": 1.5}, r"invalid gpu.sm_count: 1.5 \(allowed: an integer\)"),
    ({"memory_gib": True}, r"invalid gpu.memory_gib: True"),
    ({}, "one or more field=value"),
])
def test_bad_overrides_are_one_line_errors(changes: dict, message: str) -> None:
    with pytest.raises(mp.errors.InvalidInputError, match=message) as e:
        mp.Gpu.preset("h100-sxm").with_overrides(changes)
    assert "\n" not in str(e.value)


def test_hardware_file(tmp_path: Path) -> None:
    hw = tmp_path / "hw.toml"
    hw.write_text('preset = "h100-sxm"\nmemory_gib = 192\n[peak_tflops]\nbf16 = 1500\n')
    g = mp.Gpu.from_file(hw)
    assert g.hypothetical and g.memory_gib == 192 and g.peak_tflops["bf16"] == 1500
    full = tmp_path / "full.json"
    data = mp.Gpu.preset("b200").to_dict()
    data["name"] = "my-chip"
    full.write_text(json.dumps(data))
    assert mp.Gpu.from_file(full).name == "what-if:my-chip"
    bad = tmp_path / "bad.toml"
    bad.write_text('preset = "h100-sxm"\nhbm = 3\n')
    with pytest.raises(mp.errors.InvalidInputError, match="'hbm': unknown field"):
        mp.Gpu.from_file(bad)
    with pytest.raises(mp.errors.InvalidInputError, match="invalid gpu file"):
        mp.Gpu.from_file(tmp_path / "missing.toml")


def test_cli_labels_hypothetical_hardware_everywhere(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    what = ["--gpu", "h100-sxm", "--gpu-set", "memory_gib=141,scaleup_domain=72"]
    code, out, _ = run(capsys, "search", *PROBLEM, *what, "--top-k", "2")
    assert code == 0 and out.startswith("HYPOTHETICAL HARDWARE: hypothetical: h100-sxm with")
    assert "what-if:h100-sxm{memory_gib=141,scaleup_domain=72}" in out
    code, out, _ = run(capsys, "search", *PROBLEM, *what, "--top-k", "2", "--json")
    data = json.loads(out)
    assert data["hardware"]["hypothetical"] is True and len(data["plans"]) == 2
    code, out, _ = run(capsys, "search", *PROBLEM, *what, "--top-k", "2", "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {r["hypothetical"] for r in rows} == {"True"} and rows[0]["gpu"].startswith("what-if:")
    plan = "dp=64,tp=1,pp=1,micro_batch=1,zero=1,recompute=none"
    for command in ("evaluate", "explain"):
        code, out, _ = run(capsys, command, *PROBLEM, *what, "--plan", plan, "--json")
        assert code == 0 and json.loads(out)["hardware"]["hypothetical"] is True
        code, out, _ = run(capsys, command, *PROBLEM, *what, "--plan", plan)
        assert code == 0 and out.startswith("HYPOTHETICAL HARDWARE")
    # A plain preset is not labelled.
    code, out, _ = run(capsys, "search", *PROBLEM, "--gpu", "h100-sxm", "--top-k", "1", "--json")
    assert "hardware" not in json.loads(out)


@pytest.mark.parametrize("argv, message", [
    (["--gpu", "h100-sxm", "--gpu-set", "memory_gb=1"], "unknown field (allowed: memory_gib"),
    (["--gpu", "h100-sxm", "--gpu-set", "memory_gib"], "invalid --gpu-set: 'memory_gib'"),
    (["--gpu", "h100-sxm", "--gpu-set", "scaleup_domain=4294967296"], "1..="),
    ([], "give one of --gpu NAME or --gpu-file FILE"),
    (["--gpu-file", "/nonexistent.toml"], "--gpu-file: no such file"),
])
def test_cli_bad_what_if_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, out, err = run(capsys, "search", *PROBLEM, *argv)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1


def test_sweep_hardware_axes(capsys: pytest.CaptureFixture[str]) -> None:
    points = sweep.grid(["llama3-8b"], ["h100-sxm"], [64], [512], [4096],
                        {"memory_gib": [40, 141], "scaleup_domain": [8, 72]})
    assert [p.hardware for p in points] == [
        (("memory_gib", 40), ("scaleup_domain", 8)), (("memory_gib", 40), ("scaleup_domain", 72)),
        (("memory_gib", 141), ("scaleup_domain", 8)), (("memory_gib", 141), ("scaleup_domain", 72))]
    rows = sweep.sweep(points, space=mp.SearchSpace(max_micro_batch=2), threads=2, progress=False)
    for p, r in zip(points, rows):
        assert r["hypothetical"] is True and r["status"] == "ok"
        assert (r["hw.memory_gib"], r["hw.scaleup_domain"]) == tuple(v for _, v in p.hardware)
        gpu = mp.Gpu.preset("h100-sxm").with_overrides(dict(p.hardware))
        best = mp.search("llama3-8b", mp.Cluster(gpu, 64), mp.Workload(512, 4096),
                         mp.SearchSpace(max_micro_batch=2, top_k=1)).best
        assert best is not None and r["plan"] == str(best.plan) and r["gpu"] == gpu.name
        assert r["peak_memory_gib"] <= dict(p.hardware)["memory_gib"]
    code, out, err = run(capsys, "sweep", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus",
                         "64", "--global-batch", "512", "--seq-len", "4096", "--max-micro-batch",
                         "2", "--gpu-sweep", "memory_gib=40,141", "--gpu-sweep",
                         "scaleup_domain=8,72", "--csv", "--no-progress")
    assert code == 0, err
    got = list(csv.DictReader(io.StringIO(out)))
    assert [r["plan"] for r in got] == [r["plan"] for r in rows]
    assert list(got[0])[-2:] == ["hw.memory_gib", "hw.scaleup_domain"]
    assert {r["hypothetical"] for r in got} == {"True"}
    code, out, err = run(capsys, "sweep", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus",
                         "64", "--global-batch", "512", "--seq-len", "4096",
                         "--gpu-sweep", "hbm=1,2")
    assert code == 2 and "'hbm': unknown field" in err
    assert whatif.base_name(rows[0]["gpu"]) == "h100-sxm"
