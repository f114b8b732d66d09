"""``meshplan.search`` and ``meshplan.evaluate``: typed objects in, typed objects out.

Thin by design: every number comes from the Rust core (``meshplan._core``), which releases the
GIL while it works, so several searches can run at once from Python threads.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

from . import _core
from ._core import CancelToken
from ._fields import as_type
from .hardware import Cluster
from .model import Model
from .plan import Plan
from .report import Evaluation, SearchResult
from .space import SearchSpace
from .workload import Workload

ModelLike = Union[Model, str, "os.PathLike[str]"]
"""A :class:`Model`, a preset name, or a path to a Hugging Face ``config.json``."""


def as_model(model: object) -> Model:
    """A :class:`Model` from a Model, a dict, a preset name or a path to a ``config.json``.

    A string is a path when it exists, ends in ``.json`` or contains a path separator (preset
    names have none); a directory stands for the ``config.json`` inside it (a Hugging Face
    snapshot). Any other string is a preset name.
    """
    if isinstance(model, (str, os.PathLike)):
        path = hf_config_path(model)
        if path is None:
            return Model.preset(os.fspath(model))
        return Model.from_hf_config(path)
    return as_type(Model, model, "model")


def hf_config_path(model: object) -> Optional[str]:
    """The ``config.json`` path that ``model`` names (see :func:`as_model`), None when it is a
    preset name or not a string or path."""
    if not isinstance(model, (str, os.PathLike)):
        return None
    path = os.fspath(model)
    is_path = (
        not isinstance(model, str)
        or path.endswith(".json")
        or "/" in path
        or os.sep in path
        or os.path.exists(path)
    )
    if not is_path:
        return None
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    return path


def problem_dict(model: object, cluster: object, workload: object) -> dict[str, Any]:
    """The core's problem shape ``{"model", "cluster", "workload"}`` from the typed objects."""
    return {
        "model": as_model(model).to_dict(),
        "cluster": as_type(Cluster, cluster, "cluster").to_dict(),
        "workload": as_type(Workload, workload, "workload").to_dict(),
    }


def search(
    model: ModelLike,
    cluster: Cluster,
    workload: Workload,
    space: Optional[SearchSpace] = None,
    *,
    threads: Optional[int] = None,
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
) -> SearchResult:
    """The best plans of ``model`` on ``cluster`` for ``workload``, ranked by tokens/s per GPU.

    ``space`` constrains the search (None: every degree and knob open, see :class:`SearchSpace`).
    ``threads`` defaults to ``MESHPLAN_THREADS``, else every core; the ranking does not depend
    on it. ``timeout_s`` raises :class:`~meshplan.errors.DeadlineExceededError` when passed;
    ``cancel.cancel()`` from another thread raises :class:`~meshplan.errors.CancelledError`;
    Ctrl-C stops the search and raises ``KeyboardInterrupt``.
    """
    problem = problem_dict(model, cluster, workload)
    space_dict = as_type(SearchSpace, SearchSpace() if space is None else space, "space").to_dict()
    raw = _core.search(problem, space_dict, threads, timeout_s, cancel)
    return SearchResult.from_dict(raw)


def evaluate(
    model: ModelLike,
    cluster: Cluster,
    workload: Workload,
    plan: Union[Plan, str],
    *,
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
) -> Evaluation:
    """Scores one ``plan`` (a :class:`Plan` or ``"dp=8,tp=8,pp=4,..."``).

    An infeasible plan is still scored, with ``feasible=False`` and its reasons; a malformed
    one (a zero degree, a product that is not the GPU count) raises
    :class:`~meshplan.errors.InvalidInputError`. ``timeout_s`` and ``cancel`` as
    :func:`search`.
    """
    if isinstance(plan, str):
        plan = Plan.parse(plan)
    problem = problem_dict(model, cluster, workload)
    raw = _core.evaluate(problem, as_type(Plan, plan, "plan").to_dict(), timeout_s, cancel)
    return Evaluation.from_dict(raw)


__all__ = ["search", "evaluate", "as_model", "problem_dict", "ModelLike"]
