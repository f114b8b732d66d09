"""The whole feasible space of a search as NumPy columns (core ``feasible.rs``).

:func:`feasible_space` returns every feasible plan, not just the best ``top_k``: one
``numpy.ndarray`` per degree, knob and metric, filled in Rust and handed over as raw buffers (no
per-plan Python object), ranked best first (row ``i`` is the plan a search ranks ``i + 1``).
Study it with NumPy or pandas::

    fs = meshplan.feasible_space("llama3-70b", meshplan.Cluster("h100-sxm", 1024),
                                 meshplan.Workload(1024, 8192))
    fs.num_plans, fs["tokens_per_s_per_gpu"].max(), fs.decode("schedule")[:5]
    import pandas; df = pandas.DataFrame(fs.decoded())     # labels instead of codes

Columns (dtype): ``rank`` (uint32, 1 = best), ``dp tp pp ep cp vpp micro_batch`` (uint32),
``zero`` (uint8), ``recompute schedule order`` (uint8 codes; labels in :attr:`categories`),
``etp`` (uint32: a folded plan's expert TP, 0 for an unfolded plan), ``dispatcher`` (uint8 code,
``none`` for ``ep = 1``), ``cp_exchange`` (uint8 code, ``default`` for the stack's),
``recompute_modules`` (uint8 code: the module set's bits, bit ``i`` the ``i``-th of
:data:`meshplan.plan.RECOMPUTE_MODULES`, labels ``layernorm+moe_act``; ``default`` for none named),
``sequence_parallel ep_overlap`` (bool), ``step_time_s tokens_per_s_per_gpu mfu model_tflops_per_gpu
hardware_tflops_per_gpu peak_memory_gib`` (float64), ``micro_batches worst_stage`` (uint32), and
the breakdowns ``memory_gib.{weights,gradients,optimizer,activations,transient,fixed}`` and
``time_s.{compute,tp,cp,ep,pp_p2p,bubble,dp,optimizer}`` (float64): the columns of
``meshplan search --csv`` less ``feasible``. Every number is bit for bit what
:func:`meshplan.evaluate` gives for that plan.

The arrays are read-only views of the buffers the core filled (``.copy()`` for a writable one).
A space with more than ``max_plans`` feasible plans (default :data:`DEFAULT_MAX_PLANS`, about
200 bytes each) raises :class:`~meshplan.errors.SpaceTooLargeError` as soon as the count passes
the cap.
"""

from __future__ import annotations

import csv
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, TextIO

from . import _core
from ._core import CancelToken
from ._fields import as_type
from .api import ModelLike, problem_dict
from .hardware import Cluster
from .plan import Plan
from .report import SearchStats
from .space import SearchSpace
from .workload import Workload

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

DEFAULT_MAX_PLANS = 5_000_000
"""Default cap on the feasible plans :func:`feasible_space` returns (the core's)."""

CATEGORICAL = ("recompute", "schedule", "order", "dispatcher", "cp_exchange", "recompute_modules")
"""Columns holding small integer codes; their labels are in :attr:`FeasibleSpace.categories`."""


class FeasibleSpace(Mapping[str, "npt.NDArray[Any]"]):
    """Every feasible plan as columns: a mapping of column name to ``numpy.ndarray`` (all the
    same length, :attr:`num_plans`), ranked best first, with the search's :attr:`stats`."""

    def __init__(
        self,
        columns: Mapping[str, npt.NDArray[Any]],
        categories: Mapping[str, tuple[str, ...]],
        stats: SearchStats,
    ) -> None:
        self._columns = dict(columns)
        self.categories: dict[str, tuple[str, ...]] = dict(categories)
        """Labels of the coded columns: code ``k`` of ``column`` is ``categories[column][k]``."""
        self.stats = stats
        """Candidates, feasible (= :attr:`num_plans`), pruned by rule, elapsed, threads."""

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        return self._columns[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)

    def __repr__(self) -> str:
        return f"FeasibleSpace({self.num_plans:,} plans, {len(self)} columns)"

    @property
    def num_plans(self) -> int:
        """Rows: the feasible plans."""
        return int(self._columns["rank"].shape[0])

    def decode(self, name: str) -> npt.NDArray[Any]:
        """Column ``name`` with its codes replaced by labels (an object array); other columns
        unchanged."""
        import numpy as np

        column = self._columns[name]
        if name not in self.categories:
            return column
        labels = np.array(self.categories[name], dtype=object)
        decoded: npt.NDArray[Any] = labels[column]
        return decoded

    def decoded(self) -> dict[str, npt.NDArray[Any]]:
        """Every column, the coded ones decoded (e.g. for ``pandas.DataFrame``)."""
        return {name: self.decode(name) for name in self._columns}

    def plan(self, row: int) -> Plan:
        """The plan of ``row`` (0 = the best)."""
        fields: dict[str, Any] = {}
        for name in ("dp", "tp", "pp", "ep", "cp", "vpp", "micro_batch", "zero"):
            fields[name] = int(self._columns[name][row])
        fields["sequence_parallel"] = bool(self._columns["sequence_parallel"][row])
        for name in CATEGORICAL:
            fields[name] = self.categories[name][int(self._columns[name][row])]
        # etp 0: an unfolded plan (Plan.etp None); dispatcher "none": a plan with ep = 1.
        fields["etp"] = int(self._columns["etp"][row]) or None
        if fields["dispatcher"] == "none":
            fields["dispatcher"] = None
        # cp_exchange "default": the plan leaves it to the stack.
        if fields["cp_exchange"] == "default":
            fields["cp_exchange"] = None
        # recompute_modules "default": Megatron's core attention alone (none named).
        if fields["recompute_modules"] == "default":
            fields["recompute_modules"] = None
        fields["ep_overlap"] = bool(self._columns["ep_overlap"][row])
        return Plan.from_dict(fields)

    def write_csv(self, out: TextIO) -> None:
        """The rows as CSV with a header (labels for the coded columns, shortest round-trip
        floats), the ``meshplan search --all --csv`` format."""
        names = list(self._columns)
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        columns = [self.decode(n).tolist() for n in names]
        writer.writerows(zip(*columns))


def _array(dtype: str, buffer: bytes) -> np.ndarray[Any, Any]:
    import numpy as np

    return np.frombuffer(buffer, dtype=np.dtype(dtype))


def from_core(raw: Mapping[str, Any]) -> FeasibleSpace:
    """A :class:`FeasibleSpace` from ``meshplan._core.feasible_space``'s buffers."""
    columns = {name: _array(dtype, data) for name, dtype, data in raw["columns"]}
    categories = {name: tuple(labels) for name, labels in raw["categories"]}
    return FeasibleSpace(columns, categories, SearchStats.from_dict(raw["stats"]))


def feasible_space(
    model: ModelLike,
    cluster: Cluster,
    workload: Workload,
    space: Optional[SearchSpace] = None,
    *,
    max_plans: int = DEFAULT_MAX_PLANS,
    threads: Optional[int] = None,
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
) -> FeasibleSpace:
    """Every feasible plan of ``model`` on ``cluster`` for ``workload`` in ``space`` (None: every
    degree and knob open), as NumPy columns ranked best first (see the module docs).

    ``space.top_k`` does not apply. More than ``max_plans`` feasible plans raises
    :class:`~meshplan.errors.SpaceTooLargeError`; ``threads``, ``timeout_s`` and ``cancel`` work
    as in :func:`meshplan.search`.
    """
    problem = problem_dict(model, cluster, workload)
    space_dict = None if space is None else as_type(SearchSpace, space, "space").to_dict()
    raw = _core.feasible_space(problem, space_dict, max_plans, threads, timeout_s, cancel)
    return from_core(raw)


__all__ = ["FeasibleSpace", "feasible_space", "DEFAULT_MAX_PLANS", "CATEGORICAL"]
