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
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence, Union

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
    ``within_20pct``, ``median_signed_error``), ``memory`` (``n``, ``median_ape``), ``by_gpu``
    and ``by_arch`` (throughput statistics per group) and, after a search, ``feasible_recall``
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
    if isinstance(cases, (str, os.PathLike)):
        with open(os.fspath(cases), encoding="utf-8") as f:
            text = f.read()
    else:
        text = json.dumps(list(cases))
    cal = None if calibration is None else calibration_text(calibration)
    raw = _core.validate(text, search, cal, threads)
    return ValidationReport(cases=list(raw["cases"]), summary=dict(raw["summary"]))


__all__ = ["validate", "calibrated", "calibration_text", "ValidationReport", "CalibrationLike"]
