"""Pictures: each renders to a real PNG and SVG; the schedule simulator reproduces the pipeline
formulas; the Pareto front and the mesh colouring are what they claim."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

import meshplan as mp  # noqa: E402
from meshplan import plot  # noqa: E402
from meshplan.cli import main  # noqa: E402
from meshplan.errors import InvalidInputError  # noqa: E402

CLUSTER = mp.Cluster("h100-sxm", 32)
WORKLOAD = mp.Workload(global_batch=16, seq_len=4096)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000, path


def assert_svg(path: Path) -> None:
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(list(root.iter())) > 50


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_pareto_renders(tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"pareto.{suffix}"
    fig = plot.pareto("llama3-8b", CLUSTER, WORKLOAD, mp.SearchSpace(max_micro_batch=2),
                      top_k=150, out=out)
    (assert_png if suffix == "png" else assert_svg)(out)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any(t.startswith("#1  ") for t in "\n".join(texts).splitlines())


@pytest.mark.parametrize("plan", [
    "dp=2,tp=4,pp=4", "dp=2,tp=4,pp=4,vpp=2", "dp=2,tp=4,pp=4,schedule=zb-h1",
])
@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_schedule_renders(tmp_path: Path, plan: str, suffix: str) -> None:
    out = tmp_path / f"schedule.{suffix}"
    plot.schedule("llama3-8b", CLUSTER, WORKLOAD, plan, out=out)
    (assert_png if suffix == "png" else assert_svg)(out)


@pytest.mark.parametrize("axis", ["tp", "dp", "pp", "dense_dp"])
@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_mesh_renders(tmp_path: Path, axis: str, suffix: str) -> None:
    out = tmp_path / f"mesh-{axis}.{suffix}"
    plot.mesh("llama3-8b", CLUSTER, WORKLOAD, "dp=2,tp=4,pp=2,cp=2", axis=axis, out=out)
    (assert_png if suffix == "png" else assert_svg)(out)


def uniform(p: int, m: int, v: int, schedule: str, f: float = 1.0, b: float = 2.0,
            w: float = 1.0) -> dict[str, Any]:
    return {
        "schedule": schedule, "vpp": v, "micro_batches": m,
        "stages": [{"index": j, "layers": 1, "fwd_s": f, "bwd_s": b, "wgrad_s": w}
                   for j in range(p)],
    }


@pytest.mark.parametrize("p, m", [(4, 8), (4, 4), (8, 3), (1, 5), (2, 16)])
def test_1f1b_timeline_is_the_formula(p: int, m: int) -> None:
    blocks = plot.schedule_timeline(uniform(p, m, 1, "1f1b"))
    assert len(blocks) == 2 * p * m
    assert max(b.end for b in blocks) == pytest.approx((m + p - 1) * 3.0)
    # 1F1B never holds more than p - j micro-batches on stage j.
    for j in range(p):
        live, peak = 0, 0
        for b in sorted((b for b in blocks if b.stage == j), key=lambda b: b.start):
            live += 1 if b.kind == "F" else -1
            peak = max(peak, live)
        assert peak == min(p - j, m)


@pytest.mark.parametrize("p, m, v", [(4, 8, 2), (4, 16, 4), (2, 4, 3)])
def test_interleaved_timeline_is_the_formula(p: int, m: int, v: int) -> None:
    blocks = plot.schedule_timeline(uniform(p, m, v, "interleaved-1f1b"))
    assert len(blocks) == 2 * p * m * v
    # NAR21: (m + (p − 1)/v) · (t_F + t_B).
    assert max(b.end for b in blocks) == pytest.approx((m + (p - 1) / v) * 3.0)


def test_zero_bubble_fills_the_bubble_with_weight_gradients() -> None:
    p, m = 4, 8
    one = max(b.end for b in plot.schedule_timeline(uniform(p, m, 1, "1f1b")))
    blocks = plot.schedule_timeline(uniform(p, m, 1, "zb-h1"))
    zb = max(b.end for b in blocks)
    assert {b.kind for b in blocks} == {"F", "B", "W"} and len(blocks) == 3 * p * m
    assert m * 3.0 < zb < one
    # Every weight gradient follows its own input gradient.
    ends = {(b.stage, b.kind, b.micro_batch): b for b in blocks}
    assert all(ends[(b.stage, "B", b.micro_batch)].end <= b.start for b in blocks if b.kind == "W")


def test_timeline_respects_the_pipeline_dependencies() -> None:
    blocks = plot.schedule_timeline(uniform(4, 8, 2, "interleaved-1f1b", f=1.0, b=2.5))
    at = {(b.stage, b.kind, b.micro_batch, b.chunk): b for b in blocks}
    for b in blocks:
        if b.kind == "F" and b.stage > 0:
            assert at[(b.stage - 1, "F", b.micro_batch, b.chunk)].end <= b.start + 1e-12
        if b.kind == "B" and b.stage < 3:
            assert at[(b.stage + 1, "B", b.micro_batch, b.chunk)].end <= b.start + 1e-12
    for j in range(4):
        row = sorted((b for b in blocks if b.stage == j), key=lambda b: b.start)
        assert all(x.end <= y.start + 1e-12 for x, y in zip(row, row[1:]))


def test_pareto_front_is_the_non_dominated_set() -> None:
    result = mp.search("llama3-8b", CLUSTER, WORKLOAD, mp.SearchSpace(max_micro_batch=2, top_k=150))
    front = plot.pareto_front(result.plans)
    assert front
    for f in front:
        assert not any(p.step_time_s < f.step_time_s and p.peak_memory_gib < f.peak_memory_gib
                       for p in result.plans)
    for p in result.plans:
        if p not in front:
            assert any(f.step_time_s <= p.step_time_s and f.peak_memory_gib <= p.peak_memory_gib
                       for f in front)


def test_group_ids_match_the_explained_groups() -> None:
    x = mp.explain("llama3-8b", CLUSTER, WORKLOAD, "dp=2,tp=4,pp=2,cp=2,order=tp-dp-cp-ep-pp")
    n = x.plan.num_gpus
    for g in x.mesh["groups"]:
        ids = plot.group_ids(x.mesh, g["axis"], n)
        members = [r for r in range(n) if ids[r] == ids[0]]
        assert members == g["example_ranks"], g["axis"]
        assert len(set(ids)) == n // g["size"]
    with pytest.raises(InvalidInputError, match="axis"):
        plot.group_ids(x.mesh, "zz", n)


def test_bad_output_suffix(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="png"):
        plot.mesh("llama3-8b", CLUSTER, WORKLOAD, "dp=8,tp=4,pp=1", out=tmp_path / "m.gif")


PROBLEM = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "32", "--global-batch", "16",
           "--seq-len", "4096"]


def test_cli_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pareto = tmp_path / "p.svg"
    assert main(["plot", "pareto", *PROBLEM, "--max-micro-batch", "2", "--out", str(pareto)]) == 0
    assert_svg(pareto)
    sched = tmp_path / "s.png"
    assert main(["plot", "schedule", *PROBLEM, "--plan", "dp=2,tp=4,pp=4", "--out", str(sched)]) == 0
    assert_png(sched)
    mesh = tmp_path / "m.png"
    assert main(["plot", "mesh", *PROBLEM, "--plan", "dp=2,tp=4,pp=4", "--axis", "pp",
                 "--out", str(mesh)]) == 0
    assert_png(mesh)
    assert f"wrote {mesh}" in capsys.readouterr().out
    assert main(["plot", "mesh", *PROBLEM, "--plan", "dp=2,tp=4,pp=4"]) == 2
    assert "--out" in capsys.readouterr().err
