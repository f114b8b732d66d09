"""The model descriptor: a decoder-only transformer, dense or MoE, with GQA and optional MLA.

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
from ._fields import checked
from .errors import InvalidInputError


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "expert_ffn_hidden": self.expert_ffn_hidden,
            "shared_experts": self.shared_experts,
            "shared_expert_ffn_hidden": self.shared_expert_ffn_hidden,
            "first_dense_layers": self.first_dense_layers,
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
    """``"swiglu"`` or ``"gelu"``."""
    head_dim: Optional[int] = None
    """Per-head dimension; None means ``hidden / heads``."""
    norm: str = "rmsnorm"
    """``"rmsnorm"`` or ``"layernorm"``."""
    tied_embeddings: bool = False
    moe: Optional[Moe] = None
    mla: Optional[Mla] = None

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
            "moe": None if self.moe is None else self.moe.to_dict(),
            "mla": None if self.mla is None else self.mla.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Model:
        fields = checked(cls, data, "model")
        moe, mla = fields.get("moe"), fields.get("mla")
        fields["moe"] = None if moe is None or isinstance(moe, Moe) else Moe.from_dict(moe)
        fields["mla"] = None if mla is None or isinstance(mla, Mla) else Mla.from_dict(mla)
        return cls(**fields)

    @staticmethod
    def presets() -> list[str]:
        """Names of the built-in model presets."""
        return _core.model_presets()

    @classmethod
    def preset(cls, name: str) -> Model:
        """The built-in model ``name`` (see :meth:`presets`); ``UnknownPresetError`` otherwise."""
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
        if isinstance(source, Mapping):
            text = json.dumps(source)
        elif isinstance(source, str) and source.lstrip().startswith("{"):
            text = source
        elif isinstance(source, (str, os.PathLike)):
            text = read_text(source, "model config")
        else:
            raise InvalidInputError(
                "invalid model config: expected a path, a dict or JSON text, "
                f"got {type(source).__name__}"
            )
        return cls.from_dict(_core.model_from_hf_config(text, name))


def read_text(path: Union[str, "os.PathLike[str]"], what: str) -> str:
    """The text of ``path``; an unreadable file is an :class:`InvalidInputError`."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise InvalidInputError(f"cannot read {what} {os.fspath(path)!r}: {reason}") from None
