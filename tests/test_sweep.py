"""``meshplan sweep`` and ``meshplan.sweep``: the cartesian product in order, the best plan per
point (the search's), CSV/JSON columns, errors as rows, and the plot file."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

import meshplan as mp
from meshplan import sweep
from meshplan.cli import main

SMALL = ["--max-micro-batch", "2", "--max-vpp", "2"]


def test_grid_is_the_cartesian_product_last_fastest() -> None:
    points = sweep.grid(["a", "b"], ["g"], [8, 16], [64], [2048, 4096])
    assert len(points) == 8
    assert points[0] == sweep.Point("a", "g", 8, 64, 2048)
    assert points[1] == sweep.Point("a", "g", 8, 64, 4096)
    assert points[-1] == sweep.Point("b", "g", 16, 64, 4096)
    with pytest.raises(mp.errors.InvalidInputError, match="sweep.gpus"):
        sweep.grid(["a"], ["g"], [], [64], [2048])


def test_rows_are_the_best_plans_of_their_searches() -> None:
    space = mp.SearchSpace(max_micro_batch=2, max_vpp=2)
    points = sweep.grid(["llama3-8b"], ["h100-sxm", "a100-sxm-80g"], [8, 16], [64], [4096])
    rows = sweep.sweep(points, mp.Workload(1, 1), space, threads=2, progress=False)
    assert [(r["gpu"], r["gpus"]) for r in rows] == [
        ("h100-sxm", 8), ("h100-sxm", 16), ("a100-sxm-80g", 8), ("a100-sxm-80g", 16)]
    for r in rows:
        assert list(r) == list(sweep.COLUMNS)
        best = mp.search("llama3-8b", mp.Cluster(r["gpu"], r["gpus"]), mp.Workload(64, 4096),
                         space).best
        assert best is not None and r["status"] == "ok" and r["error"] is None
        assert r["tokens_per_s_per_gpu"] == best.tokens_per_s_per_gpu
        assert r["mfu"] == best.mfu and r["step_time_s"] == best.step_time_s
        assert r["plan"] == str(best.plan) and mp.Plan.parse(r["plan"]) == best.plan
        assert (r["dp"], r["tp"], r["pp"]) == (best.plan.dp, best.plan.tp, best.plan.pp)


def test_bad_points_are_rows_not_exceptions() -> None:
    points = [sweep.Point("llama3-8b", "no-such-gpu", 8, 64, 4096),
              sweep.Point("llama3.1-405b", "a100-sxm-40g", 8, 8, 4096),
              sweep.Point("llama3-8b", "a100-sxm-80g", 8, 64, 4096)]
    rows = sweep.sweep(points, mp.Workload(1, 1, precision="fp8"), progress=False)
    assert rows[0]["status"] == "error" and "no-such-gpu" in rows[0]["error"]
    assert rows[1]["status"] == "error" and "precision" in rows[1]["error"]  # A100: no FP8
    assert rows[2]["status"] == "error"
    rows = sweep.sweep(points[1:2], progress=False)
    assert rows[0]["status"] == "infeasible" and rows[0]["tokens_per_s_per_gpu"] is None
    assert rows[0]["candidates"] > 0 and rows[0]["feasible"] == 0


def test_cli_csv_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "sweep.png"
    argv = ["sweep", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8,16,32",
            "--global-batch", "64", "--seq-len", "2048,4096", *SMALL]
    assert main(argv + ["--csv", "--plot", str(png)]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 6
    assert list(rows[0]) == list(sweep.COLUMNS)
    assert [(int(r["gpus"]), int(r["seq_len"])) for r in rows] == [
        (8, 2048), (8, 4096), (16, 2048), (16, 4096), (32, 2048), (32, 4096)]
    assert all(r["status"] == "ok" and float(r["tokens_per_s_per_gpu"]) > 0 for r in rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    out = tmp_path / "rows.json"
    assert main(argv + ["--json", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [d["tokens_per_s_per_gpu"] for d in data] == [float(r["tokens_per_s_per_gpu"]) for r in rows]
    assert set(data[0]) == set(sweep.COLUMNS)

    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "tok/s/GPU" in table and table.count("llama3-8b") == 6

    assert main(argv[:-4] + ["--model", "llama3-8b,nope"]) == 0  # an unknown model is a row
    assert "unknown model preset" in capsys.readouterr().out


def test_plot_x_variable_and_categorical_axis(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = sweep.sweep(sweep.grid(["llama3-8b", "gpt-1.7b"], ["h100-sxm"], [8], [64], [2048]),
                       mp.Workload(1, 1), mp.SearchSpace(max_micro_batch=2, max_vpp=2),
                       progress=False)
    assert sweep.x_variable(rows) == "model"
    svg = tmp_path / "models.svg"
    assert sweep.plot(rows, str(svg)) == str(svg)
    assert b"<svg" in svg.read_bytes()
    with pytest.raises(mp.errors.InvalidInputError, match="x"):
        sweep.plot(rows, str(svg), x="color")


def test_cli_bad_input_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["sweep", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8,x",
                 "--global-batch", "64", "--seq-len", "2048"]) == 2
    assert "GPU counts" in capsys.readouterr().err
    assert main(["sweep", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
                 "--global-batch", "64", "--seq-len", "2048", "--out",
                 str(tmp_path / "missing" / "x.csv")]) == 2
    assert "--out" in capsys.readouterr().err
