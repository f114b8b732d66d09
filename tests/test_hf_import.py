"""Import of real Hugging Face ``config.json`` files (verbatim copies in fixtures/hf)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import HF_CONFIGS

import meshplan as mp

# Fixtures whose architecture is not modelled, with the key the import error names.
UNSUPPORTED = {
    "DeepSeek-V4-Flash.json": "model_type",
}
CONFIGS = sorted(p for p in HF_CONFIGS.glob("*.json") if p.name not in UNSUPPORTED)

# (file, preset with the same architecture)
SAME_AS_PRESET = [
    ("Llama-3.1-405B.json", "llama3.1-405b"),
    ("Mixtral-8x7B-v0.1.json", "mixtral-8x7b"),
    ("Mixtral-8x22B-v0.1.json", "mixtral-8x22b"),
    ("DeepSeek-V3.json", "deepseek-v3"),
    ("Qwen3-30B-A3B.json", "qwen3-30b-a3b"),
    ("Qwen3-235B-A22B.json", "qwen3-235b-a22b"),
    ("Qwen2.5-72B.json", "qwen2.5-72b"),
    ("GLM-4.5.json", "glm-4.5"),
    ("Kimi-K2-Instruct.json", "kimi-k2"),
    ("gpt-oss-120b.json", "gpt-oss-120b"),
    ("Nemotron-H-56B-Base-8K.json", "nemotron-h-56b"),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json", "nemotron-3-nano-30b-a3b"),
    ("Qwen3-Next-80B-A3B-Instruct.json", "qwen3-next-80b-a3b"),
]


def load(name: str) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((HF_CONFIGS / name).read_text())
    return raw


def shape(m: mp.Model) -> dict[str, Any]:
    d = m.to_dict()
    del d["name"]
    return d


def test_fixtures_are_present() -> None:
    assert len(CONFIGS) >= 10


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_fixture_imports_with_the_files_dimensions(path: Path) -> None:
    raw = json.loads(path.read_text())
    m = mp.Model.from_hf_config(path)
    # Nemotron 3 Ultra's file counts its layers only as the length of layers_block_type.
    assert m.layers == raw.get("num_hidden_layers", len(raw.get("layers_block_type", [])))
    assert m.hidden == raw["hidden_size"]
    assert m.heads == raw["num_attention_heads"]
    assert m.vocab == raw["vocab_size"]
    assert m.tied_embeddings == raw.get("tie_word_embeddings", False)
    if "head_dim" in raw and raw.get("model_type") not in ("deepseek_v3", "kimi_k2"):
        assert m.head_dim == raw["head_dim"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_path_dict_and_text_give_the_same_model(path: Path) -> None:
    by_path = mp.Model.from_hf_config(path)
    assert mp.Model.from_hf_config(str(path)) == by_path
    assert mp.Model.from_hf_config(json.loads(path.read_text())) == by_path
    assert mp.Model.from_hf_config(path.read_text()) == by_path


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_imported_model_can_be_evaluated(path: Path) -> None:
    m = mp.Model.from_hf_config(path)
    ep = 8 if m.moe is not None else 1
    ev = mp.evaluate(m, mp.Cluster("b200", 64), mp.Workload(256, 4096),
                     mp.Plan(dp=64 // (8 * ep), tp=8, pp=1, ep=ep, zero=1))
    assert ev.step_time_s > 0 and ev.peak_memory_gib > 0


@pytest.mark.parametrize("file, preset", SAME_AS_PRESET)
def test_import_matches_the_preset(file: str, preset: str) -> None:
    assert shape(mp.Model.from_hf_config(HF_CONFIGS / file)) == shape(mp.Model.preset(preset))


def test_mixtral_moe_fields() -> None:
    m = mp.Model.from_hf_config(HF_CONFIGS / "Mixtral-8x7B-v0.1.json")
    assert m.moe is not None and m.mla is None
    assert (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden) == (8, 2, 14336)
    assert m.kv_heads == 8


def test_qwen3_moe_head_dim_differs_from_hidden_over_heads() -> None:
    raw = load("Qwen3-30B-A3B.json")
    m = mp.Model.from_hf_config(raw)
    assert m.head_dim == 128 != m.hidden // m.heads
    assert m.moe is not None
    assert m.moe.expert_ffn_hidden == raw["moe_intermediate_size"]
    assert m.moe.num_experts == raw["num_experts"] and m.moe.top_k == raw["num_experts_per_tok"]


def test_deepseek_v3_moe_and_mla() -> None:
    raw = load("DeepSeek-V3.json")
    m = mp.Model.from_hf_config(raw)
    assert m.moe is not None and m.mla is not None
    assert m.moe.num_experts == raw["n_routed_experts"]
    assert m.moe.shared_experts == raw["n_shared_experts"]
    assert m.moe.first_dense_layers == raw["first_k_dense_replace"]
    assert m.moe.expert_ffn_hidden == raw["moe_intermediate_size"]
    assert m.mla.q_lora_rank == raw["q_lora_rank"]
    assert m.mla.kv_lora_rank == raw["kv_lora_rank"]
    assert m.mla.qk_rope_head_dim == raw["qk_rope_head_dim"]


def test_name_override() -> None:
    m = mp.Model.from_hf_config(HF_CONFIGS / "Qwen2.5-72B.json", name="my-qwen")
    assert m.name == "my-qwen"
    assert mp.Model.from_hf_config(HF_CONFIGS / "Qwen2.5-72B.json").name != ""


def test_search_on_an_imported_model() -> None:
    result = mp.search(str(HF_CONFIGS / "Mixtral-8x7B-v0.1.json"), mp.Cluster("h100-sxm", 16),
                       mp.Workload(128, 4096), mp.SearchSpace(max_micro_batch=1, top_k=3))
    assert result.plans and all(p.plan.num_gpus == 16 for p in result.plans)


@pytest.mark.parametrize("file, key", sorted(UNSUPPORTED.items()))
def test_unsupported_fixtures_name_the_key(file: str, key: str) -> None:
    with pytest.raises(mp.errors.HfConfigError, match=key):
        mp.Model.from_hf_config(HF_CONFIGS / file)


def test_nemotron_h_pattern_and_mamba_fields() -> None:
    raw = load("Nemotron-H-56B-Base-8K.json")
    m = mp.Model.from_hf_config(raw)
    assert m.layer_pattern == raw["hybrid_override_pattern"]
    assert m.mamba is not None
    assert (m.mamba.heads, m.mamba.head_dim, m.mamba.state, m.mamba.groups) == (
        raw["mamba_num_heads"], raw["mamba_head_dim"], raw["ssm_state_size"], raw["n_groups"])
    assert (m.mamba.conv_kernel, m.mamba.chunk) == (raw["conv_kernel"], raw["chunk_size"])
    assert m.activation == "relu2" and m.head_dim == raw["attention_head_dim"]
    # The descriptor round-trips through its dict (the --json shape).
    assert mp.Model.from_dict(m.to_dict()) == m


def test_qwen3_next_linear_attention_fields() -> None:
    raw = load("Qwen3-Next-80B-A3B-Instruct.json")
    m = mp.Model.from_hf_config(raw)
    assert m.layer_pattern == "GGGA" * 12
    assert m.linear_attention is not None
    assert (m.linear_attention.key_heads, m.linear_attention.value_heads) == (
        raw["linear_num_key_heads"], raw["linear_num_value_heads"])
    assert m.linear_attention.conv_kernel == raw["linear_conv_kernel_dim"]


def test_a_latent_moe_imports_with_its_latent_width() -> None:
    m = mp.Model.from_hf_config(HF_CONFIGS / "NVIDIA-Nemotron-3-Super-120B-A12B-FP8.json")
    assert m.moe is not None and m.moe.latent_size == 1024
    plain = mp.Model.from_dict({**m.to_dict(), "moe": {**m.moe.to_dict(), "latent_size": None}})
    # Experts at ℓ = h/4: a quarter of the expert weight per GPU of the same experts at h.
    plan = mp.Plan(dp=1, tp=1, pp=1, ep=64, zero=1)
    weights = [mp.evaluate(x, mp.Cluster("b200", 64), mp.Workload(512, 8192), plan).memory_gib["weights"]
               for x in (m, plain)]
    assert weights[0] < 0.75 * weights[1]
    with pytest.raises(mp.errors.InvalidInputError, match="model.moe.latent_size"):
        mp.Model.from_dict({**m.to_dict(), "moe": {**m.moe.to_dict(), "latent_size": 0}})
