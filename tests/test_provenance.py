"""Hardware provenance: every GPU preset states where each calibration constant comes from,
``meshplan gpus`` shows it, and a search or evaluation on a GPU whose GEMM efficiency is not its
own fit says so (an additive ``notes`` field in JSON, a ``note:`` line in tables)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import meshplan as mp
from meshplan.cli import main
from meshplan.errors import UnknownPresetError
from meshplan.hardware import calibration_notes, provenance

KINDS = {"fitted", "measured", "derived", "shared", "assumed"}
NEW = ["mi325x", "mi355x", "h20", "rtx-pro-6000"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_preset_accounts_for_its_hardware_constants() -> None:
    for name in mp.Gpu.presets():
        p = provenance(name)
        assert p["summary"] in KINDS
        gpu = mp.Gpu.preset(name)
        for precision in gpu.calibration["gemm_efficiency"]:
            if gpu.calibration["gemm_efficiency"][precision] is not None:
                origin = p["constants"][f"gemm_efficiency.{precision}"]
                assert origin["kind"] in KINDS and origin["note"], (name, precision)
        for key in ("attention_efficiency", "memory_efficiency", "scaleup_bus_efficiency",
                    "network_bus_efficiency"):
            assert p["constants"][key]["kind"] in KINDS, (name, key)
    assert set(NEW) <= set(mp.Gpu.presets())
    assert provenance("h100-sxm")["summary"] == "fitted"
    assert provenance("h20")["summary"] == "derived"
    assert provenance("mi355x")["summary"] == "assumed"
    with pytest.raises(UnknownPresetError):
        provenance("h999")


def test_the_blackwell_ultra_presets_are_derived_by_a_measured_ratio() -> None:
    gb200, gb300 = mp.Gpu.preset("gb200-nvl72"), mp.Gpu.preset("gb300-nvl72")
    for p in ("bf16", "fp8", "mxfp8", "nvfp4"):
        ratio = gb300.calibration["gemm_efficiency"][p] / gb200.calibration["gemm_efficiency"][p]
        assert ratio == pytest.approx(1.164, abs=0.002), p
    note = provenance("gb300-nvl72")["constants"]["gemm_efficiency.mxfp8"]
    assert note["kind"] == "derived" and "1.164" in note["note"]
    b200, b300 = mp.Gpu.preset("b200"), mp.Gpu.preset("b300")
    ratio = b300.calibration["gemm_efficiency"]["mxfp8"] / b200.calibration["gemm_efficiency"]["mxfp8"]
    assert ratio == pytest.approx(1.094, abs=0.002)


def test_gpus_command_shows_how_each_preset_was_calibrated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "gpus")
    assert code == 0 and "calibrated" in out.splitlines()[0]
    row = next(line for line in out.splitlines() if line.startswith("gb300-nvl72"))
    assert " derived " in row
    code, out, _ = run(capsys, "gpus", "--provenance", "--gpu", "gb300-nvl72")
    assert code == 0
    assert out.startswith("gb300-nvl72: calibrated derived")
    assert "gemm_efficiency.mxfp8" in out and "1.164" in out and "0.618" in out
    code, out, _ = run(capsys, "gpus", "--json")
    gpus = json.loads(out)
    assert all(g["provenance"]["summary"] in KINDS for g in gpus)
    code, _, err = run(capsys, "gpus", "--gpu", "h999")
    assert code == 2 and "h999" in err


PROBLEM = ["--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096",
           "--plan", "dp=8,tp=1,pp=1,zero=1"]


def test_evaluations_on_derived_gpus_say_so(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "evaluate", *PROBLEM, "--gpu", "h20", "--json")
    assert code == 0
    notes = json.loads(out)["notes"]
    assert len(notes) == 1 and "h20 has no runs of its own" in notes[0]
    assert "meshplan calibrate" in notes[0]
    code, out, _ = run(capsys, "evaluate", *PROBLEM, "--gpu", "h20")
    assert "note: h20 has no runs of its own" in out
    # Fitted on its own runs: no note, and the JSON keeps its shape.
    code, out, _ = run(capsys, "evaluate", *PROBLEM, "--gpu", "h100-sxm", "--json")
    assert "notes" not in json.loads(out)
    # A fitted GPU at a precision it has no runs for says which constant is derived.
    # (gb200-nvl72: its bf16 value is derived from its fitted fp8 one; b200's bf16 has been
    # fitted on its own SimuMax runs since Dec 2026 and says nothing.)
    code, out, _ = run(capsys, "search", *PROBLEM[:-2], "--gpu", "gb200-nvl72", "--top-k", "1", "--json")
    notes = json.loads(out)["notes"]
    assert "gb200-nvl72's bf16 GEMM efficiency is derived" in notes[0]
    code, out, _ = run(capsys, "search", *PROBLEM[:-2], "--gpu", "b200", "--top-k", "1", "--json")
    assert "notes" not in json.loads(out)
    # The user's own calibration replaces the derived value: no note.
    own = tmp_path / "mine.toml"
    own.write_text("[h20]\ngemm_efficiency = { bf16 = 0.7 }\n")
    code, out, err = run(capsys, "evaluate", *PROBLEM, "--gpu", "h20", "--json",
                         "--calibration", str(own))
    assert code == 0, err
    assert "notes" not in json.loads(out)


def test_calibration_notes_api() -> None:
    assert calibration_notes("h100-sxm", "fp8") == []
    assert calibration_notes("mi300x", "bf16")[0].startswith("mi300x has no runs of its own: its "
                                                             "calibration is assumed")
    what_if = mp.Gpu.preset("h20").with_overrides(memory_gib=141)
    assert calibration_notes(what_if, "bf16") == []
