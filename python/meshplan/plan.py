"""A parallel plan: the five degrees (``N = dp·tp·pp·ep·cp``, or ``dp·tp·pp·cp`` folded) and their
knobs (core ``plan.rs``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ._fields import check_fields, checked
from .errors import InvalidInputError

_INT_FIELDS = (
    "dp", "tp", "pp", "ep", "cp", "vpp", "micro_batch", "zero", "etp", "first_stage_layers",
    "last_stage_layers", "offload_layers",
)
# Fields only a given plan carries (a recipe's end-rank layer counts, its offloading), never a
# searched one: written only where set, and not columns of the tables and exports.
_GIVEN_ONLY_FIELDS = ("first_stage_layers", "last_stage_layers", "offload_layers")
_ALIASES = {"mb": "micro_batch", "sp": "sequence_parallel"}
_TRUE = ("true", "1", "on", "yes")
_FALSE = ("false", "0", "off", "no")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
"""Megatron's rank order, innermost (consecutive ranks) first."""


@dataclass
class Plan:
    """One way to run a workload on a cluster.

    Dense layers see ``dp·ep`` as their data-parallel degree; routed experts are split ``ep``
    ways. ``zero``: 0 none (DDP), 1 optimizer states (Megatron's distributed optimizer),
    2 + gradients, 3 + parameters (FSDP). ``schedule`` None picks ``interleaved-1f1b`` when
    ``vpp > 1``, else ``1f1b``; ``zb-h1`` is the zero-bubble schedule. ``order`` is the rank
    order of the device mesh, innermost first (``"tp-cp-ep-dp-pp"``, Megatron's default: TP on
    consecutive ranks, PP outermost); it decides which groups share an NVLink domain.

    ``etp`` (MoE parallel folding): given, the plan is *folded* — the dense layers run
    ``tp × cp × dp × pp`` (``dp`` is then Megatron's data-parallel size, ``N = dp·tp·pp·cp``) and
    the expert layers their own ``etp × ep × edp × pp`` over the same ranks, so EP may span
    ranks the dense layers spend on TP, CP and DP (``etp·ep`` divides ``dp·tp·cp``). None: EP
    is carved out of data parallelism and the experts split ``tp`` ways.
    """

    dp: int
    tp: int
    pp: int
    ep: int = 1
    cp: int = 1
    vpp: int = 1
    micro_batch: int = 1
    zero: int = 0
    recompute: str = "none"
    """``"none"``, ``"selective"`` (core attention, Megatron), ``"full"`` or ``"selective-op"``
    (every other matmul output kept, the rest recomputed: torchtitan's op-level policy)."""
    sequence_parallel: bool = False
    schedule: Optional[str] = None
    order: str = DEFAULT_ORDER
    """Rank order, innermost first: each of tp, cp, ep, dp, pp once, joined by ``-``."""
    etp: Optional[int] = None
    """Expert tensor parallelism of a folded MoE plan (None: not folded)."""
    dispatcher: Optional[str] = None
    """MoE token dispatcher: ``"alltoall"`` (NCCL all-to-all), ``"allgather"`` or ``"flex"``
    (DeepEP/HybridEP, node-deduplicated); None: the workload's stack's default."""
    ep_overlap: bool = False
    """EP communication overlap: dispatch and combine hidden behind another micro-batch's
    computation (Megatron ``--overlap-moe-expert-parallel-comm``)."""
    cp_exchange: Optional[str] = None
    """Context parallelism's exchange: ``"ring"`` (ring attention, Megatron ``p2p``),
    ``"allgather"``, ``"a2a"`` (Ulysses all-to-all; heads and K/V groups per TP rank divisible
    by ``cp``) or ``"a2a+p2p"`` (all-to-all inside an NVLink domain, ring across); None: the
    workload's stack's default (Megatron ``--cp-comm-type``)."""
    recompute_modules: Optional[str] = None
    """Megatron-Core's selective-recompute modules, with ``recompute="selective"`` only:
    ``core_attn``, ``moe_act``, ``layernorm``, ``mla_up_proj``, ``mlp``, ``moe``,
    ``shared_experts`` joined by ``+`` (e.g. ``"layernorm+moe_act"``; a list of names is
    accepted and normalised to that form, in Megatron's order). None: Megatron's default, core
    attention alone (``--recompute-granularity selective --recompute-modules ...``)."""
    first_stage_layers: Optional[int] = None
    """Transformer layers on the first pipeline rank (all its chunks together) where the run
    fixed them: Megatron's ``--decoder-first-pipeline-num-layers``, or what a
    ``--pipeline-model-parallel-layout`` gives that rank (DeepSeek-V3's ``Et|(tt|)*30mL`` on
    pp 8 × vpp 4: 7). The ranks whose count is not fixed share the other layers equally. None:
    the stack's split (the search never sets it)."""
    last_stage_layers: Optional[int] = None
    """Transformer layers on the last pipeline rank (all its chunks; it also holds the LM head,
    the loss and any MTP depths): Megatron's ``--decoder-last-pipeline-num-layers`` or its
    layout's last rank (``Et|(tt|)*30mL`` on pp 8 × vpp 4: 6). None: see
    :attr:`first_stage_layers`."""
    offload_layers: Optional[int] = None
    """Activation offloading to host memory: transformer layers per model chunk whose
    activations saved for backward go to the host in the forward and come back in the backward
    (Megatron-Core ``cpu_offloading_num_layers``; fewer than the chunk's layers; Megatron-Core
    runs it with pp = 1 and no recompute only). None or 0: off (the search never sets it)."""

    def __post_init__(self) -> None:
        if self.recompute_modules is not None:
            self.recompute_modules = normalise_modules(self.recompute_modules)
        check_fields(self, "plan", _KINDS)

    @property
    def num_gpus(self) -> int:
        """GPUs the plan uses: ``dp·tp·pp·ep·cp``, or ``dp·tp·pp·cp`` for a folded plan."""
        if self.folded:
            return self.dp * self.tp * self.pp * self.cp
        return self.dp * self.tp * self.pp * self.ep * self.cp

    @property
    def folded(self) -> bool:
        """Whether the experts run a mesh of their own (``etp`` given)."""
        return self.etp is not None

    @property
    def dense_dp(self) -> int:
        """The dense layers' data parallelism (Megatron's DP): ``dp·ep``, or ``dp`` folded."""
        return self.dp if self.folded else self.dp * self.ep

    @property
    def expert_tp(self) -> int:
        """Ways each routed expert splits: ``etp``, else ``tp``."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Replicas of each expert shard: ``dp·cp``, or ``dp·tp·cp / (etp·ep)`` folded."""
        if self.etp is None:
            return self.dp * self.cp
        return self.dp * self.tp * self.cp // (self.etp * self.ep)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dp": self.dp,
            "tp": self.tp,
            "pp": self.pp,
            "ep": self.ep,
            "cp": self.cp,
            "vpp": self.vpp,
            "micro_batch": self.micro_batch,
            "zero": self.zero,
            "recompute": self.recompute,
            "sequence_parallel": self.sequence_parallel,
            "schedule": self.schedule,
            "order": self.order,
            "etp": self.etp,
            "dispatcher": self.dispatcher,
            "ep_overlap": self.ep_overlap,
            "cp_exchange": self.cp_exchange,
            "recompute_modules": (
                None if self.recompute_modules is None else self.recompute_modules.split("+")
            ),
            # Only where given, as the core writes a plan (the search never sets them).
            **{k: getattr(self, k) for k in _GIVEN_ONLY_FIELDS if getattr(self, k) is not None},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        return cls(**checked(cls, data, "plan"))

    @classmethod
    def parse(cls, text: str) -> Plan:
        """A plan from ``"dp=8,tp=8,pp=4,micro_batch=1,zero=1,recompute=selective,..."``.

        Keys are the field names (``mb`` and ``sp`` are accepted for ``micro_batch`` and
        ``sequence_parallel``); ``dp``, ``tp`` and ``pp`` are required, the rest default as in
        the constructor. Booleans are ``true/false``, ``on/off``, ``yes/no`` or ``1/0``.
        """
        if not isinstance(text, str):
            raise InvalidInputError(f"invalid plan: expected a string, got {type(text).__name__}")
        allowed = [f.name for f in dataclasses.fields(cls)]
        fields: dict[str, Any] = {}
        for piece in (p.strip() for p in text.split(",")):
            if not piece:
                continue
            key, eq, value = (s.strip() for s in piece.partition("="))
            if not eq or not key or not value:
                raise InvalidInputError(
                    f"invalid plan: {piece!r} is not key=value (e.g. dp=8,tp=8,pp=4)"
                )
            key = _ALIASES.get(key.replace("-", "_"), key.replace("-", "_"))
            if key not in allowed:
                raise InvalidInputError(
                    f"invalid plan.{key}: unknown field (allowed: {', '.join(allowed)})"
                )
            if key in fields:
                raise InvalidInputError(f"invalid plan.{key}: given twice")
            fields[key] = _value(key, value)
        for key in ("dp", "tp", "pp"):
            if key not in fields:
                raise InvalidInputError(f"missing plan.{key} (a required field)")
        return cls(**fields)

    def __str__(self) -> str:
        """The plan in the syntax :meth:`parse` reads (the default ``order`` left out)."""
        fields = self.to_dict()
        if fields["order"] == DEFAULT_ORDER:
            del fields["order"]
        if not fields["ep_overlap"]:
            del fields["ep_overlap"]
        fields["recompute_modules"] = self.recompute_modules
        parts = [f"{k}={v}" for k, v in fields.items() if v is not None]
        return ",".join(parts).replace("=True", "=true").replace("=False", "=false")


_KINDS = {
    **{name: "int" for name in _INT_FIELDS}, "recompute": "str", "sequence_parallel": "bool",
    "schedule": "str?", "order": "str", "etp": "int?", "dispatcher": "str?", "ep_overlap": "bool",
    "cp_exchange": "str?", "recompute_modules": "str?", "first_stage_layers": "int?",
    "last_stage_layers": "int?", "offload_layers": "int?",
}
"""What :class:`Plan` checks at construction (see :func:`meshplan._fields.check_fields`)."""


RECOMPUTE_MODULES: tuple[str, ...] = (
    "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
)
"""Megatron-Core's selective-recompute modules, in its order (core ``RecomputeModule::ALL``)."""


def normalise_modules(value: Any, where: str = "plan.recompute_modules") -> str:
    """``"layernorm+moe_act"`` from that string (``+``, ``,`` or spaces between names) or a list
    of names: known names, at least one, in Megatron's order."""
    if isinstance(value, str):
        names = [n for n in value.replace(",", "+").replace(" ", "+").split("+") if n]
    elif isinstance(value, (list, tuple)) and all(isinstance(n, str) for n in value):
        names = list(value)
    else:
        names = []
    allowed = ", ".join(RECOMPUTE_MODULES)
    lowered = {n.strip().lower() for n in names}
    if not lowered or not lowered <= set(RECOMPUTE_MODULES):
        raise InvalidInputError(
            f"invalid {where}: {value!r} (allowed: one or more of {allowed}, joined by '+')"
        )
    return "+".join(m for m in RECOMPUTE_MODULES if m in lowered)


def _value(key: str, text: str) -> Any:
    if key in _INT_FIELDS:
        try:
            return int(text)
        except ValueError:
            raise InvalidInputError(
                f"invalid plan.{key}: {text!r} (allowed: an integer)"
            ) from None
    if key in ("sequence_parallel", "ep_overlap"):
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise InvalidInputError(
            f"invalid plan.{key}: {text!r} (allowed: true/false, on/off, yes/no, 1/0)"
        )
    return text


PLAN_FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(Plan) if f.name not in _GIVEN_ONLY_FIELDS
)
"""The plan's fields in order (``dp`` ... ``order``): the columns every table and export lists
(not the fixed end-rank layer counts nor the offloaded layers, which only a given plan carries,
never a searched one)."""
