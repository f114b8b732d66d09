"""Holding the cost model against published training runs, and user calibration files.

:func:`validate` reads a case file in the schema of ``validation/cases.json`` (in this repository) (published
runs: model, cluster, the plan that ran, what was measured), evaluates every representable case's
plan in the Rust core and compares prediction with measurement. Unknown (null) knobs get the
documented defaults of the core's ``validation`` module; every case row lists the ones it needed.

Calibration constants (GEMM efficiency, bus efficiency, latencies, fixed memory, ...) live in the
core's GPU data file. A calibration file overrides any of them for your own cluster: a TOML (or
JSON) table per GPU preset name, or ``"*"`` for every GPU::

    [h100-sxm]
    gemm_efficiency = { bf16 = 0.70, fp8 = 0.62 }
    network_bus_efficiency = 0.7

Use it with :func:`calibrated` (a :class:`~meshplan.Cluster` whose GPU carries the overrides),
``validate(..., calibration=...)``, or ``--calibration FILE`` on the command line.

:func:`fit_gemm_efficiency` fits the per-(GPU, precision) GEMM efficiencies to a case file (the
fit of ``benchmarks/fidelity/fit_calibration.py``), and :func:`cross_validate` measures how well
the fitted constants predict runs they were not fitted to: it leaves one group of cases out at a
time (a GPU type, a model, or a source), refits without it and predicts it.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import statistics
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from . import _core
from ._fields import as_type
from .hardware import Cluster, Gpu

CalibrationLike = Union[str, "os.PathLike[str]", Mapping[str, Mapping[str, Any]]]
"""A calibration file's path, or the overrides as a mapping (GPU name or ``"*"`` → fields)."""

CasesLike = Union[str, "os.PathLike[str]", Sequence[Mapping[str, Any]]]
"""A case file's path, or the cases as a list of dicts."""


def calibration_text(calibration: CalibrationLike) -> str:
    """The text of a calibration given as a path or a mapping."""
    if isinstance(calibration, Mapping):
        return json.dumps(calibration)
    with open(os.fspath(calibration), encoding="utf-8") as f:
        return f.read()


def calibrated(cluster: Cluster, calibration: CalibrationLike) -> Cluster:
    """``cluster`` with its GPU's calibration constants overridden by ``calibration``.

    Raises :class:`~meshplan.errors.InvalidInputError` naming the bad field for an unknown GPU
    name, an unknown field or an out-of-range value.
    """
    cluster = as_type(Cluster, cluster, "cluster")
    gpu = cluster.gpu if isinstance(cluster.gpu, Gpu) else Gpu.preset(cluster.gpu)
    raw = _core.apply_calibration(gpu.to_dict(), calibration_text(calibration))
    return replace(cluster, gpu=Gpu.from_dict(raw))


@dataclass
class ValidationReport:
    """Per-case rows and a summary (fractions, not percent).

    ``summary`` has ``throughput`` (``n``, ``median_ape``, ``p90_ape``, ``within_10pct``,
    ``within_20pct``, ``median_signed_error``), ``memory`` (``n``, ``median_ape``), ``by_gpu``,
    ``by_arch`` and ``by_stack`` (throughput statistics per group; each case is timed under the
    training stack that ran it) and, after a search, ``feasible_recall``
    and ``regret`` (``n``, ``median``, ``p90``). APE = |predicted / measured − 1|.
    """

    cases: list[dict[str, Any]]
    summary: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"cases": self.cases, "summary": self.summary}

    def case(self, case_id: str) -> dict[str, Any]:
        """The row of the case ``case_id`` (KeyError if absent)."""
        for row in self.cases:
            if row["id"] == case_id:
                return row
        raise KeyError(case_id)


def _cases_text(cases: CasesLike) -> str:
    if isinstance(cases, (str, os.PathLike)):
        with open(os.fspath(cases), encoding="utf-8") as f:
            return f.read()
    return json.dumps(list(cases))


def validate(
    cases: CasesLike,
    *,
    search: bool = False,
    calibration: Optional[CalibrationLike] = None,
    threads: Optional[int] = None,
) -> ValidationReport:
    """Compares the cost model with the published runs of ``cases``.

    With ``search=True`` each case's problem is also searched: the report then says whether the
    published plan is judged feasible (``feasible_recall``), its rank among the feasible plans
    and the regret (best predicted tokens/s over the published plan's, minus 1).
    A case that does not fit the schema raises :class:`~meshplan.errors.InvalidCaseError`
    naming the case and the field.
    """
    text = _cases_text(cases)
    cal = None if calibration is None else calibration_text(calibration)
    raw = _core.validate(text, search, cal, threads)
    return ValidationReport(cases=list(raw["cases"]), summary=dict(raw["summary"]))


FIT_MIN_RUNS = 3
"""Dense runs a (GPU, precision) group needs for its GEMM efficiency to be fitted."""

FIT_BISECTION_STEPS = 12
"""Bisection steps of the GEMM-efficiency fit (the interval [0.15, 1] shrinks 4096-fold)."""

CROSS_VALIDATION_GROUPS = ("gpu", "model", "source", "stack")
"""What :func:`cross_validate` can leave out: a GPU type, a model, a source, or a training stack."""


def calibration_mapping(calibration: Optional[CalibrationLike]) -> dict[str, Any]:
    """The overrides of ``calibration`` as a mapping (JSON when the text starts with ``{``, TOML
    otherwise, as the core reads it); ``{}`` for None."""
    if calibration is None:
        return {}
    if isinstance(calibration, Mapping):
        return copy.deepcopy(dict(calibration))
    text = calibration_text(calibration)
    if text.lstrip().startswith("{"):
        return dict(json.loads(text))
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef,import-not-found,unused-ignore]
    return dict(tomllib.loads(text))


def _case_list(cases: CasesLike) -> list[dict[str, Any]]:
    return list(json.loads(_cases_text(cases)))


def source_family(case: Mapping[str, Any]) -> str:
    """The source a case belongs to: the prefix of its id before the first ``-`` (ids are named
    ``<source>-...``: ``mbridge``, ``dgxc``, ``narayanan21``, ``torchtitan``, ...), so that the
    releases of one performance table form one group."""
    return str(case["id"]).split("-", 1)[0]


def case_stacks(cases: CasesLike) -> dict[str, str]:
    """The training stack of each case by id, as the core maps its source (``data/sources.toml``
    in the core: torchtitan, DeepSpeed, MaxText; megatron-core otherwise)."""
    return {str(row["id"]): str(row["stack"]) for row in validate(cases).cases}


def _group_of(by: str, cases: Sequence[Mapping[str, Any]]) -> Callable[[Mapping[str, Any]], str]:
    if by == "stack":
        stacks = case_stacks(list(cases))
        return lambda c: stacks[str(c["id"])]
    if by == "gpu":
        return lambda c: str(c["cluster"]["gpu"])
    if by == "model":
        return lambda c: str(c["model"]["name"])
    if by == "source":
        return source_family
    raise ValueError(f"cross-validation group {by!r}: allowed {', '.join(CROSS_VALIDATION_GROUPS)}")


def _with_gemm(base: Mapping[str, Any], values: Mapping[tuple[str, str], float]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for (gpu, precision), value in values.items():
        out.setdefault(gpu, {}).setdefault("gemm_efficiency", {})[precision] = value
    return out


def _dense_errors(report: ValidationReport) -> dict[tuple[str, str], list[tuple[str, float]]]:
    """The (source, signed error) of each evaluated dense run, by (GPU, precision)."""
    groups: dict[tuple[str, str], list[tuple[str, float]]] = defaultdict(list)
    for row in report.cases:
        if row["status"] == "ok" and row.get("signed_error") is not None and row["arch"] == "dense":
            groups[(row["gpu"], row["precision"])].append((source_family(row), row["signed_error"]))
    return groups


def balanced_median(errors: Sequence[tuple[str, float]]) -> float:
    """The median over sources of each source's median error: every source of a group has one
    vote, whatever its number of runs (``errors`` are (source, error) pairs)."""
    by_source: dict[str, list[float]] = defaultdict(list)
    for source, error in errors:
        by_source[source].append(error)
    return statistics.median(statistics.median(v) for v in by_source.values())


def fit_gemm_efficiency(
    cases: CasesLike,
    calibration: Optional[CalibrationLike] = None,
    *,
    min_runs: int = FIT_MIN_RUNS,
    steps: int = FIT_BISECTION_STEPS,
) -> dict[tuple[str, str], float]:
    """GEMM efficiency per (GPU, precision) fitted to the *dense* runs of ``cases``.

    Each group with at least ``min_runs`` evaluated dense runs is bisected on [0.15, 1] so that
    its dense runs' signed throughput error is zero at the median (dense only, so that errors of
    the MoE terms do not leak into the GEMM efficiency); all groups move together, one
    ``validate`` per step. Every other constant is the data file's, overridden by
    ``calibration``. Groups with fewer runs are absent from the result.

    The median is taken over sources, not runs (:func:`balanced_median`): the runs of one source
    share its cluster, software and measuring, so their errors are not independent, and a source
    with a hundred rows of one cluster would otherwise outvote every other source of that GPU.
    """
    case_list = _case_list(cases)
    base = calibration_mapping(calibration)
    first = _dense_errors(validate(case_list, calibration=base or None))
    keys = sorted(k for k, v in first.items() if len(v) >= min_runs)
    lo = {k: 0.15 for k in keys}
    hi = {k: 1.0 for k in keys}
    mid = {k: round((lo[k] + hi[k]) / 2, 4) for k in keys}
    for _ in range(steps):
        errors = _dense_errors(validate(case_list, calibration=_with_gemm(base, mid)))
        for k in keys:
            if balanced_median(errors[k]) > 0:
                hi[k] = mid[k]  # predicted too fast: lower the efficiency
            else:
                lo[k] = mid[k]
        mid = {k: round((lo[k] + hi[k]) / 2, 4) for k in keys}
    return mid


SIXTEEN_BIT = ("bf16", "fp16")
"""Precisions that run at the same tensor-core rate."""


def _matmul_table(gpu: str, base: Mapping[str, Any]) -> dict[str, tuple[float, bool]]:
    """``gpu``'s maximum-achievable-matmul fractions by precision (its preset's
    ``calibration.matmul_efficiency``, overridden by ``base``), each with whether it is measured:
    the preset's provenance says ``measured`` (not ``derived`` from a sibling or another
    precision), and an override is the user's own microbenchmark."""
    table: dict[str, tuple[float, bool]] = {}
    if gpu in _core.gpu_presets():
        kinds = _core.gpu_provenance(gpu)["constants"]
        for precision, value in (_core.gpu_preset(gpu)["calibration"].get("matmul_efficiency") or {}).items():
            if value is not None:
                kind = (kinds.get(f"matmul_efficiency.{precision}") or {}).get("kind")
                table[precision] = (float(value), kind == "measured")
    for key in ("*", gpu):
        for precision, value in ((base.get(key) or {}).get("matmul_efficiency") or {}).items():
            if value is not None:
                table[precision] = (float(value), True)
    return table


def matmul_fact(gpu: str, base: Mapping[str, Any], precision: str = "bf16") -> Optional[float]:
    """``gpu``'s maximum-achievable-matmul fraction at ``precision``, else at BF16 (as the core's
    ``device::gemm_efficiency`` falls back), measured or derived; None when no microbenchmark is
    on record (a user GPU, a power-capped SKU)."""
    table = _matmul_table(gpu, base)
    fact = table.get(precision) or table.get("bf16")
    return fact[0] if fact is not None else None


REALISATION_MIN_GROUPS = 2
"""Fitted (GPU, precision) groups a realisation class needs in a fold to get its own median."""


@functools.lru_cache(maxsize=None)
def realisation_class(gpu: str) -> str:
    """The class of the core's ``matmul_realisation`` (``data/device.toml``) ``gpu`` belongs to:
    its preset's ``architecture`` where the table has one for it, else ``default`` (a fixed
    fact of the shipped presets, looked up once per name: every fold's prior asks for it)."""
    architecture = _core.gpu_preset(gpu).get("architecture") if gpu in _core.gpu_presets() else None
    return _core.matmul_realisation(architecture)[0]


def matmul_realisation(
    fitted: Mapping[tuple[str, str], float],
    base: Mapping[str, Any],
    gpu: Optional[str] = None,
) -> Optional[float]:
    """What training runs realise of the matmul microbenchmark, refitted on ``fitted`` by the rule
    of ``data/device.toml`` ``matmul_realisation``: the median, over the fitted (GPU, precision)
    groups whose matmul fraction is *measured at that precision* (BF16 and FP16 are one tensor-core
    rate: a measured BF16 fraction serves an FP16 group), of fitted efficiency / fraction, taken
    within ``gpu``'s realisation class (:func:`realisation_class`) when ``fitted`` has at least
    :data:`REALISATION_MIN_GROUPS` groups of it, else over every group (a class the fold cannot
    estimate); all groups pooled when ``gpu`` is None; None when no fitted group has a measured
    fraction."""
    ratios: list[tuple[str, float]] = []
    for (name, precision), value in fitted.items():
        table = _matmul_table(name, base)
        same_rate = SIXTEEN_BIT if precision in SIXTEEN_BIT else (precision,)
        measured = [fact for p, (fact, is_measured) in table.items() if p in same_rate and is_measured]
        if measured:
            ratios.append((realisation_class(name), value / measured[0]))
    if gpu is not None:
        own = realisation_class(gpu)
        same = [r for c, r in ratios if c == own]
        if len(same) >= REALISATION_MIN_GROUPS:
            return statistics.median(same)
    return statistics.median([r for _, r in ratios]) if ratios else None


def matmul_prior(
    key: tuple[str, str],
    fitted: Mapping[tuple[str, str], float],
    base: Mapping[str, Any],
) -> Optional[float]:
    """GEMM efficiency of a (GPU, precision) no training run fitted, from hardware facts, by the
    rule the core applies to a GPU without fitted efficiencies (``device::gemm_efficiency``): the
    GPU's matmul fraction at that precision (else at BF16, :func:`matmul_fact`) times the
    realisation of its class, refitted on ``fitted`` (:func:`matmul_realisation`, the fold's own
    ``matmul_realisation``); None when the GPU has no fact or no fitted group has a measured one.

    A GPU's fitted efficiency is mostly its microbenchmark times how much of it the software
    realises (0.91-0.98 for the Ampere/Hopper sources, 0.71-0.83 for the Blackwell ones,
    docs/costmodel.md §5.2), so a held-out GPU is predicted from its own hardware rather than
    from the other GPUs' median."""
    fact = matmul_fact(key[0], base, key[1])
    realisation = matmul_realisation(fitted, base, key[0])
    if fact is None or realisation is None:
        return None
    return round(fact * realisation, 4)


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``throughput``, ``by_gpu``, ``by_arch`` and ``by_stack`` of case rows, as in
    :attr:`ValidationReport.summary` (the core's own summary of them)."""
    summary = _core.summarise(rows)
    return {k: summary[k] for k in ("throughput", "by_gpu", "by_arch", "by_stack")}


def throughput_stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The core's throughput statistics (``n``, ``median_ape``, ``p90_ape``, ``within_10pct``,
    ``within_20pct``, ``median_signed_error``) of the scored rows among the ``ok`` ``rows``."""
    return dict(_core.summarise(rows)["throughput"])


@dataclass
class CrossValidationReport:
    """Leave-one-group-out predictions of every case, and how each fold was fitted.

    ``cases`` are the rows of :func:`validate`, each predicted by the fold that held its group out
    (with a ``group`` field); ``summary`` has ``throughput``, ``by_gpu``, ``by_arch`` and
    ``by_stack`` over them
    and ``by_group`` (each held-out group's statistics); ``folds`` lists per group the training
    and held-out case counts, the GEMM efficiencies used for the held-out group and where each
    came from (``fitted`` on the other groups' runs; when the other groups have too few runs of
    that GPU and precision, ``matmul fact`` from its microbenchmark, or ``fleet median`` of the
    fitted values at that precision).
    """

    by: str
    cases: list[dict[str, Any]]
    summary: dict[str, Any]
    folds: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"by": self.by, "cases": self.cases, "summary": self.summary, "folds": self.folds}


def cross_validate(
    cases: CasesLike,
    by: str,
    *,
    calibration: Optional[CalibrationLike] = None,
) -> CrossValidationReport:
    """Leave-one-group-out cross-validation of the fitted constants on ``cases``.

    ``by`` is ``"gpu"`` (cluster GPU type), ``"model"`` (model name), ``"source"``
    (:func:`source_family`) or ``"stack"`` (the training stack that ran it, :func:`case_stacks`). For each group, the GEMM efficiency of every (GPU, precision) is
    refitted by :func:`fit_gemm_efficiency` on the *other* groups' runs, and the group is
    predicted with them; a (GPU, precision) the other groups cannot fit (fewer than
    :data:`FIT_MIN_RUNS` dense runs: always so for the held-out GPU under ``by="gpu"``) gets
    a prior from hardware facts (:func:`matmul_prior`: its measured matmul fraction times the
    fold's realisation ratio) when the GPU has a microbenchmark on record, else the median of
    that fold's fitted values at the same precision (or of all of them), never the data file's
    in-sample value. The four constants shared by every GPU
    (``elementwise_bytes_per_hidden``, ``attention_efficiency``, ``layer_overhead_us``,
    ``tp_overlap``) keep the data file's values (or ``calibration``'s): they were
    fitted once on all cases on a grid that is too slow to rerun per fold, so they remain
    in-sample. Raises ValueError for an unknown ``by``.
    """
    case_list = _case_list(cases)
    group = _group_of(by, case_list)
    base = calibration_mapping(calibration)
    names = sorted({group(c) for c in case_list})
    rows: list[dict[str, Any]] = []
    folds: list[dict[str, Any]] = []
    for name in names:
        held = [c for c in case_list if group(c) == name]
        train = [c for c in case_list if group(c) != name]
        fitted = fit_gemm_efficiency(train, base) if train else {}
        used: dict[tuple[str, str], float] = {}
        origin: dict[str, str] = {}
        # The (GPU, precision) of each held-out row as the core resolved it (defaults filled in).
        first = validate(held, calibration=base or None)
        for row in first.cases:
            if row["status"] != "ok":
                continue
            key = (str(row["gpu"]), str(row["precision"]))
            if key in used:
                continue
            if key in fitted:
                used[key], how = fitted[key], "fitted"
            elif (prior := matmul_prior(key, fitted, base)) is not None:
                used[key], how = prior, "matmul fact"
            else:
                same = [v for (_, p), v in fitted.items() if p == key[1]]
                pool = same or list(fitted.values())
                if not pool:
                    continue  # nothing fitted at all: the data file's value stays
                used[key], how = round(statistics.median(pool), 4), "fleet median"
            origin[f"{key[0]}/{key[1]}"] = how
        report = validate(held, calibration=_with_gemm(base, used) or None)
        for row in report.cases:
            rows.append({**row, "group": name})
        folds.append({
            "group": name,
            "n_train": len(train),
            "n_held_out": len(held),
            "gemm_efficiency": {f"{g}/{p}": v for (g, p), v in sorted(used.items())},
            "origin": origin,
        })
    summary = summarize(rows)
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["status"] == "ok":
            by_group[r["group"]].append(r)
    summary["by_group"] = {k: throughput_stats(v) for k, v in sorted(by_group.items())}
    return CrossValidationReport(by=by, cases=rows, summary=summary, folds=folds)


__all__ = [
    "validate", "calibrated", "calibration_text", "calibration_mapping", "ValidationReport",
    "CalibrationLike", "fit_gemm_efficiency", "cross_validate", "CrossValidationReport",
    "summarize", "throughput_stats", "matmul_fact", "matmul_realisation", "matmul_prior",
    "realisation_class", "REALISATION_MIN_GROUPS", "source_family", "case_stacks", "CROSS_VALIDATION_GROUPS",
]
