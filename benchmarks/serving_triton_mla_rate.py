"""Derive ``triton_mla_attention_efficiency`` (data/serving.toml) from sgl-project/sglang PR 3550.

The PR serves DeepSeek-V3 at TP 8 on 8xH200 with SGLang's Triton MLA backend and the radix
cache off, 60 prompts of uniform 1-32000 tokens at 1 request/s, 100 output tokens each, and
reports 2,679.07 input tokens/s: the run is saturated, so its 349.7 s are the sum of the
prompts' prefills (in 8192-token chunks) plus the first arrival and the decode tail. This
script rebuilds the prompts (bench_serving's sampler, seed 1: 936,860 tokens, as the PR
reports), takes this model's time for each chunk without its attention, and solves for the
rate at which the chunks' absorbed-form attention (2·h·(2·d_c + d_r) FLOPs per query-key pair)
fills the rest. It then times every chunk with ``attention_kernel = "triton-mla"`` at the
constant of data/serving.toml and prints the modelled run against the measured one
(tests/test_serving_validation.py holds the constant to this derivation).

    python benchmarks/serving_triton_mla_rate.py
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import meshplan
from meshplan import Cluster

MEASURED_INPUT_TOK_S = 2679.07  # PR 3550, Triton backend, "Input token throughput (tok/s)"
TOTAL_INPUT_TOKENS = 936_860  # PR 3550, "Total input tokens"
CHUNK = 8192  # SGLang 0.4's chunked_prefill_size on H200
FIRST_ARRIVAL_S = 1.0  # Poisson arrivals at 1/s: the run starts with the first one
DECODE_TAIL_S = (3.0, 6.0)  # 100 decode steps of the last requests, and the other decodes
PEAK_16BIT = meshplan.Gpu.preset("h200-sxm").peak_tflops["bf16"] * 1e12  # the preset's dense BF16 peak


@dataclass
class Derivation:
    measured_s: float  # the run's duration
    chunks: list[tuple[int, int]]  # (new tokens, cached prefix) of every prefill forward
    non_attention_s: float  # this model's time of those forwards without attention
    absorbed_flops_per_gpu: float  # their absorbed-form attention, per GPU
    rates: dict[float, float]  # decode tail (s) -> attention FLOP/s per GPU
    modelled_s: float  # the run re-timed at the shipped constant (first decode tail)

    def efficiency(self, tail_s: float) -> float:
        return self.rates[tail_s] / PEAK_16BIT


def prompt_lengths() -> np.ndarray:
    """bench_serving's random dataset at --random-input 32000 --random-range-ratio 0, seed 1."""
    np.random.seed(1)
    return np.random.randint(1, 32000 + 1, size=60)


def chunk_prefill(tokens: int, kernel: str, prefix: int = 0) -> dict:
    """This model's forward of one chunk of ``tokens`` new tokens after ``prefix`` cached ones
    (TP 8, FP8 block weights)."""
    plan = {"worker": {"tp": 8, "max_sequences": 1, "max_batched_tokens": CHUNK,
                       "attention_kernel": kernel, "expert_tp": 8}, "replicas": 1}
    result = meshplan.evaluate_serving(
        "deepseek-v3", Cluster(gpu="h200-sxm", num_gpus=8), plan, input_len=prefix + tokens, output_len=2,
        prefix_fraction=prefix / (prefix + tokens),
        weight_precision="fp8", kv_precision="bf16", concurrency=1, arrival="waves", num_requests=1)
    return result["time"]["prefill"]


def derive() -> Derivation:
    lengths = prompt_lengths()
    assert int(lengths.sum()) == TOTAL_INPUT_TOKENS, "bench_serving's sampler no longer matches"
    model = meshplan.Model.preset("deepseek-v3")
    mla = model.mla
    assert mla is not None
    width = 2 * mla.kv_lora_rank + mla.qk_rope_head_dim
    measured_s = TOTAL_INPUT_TOKENS / MEASURED_INPUT_TOK_S
    non_attention_s = 0.0
    absorbed_flops = 0.0  # whole model, all 8 GPUs
    own: dict[int, float] = {}
    chunks: list[tuple[int, int]] = []
    for n in lengths:
        done = 0
        while done < n:
            c = int(min(CHUNK, n - done))
            chunks.append((c, done))
            if c not in own:
                flash = chunk_prefill(c, "flash")
                own[c] = flash["total_s"] - flash["attention_s"]
            non_attention_s += own[c]
            absorbed_flops += model.layers * 2 * model.heads * width * c * (done + c / 2)
            done += c
    per_gpu = absorbed_flops / 8
    rates = {tail: per_gpu / (measured_s - FIRST_ARRIVAL_S - tail - non_attention_s) for tail in DECODE_TAIL_S}
    modelled = sum(chunk_prefill(c, "triton-mla", prefix)["total_s"] for c, prefix in chunks)
    return Derivation(measured_s, chunks, non_attention_s, per_gpu, rates,
                      modelled + FIRST_ARRIVAL_S + DECODE_TAIL_S[0])


def main() -> None:
    d = derive()
    print(f"measured run: {d.measured_s:.1f} s for {TOTAL_INPUT_TOKENS} prompt tokens in {len(d.chunks)} chunks")
    print(f"this model without attention: {d.non_attention_s:.1f} s; "
          f"absorbed attention {d.absorbed_flops_per_gpu / 1e12:,.0f} TFLOP per GPU")
    for tail, rate in d.rates.items():
        print(f"decode tail {tail:.0f} s: {rate / 1e12:.1f} TFLOP/s per GPU, {d.efficiency(tail):.3f} of the 16-bit peak")
    print(f"modelled with attention_kernel = triton-mla: {d.modelled_s:.1f} s (measured {d.measured_s:.1f} s)")


if __name__ == "__main__":
    main()
