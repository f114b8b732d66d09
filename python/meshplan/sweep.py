"""``meshplan sweep``: the best plan over a grid of what-ifs (GPU counts, GPU types, models,
batch sizes, sequence lengths), searched as one batch (:func:`meshplan.search_many`).

:func:`sweep` takes one or more values per variable and searches the cartesian product (in the
order model, gpu, gpus, global_batch, seq_len, the last varying fastest); each point gives one
row (:data:`COLUMNS`): the variables, ``status`` (``ok``, ``infeasible`` when no plan fits, or
``error`` with the message in ``error``), the best plan's tokens/s per GPU, MFU, step time and
peak memory, its degrees and knobs, the plan in ``meshplan evaluate --plan`` syntax, and the
search's candidate and feasible counts. :func:`plot` draws the best tokens/s per GPU and MFU
against the swept variable (``pip install 'meshplan[plot]'``).
"""

from __future__ import annotations

import csv
import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence, TextIO

from .batch import Query, search_many
from .errors import InvalidInputError, MeshplanError
from .hardware import Cluster, Gpu
from .plan import PLAN_FIELDS
from .report import SearchResult
from .space import SearchSpace
from .workload import Workload

VARIABLES = ("model", "gpu", "gpus", "global_batch", "seq_len")
"""What a sweep varies, outermost first."""

COLUMNS = (
    *VARIABLES,
    "hypothetical",
    "status",
    "tokens_per_s_per_gpu",
    "mfu",
    "step_time_s",
    "peak_memory_gib",
    *PLAN_FIELDS,
    "plan",
    "candidates",
    "feasible",
    "error",
)
"""The columns of one sweep row (CSV header, JSON keys)."""

_PLAN_FIELDS = COLUMNS[COLUMNS.index("dp") : COLUMNS.index("plan")]


@dataclass(frozen=True)
class Point:
    """One point of a sweep."""

    model: str
    gpu: str
    gpus: int
    global_batch: int
    seq_len: int
    hardware: tuple[tuple[str, Any], ...] = ()
    """What-if GPU fields of this point (``(("memory_gib", 141), ...)``), applied to ``gpu``
    (see :mod:`meshplan.whatif`); empty: the preset as it is."""


def grid(
    models: Sequence[str],
    gpus: Sequence[str],
    counts: Sequence[int],
    global_batches: Sequence[int],
    seq_lens: Sequence[int],
    hardware: Optional[Mapping[str, Sequence[Any]]] = None,
) -> list[Point]:
    """The cartesian product of the values, the last variable varying fastest.

    ``hardware`` sweeps GPU fields as further axes (``{"memory_gib": [80, 141], "scaleup_domain":
    [8, 72]}``), varying faster than the five variables, in the mapping's order."""
    for name, values in zip(VARIABLES, (models, gpus, counts, global_batches, seq_lens)):
        if not values:
            raise InvalidInputError(f"invalid sweep.{name}: [] (allowed: one or more values)")
    axes = dict(hardware or {})
    for name, values in axes.items():
        if not values:
            raise InvalidInputError(f"invalid sweep.{name}: [] (allowed: one or more values)")
    settings = [tuple(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    return [
        Point(*p, hardware=h)
        for p in itertools.product(models, gpus, counts, global_batches, seq_lens)
        for h in settings
    ]


def _row(point: Point, outcome: Any) -> dict[str, Any]:
    row: dict[str, Any] = {name: None for name in COLUMNS}
    row.update({k: v for k, v in vars(point).items() if k != "hardware"})
    row["hypothetical"] = bool(point.hardware)
    row.update({f"hw.{k}": v for k, v in point.hardware})
    if isinstance(outcome, MeshplanError):
        row.update(status="error", error=" ".join(str(outcome).split("\n")))
        return row
    assert isinstance(outcome, SearchResult)
    row.update(candidates=outcome.stats.candidates, feasible=outcome.stats.feasible)
    best = outcome.best
    if best is None:
        row["status"] = "infeasible"
        return row
    plan = best.plan.to_dict()
    row.update({k: plan[k] for k in _PLAN_FIELDS})
    row.update(
        status="ok",
        tokens_per_s_per_gpu=best.tokens_per_s_per_gpu,
        mfu=best.mfu,
        step_time_s=best.step_time_s,
        peak_memory_gib=best.peak_memory_gib,
        plan=str(best.plan),
    )
    return row


def sweep(
    points: Sequence[Point],
    workload: Optional[Workload] = None,
    space: Optional[SearchSpace] = None,
    *,
    gpus_per_node: Optional[int] = None,
    nvlink_domain: Optional[int] = None,
    calibration: Optional[str] = None,
    threads: Optional[int] = None,
    progress: Optional[bool] = None,
    timeout_s: Optional[float] = None,
    gpu_overrides: Optional[Mapping[str, Any]] = None,
    executor: str = "local",
    ray_address: Optional[str] = None,
    chunk_size: Optional[int] = None,
) -> list[dict[str, Any]]:
    """The best plan at every point (one row each, in order; see the module docs).

    ``workload`` sets everything but the swept ``global_batch`` and ``seq_len`` (precision,
    optimizer, ...); ``space`` constrains every search (``top_k`` is set to 1). A point that
    cannot be searched (an unknown preset, a precision the GPU lacks) is a row with ``status``
    ``error``, not an exception. ``timeout_s`` bounds the whole sweep: the points not searched
    in time are ``error`` rows (a deadline).

    ``gpu_overrides`` changes every point's GPU (what-if hardware, :mod:`meshplan.whatif`); a
    point's own ``hardware`` is applied after it. Rows of hypothetical GPUs have
    ``hypothetical`` true, the what-if label in ``gpu`` and one ``hw.<field>`` column per swept
    field. ``executor="ray"`` searches on a Ray cluster (see :func:`meshplan.search_many`).
    """
    from . import whatif

    from .api import as_model
    from .validation import calibrated

    base = workload or Workload(1, 1)
    space = replace(space or SearchSpace(), top_k=1)
    models: dict[str, Any] = {}
    gpu_types: dict[tuple[str, tuple[tuple[str, Any], ...]], Gpu] = {}
    queries: list[Any] = []
    for p in points:
        try:
            if p.model not in models:
                models[p.model] = as_model(p.model)
            key = (p.gpu, p.hardware)
            if key not in gpu_types:
                gpu = Gpu.preset(p.gpu)
                if calibration is not None:
                    # Calibration first: its file names the preset, not the what-if label.
                    gpu = calibrated(Cluster(gpu, 1), calibration).resolved_gpu()
                changes = {**(gpu_overrides or {}), **dict(p.hardware)}
                gpu_types[key] = gpu.with_overrides(changes) if changes else gpu
            gpu = gpu_types[key]
            cluster = Cluster(gpu, p.gpus, gpus_per_node, nvlink_domain)
            work = replace(base, global_batch=p.global_batch, seq_len=p.seq_len)
            queries.append(Query(models[p.model], cluster, work, space))
        except MeshplanError as e:
            queries.append(e)
    good = [q for q in queries if isinstance(q, Query)]
    results = iter(search_many(good, threads=threads, progress=progress, timeout_s=timeout_s,
                               executor=executor, ray_address=ray_address,
                               chunk_size=chunk_size))
    rows = []
    for p, q in zip(points, queries):
        row = _row(p, q if isinstance(q, MeshplanError) else next(results))
        made = gpu_types.get((p.gpu, p.hardware))
        if made is not None and whatif.is_hypothetical(made.name):
            row.update(gpu=made.name, hypothetical=True)
        rows.append(row)
    return rows


def write_csv(rows: Sequence[dict[str, Any]], out: TextIO) -> None:
    """The rows as CSV, header :data:`COLUMNS` (empty cells where a point has no plan)."""
    extra = list(dict.fromkeys(k for r in rows for k in r if k not in COLUMNS))
    writer = csv.DictWriter(out, fieldnames=[*COLUMNS, *extra], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)


def x_variable(rows: Sequence[dict[str, Any]]) -> str:
    """The variable a plot puts on the x axis: the first numeric one that varies (gpus,
    global_batch, seq_len), else the first that varies at all, else ``gpus``."""
    varying = [v for v in VARIABLES if len({r[v] for r in rows}) > 1]
    numeric = [v for v in ("gpus", "global_batch", "seq_len") if v in varying]
    return (numeric or varying or ["gpus"])[0]


def plot(rows: Sequence[dict[str, Any]], out: str, x: Optional[str] = None) -> str:
    """Best tokens/s per GPU and MFU against ``x`` (default :func:`x_variable`), one line per
    combination of the other varying variables; written to ``out`` (PNG, SVG or PDF by the
    suffix). Returns ``out``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - the plot extra is installed in the test suite
        raise MeshplanError(
            "plots need matplotlib: pip install 'meshplan[plot]'"
        ) from None
    if not rows:
        raise InvalidInputError("invalid sweep: no rows to plot")
    x = x or x_variable(rows)
    if x not in VARIABLES:
        raise InvalidInputError(f"invalid x: {x!r} (allowed: {', '.join(VARIABLES)})")
    others = [v for v in VARIABLES if v != x and len({r[v] for r in rows}) > 1]
    numeric = all(isinstance(r[x], int) for r in rows)
    categories = list(dict.fromkeys(r[x] for r in rows))
    series: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault(tuple(r[v] for v in others), []).append(r)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, members in series.items():
        label = ", ".join(f"{v}={k}" for v, k in zip(others, key)) or None
        xs = [m[x] if numeric else categories.index(m[x]) for m in members]
        tps = [m["tokens_per_s_per_gpu"] if m["status"] == "ok" else math.nan for m in members]
        mfu = [100 * m["mfu"] if m["status"] == "ok" else math.nan for m in members]
        ax_t.plot(xs, tps, marker="o", label=label)
        ax_m.plot(xs, mfu, marker="o", label=label)
    for ax, title in ((ax_t, "best tokens/s per GPU"), (ax_m, "MFU of the best plan (%)")):
        ax.set_xlabel(x)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if numeric and x == "gpus" and len(categories) > 2:
            ax.set_xscale("log", base=2)
            ax.set_xticks(categories, [str(c) for c in categories])
            ax.minorticks_off()
        if not numeric:
            ax.set_xticks(range(len(categories)), [str(c) for c in categories])
    if any(k for k in series):
        ax_t.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


__all__ = ["Point", "grid", "sweep", "write_csv", "plot", "x_variable", "VARIABLES", "COLUMNS"]
