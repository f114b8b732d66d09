"""The model descriptor: a decoder-only transformer, dense or MoE, with GQA and optional MLA, and
optionally a hybrid layer stack (``layer_pattern``: Mamba-2, gated DeltaNet, sliding-window
attention, FFN-only layers).

Mirrors the core's ``Model`` (``rust/meshplan-core/src/model.rs``). Build one from a preset
(:meth:`Model.preset`), from a Hugging Face ``config.json`` (:meth:`Model.from_hf_config`) or
field by field; the core checks the values when the model is used and names any bad field.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from . import _core
from ._fields import check_fields, checked, invalid, shown
from .errors import HfConfigError, InvalidInputError


@dataclass
class Moe:
    """Mixture-of-experts block shape."""

    num_experts: int
    """Routed experts."""
    top_k: int
    """Experts each token is routed to."""
    expert_ffn_hidden: int
    """Intermediate size of one routed expert."""
    shared_experts: int = 0
    """Always-on shared experts."""
    shared_expert_ffn_hidden: Optional[int] = None
    """Intermediate size of one shared expert (None: ``expert_ffn_hidden``)."""
    first_dense_layers: int = 0
    """Leading layers that keep a dense FFN (DeepSeek's ``first_k_dense_replace``)."""
    latent_size: Optional[int] = None
    """Latent width of a latent MoE (Nemotron 3 Super/Ultra): tokens projected ``h → ℓ``
    before routing, experts at width ``ℓ`` (None: the experts see ``hidden``)."""

    def __post_init__(self) -> None:
        check_fields(self, "model.moe", {
            "num_experts": "int", "top_k": "int", "expert_ffn_hidden": "int",
            "shared_experts": "int", "shared_expert_ffn_hidden": "int?",
            "first_dense_layers": "int", "latent_size": "int?",
        })

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "expert_ffn_hidden": self.expert_ffn_hidden,
            "shared_experts": self.shared_experts,
            "shared_expert_ffn_hidden": self.shared_expert_ffn_hidden,
            "first_dense_layers": self.first_dense_layers,
            "latent_size": self.latent_size,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "model.moe") -> Moe:
        return cls(**checked(cls, data, where))


@dataclass
class Mla:
    """Multi-head latent attention dimensions (DeepSeek-V2/V3, Kimi-K2)."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: Optional[int] = None
    """Query low-rank projection; None means a full-rank query projection."""

    def __post_init__(self) -> None:
        check_fields(self, "model.mla", {
            "kv_lora_rank": "int", "qk_rope_head_dim": "int", "qk_nope_head_dim": "int",
            "v_head_dim": "int", "q_lora_rank": "int?",
        })

    def to_dict(self) -> dict[str, Any]:
        return {
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "v_head_dim": self.v_head_dim,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "model.mla") -> Mla:
        return cls(**checked(cls, data, where))


@dataclass
class Mamba:
    """Mamba-2 (SSD) mixer dimensions (Nemotron-H); ``d_inner = heads · head_dim``."""

    heads: int
    """SSM heads (HF ``mamba_num_heads``)."""
    head_dim: int
    """Channels per head (HF ``mamba_head_dim``)."""
    state: int
    """State size (HF ``ssm_state_size``)."""
    groups: int
    """Groups sharing one B and C (HF ``n_groups``)."""
    conv_kernel: int = 4
    """Width of the causal depthwise convolution (HF ``conv_kernel``)."""
    chunk: int = 128
    """Chunk length of the chunked scan (HF ``chunk_size``)."""

    def __post_init__(self) -> None:
        check_fields(self, "model.mamba", {
            "heads": "int", "head_dim": "int", "state": "int", "groups": "int",
            "conv_kernel": "int", "chunk": "int",
        })

    def to_dict(self) -> dict[str, Any]:
        return {
            "heads": self.heads,
            "head_dim": self.head_dim,
            "state": self.state,
            "groups": self.groups,
            "conv_kernel": self.conv_kernel,
            "chunk": self.chunk,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "model.mamba") -> Mamba:
        return cls(**checked(cls, data, where))


@dataclass
class LinearAttention:
    """Gated DeltaNet linear-attention dimensions (Qwen3-Next's ``linear_attention`` layers)."""

    key_heads: int
    """Query/key heads (HF ``linear_num_key_heads``)."""
    key_head_dim: int
    """Query/key head dimension (HF ``linear_key_head_dim``)."""
    value_heads: int
    """Value heads (HF ``linear_num_value_heads``)."""
    value_head_dim: int
    """Value head dimension (HF ``linear_value_head_dim``)."""
    conv_kernel: int = 4
    """Width of the causal convolution on q, k, v (HF ``linear_conv_kernel_dim``)."""
    chunk: int = 64
    """Chunk length of the chunked delta rule (flash-linear-attention: 64)."""

    def __post_init__(self) -> None:
        check_fields(self, "model.linear_attention", {
            "key_heads": "int", "key_head_dim": "int", "value_heads": "int",
            "value_head_dim": "int", "conv_kernel": "int", "chunk": "int",
        })

    def to_dict(self) -> dict[str, Any]:
        return {
            "key_heads": self.key_heads,
            "key_head_dim": self.key_head_dim,
            "value_heads": self.value_heads,
            "value_head_dim": self.value_head_dim,
            "conv_kernel": self.conv_kernel,
            "chunk": self.chunk,
        }

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], where: str = "model.linear_attention"
    ) -> LinearAttention:
        return cls(**checked(cls, data, where))


@dataclass
class Model:
    """A decoder-only transformer."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    """Dense FFN intermediate size (also the dense layers of an MoE model)."""
    vocab: int
    activation: str = "swiglu"
    """Gated (three FFN matrices): ``"swiglu"``, ``"geglu"``, ``"reglu"``; plain (two):
    ``"gelu"``, ``"relu2"`` (squared ReLU), ``"silu"``. Independent of ``norm`` and
    ``tied_embeddings``."""
    head_dim: Optional[int] = None
    """Per-head dimension; None means ``hidden / heads``."""
    norm: str = "rmsnorm"
    """``"rmsnorm"`` or ``"layernorm"``."""
    tied_embeddings: bool = False
    moe: Optional[Moe] = None
    mla: Optional[Mla] = None
    dropout: bool = False
    """Dropout on the attention probabilities and residual branches (GPT-3-era recipes): its
    1-byte masks are stored for the backward."""
    layer_pattern: Optional[str] = None
    """The layers in order, one character each: ``M`` Mamba-2, ``*`` attention, ``-`` dense
    FFN, ``E`` MoE FFN (each alone in its layer, Nemotron-H's ``hybrid_override_pattern``);
    ``A``/``a`` attention, ``S``/``s`` sliding-window attention, ``G``/``g`` gated DeltaNet, each
    with the MoE (upper case) or dense (lower case) FFN. None: every layer attention + FFN."""
    mamba: Optional[Mamba] = None
    """The Mamba-2 mixer of the ``M`` layers."""
    linear_attention: Optional[LinearAttention] = None
    """The gated DeltaNet mixer of the ``G``/``g`` layers."""
    sliding_window: Optional[int] = None
    """Tokens each query of an ``S``/``s`` layer attends."""
    mtp_layers: Optional[int] = None
    """Multi-token-prediction depths the model trains with (Megatron ``mtp_num_layers``): each
    runs the MTP block, ``eh_proj`` and the LM head and loss again on the last pipeline rank
    (time only). None: no MTP."""
    mtp_pattern: Optional[str] = None
    """The MTP block's layers in ``layer_pattern`` notation (Nemotron 3: ``"*E"``), characters
    of ``layer_pattern``; None: one layer like the stack's last."""
    attention_output_gate: bool = False
    """Softmax attention's output gated per channel by a sigmoid of a second query-sized
    projection (Qwen3-Next's gated attention)."""

    def __post_init__(self) -> None:
        check_fields(self, "model", {
            "name": "str", "layers": "int", "hidden": "int", "heads": "int", "kv_heads": "int",
            "ffn_hidden": "int", "vocab": "int", "activation": "str", "head_dim": "int?",
            "norm": "str", "tied_embeddings": "bool", "dropout": "bool",
            "layer_pattern": "str?", "sliding_window": "int?", "mtp_layers": "int?",
            "mtp_pattern": "str?", "attention_output_gate": "bool",
        })
        # The parts may come as dicts (the core's shape); anything else is an error here.
        parts: tuple[tuple[str, Any], ...] = (
            ("moe", Moe), ("mla", Mla), ("mamba", Mamba), ("linear_attention", LinearAttention),
        )
        for part, cls in parts:
            value = getattr(self, part)
            if isinstance(value, Mapping):
                setattr(self, part, cls.from_dict(value))
            elif value is not None and not isinstance(value, cls):
                raise invalid(f"model.{part}", shown(value), f"a {cls.__name__}, a dict or None")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "layers": self.layers,
            "hidden": self.hidden,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "ffn_hidden": self.ffn_hidden,
            "vocab": self.vocab,
            "activation": self.activation,
            "norm": self.norm,
            "tied_embeddings": self.tied_embeddings,
            **({"dropout": True} if self.dropout else {}),
            "moe": None if self.moe is None else self.moe.to_dict(),
            "mla": None if self.mla is None else self.mla.to_dict(),
            # The hybrid-stack fields only when set: a uniform model's shape is unchanged.
            **({} if self.layer_pattern is None else {"layer_pattern": self.layer_pattern}),
            **({} if self.mamba is None else {"mamba": self.mamba.to_dict()}),
            **({} if self.linear_attention is None
               else {"linear_attention": self.linear_attention.to_dict()}),
            **({} if self.sliding_window is None else {"sliding_window": self.sliding_window}),
            **({} if self.mtp_layers is None else {"mtp_layers": self.mtp_layers}),
            **({} if self.mtp_pattern is None else {"mtp_pattern": self.mtp_pattern}),
            **({"attention_output_gate": True} if self.attention_output_gate else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Model:
        return cls(**checked(cls, data, "model"))

    @staticmethod
    def presets() -> list[str]:
        """Names of the built-in model presets."""
        return _core.model_presets()

    @staticmethod
    def aliases() -> list[dict[str, str]]:
        """The names people type for the presets (``llama3.1-8b``): ``name``, the ``preset`` it
        resolves to and ``why`` the two are the same model."""
        return _core.model_aliases()

    @classmethod
    def preset(cls, name: str) -> Model:
        """The built-in model ``name`` (see :meth:`presets`), or an alias of one (see
        :meth:`aliases`, named as typed); ``UnknownPresetError`` otherwise."""
        return cls.from_dict(_core.model_preset(name))

    @classmethod
    def from_hf_config(
        cls,
        source: Union[str, "os.PathLike[str]", Mapping[str, Any]],
        name: Optional[str] = None,
    ) -> Model:
        """A model from a Hugging Face ``config.json``.

        ``source`` is a path to the file, its parsed contents (a dict), or its text (a string
        starting with ``{``). ``name`` overrides the name taken from the config. An unreadable
        file raises :class:`InvalidInputError`; a config that cannot be mapped raises
        :class:`HfConfigError`.
        """
        path = None
        if isinstance(source, Mapping):
            text = json.dumps(source)
        elif isinstance(source, str) and source.lstrip().startswith("{"):
            text = source
        elif isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            text = read_text(source, "model config")
        else:
            raise InvalidInputError(
                "invalid model config: expected a path, a dict or JSON text, "
                f"got {type(source).__name__}"
            )
        try:
            return cls.from_dict(_core.model_from_hf_config(text, name))
        except HfConfigError as e:
            if path is None:
                raise
            raise HfConfigError(_in_file(str(e), path)) from None


_HF_PREFIX = "cannot import Hugging Face config: "
_HF_DOCUMENT = "config.json: "


def _in_file(message: str, path: str) -> str:
    """The core's message about a config text, naming the file it came from: the core only
    knows the text, and calls the document itself ``config.json``."""
    if not message.startswith(_HF_PREFIX):
        return f"{path}: {message}"
    rest = message[len(_HF_PREFIX):]
    if rest.startswith(_HF_DOCUMENT):
        rest = rest[len(_HF_DOCUMENT):]
    return f"cannot import Hugging Face config {path}: {rest}"


def read_text(path: Union[str, "os.PathLike[str]"], what: str) -> str:
    """The text of ``path``; an unreadable file is an :class:`InvalidInputError`."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise InvalidInputError(f"cannot read {what} {os.fspath(path)!r}: {reason}") from None
