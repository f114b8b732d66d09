"""meshplan: a parallelism planner for large-model training.

Given a model, a cluster and a workload, :func:`search` enumerates every way to split the GPUs
into data, tensor, pipeline, expert and context parallelism (with micro-batch, ZeRO, recompute,
sequence parallel, interleaving and schedule), prunes what cannot run, scores the rest with the
Rust cost model and returns ranked plans; :func:`evaluate` scores one plan and says why it does
or does not fit.

>>> import meshplan
>>> result = meshplan.search(
...     "llama3-70b",
...     meshplan.Cluster("h100-sxm", 512),
...     meshplan.Workload(global_batch=1024, seq_len=8192),
... )  # doctest: +SKIP
"""

from __future__ import annotations

from . import errors
from ._core import CancelToken, __version__
from .api import evaluate, search
from .batch import Query, search_many
from .calibrate import CalibrationResult, parse_nccl_tests, run_calibration
from .explain import Explanation, decode_traffic, explain
from .export import export
from .feasible import FeasibleSpace, feasible_space
from .hardware import Cluster, Gpu
from .model import LinearAttention, Mamba, Mla, Model, Moe
from .plan import Plan
from .report import Evaluation, SearchResult, SearchStats, Violation
from .serving import ServingResult, evaluate_serving, explain_serving, search_serving
from .space import Degree, SearchSpace
from .validation import CrossValidationReport, ValidationReport, calibrated, cross_validate, validate
from .workload import Workload

__all__ = [
    "search",
    "evaluate",
    "search_many",
    "search_serving",
    "evaluate_serving",
    "explain_serving",
    "ServingResult",
    "Query",
    "feasible_space",
    "FeasibleSpace",
    "explain",
    "Explanation",
    "decode_traffic",
    "export",
    "validate",
    "cross_validate",
    "CrossValidationReport",
    "calibrated",
    "run_calibration",
    "parse_nccl_tests",
    "CalibrationResult",
    "ValidationReport",
    "Model",
    "Moe",
    "Mla",
    "Mamba",
    "LinearAttention",
    "Gpu",
    "Cluster",
    "Workload",
    "Plan",
    "SearchSpace",
    "Degree",
    "Evaluation",
    "SearchResult",
    "SearchStats",
    "Violation",
    "CancelToken",
    "errors",
    "__version__",
]


def __getattr__(name: str) -> object:
    # `meshplan.plot` needs matplotlib (the optional `plot` extra): imported on first use.
    if name == "plot":
        import importlib

        return importlib.import_module(".plot", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
