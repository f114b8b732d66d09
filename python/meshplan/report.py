"""What the core returns: scored plans and search statistics (core ``report.rs``).

Units are in the names: seconds (``_s``), GiB (binary, ``_gib``), TFLOP/s. Keys the core adds
later are kept in ``extra`` and written back by ``to_dict``, so nothing is lost on the way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ._fields import checked, field_names
from .plan import Plan


def _split(cls: type, data: Mapping[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(known fields, extra keys) of a core result dict."""
    fields = checked(cls, data, where, allow_extra=True)
    names = field_names(cls)
    extra = {k: fields.pop(k) for k in list(fields) if k not in names}
    return fields, extra


@dataclass
class Violation:
    """Why a plan cannot run: a stable rule key (also a pruning counter) and a sentence."""

    rule: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "message": self.message}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Violation:
        return cls(**checked(cls, data, "reason"))


@dataclass
class Evaluation:
    """A scored plan: feasibility with reasons, step time, throughput, MFU and breakdowns."""

    plan: Plan
    """The plan, with its schedule resolved."""
    feasible: bool
    reasons: list[Violation]
    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    """Model FLOPs utilisation (no recompute; causal attention counted half) over the dense
    peak at the workload's precision, as a fraction."""
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    """Including recompute."""
    peak_memory_gib: float
    """Per-GPU peak on the most loaded pipeline stage."""
    memory_gib: dict[str, float]
    """Peak memory by component: weights, gradients, optimizer, activations, transient, fixed."""
    time_s: dict[str, float]
    """Step time by component: compute, tp, cp, ep, pp_p2p, bubble, dp, optimizer."""
    micro_batches: int
    """Micro-batches per pipeline per step."""
    worst_stage: int
    """Index of the pipeline stage with the highest memory."""
    rank: Optional[int] = None
    """1-based rank in a search result; None for a single evaluation."""
    group_size: Optional[int] = None
    """In a search for distinct plans (the default): how many feasible plans this one stands
    for, itself and those within 0.1 % of its step time and 0.5 GiB of its peak memory; None
    otherwise."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The core's shape (plan fields nested under ``"plan"``)."""
        out: dict[str, Any] = {} if self.rank is None else {"rank": self.rank}
        out.update(
            plan=self.plan.to_dict(),
            feasible=self.feasible,
            reasons=[r.to_dict() for r in self.reasons],
            step_time_s=self.step_time_s,
            tokens_per_s_per_gpu=self.tokens_per_s_per_gpu,
            mfu=self.mfu,
            model_tflops_per_gpu=self.model_tflops_per_gpu,
            hardware_tflops_per_gpu=self.hardware_tflops_per_gpu,
            peak_memory_gib=self.peak_memory_gib,
            memory_gib=dict(self.memory_gib),
            time_s=dict(self.time_s),
            micro_batches=self.micro_batches,
            worst_stage=self.worst_stage,
        )
        if self.group_size is not None:
            out["group_size"] = self.group_size
        out.update(self.extra)
        return out

    def to_flat_dict(self) -> dict[str, Any]:
        """One flat record: rank, the plan's fields, then the metrics (the CLI's JSON shape)."""
        out: dict[str, Any] = {"rank": self.rank}
        out.update(self.plan.to_dict())
        nested = self.to_dict()
        del nested["plan"]
        nested.pop("rank", None)
        out.update(nested)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evaluation:
        fields, extra = _split(cls, data, "evaluation")
        fields["plan"] = Plan.from_dict(fields["plan"])
        fields["reasons"] = [Violation.from_dict(r) for r in fields["reasons"]]
        fields["extra"] = {**fields.get("extra", {}), **extra}
        return cls(**fields)


@dataclass
class SearchStats:
    """What a search looked at."""

    candidates: int
    """Every plan of the space, pruned or not."""
    feasible: int
    """Plans that passed every rule."""
    pruned: dict[str, int]
    """Plans removed, by rule."""
    elapsed_s: float
    threads: int = 0
    """Worker threads used."""
    groups_complete: Optional[bool] = None
    """In a search for distinct plans: whether every ``group_size`` counts all of its group
    (False only when the search reached its cap on plans kept); None otherwise."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "candidates": self.candidates,
            "feasible": self.feasible,
            "pruned": dict(self.pruned),
            "elapsed_s": self.elapsed_s,
            "threads": self.threads,
        }
        if self.groups_complete is not None:
            out["groups_complete"] = self.groups_complete
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchStats:
        fields, extra = _split(cls, data, "stats")
        fields["extra"] = {**fields.get("extra", {}), **extra}
        return cls(**fields)


@dataclass
class SearchResult:
    """Ranked plans (best first) and the search's statistics."""

    plans: list[Evaluation]
    stats: SearchStats

    @property
    def best(self) -> Optional[Evaluation]:
        """The top plan, or None when nothing was feasible."""
        return self.plans[0] if self.plans else None

    def to_dict(self) -> dict[str, Any]:
        return {"plans": [p.to_dict() for p in self.plans], "stats": self.stats.to_dict()}

    def _repr_html_(self) -> str:
        """Jupyter: the ranked plans as an HTML table."""
        from .report_html import search_result_html

        return search_result_html(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchResult:
        fields = checked(cls, data, "result")
        return cls(
            plans=[Evaluation.from_dict(p) for p in fields["plans"]],
            stats=SearchStats.from_dict(fields["stats"]),
        )
