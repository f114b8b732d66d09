"""Derive ``mxfp4_upcast_moe_bandwidth_fraction`` and ``mxfp4_upcast_moe_gemm_efficiency``
(data/serving.toml) from the SGLang team's gpt-oss benchmark on H100.

On Hopper, which has no FP4 tensor cores, gpt-oss's MXFP4 routed experts run in OpenAI's Triton
``matmul_ogs`` kernel, which upcasts the weights in the kernel (and, below ~32 rows, splits K into
FP32 partials: vllm-project/vllm PR 30528, sgl-project/sglang PR 16014). The kernel's bandwidth is
not published; one decode rate of SGLang on H100 is:

- LMSYS blog "SGLang for gpt-oss: From Day 0 Support to Enhanced Performance" (Aug 27, 2025),
  chart "High-Throughput Decode Performance (Batch Size 32)", bar "H100 (Input 1k)", Optimized
  (main): 4,791 tok/s, read from the chart's SVG (lm-sys/lm-sys.github.io
  public/images/blog/gpt_oss/combined_decode_performance.svg: bar top at y = 213.745, axis 0 at
  544.468 and 1000 at 475.437). Reproduction (sgl-project/sglang benchmark/gpt_oss/README.md):
  SGLang v0.5.1.post3, ``launch_server --model openai/gpt-oss-120b --tp 8`` on H100,
  ``bench_one_batch_server --batch-size 32 --input-len 1024 --output-len 512``, whose output
  throughput is batch · output_len / (latency − TTFT), i.e. 511 decode steps.

A decode step of that batch is, in this model, a part that does not depend on the constant (the
dense weights, attention, the all-reduces, launches and host time) plus the routed experts'
streaming, inversely proportional to the fraction of the HBM bandwidth. This script takes both
from this model at the shipped constant (the core reports the experts' share of a step,
``routed_expert_s``) and solves for the fraction that makes the step the measured one; the
prefill rate comes from the same blog's two H100 prefill bars (``derive_prefill``). It then re-times the source's other Hopper bars at
the shipped constant as checks, and two other engines' published Hopper runs of the same model
that were not used to derive it (tests/test_serving_validation.py holds the constant to this
derivation):

- vllm-project/vllm PR 27523 (Oct 2025), ``vllm bench latency --model openai/gpt-oss-120b
  --num-iters 100`` at its defaults (batch 8, 32 in, 128 out; TP 1, so an 80 GB Hopper GPU, taken
  as H100 SXM): 1.58155 s average with the Triton MXFP4 backend (1.17 s with Marlin).
- vllm-project/vllm issue 30326 (Dec 2025), gpt-oss-120b on H200 at TP 8, 1024 in / 1024 out
  (--ignore-eos), output throughput before PR 29708: 1,947.66 tok/s at concurrency 8 and
  12,781.05 tok/s at concurrency 128 (the MoE backend is not stated; triton_kernels was vLLM's
  Hopper default then, PR 30528).

    python benchmarks/serving_mxfp4_hopper_rate.py
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

import meshplan
from meshplan import Cluster

TP = 8
BATCH = 32
OUTPUT_LEN = 512
# The chart's bars (tok/s) from the SVG's geometry: (544.468 - top) / 69.031 * 1000.
AXIS_ZERO_Y = 544.467632
PX_PER_1000 = 544.467632 - 475.436877
BAR_TOP_Y = {1024: 213.744737, 8192: 228.531815}  # H100 (Input 1k), H100 (Input 8k), Optimized
B200_BAR_TOP_Y = {1024: 54.418994, 8192: 86.817198}  # B200 (Input 1k), (Input 8k) at TP 4, Optimized
B200_BATCH1_TOK_S = 416.02  # the blog's batch-1 table, MXFP4 on B200 (TP 4)
BATCH1_TOK_S = 318.53  # the blog's batch-1 table, MXFP4 on H100 (TP 8, --attention-backend triton)
# SGLang's default chunked-prefill budget by GPU memory (python/sglang/srt/server_args.py: 8192
# tokens from 35 to 160 GB, H100; 16384 above, B200).
CHUNK = {"h100-sxm": 8192, "b200": 16384}
SERVING_TOML = Path(__file__).parent.parent / "rust" / "meshplan-core" / "data" / "serving.toml"


def bar_tok_s(input_len: int, bars: dict[int, float] = BAR_TOP_Y) -> float:
    return (AXIS_ZERO_Y - bars[input_len]) / PX_PER_1000 * 1000.0


def measured_step_s(tok_s: float, batch: int) -> float:
    """bench_one_batch_server: batch · OSL tokens over (latency − TTFT), 511 decode steps."""
    return batch * OUTPUT_LEN / tok_s / (OUTPUT_LEN - 1)


def evaluate(gpu: str, tp: int, batch: int, input_len: int, output_len: int = OUTPUT_LEN,
             prompts: int | None = None, chunk: int | None = None) -> dict:
    """This model's evaluation of gpt-oss-120b (MXFP4 experts) on one worker of ``tp`` GPUs at TP
    ``tp``: a closed loop of ``batch`` equal-length requests arriving in waves (a benchmark's
    one batch), over a run of ``prompts`` requests (default one wave), in forwards of ``chunk``
    tokens where the engine fixes them."""
    worker = {"tp": tp, "expert_tp": tp, "max_sequences": batch}
    if chunk is not None:
        worker["max_batched_tokens"] = chunk
    return meshplan.evaluate_serving(
        "gpt-oss-120b", Cluster(gpu=gpu, num_gpus=tp), {"worker": worker, "replicas": 1},
        input_len=input_len, output_len=output_len, expert_weights="mxfp4", concurrency=batch,
        arrival="waves", num_requests=prompts)


def modelled_step(input_len: int, batch: int, gpu: str = "h100-sxm", tp: int = TP) -> dict:
    """This model's pure decode step of the benchmark's batch (the rates as shipped)."""
    return dict(evaluate(gpu, tp, batch, input_len, prompts=batch)["time"]["decode"])


def modelled_step_s(input_len: int, batch: int, gpu: str = "h100-sxm", tp: int = TP) -> float:
    return float(modelled_step(input_len, batch, gpu, tp)["total_s"])


def vllm_bench_latency_s() -> float:
    """vLLM PR 27523's bench latency: one batch of 8 prompts of 32 tokens, 128 outputs, TP 1."""
    return float(evaluate("h100-sxm", 1, 8, 32, 128, prompts=8)["time"]["e2e_s"])


def vllm_h200_tok_s(concurrency: int, prompts: int | None) -> float:
    """vLLM issue 30326: a closed loop of equal-length requests (--ignore-eos, range ratio 1.0,
    hence waves) at ``concurrency``, 1024 in / 1024 out, TP 8 on H200; the issue gives the
    client command (40 prompts) for concurrency 8 only."""
    return float(evaluate("h200-sxm", 8, concurrency, 1024, 1024, prompts=prompts)["output_tokens_per_s"])


# The same blog's prefill chart ("High-Throughput Prefill Performance (Batch Size 32)",
# combined_prefill_performance.svg: axis 0 at y = 542.138, 20000 tok/s per 59.734 px), Optimized
# bars: bench_one_batch_server's input throughput, batch · input_len / TTFT of the last request.
# H100 at TP 8 (MXFP4 experts upcast in Triton's kernel), B200 at TP 4 (native MXFP4 MoE).
PREFILL_AXIS_ZERO_Y = 542.13826
PREFILL_PX_PER_20000 = 542.13826 - 482.404034
PREFILL_BAR_TOP_Y = {("h100-sxm", 1024): 265.384514, ("h100-sxm", 8192): 220.419725,
                     ("b200", 1024): 62.488614, ("b200", 8192): 54.308072}
PREFILL_TP = {"h100-sxm": 8, "b200": 4}


def prefill_bar_tok_s(gpu: str, input_len: int) -> float:
    return (PREFILL_AXIS_ZERO_Y - PREFILL_BAR_TOP_Y[(gpu, input_len)]) / PREFILL_PX_PER_20000 * 20000.0


def modelled_prefill_tok_s(gpu: str, input_len: int) -> float:
    """This model's prefill of the benchmark's 32 prompts in forwards of SGLang's chunked-prefill
    budget: prompt tokens over the forwards' time."""
    forwards = BATCH * input_len / CHUNK[gpu]
    return BATCH * input_len / (forwards * float(prefill_forward(gpu, input_len)["total_s"]))


def shipped(name: str = "mxfp4_upcast_moe_bandwidth_fraction") -> float:
    return float(tomllib.loads(SERVING_TOML.read_text())[name])


def prefill_forward(gpu: str, input_len: int) -> dict:
    """This model's prefill forward of SGLang's budget of ``input_len``-token prompts."""
    result = evaluate(gpu, PREFILL_TP[gpu], BATCH, input_len, prompts=BATCH, chunk=CHUNK[gpu])
    return dict(result["time"]["prefill"])


@dataclass
class PrefillDerivation:
    efficiency: float  # mxfp4_upcast_moe_gemm_efficiency that fits both H100 bars
    fixed_s: float  # the batch's time outside its forwards, the other unknown of the two bars
    measured_s: dict[int, float]  # input_len -> the last request's TTFT
    modelled_s: dict[int, float]  # input_len -> the forwards at the shipped constant, plus fixed_s
    eight_k_alone: float  # the constant the 8k bar gives with no fixed time


def derive_prefill() -> PrefillDerivation:
    """The two H100 prefill bars (TP 8, 32 prompts of 1k and of 8k tokens in forwards of 8192
    tokens: 4 and 32 forwards) give two equations, TTFT = forwards x (rest + experts x s) +
    fixed, in two unknowns: s, how much longer the routed experts' GEMMs take than at the
    shipped constant (they are compute-bound, their time inversely proportional to it), and the
    batch's fixed time (tokenising and admitting 32 requests, which the model does not price)."""
    cap = shipped("mxfp4_upcast_moe_gemm_efficiency")
    rest, experts, forwards, measured = {}, {}, {}, {}
    for input_len in (1024, 8192):
        f = prefill_forward("h100-sxm", input_len)
        assert not f["memory_bound"], "a prefill forward of 8192 tokens is compute-bound"
        rest[input_len] = f["total_s"] - f["routed_expert_s"]
        experts[input_len] = f["routed_expert_s"]
        forwards[input_len] = BATCH * input_len / CHUNK["h100-sxm"]
        measured[input_len] = BATCH * input_len / prefill_bar_tok_s("h100-sxm", input_len)
    a, b = 1024, 8192
    scale = ((measured[b] - measured[a] - forwards[b] * rest[b] + forwards[a] * rest[a])
             / (forwards[b] * experts[b] - forwards[a] * experts[a]))
    fixed = measured[a] - forwards[a] * (rest[a] + experts[a] * scale)
    modelled = {n: forwards[n] * (rest[n] + experts[n]) + fixed for n in (a, b)}
    # With no fixed time, the 8k bar alone (the 1k bar would then say another rate).
    alone = (measured[b] / forwards[b] - rest[b]) / experts[b]
    return PrefillDerivation(cap / scale, fixed, measured, modelled, cap / alone)


@dataclass
class Derivation:
    measured_step_s: float
    modelled_step_s: float  # at the shipped constant
    expert_s: float  # the routed experts' share of the modelled step, at the shipped constant
    fraction: float  # what makes the modelled step the measured one
    checks: dict[str, tuple[float, float]]  # name -> (modelled, measured) step seconds
    others: dict[str, tuple[float, float]]  # other engines' runs: name -> (modelled, measured)


def derive() -> Derivation:
    measured = measured_step_s(bar_tok_s(1024), BATCH)
    decode = modelled_step(1024, BATCH)
    assert decode["memory_bound"], "a decode step of 32 sequences streams its weights"
    step, experts = float(decode["total_s"]), float(decode["routed_expert_s"])
    # The experts' time is their weights over the streamed share of the bandwidth (their
    # activations are ~1 % of the bytes): the share that leaves the rest of the step as it is
    # and fills the measured one.
    fraction = shipped() * experts / (measured - (step - experts))
    checks = {
        "batch 32, input 8k": (modelled_step_s(8192, BATCH), measured_step_s(bar_tok_s(8192), BATCH)),
        "batch 1, input 1k": (modelled_step_s(1024, 1), measured_step_s(BATCH1_TOK_S, 1)),
    }
    others = {
        "vLLM PR 27523 bench latency, H100 TP 1, batch 8 (s)": (vllm_bench_latency_s(), 1.58155),
        "vLLM issue 30326, H200 TP 8, concurrency 8 (tok/s)": (vllm_h200_tok_s(8, 40), 1947.66),
        "vLLM issue 30326, H200 TP 8, concurrency 128 (tok/s)": (vllm_h200_tok_s(128, None), 12781.05),
    }
    return Derivation(measured, step, experts, fraction, checks, others)


def main() -> None:
    d = derive()
    print(f"H100 TP {TP}, batch {BATCH}, 1k in: {bar_tok_s(1024):,.0f} tok/s measured, "
          f"a decode step of {d.measured_step_s * 1e3:.2f} ms")
    bandwidth = meshplan.Gpu.preset("h100-sxm").memory_bandwidth_gbps * 1e9
    expert_bytes = d.expert_s * bandwidth * shipped()
    expert_s = d.expert_s * shipped() / d.fraction
    print(f"the routed experts stream {expert_bytes / 1e9:.2f} GB per GPU per step (weights and "
          f"activations); the rest of the "
          f"step {(d.measured_step_s - expert_s) * 1e3:.2f} ms, the experts {expert_s * 1e3:.2f} ms "
          f"({expert_bytes / expert_s / 1e12:.2f} TB/s)")
    print(f"fraction of the HBM bandwidth that gives the measured step: {d.fraction:.3f} "
          f"(shipped {shipped():.3f}; modelled step at it {d.modelled_step_s * 1e3:.2f} ms)")
    for name, (modelled, measured) in d.checks.items():
        print(f"check {name}: modelled {modelled * 1e3:.2f} ms, measured {measured * 1e3:.2f} ms "
              f"({(modelled - measured) / measured:+.0%})")
    for name, (modelled, measured) in d.others.items():
        print(f"check {name}: modelled {modelled:,.3f}, measured {measured:,.3f} "
              f"({(modelled - measured) / measured:+.0%})")
    p = derive_prefill()
    print(f"prefill: mxfp4_upcast_moe_gemm_efficiency {p.efficiency:.3f} (shipped "
          f"{shipped('mxfp4_upcast_moe_gemm_efficiency'):.3f}) and {p.fixed_s * 1e3:.0f} ms per batch outside the "
          f"forwards fit both H100 bars; at the shipped constant: "
          + ", ".join(f"{n} in {p.modelled_s[n]:.3f} s against {p.measured_s[n]:.3f} s" for n in p.measured_s)
          + f"; the 8k bar alone, with no fixed time, gives {p.eight_k_alone:.3f}")
    # Not these constants': the same blog's B200 decode (native MXFP4, decode_bandwidth_fraction)
    # and prefill bars (compute-bound).
    for input_len in B200_BAR_TOP_Y:
        modelled = modelled_step_s(input_len, BATCH, "b200", 4)
        measured = measured_step_s(bar_tok_s(input_len, B200_BAR_TOP_Y), BATCH)
        print(f"decode b200 TP 4, batch 32, {input_len} in: modelled {modelled * 1e3:.2f} ms, "
              f"measured {measured * 1e3:.2f} ({(modelled - measured) / measured:+.0%})")
    modelled, measured = modelled_step_s(1024, 1, "b200", 4), measured_step_s(B200_BATCH1_TOK_S, 1)
    print(f"decode b200 TP 4, batch 1: modelled {modelled * 1e3:.2f} ms, measured {measured * 1e3:.2f} "
          f"({(modelled - measured) / measured:+.0%})")
    for gpu, input_len in PREFILL_BAR_TOP_Y:
        modelled, measured = modelled_prefill_tok_s(gpu, input_len), prefill_bar_tok_s(gpu, input_len)
        print(f"prefill {gpu} TP {PREFILL_TP[gpu]}, 32 x {input_len} in: modelled {modelled:,.0f} tok/s, "
              f"measured {measured:,.0f} ({(modelled - measured) / measured:+.0%})")


if __name__ == "__main__":
    main()
