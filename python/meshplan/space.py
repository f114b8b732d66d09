"""The search space: which degrees and knobs the search may choose (core ``space.rs``).

Every field left at None keeps the core's default (``meshplan._core.default_space()``), so the
defaults live in one place. A degree is fixed by an integer (``tp=8``), bounded by the
``min_X``/``max_X`` conveniences (``max_pp=16``), or given whole as a :class:`Degree`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

from . import _core
from ._fields import checked
from .errors import InvalidInputError

DEGREES = ("dp", "tp", "pp", "ep", "cp", "vpp", "micro_batch")
_OTHER = (
    "zero",
    "recompute",
    "sequence_parallel",
    "schedules",
    "orders",
    "memory_headroom_gib",
    "tp_within_domain",
    "cp_within_domain",
    "ep_within_domain",
    "top_k",
    "max_candidates",
)


@dataclass
class Degree:
    """Constraint on one degree: ``fixed`` (overrides the bounds), or ``min``/``max`` bounds."""

    fixed: Optional[int] = None
    min: Optional[int] = None
    max: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        return {"fixed": self.fixed, "min": self.min, "max": self.max}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "space.degree") -> Degree:
        return cls(**checked(cls, data, where))


DegreeLike = Union[int, Degree, None]


@dataclass
class SearchSpace:
    """What :func:`meshplan.search` may choose; None everywhere is the core's default space.

    The core's defaults: every degree open except ``vpp`` and ``micro_batch`` (at most 16 each),
    ZeRO 0-3, recompute none/selective/full, sequence parallel on and off, every schedule, 1 GiB of
    memory headroom, TP inside one NVLink domain, CP and EP free to cross it, top 10 plans.
    """

    dp: DegreeLike = None
    tp: DegreeLike = None
    pp: DegreeLike = None
    ep: DegreeLike = None
    cp: DegreeLike = None
    vpp: DegreeLike = None
    micro_batch: DegreeLike = None
    min_dp: Optional[int] = None
    max_dp: Optional[int] = None
    min_tp: Optional[int] = None
    max_tp: Optional[int] = None
    min_pp: Optional[int] = None
    max_pp: Optional[int] = None
    min_ep: Optional[int] = None
    max_ep: Optional[int] = None
    min_cp: Optional[int] = None
    max_cp: Optional[int] = None
    min_vpp: Optional[int] = None
    max_vpp: Optional[int] = None
    min_micro_batch: Optional[int] = None
    max_micro_batch: Optional[int] = None
    zero: Optional[Sequence[int]] = None
    """Allowed ZeRO stages."""
    recompute: Optional[Sequence[str]] = None
    """Allowed recompute modes: ``none``, ``selective``, ``full`` (the default set) and
    ``selective-op`` (torchtitan's op-level checkpointing, searched only when listed)."""
    sequence_parallel: Optional[Sequence[bool]] = None
    """Allowed sequence-parallel settings."""
    schedules: Optional[Sequence[str]] = None
    """Allowed schedules: ``1f1b``, ``interleaved-1f1b``, ``zb-h1``."""
    orders: Optional[Sequence[str]] = None
    """Rank orders to consider (default: ``["tp-cp-ep-dp-pp"]``); an order is only tried where
    it puts some group on a different fabric than an order listed before it."""
    memory_headroom_gib: Optional[float] = None
    """GiB kept free on every GPU."""
    tp_within_domain: Optional[bool] = None
    cp_within_domain: Optional[bool] = None
    ep_within_domain: Optional[bool] = None
    top_k: Optional[int] = None
    """Plans returned."""
    max_candidates: Optional[int] = None
    """Refuse spaces with more candidates than this (``SpaceTooLargeError``)."""

    def to_dict(self) -> dict[str, Any]:
        """The full core shape: the core's defaults with this object's choices on top."""
        out: dict[str, Any] = _core.default_space()
        for name in DEGREES:
            degree = dict(out[name])
            given = getattr(self, name)
            if isinstance(given, Degree):
                degree = given.to_dict()
            elif given is not None:
                degree = {"fixed": given, "min": None, "max": None}
            for bound in ("min", "max"):
                value = getattr(self, f"{bound}_{name}")
                if value is not None:
                    degree[bound] = value
            out[name] = degree
        for name in _OTHER:
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if isinstance(value, (list, tuple)) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        """From the core shape (degrees as ``{"fixed", "min", "max"}`` dicts); missing keys keep
        the core's defaults."""
        if not isinstance(data, Mapping):
            raise InvalidInputError(
                f"invalid space: expected a mapping, got {type(data).__name__}"
            )
        allowed = DEGREES + _OTHER
        for key in data:
            if key not in allowed:
                raise InvalidInputError(
                    f"invalid space.{key}: unknown field (allowed: {', '.join(allowed)})"
                )
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in DEGREES and isinstance(value, Mapping):
                kwargs[key] = Degree.from_dict(value, f"space.{key}")
            else:
                kwargs[key] = value
        return cls(**kwargs)

