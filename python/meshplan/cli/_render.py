"""How the commands print: plan tables, search statistics, one evaluated plan, CSV rows, and the
title and hardware labels of a problem."""

from __future__ import annotations

import csv
from typing import Any, Optional, Sequence, TextIO

from ..hardware import Cluster, Gpu, calibration_notes
from ..model import Model
from ..plan import DEFAULT_ORDER, PLAN_FIELDS
from ..report import Evaluation, SearchResult, SearchStats
from ..workload import Workload

PLAN_COLUMNS = ("rank", *PLAN_FIELDS)
METRIC_COLUMNS = (
    "feasible",
    "step_time_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "model_tflops_per_gpu",
    "hardware_tflops_per_gpu",
    "peak_memory_gib",
    "micro_batches",
    "worst_stage",
)


def search_json(result: SearchResult) -> dict[str, Any]:
    """``{"plans": [flat plan records], "stats": {...}}`` (the ``search --json`` shape)."""
    return {"plans": [p.to_flat_dict() for p in result.plans], "stats": result.stats.to_dict()}


def flat_row(ev: Evaluation) -> dict[str, Any]:
    """One CSV row: the plan, the metrics, and ``memory_gib.*`` / ``time_s.*`` columns."""
    flat = ev.to_flat_dict()
    row = {k: flat[k] for k in PLAN_COLUMNS + METRIC_COLUMNS}
    row.update({f"memory_gib.{k}": v for k, v in ev.memory_gib.items()})
    row.update({f"time_s.{k}": v for k, v in ev.time_s.items()})
    return row


def labelled(data: dict[str, Any], cluster: Cluster, precision: Optional[str] = None) -> dict[str, Any]:
    """``data`` with a ``hardware`` entry when the GPU is hypothetical (a what-if), and a
    ``notes`` list when ``precision``'s GEMM efficiency was not fitted on the GPU's own runs
    (:func:`meshplan.hardware.calibration_notes`)."""
    if cluster.resolved_gpu().hypothetical:
        data = {"hardware": hardware_json(cluster), **data}
    notes = [] if precision is None else calibration_notes(cluster.resolved_gpu(), precision)
    if notes:
        data = {**data, "notes": notes}
    return data


def write_csv(plans: Sequence[Evaluation], out: TextIO, cluster: Optional[Cluster] = None) -> None:
    """The plans as CSV with a header row (``gpu`` and ``hypothetical`` columns first when
    ``cluster``'s GPU is a what-if)."""
    rows = [flat_row(p) for p in plans]
    if cluster is not None and cluster.resolved_gpu().hypothetical:
        rows = [{"gpu": cluster.resolved_gpu().name, "hypothetical": True, **r} for r in rows]
    header = list(rows[0]) if rows else list(PLAN_COLUMNS + METRIC_COLUMNS)
    writer = csv.DictWriter(out, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An aligned text table: text columns left-aligned, numbers right-aligned."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    numeric = [
        all(_is_number(r[i]) or r[i] == "-" for r in cells[1:])
        and any(_is_number(r[i]) for r in cells[1:])
        for i in range(len(header))
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric)]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) or (
        isinstance(value, str) and value.replace(",", "").replace(".", "", 1).isdigit()
    )


def plans_table(plans: Sequence[Evaluation]) -> str:
    """The ranked plans as an aligned table (with an ``order`` column when some plan does not
    use the default rank order)."""
    header = [
        "rank", "dp", "tp", "pp", "ep", "cp", "vpp", "mb", "zero", "recompute", "sp",
        "schedule", "step s", "tok/s/GPU", "MFU %", "mem GiB",
    ]
    orders = any(ev.plan.order != DEFAULT_ORDER for ev in plans)
    if orders:
        header.insert(12, "order")
    # Folded MoE plans: the experts' own tensor parallelism ("-": not folded).
    folded = any(ev.plan.etp is not None for ev in plans)
    if folded:
        header.insert(6, "etp")
    # Plans that name their CP exchange (a search given cp_exchanges): it, after cp.
    exchanges = any(ev.plan.cp_exchange is not None for ev in plans)
    if exchanges:
        header.insert(6, "cp exch")
    # Distinct plans: how many indistinguishable plans each row stands for.
    grouped = any(ev.group_size is not None for ev in plans)
    if grouped:
        header.append("plans")
    rows = []
    for ev in plans:
        p = ev.plan
        row: list[Any] = [
            ev.rank if ev.rank is not None else "-", p.dp, p.tp, p.pp, p.ep, p.cp, p.vpp,
            p.micro_batch, p.zero,
            # Megatron's recompute modules beside the mode, where the plan names them.
            p.recompute if p.recompute_modules is None else f"{p.recompute}({p.recompute_modules})",
            "on" if p.sequence_parallel else "off",
            p.schedule or "-", f"{ev.step_time_s:.3f}", f"{ev.tokens_per_s_per_gpu:,.0f}",
            f"{100 * ev.mfu:.1f}", f"{ev.peak_memory_gib:.1f}",
        ]
        if orders:
            row.insert(12, p.order)
        if folded:
            row.insert(6, p.etp if p.etp is not None else "-")
        if exchanges:
            row.insert(6, p.cp_exchange if p.cp_exchange is not None else "-")
        if grouped:
            row.append(ev.group_size if ev.group_size is not None else "-")
        rows.append(row)
    return table(header, rows)


def stats_block(stats: SearchStats) -> str:
    """What was searched and what was pruned, largest reason first."""
    lines = [
        f"candidates  {stats.candidates:,}",
        f"feasible    {stats.feasible:,}",
        f"elapsed     {stats.elapsed_s:.2f} s" + (f" ({stats.threads} threads)" if stats.threads else ""),
    ]
    if stats.groups_complete is not None:
        lines.append(
            "plans       each row is the best of its group of plans within 0.1 % step time and "
            "0.5 GiB (--ungrouped lists them all)"
            + ("" if stats.groups_complete else "; group sizes are lower bounds")
        )
    if stats.pruned:
        lines.append("pruned")
        reasons = sorted(stats.pruned.items(), key=lambda kv: (-kv[1], kv[0]))
        width = max(len(r) for r, _ in reasons)
        count_width = max(len(f"{c:,}") for _, c in reasons)
        lines += [f"  {r.ljust(width)}  {f'{c:,}'.rjust(count_width)}" for r, c in reasons]
    return "\n".join(lines)


def evaluation_block(ev: Evaluation) -> str:
    """One evaluated plan: feasibility with reasons, throughput, and both breakdowns."""
    p = ev.plan
    lines = [
        f"plan        {p}  (rank order {p.order})",
        f"feasible    {'yes' if ev.feasible else 'NO'}",
    ]
    lines += [f"  - {r.rule}: {r.message}" for r in ev.reasons]
    lines += [
        f"step time   {ev.step_time_s:.3f} s  ({ev.micro_batches} micro-batches per pipeline)",
        f"throughput  {ev.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {100 * ev.mfu:.1f} %, "
        f"{ev.model_tflops_per_gpu:.0f} model TFLOP/s per GPU",
        f"peak memory {ev.peak_memory_gib:.1f} GiB per GPU (stage {ev.worst_stage})",
        "",
        "memory GiB  " + "  ".join(f"{k} {v:.2f}" for k, v in ev.memory_gib.items()),
        "time s      " + "  ".join(f"{k} {v:.4f}" for k, v in ev.time_s.items()),
    ]
    return "\n".join(lines)


def title(model: Model, cluster: Cluster, workload: Workload) -> str:
    """The problem in one line (two when the GPU is a what-if)."""
    gpu = cluster.gpu.name if isinstance(cluster.gpu, Gpu) else cluster.gpu
    title = (
        f"{model.name} on {cluster.num_gpus} x {gpu}, global batch {workload.global_batch} x "
        f"{workload.seq_len} tokens, {workload.precision}"
    )
    if isinstance(cluster.gpu, Gpu) and cluster.gpu.hypothetical:
        title = f"HYPOTHETICAL HARDWARE: {cluster.gpu.description}\n{title}"
    for note in calibration_notes(cluster.resolved_gpu(), workload.precision):
        title = f"{title}\nnote: {note}"
    return title


def hardware_json(cluster: Cluster) -> dict[str, Any]:
    """``{"gpu": name, "hypothetical": bool, "description": ...}`` for JSON outputs."""
    gpu = cluster.resolved_gpu()
    return {"gpu": gpu.name, "hypothetical": gpu.hypothetical, "description": gpu.description}
