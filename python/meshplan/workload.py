"""The training workload: batch, sequence length, precision, optimizer (core ``workload.rs``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ._fields import check_fields, check_list, checked, invalid, shown

LORA_TARGETS = ("q", "k", "v", "qkv", "o", "mlp", "fc1", "fc2")
"""Linears that can carry a LoRA adapter: separate query, key, value projections (``q``, ``k``,
``v``: PEFT, torchtune) or the fused one (``qkv``: Megatron's ``linear_qkv``); the output
projection (``o``); separate gate, up and down projections (``mlp``) or the fused gate/up
(``fc1``) and the down projection (``fc2``) of every FFN, routed experts included."""

MEGATRON_LORA_TARGETS = ("qkv", "o", "fc1", "fc2")
"""Megatron-Bridge's default ``target_modules`` (``linear_qkv, linear_proj, linear_fc1,
linear_fc2``)."""

LORA_BASES = ("bf16", "fp8", "nf4")
"""Storage formats of the frozen base weights under LoRA."""

CUDA_GRAPHS = ("none", "partial", "full")
"""Values of :attr:`Workload.cuda_graphs` (docs/costmodel.md §5.5)."""


@dataclass
class Workload:
    """What is trained per optimizer step, independent of how it is split."""

    global_batch: int
    """Sequences per optimizer step."""
    seq_len: int
    """Tokens per sequence."""
    precision: str = "bf16"
    """GEMM precision: ``bf16``, ``fp16``, ``fp8``, ``mxfp8`` or ``nvfp4`` (where the GPU has it)."""
    optimizer: str = "adam"
    """``"adam"`` (mixed-precision Adam/AdamW) or ``"sgd-momentum"``."""
    grad_bytes: int = 4
    """Bytes per gradient element in the reduction: 4 (fp32, Megatron's default) or 2."""
    lora: bool = False
    """LoRA fine-tuning: frozen base weights (no weight gradients, optimizer state or DP
    gradient reduction for them; a frozen linear stores no input for the backward unless an
    adapter reads it) and trained rank-``lora_rank`` adapters on ``lora_targets``
    (docs/costmodel.md §2.7)."""
    flash_attention: bool = True
    """Fused (flash) attention; False models the unfused softmax of pre-2023 Megatron, which
    stores the ``a·s²`` attention scores."""
    fused_cross_entropy: bool = True
    """Fused loss (Megatron's vocab-parallel cross-entropy): 8 bytes per logit at the loss
    backward. False models eager ``F.cross_entropy`` on fp32-upcast logits (torchtitan):
    14 bytes per logit."""
    stack: str = "megatron-core"
    """The training stack that runs the plan: ``megatron-core`` (default), ``torchtitan``,
    ``deepspeed`` or ``maxtext`` (``meshplan stacks``). It sets how the plan is timed (overlap,
    kernel efficiency, host overhead) and which plans the search returns (what the stack can
    run); each value and its source are in the core's ``data/stacks.toml``."""
    bucket_params: Optional[int] = None
    """Parameters per data-parallel gradient bucket (Megatron ``--ddp-bucket-size``); None takes
    the stack's default (Megatron-Core: ``max(40 M, 1 M · data-parallel ranks)``)."""
    moe_imbalance: float = 1.1
    """Routing imbalance λ of MoE layers: tokens routed to the busiest expert-parallel rank over
    the mean, 1 to 100. A property of the router and recipe, not of the GPU: 1.1 (the default)
    for aux-loss balanced dropless training, 1.0 where routing is force-balanced (Megatron-Bridge
    benchmarks) or tokens are dropped at capacity factor 1. Scales the routed experts' GEMMs,
    activation memory and dispatch time."""
    lora_rank: int = 32
    """LoRA adapter rank (read under ``lora``); default 32, Megatron-Bridge's ``LoRA.dim``."""
    lora_targets: tuple[str, ...] = field(default_factory=lambda: MEGATRON_LORA_TARGETS)
    """Linears with an adapter (read under ``lora``), of :data:`LORA_TARGETS`; default every
    linear in Megatron's fused form, ``qkv, o, fc1, fc2`` (Megatron-Bridge's default)."""
    lora_base: str = "bf16"
    """Storage of the frozen base weights of the layers' linears under ``lora``: ``bf16``,
    ``fp8`` (Transformer Engine FP8-only weights) or ``nf4`` (QLoRA, 4.127 bits per weight)."""
    precision_recipe: Optional[str] = None
    """Low-precision recipe (a table of the core's ``data/precision.toml``): which linear layers
    an FP8/FP4 run keeps in BF16 or runs in MXFP8, e.g. ``"nemotron3-super-nvfp4"`` (attention,
    latent projections and the LM head BF16, Mamba-2 ``out_proj`` MXFP8, the last 14 layers
    BF16), ``"nemotron3-fp8"`` or ``"mxfp8-fused-expert-mlp"`` (mxfp8 only: the routed experts'
    fused MXFP8 grouped MLP, no element-wise pass for their activation). None: every linear of
    the layers at ``precision``."""
    cross_entropy_in_place: bool = False
    """The fused loss computes its gradient during the forward into the 16-bit logits and keeps
    only them, 2 bytes per logit (TransformerEngine's ``parallel_cross_entropy``, Megatron
    ``--cross-entropy-fusion-impl te``); needs ``fused_cross_entropy``."""
    cuda_graphs: str = "none"
    """CUDA graphs of the run, of :data:`CUDA_GRAPHS`: ``none`` (default), ``partial`` (per-layer
    scopes that leave the routed experts eager: Megatron's ``attn``, ``moe_router``,
    ``moe_preprocess``) or ``full`` (graphs that cover the MoE block: whole-layer graphs with
    token drop and padding, or full-iteration graphs). Only ``full`` removes the host-issue
    floor of a dropless MoE layer (docs/costmodel.md §5.5)."""

    def __post_init__(self) -> None:
        check_fields(self, "workload", _KINDS)
        self.lora_targets = tuple(check_list("workload.lora_targets", self.lora_targets, "str"))
        for target in self.lora_targets:
            if target not in LORA_TARGETS:
                raise invalid("workload.lora_targets", shown(target), ", ".join(LORA_TARGETS))
        if self.lora_base not in LORA_BASES:
            raise invalid("workload.lora_base", shown(self.lora_base), ", ".join(LORA_BASES))
        if self.cuda_graphs not in CUDA_GRAPHS:
            raise invalid("workload.cuda_graphs", shown(self.cuda_graphs), ", ".join(CUDA_GRAPHS))

    def to_dict(self) -> dict[str, Any]:
        return {
            "global_batch": self.global_batch,
            "seq_len": self.seq_len,
            "precision": self.precision,
            "optimizer": self.optimizer,
            "grad_bytes": self.grad_bytes,
            "lora": self.lora,
            "flash_attention": self.flash_attention,
            "fused_cross_entropy": self.fused_cross_entropy,
            "stack": self.stack,
            **({} if self.bucket_params is None else {"bucket_params": self.bucket_params}),
            "moe_imbalance": self.moe_imbalance,
            "lora_rank": self.lora_rank,
            "lora_targets": list(self.lora_targets),
            "lora_base": self.lora_base,
            **({} if self.precision_recipe is None
               else {"precision_recipe": self.precision_recipe}),
            # Only when set: a default workload's dict is what it was before the field.
            **({"cross_entropy_in_place": True} if self.cross_entropy_in_place else {}),
            **({} if self.cuda_graphs == "none" else {"cuda_graphs": self.cuda_graphs}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Workload:
        return cls(**checked(cls, data, "workload"))


_KINDS = {
    "global_batch": "int", "seq_len": "int", "precision": "str", "optimizer": "str",
    "grad_bytes": "int", "lora": "bool", "flash_attention": "bool", "fused_cross_entropy": "bool",
    "stack": "str",
    "bucket_params": "int?",
    "moe_imbalance": "number",
    "lora_rank": "int",
    "lora_base": "str",
    "precision_recipe": "str?",
    "cross_entropy_in_place": "bool",
    "cuda_graphs": "str",
}
"""What :class:`Workload` checks at construction (see :func:`meshplan._fields.check_fields`)."""
