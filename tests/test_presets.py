"""Presets through the binding: names, shapes, and exact round trips of the typed objects."""

from __future__ import annotations

from typing import Optional

import pytest

import meshplan as mp
from meshplan import _core
from meshplan.errors import InvalidInputError

ISSUE_MODELS = [
    "llama3-8b", "llama3-70b", "llama3.1-405b", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3",
    "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt3-175b",
]
ISSUE_GPUS = [
    "a100-sxm-40g", "a100-sxm-80g", "h100-sxm", "h100-sxm-96g", "h200-sxm", "h800-sxm", "b200",
    "b300", "gb200-nvl72", "gb300-nvl72", "mi300x",
]


def test_model_presets_are_sorted_and_cover_the_issue_list() -> None:
    names = mp.Model.presets()
    assert names == sorted(names)
    assert set(ISSUE_MODELS) <= set(names)
    # The GPT family of Narayanan et al. 2021, 1.7B ... 1T.
    assert sum(1 for n in names if n.startswith("gpt-")) >= 10


def test_gpu_presets_are_sorted_and_cover_the_issue_list() -> None:
    names = mp.Gpu.presets()
    assert names == sorted(names)
    assert set(ISSUE_GPUS) <= set(names)


@pytest.mark.parametrize("name", _core.model_presets())
def test_every_model_preset_round_trips_exactly(name: str) -> None:
    raw = _core.model_preset(name)
    model = mp.Model.from_dict(raw)
    assert model.name == name
    assert model.to_dict() == raw
    assert mp.Model.preset(name) == model


@pytest.mark.parametrize("name", _core.gpu_presets())
def test_every_gpu_preset_round_trips(name: str) -> None:
    raw = _core.gpu_preset(name)
    gpu = mp.Gpu.from_dict(raw)
    assert gpu.name == name
    # Precisions the chip lacks come back as None from the core and are dropped in Python.
    assert gpu.peak_tflops == {k: v for k, v in raw["peak_tflops"].items() if v is not None}
    assert "bf16" in gpu.peak_tflops
    assert mp.Gpu.from_dict(gpu.to_dict()) == gpu
    assert {k: v for k, v in gpu.to_dict().items() if k != "peak_tflops"} == {
        k: v for k, v in raw.items() if k != "peak_tflops"
    }


def test_llama3_70b_has_its_published_shape() -> None:
    m = mp.Model.preset("llama3-70b")
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab) == (
        80, 8192, 64, 8, 28672, 128256,
    )
    assert m.activation == "swiglu" and m.moe is None and m.mla is None


def test_deepseek_v3_preset_has_moe_and_mla() -> None:
    m = mp.Model.preset("deepseek-v3")
    assert m.moe is not None and m.mla is not None
    assert (m.moe.num_experts, m.moe.top_k, m.moe.shared_experts, m.moe.first_dense_layers) == (
        256, 8, 1, 3,
    )
    assert (m.mla.q_lora_rank, m.mla.kv_lora_rank) == (1536, 512)


def test_a100_has_no_fp8_and_h100_has() -> None:
    assert "fp8" not in mp.Gpu.preset("a100-sxm-80g").peak_tflops
    h100 = mp.Gpu.preset("h100-sxm")
    assert h100.peak_tflops["fp8"] > h100.peak_tflops["bf16"]


def test_cluster_preset_equals_cluster_by_name() -> None:
    by_name = mp.Cluster("h100-sxm", 16, gpus_per_node=8)
    by_preset = mp.Cluster.preset("h100-sxm", 16, gpus_per_node=8)
    assert by_name.to_dict() == by_preset.to_dict()
    assert by_preset.to_dict()["gpu"] == mp.Gpu.from_dict(_core.gpu_preset("h100-sxm")).to_dict()


def test_a_user_gpus_architecture_picks_its_matmul_realisation() -> None:
    """A GPU whose only GEMM figure is its microbenchmark is priced at its architecture's
    realisation (data/device.toml): Blackwell's is lower, so the same GPU runs slower labelled
    Blackwell than unlabelled; a malformed name is a one-line error naming the field."""
    import dataclasses

    base = mp.Gpu.preset("h100-sxm")
    assert base.architecture == "hopper" and mp.Gpu.preset("gb200-nvl72").architecture == "blackwell"
    calibration = {**base.calibration, "gemm_efficiency": {}}
    model, workload, plan = mp.Model.preset("llama3-8b"), mp.Workload(global_batch=8, seq_len=4096), mp.Plan(dp=8, tp=1, pp=1)

    def step(architecture: Optional[str]) -> float:
        gpu = dataclasses.replace(base, name="my-gpu", architecture=architecture, calibration=calibration)
        return mp.evaluate(model, mp.Cluster(gpu, 8), workload, plan).step_time_s

    (_, default), (_, blackwell) = _core.matmul_realisation(None), _core.matmul_realisation("blackwell")
    assert blackwell < default
    assert step(None) == step("hopper") == step("no-class-of-its-own")
    assert step("blackwell") > step(None)
    with pytest.raises(InvalidInputError, match=r"gpu\.architecture: Blackwell!"):
        step("Blackwell!")
