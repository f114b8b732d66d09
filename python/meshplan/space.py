"""The search space: which degrees and knobs the search may choose (core ``space.rs``).

Every field left at None keeps the core's default (``meshplan._core.default_space()``), so the
defaults live in one place. A degree is fixed by an integer (``tp=8``), bounded by the
``min_X``/``max_X`` conveniences (``max_pp=16``), or given whole as a :class:`Degree`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

from . import _core
from ._fields import check_bool, check_fields, check_int, check_list, check_number, checked
from .errors import InvalidInputError
from .plan import normalise_modules

DEGREES = ("dp", "tp", "pp", "ep", "cp", "etp", "vpp", "micro_batch")
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
    "distinct",
    "fold",
    "dispatchers",
    "ep_overlap",
    "cp_exchanges",
    "recompute_modules",
)


_LIST_ITEMS = {
    "zero": "int", "recompute": "str", "sequence_parallel": "bool", "schedules": "str",
    "orders": "str", "dispatchers": "str", "ep_overlap": "bool",
    "cp_exchanges": "str", "recompute_modules": "str",
}
"""The item type of each list of a :class:`SearchSpace`."""


@dataclass
class Degree:
    """Constraint on one degree: ``fixed`` (overrides the bounds), or ``min``/``max`` bounds."""

    fixed: Optional[int] = None
    min: Optional[int] = None
    max: Optional[int] = None

    def __post_init__(self) -> None:
        # Only integers (the space checks the bounds, knowing which degree this is).
        check_fields(self, "degree", {"fixed": "int?", "min": "int?", "max": "int?"})

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
    etp: DegreeLike = None
    """Expert tensor parallelism of MoE plans, folded or not (an unfolded plan's is its ``tp``)."""
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
    min_etp: Optional[int] = None
    max_etp: Optional[int] = None
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
    distinct: Optional[bool] = None
    """Distinct plans (None: True): ``top_k`` counts groups of plans whose predicted step time
    (within 0.1 %) and peak memory (within 0.5 GiB) are indistinguishable at the cost model's
    resolution, and each returned plan is the best of its group with ``group_size`` saying how
    many it stands for. False returns the ``top_k`` best plans one by one."""
    dispatchers: Optional[Sequence[str]] = None
    """MoE token dispatchers to try for plans with ``ep > 1``: ``alltoall``, ``allgather``,
    ``flex`` (None or empty: the stack's default)."""
    ep_overlap: Optional[Sequence[bool]] = None
    """EP communication overlap settings to try for plans with ``ep > 1`` (None or empty: the
    stack's default, off)."""
    cp_exchanges: Optional[Sequence[str]] = None
    """Context-parallel exchanges to try for plans with ``cp > 1``: ``ring``, ``allgather``,
    ``a2a``, ``a2a+p2p`` (None or empty: the stack's default, left unnamed in the plan)."""
    recompute_modules: Optional[Sequence[str]] = None
    """Megatron-Core selective-recompute module sets to try for ``recompute="selective"``, each
    as :attr:`Plan.recompute_modules` writes it (``"layernorm+moe_act"``; ``"core_attn"`` is
    Megatron's default, the plan without modules). None or empty: the default alone, plans
    left unnamed."""
    fold: Optional[bool] = None
    """Also try folded MoE plans (MoE parallel folding, :attr:`Plan.etp`; None: True): expert
    meshes whose EP spans ranks the dense layers spend on TP, CP and DP."""

    def __post_init__(self) -> None:
        for name in DEGREES:
            given = getattr(self, name)
            if isinstance(given, Mapping):
                given = Degree.from_dict(given, f"space.{name}")
                setattr(self, name, given)
            if isinstance(given, Degree):
                for bound in ("fixed", "min", "max"):
                    value = getattr(given, bound)
                    if value is not None:
                        check_int(f"space.{name}.{bound}", value)
            elif given is not None:
                setattr(self, name, check_int(f"space.{name}.fixed", given))
            for bound in ("min", "max"):
                value = getattr(self, f"{bound}_{name}")
                if value is not None:
                    setattr(self, f"{bound}_{name}", check_int(f"space.{name}.{bound}", value))
        for name, item in _LIST_ITEMS.items():
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, check_list(f"space.{name}", value, item))
        if self.recompute_modules is not None:
            self.recompute_modules = [
                normalise_modules(m, "space.recompute_modules") for m in self.recompute_modules
            ]
        if self.memory_headroom_gib is not None:
            check_number("space.memory_headroom_gib", self.memory_headroom_gib)
        for name in ("tp_within_domain", "cp_within_domain", "ep_within_domain", "distinct",
                     "fold"):
            value = getattr(self, name)
            if value is not None:
                check_bool(f"space.{name}", value)
        for name in ("top_k", "max_candidates"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, check_int(f"space.{name}", value))

    def to_dict(self) -> dict[str, Any]:
        """The full core shape: the core's defaults with this object's choices on top."""
        out: dict[str, Any] = _core.default_space()
        for name in DEGREES:
            degree = dict(out[name])
            given = getattr(self, name)
            if isinstance(given, Mapping):
                given = Degree.from_dict(given, f"space.{name}")
                setattr(self, name, given)
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
        if self.distinct is None:
            out["distinct"] = True
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



# --- why a space holds no candidate ------------------------------------------------------------

_OUTER = ("dp", "tp", "pp", "ep", "cp")


def _allows(degree: Mapping[str, Any], value: int) -> bool:
    """The core's ``Degree::allows``: ``fixed`` wins, else the bounds (None is open)."""
    if degree.get("fixed") is not None:
        return bool(value == degree["fixed"])
    lo, hi = degree.get("min"), degree.get("max")
    return (lo is None or value >= lo) and (hi is None or value <= hi)


def _divisors(n: int) -> list[int]:
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return small + large[::-1]


def _constraint_text(name: str, degree: Mapping[str, Any]) -> str:
    if degree.get("fixed") is not None:
        return f"{name}={degree['fixed']}"
    lo, hi = degree.get("min"), degree.get("max")
    if lo is not None and hi is not None:
        return f"{lo} <= {name} <= {hi}"
    return f"{name} >= {lo}" if lo is not None else f"{name} <= {hi}"


def _factorisable(num_gpus: int, allowed: Mapping[str, Sequence[int]]) -> bool:
    """Whether some ``dp·tp·pp·ep·cp = num_gpus`` takes every degree from ``allowed``."""
    reachable = {1}
    for name in _OUTER:
        reachable = {
            p * d for p in reachable for d in allowed[name] if num_gpus % (p * d) == 0
        }
    return num_gpus in reachable


def why_no_candidates(
    space: Mapping[str, Any], num_gpus: int, *, moe: bool, global_batch: int
) -> str:
    """Why a search over ``space`` (the core's full shape, :meth:`SearchSpace.to_dict`) on
    ``num_gpus`` GPUs has no candidate at all, in one sentence naming the constraint: a fixed
    degree that does not divide the GPU count, bounds no divisor meets, degrees that cannot
    multiply to the GPU count together, a micro-batch range beyond the global batch, or
    schedules that apply to no pipeline depth. The search's ``pruned`` counts cannot say it:
    nothing was pruned, nothing was there."""
    divisors = _divisors(num_gpus)
    allowed: dict[str, list[int]] = {}
    for name in _OUTER:
        values = [d for d in divisors if _allows(space[name], d)]
        if name == "ep" and not moe:
            values = [v for v in values if v == 1]
        allowed[name] = values
    rule = "dp·tp·pp·ep·cp must equal the GPU count"
    for name in _OUTER:
        degree = space[name]
        if allowed[name]:
            continue
        if name == "ep" and not moe and any(_allows(degree, d) for d in divisors):
            return f"{_constraint_text(name, degree)} needs an MoE model (a dense model has ep = 1)"
        if degree.get("fixed") is not None:
            return f"{name}={degree['fixed']} does not divide the {num_gpus:,} GPUs ({rule})"
        return (f"no divisor of the {num_gpus:,} GPUs satisfies "
                f"{_constraint_text(name, degree)} ({rule})")
    if not _factorisable(num_gpus, allowed):
        given = [_constraint_text(n, space[n]) for n in _OUTER if space[n] != _OPEN_DEGREE]
        return f"no dp·tp·pp·ep·cp = {num_gpus:,} satisfies {', '.join(given)} together"
    mb = space["micro_batch"]
    upper = mb.get("fixed") or mb.get("max") or 16
    if not any(_allows(mb, v) for v in range(1, min(upper, global_batch) + 1)):
        return (f"no micro-batch size satisfies {_constraint_text('micro_batch', mb)} and is at "
                f"most the global batch ({global_batch:,})")
    pps = allowed["pp"]
    vpp = space["vpp"]
    vpp_upper = vpp.get("fixed") or vpp.get("max") or 16
    usable = {
        "1f1b": _allows(vpp, 1),
        "zb-h1": _allows(vpp, 1) and max(pps) > 1,
        "interleaved-1f1b": max(pps) > 1 and any(_allows(vpp, v) for v in range(2, vpp_upper + 1)),
    }
    schedules = list(space["schedules"])
    if not any(usable.get(s, False) for s in schedules):
        return (f"no schedule of {', '.join(schedules)} applies: 1f1b needs vpp = 1 allowed, "
                "zb-h1 needs pp > 1 and vpp = 1, interleaved-1f1b needs pp > 1 and vpp >= 2")
    return "the space allows no candidate (check the fixed degrees and bounds)"


_OPEN_DEGREE = {"fixed": None, "min": None, "max": None}
