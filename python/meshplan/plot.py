"""``meshplan.plot``: pictures of plans (matplotlib, drawn off-screen; needs the ``plot`` extra).

- :func:`pareto`: the feasible plans of a search, step time against peak memory, with the
  Pareto front (no plan is both faster and smaller) and the top plans labelled.
- :func:`schedule`: the pipeline schedule of a plan (1F1B, interleaved 1F1B or ZB-H1) as a
  timeline of forward/backward blocks per stage, from the cost model's per-micro-batch stage
  times; the gaps are the bubble.
- :func:`mesh`: the ranks of a plan coloured by their group along one axis, with the NVLink
  domain boundaries drawn.

Each returns a matplotlib ``Figure`` and, given ``out``, writes it there (the format follows the
suffix: ``.png``, ``.svg``, ``.pdf``). No pyplot state is touched, so this is safe in servers and
notebooks alike.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from . import api
from ._fields import as_type
from .api import ModelLike
from .errors import InvalidInputError
from .explain import Explanation, explain
from .hardware import Cluster
from .plan import Plan
from .report import Evaluation
from .space import SearchSpace
from .workload import Workload

PathLike = Union[str, "os.PathLike[str]"]

#: Plans a Pareto picture asks the search for (the front needs more than the top 10).
PARETO_TOP_K = 400

_COLORS = {"F": "#4C72B0", "B": "#55A868", "W": "#C7E9C0"}


# --- Pareto front ---------------------------------------------------------------------------


def pareto_front(plans: Sequence[Evaluation]) -> list[Evaluation]:
    """The feasible plans no other plan beats on both step time and peak memory, by memory."""
    ordered = sorted(
        (p for p in plans if p.feasible), key=lambda p: (p.peak_memory_gib, p.step_time_s)
    )
    front: list[Evaluation] = []
    for p in ordered:
        if not front or p.step_time_s < front[-1].step_time_s:
            front.append(p)
    return front


def short_label(plan: Plan) -> str:
    """``tp4 pp2 dp8 z1 mb2`` (degrees above 1, then the knobs that matter most)."""
    parts = [f"{k}{getattr(plan, k)}" for k in ("tp", "pp", "vpp", "cp", "ep", "dp")
             if getattr(plan, k) > 1]
    parts += [f"z{plan.zero}", f"mb{plan.micro_batch}"]
    if plan.recompute != "none":
        parts.append(f"rc-{plan.recompute[:3]}")
    if plan.sequence_parallel:
        parts.append("sp")
    return " ".join(parts)


def pareto(
    model: ModelLike,
    cluster: Cluster,
    workload: Workload,
    space: Optional[SearchSpace] = None,
    *,
    top_k: int = PARETO_TOP_K,
    label: int = 5,
    threads: Optional[int] = None,
    timeout_s: Optional[float] = None,
    out: Optional[PathLike] = None,
) -> Figure:
    """Step time against peak memory of the best ``top_k`` feasible plans, the front drawn and
    the best ``label`` plans (by throughput) labelled; ``timeout_s`` bounds the search."""
    space = SearchSpace() if space is None else as_type(SearchSpace, space, "space")
    wide = dataclasses.replace(space, top_k=max(top_k, space.top_k or 0))
    result = api.search(model, cluster, workload, wide, threads=threads, timeout_s=timeout_s)
    m = api.as_model(model)
    c = as_type(Cluster, cluster, "cluster")
    fig = _figure(8.0, 5.5)
    ax = fig.add_subplot()
    plans = result.plans
    if not plans:
        ax.text(0.5, 0.5, "no feasible plan", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.scatter([p.peak_memory_gib for p in plans], [p.step_time_s for p in plans],
                   s=14, color="#999999", alpha=0.6, label=f"{len(plans)} best feasible plans")
        front = pareto_front(plans)
        ax.plot([p.peak_memory_gib for p in front], [p.step_time_s for p in front],
                "o-", color="#C44E52", markersize=5, label="Pareto front")
        top = plans[:label]
        ax.plot([p.peak_memory_gib for p in top], [p.step_time_s for p in top], "*",
                color="#DD8452", markersize=10, label=f"top {len(top)} by throughput")
        for i, p in enumerate(top):
            # Fanned out: the best plans are often a few MiB and milliseconds apart.
            ax.annotate(f"#{p.rank}", (p.peak_memory_gib, p.step_time_s),
                        xytext=(-28 - 22 * (i % 3), 14 + 13 * i), textcoords="offset points",
                        fontsize=7, arrowprops={"arrowstyle": "-", "color": "#DD8452", "lw": 0.6})
        listing = "\n".join(
            f"#{p.rank}  {short_label(p.plan)}: {p.step_time_s:.3f} s, {p.peak_memory_gib:.1f} GiB"
            for p in top
        )
        ax.text(0.02, 0.02, listing, transform=ax.transAxes, fontsize=7, va="bottom",
                family="monospace", bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "#cccccc"})
    gpu = c.resolved_gpu()
    ax.axvline(gpu.memory_gib, linestyle="--", color="#333333", linewidth=1,
               label=f"{gpu.name}: {gpu.memory_gib:g} GiB")
    ax.set_title(
        f"{m.name} on {c.num_gpus} x {gpu.name}, batch {workload.global_batch} x {workload.seq_len}: "
        f"{result.stats.feasible:,} feasible plans",
        fontsize=10,
    )
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("step time (s)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper right", framealpha=0.85)
    return _done(fig, out)


# --- pipeline schedule ----------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One operation of the pipeline timeline."""

    stage: int
    kind: str
    """``F`` forward, ``B`` backward (input gradient only under ZB-H1), ``W`` weight gradient."""
    micro_batch: int
    chunk: int
    start: float
    end: float


def _op_orders(schedule: str, p: int, m: int, v: int) -> list[list[tuple[str, int, int]]]:
    """Per stage, its operations ``(kind, micro_batch, chunk)`` in the order it runs them."""
    orders = []
    for j in range(p):
        ops: list[tuple[str, int, int]] = []
        if schedule == "interleaved-1f1b":
            groups = [list(range(g, min(g + p, m))) for g in range(0, m, p)]
            fwd = [("F", mb, c) for grp in groups for c in range(v) for mb in grp]
            bwd = [("B", mb, c) for grp in groups for c in reversed(range(v)) for mb in grp]
            warm = min((p - j - 1) * 2 + (v - 1) * p, m * v)
            ops += fwd[:warm]
            for i in range(m * v - warm):
                ops += [fwd[warm + i], bwd[i]]
            ops += bwd[m * v - warm:]
        else:
            warm = min(p - j - 1, m)
            zero_bubble = schedule == "zb-h1"
            pending: list[tuple[str, int, int]] = []
            ops += [("F", i, 0) for i in range(warm)]
            for i in range(m - warm):
                ops += [("F", warm + i, 0), ("B", i, 0)]
                if zero_bubble:
                    # The first weight gradients wait for the cool-down's idle slots.
                    (pending if i < warm else ops).append(("W", i, 0))
            for i in range(m - warm, m):
                ops.append(("B", i, 0))
                if zero_bubble:
                    ops.append(("W", i, 0))
                    if pending:
                        ops.append(pending.pop(0))
            ops += pending
        orders.append(ops)
    return orders


def _deps(op: tuple[str, int, int], j: int, p: int, v: int) -> list[tuple[int, tuple[str, int, int]]]:
    kind, mb, c = op
    if kind == "F":
        if j > 0:
            return [(j - 1, ("F", mb, c))]
        return [(p - 1, ("F", mb, c - 1))] if c > 0 else []
    if kind == "B":
        own = (j, ("F", mb, c))
        if j < p - 1:
            return [own, (j + 1, ("B", mb, c))]
        return [own, (0, ("B", mb, c + 1))] if c < v - 1 else [own]
    return [(j, ("B", mb, c))]


def schedule_timeline(pipeline: Mapping[str, Any]) -> list[Block]:
    """Simulates the schedule of ``pipeline`` (an explanation's ``pipeline``): each stage runs
    its operations in the schedule's order, each as soon as its inputs are ready.

    Forward and backward take the stage's per-micro-batch times (split evenly over its
    interleaved chunks); under ZB-H1 the backward is split into the input-gradient part and the
    weight-gradient part, which may wait to fill the bubble. Transfers are not drawn.
    """
    schedule = str(pipeline["schedule"])
    stages = list(pipeline["stages"])
    p, m, v = len(stages), int(pipeline["micro_batches"]), int(pipeline["vpp"])
    if p == 0 or m < 1 or v < 1:
        raise InvalidInputError("invalid pipeline: needs stages, micro_batches >= 1, vpp >= 1")
    zb = schedule == "zb-h1"

    def duration(j: int, kind: str) -> float:
        s = stages[j]
        if kind == "F":
            return float(s["fwd_s"]) / v
        if kind == "B":
            return (float(s["bwd_s"]) - (float(s["wgrad_s"]) if zb else 0.0)) / v
        return float(s["wgrad_s"]) / v

    orders = _op_orders(schedule, p, m, v)
    done: dict[tuple[int, tuple[str, int, int]], float] = {}
    free = [0.0] * p
    nxt = [0] * p
    blocks: list[Block] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for j in range(p):
            while nxt[j] < len(orders[j]):
                op = orders[j][nxt[j]]
                deps = _deps(op, j, p, v)
                if any(d not in done for d in deps):
                    break
                start = max([free[j]] + [done[d] for d in deps])
                end = start + duration(j, op[0])
                done[(j, op)] = end
                free[j] = end
                blocks.append(Block(j, op[0], op[1], op[2], start, end))
                nxt[j] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"the {schedule} schedule deadlocked (a bug in meshplan.plot)")
    return blocks


def schedule(
    model: ModelLike,
    cluster: Cluster,
    workload: Workload,
    plan: Union[Plan, str],
    *,
    out: Optional[PathLike] = None,
) -> Figure:
    """The pipeline timeline of ``plan``: forward and backward blocks per stage, the bubble as
    the gaps; the title gives the cost model's bubble for the step."""
    x = explain(model, cluster, workload, plan)
    return schedule_figure(x, out=out)


def schedule_figure(x: Explanation, *, out: Optional[PathLike] = None) -> Figure:
    """:func:`schedule` from an explanation."""
    pipeline = x.pipeline
    blocks = schedule_timeline(pipeline)
    p = len(pipeline["stages"])
    ev = x.evaluation
    makespan = max(b.end for b in blocks)
    busy = sum(b.end - b.start for b in blocks)
    fig = _figure(max(8.0, min(18.0, 0.15 * len(blocks) / p + 6.0)), 1.2 + 0.45 * p)
    ax = fig.add_subplot()
    annotate = len(blocks) <= 400
    for b in blocks:
        ax.add_patch(Rectangle((b.start, b.stage - 0.4), b.end - b.start, 0.8,
                               facecolor=_COLORS[b.kind], edgecolor="white", linewidth=0.5))
        if annotate:
            text = str(b.micro_batch + 1) if pipeline["vpp"] == 1 else f"{b.micro_batch + 1}.{b.chunk}"
            ax.text((b.start + b.end) / 2, b.stage, text, ha="center", va="center",
                    fontsize=6, color="black" if b.kind == "W" else "white")
    ax.set_xlim(0, makespan * 1.01)
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"stage {j}" for j in range(p)])
    ax.set_xlabel("time within one step (s)")
    idle = 1 - busy / (p * makespan) if makespan > 0 else 0.0
    step = ev.step_time_s
    ax.set_title(
        f"{pipeline['schedule']}: pp={p}, vpp={pipeline['vpp']}, {pipeline['micro_batches']} "
        f"micro-batches; idle {100 * idle:.1f}% of this timeline; cost model's bubble "
        f"{ev.time_s.get('bubble', 0.0):.3f} s of the {step:.3f} s step",
        fontsize=9,
    )
    handles = [Rectangle((0, 0), 1, 1, facecolor=_COLORS[k]) for k in ("F", "B", "W")]
    names = ["forward", "backward" + (" (input grad)" if pipeline["schedule"] == "zb-h1" else ""),
             "weight grad"]
    kinds = 3 if pipeline["schedule"] == "zb-h1" else 2
    ax.legend(handles[:kinds], names[:kinds], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.0, 1.0), title=None if pipeline["vpp"] == 1 else "micro-batch.chunk",
              title_fontsize=7)
    return _done(fig, out)


# --- mesh layout ----------------------------------------------------------------------------

_GROUP_AXES = {
    "tp": ("tp",), "cp": ("cp",), "ep": ("ep",), "dp": ("dp",), "pp": ("pp",),
    "dense_dp": ("cp", "ep", "dp"), "expert_dp": ("cp", "dp"),
}


def group_ids(mesh: Mapping[str, Any], axis: str, num_ranks: int) -> list[int]:
    """For every rank, the index of its group along ``axis`` (groups numbered by their
    smallest rank)."""
    if axis not in _GROUP_AXES:
        raise InvalidInputError(
            f"invalid axis: {axis!r} (allowed: {', '.join(_GROUP_AXES)})"
        )
    members = _GROUP_AXES[axis]
    others = [(int(a["size"]), int(a["stride"])) for a in mesh["axes"] if a["axis"] not in members]
    ids: dict[tuple[int, ...], int] = {}
    out = []
    for r in range(num_ranks):
        key = tuple((r // stride) % size for size, stride in others)
        out.append(ids.setdefault(key, len(ids)))
    return out


def mesh(
    model: ModelLike,
    cluster: Cluster,
    workload: Workload,
    plan: Union[Plan, str],
    *,
    axis: str = "tp",
    max_ranks: int = 512,
    out: Optional[PathLike] = None,
) -> Figure:
    """The ranks of ``plan`` coloured by their ``axis`` group (``tp``, ``cp``, ``ep``, ``dp``,
    ``pp``, ``dense_dp`` or ``expert_dp``), NVLink domains outlined; at most ``max_ranks`` ranks
    (whole domains) are drawn."""
    x = explain(model, cluster, workload, plan)
    return mesh_figure(x, axis=axis, max_ranks=max_ranks, out=out)


def mesh_figure(
    x: Explanation, *, axis: str = "tp", max_ranks: int = 512, out: Optional[PathLike] = None
) -> Figure:
    """:func:`mesh` from an explanation."""
    from matplotlib import colormaps

    info = x.mesh
    n = x.plan.num_gpus
    domain = int(info["domain_size"])
    cols = max(d for d in range(1, min(domain, 16) + 1) if domain % d == 0)
    shown = min(n, max(domain, max_ranks // domain * domain))
    ids = group_ids(info, axis, shown)
    rows = -(-shown // cols)
    fig = _figure(min(14.0, max(7.5, 1.0 + 0.7 * cols)), min(16.0, 1.6 + 0.45 * rows))
    ax = fig.add_subplot()
    palette = [colormaps[name](i) for name in ("tab20", "tab20b", "tab20c") for i in range(20)]
    for r in range(shown):
        row, col = divmod(r, cols)
        ax.add_patch(Rectangle((col, row), 1, 1, facecolor=palette[ids[r] % len(palette)],
                               edgecolor="white", linewidth=0.8))
        if shown <= 256:
            ax.text(col + 0.5, row + 0.5, str(r), ha="center", va="center", fontsize=7)
    rows_per_domain = domain // cols
    for d in range(-(-shown // domain)):
        ax.add_patch(Rectangle((0, d * rows_per_domain), cols, rows_per_domain, fill=False,
                               edgecolor="black", linewidth=2.2))
    ax.set_xlim(-0.1, cols + 0.1)
    ax.set_ylim(rows + 0.1, -0.1)
    ax.set_aspect("equal")
    ax.axis("off")
    group = next((g for g in info["groups"] if g["axis"] == axis), None)
    if group is None:
        where = f"{axis} = 1: every rank is its own group"
    else:
        where = (
            f"{group['size']} ranks per group, {group['members_per_domain']} per domain, "
            + ("crosses domains" if group["crosses_domain"] else "inside one domain")
        )
    more = f"; first {shown} of {n} ranks" if shown < n else ""
    ax.set_title(
        f"{axis} groups: {where}\norder {info['order']} (innermost first), "
        f"{domain} GPUs per NVLink domain (thick outline){more}",
        fontsize=9,
    )
    return _done(fig, out)


# --- shared ---------------------------------------------------------------------------------


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _done(fig: Figure, out: Optional[PathLike]) -> Figure:
    if out is not None:
        suffix = os.path.splitext(os.fspath(out))[1].lower().lstrip(".")
        if suffix not in ("png", "svg", "pdf"):
            raise InvalidInputError(
                f"invalid out: {os.fspath(out)!r} (allowed: a .png, .svg or .pdf file)"
            )
        fig.savefig(out, format=suffix)
    return fig


__all__ = [
    "pareto",
    "pareto_front",
    "schedule",
    "schedule_figure",
    "schedule_timeline",
    "mesh",
    "mesh_figure",
    "group_ids",
    "Block",
    "short_label",
    "PARETO_TOP_K",
]
