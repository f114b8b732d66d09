"""Serving plans through Python and the CLI (docs/serving.md): the issue's scenarios, the
metric relations, the Pareto front, explain, the launch commands and the command line."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

import meshplan as mp
from meshplan.cli import main
from meshplan.serving import launch_commands, parse_serving_plan, serving_problem

H100x8 = mp.Cluster("h100-sxm", 8)


def test_batch_one_latency_picks_tp_within_the_node() -> None:
    r = mp.search_serving("llama3-70b", H100x8, input_len=1024, output_len=128, concurrency=1,
                          objective="latency")
    best = r.best
    assert best is not None
    assert best["plan"]["worker"]["tp"] == 8 and best["plan"]["replicas"] == 1
    assert best["plan"]["prefill"] is None
    # Batch 1 decoding is memory-bound.
    assert best["time"]["decode"]["memory_bound"]
    ex = mp.explain_serving("llama3-70b", H100x8, best["plan"], input_len=1024, output_len=128,
                            concurrency=1)
    tp = next(a for a in ex["axes"] if a["axis"] == "tp")
    assert tp["collective"] == "all-reduce" and tp["fabric"] == "nvlink"
    assert tp["latency_bound"]
    # Two all-reduces of one hidden state per layer: 2·80·2·(7/8)·8192·2 bytes per token.
    assert tp["bytes_per_token_per_gpu"] == pytest.approx(2 * 80 * 2 * 7 / 8 * 8192 * 2)


def test_a_throughput_target_picks_replicas_of_a_smaller_tp() -> None:
    r = mp.search_serving("llama3-70b", H100x8, input_len=2048, output_len=512, concurrency=256,
                          request_rate=1.0, space={"disaggregation": False})
    best = r.best
    assert best is not None
    assert best["plan"]["worker"]["tp"] < 8 and best["plan"]["replicas"] > 1, best["label"]
    assert all(e["requests_per_s"] >= 1.0 for e in r.plans)


def test_deepseek_v3_considers_attention_dp_with_ep_and_disaggregation() -> None:
    r = mp.search_serving("deepseek-v3", mp.Cluster("h200-sxm", 16), input_len=4096, output_len=1024,
                          weight_precision="fp8", tpot_s=0.1, space={"top_k": 2000})
    workers = [e["plan"]["worker"] for e in r.plans]
    assert any(w["attention_dp"] > 1 and w["ep"] > 1 for w in workers)
    assert any(e["plan"]["prefill"] is not None for e in r.plans)
    best = r.best
    assert best is not None and best["plan"]["worker"]["ep"] > 1
    ex = mp.explain_serving("deepseek-v3", mp.Cluster("h200-sxm", 16),
                            "tp=1,adp=16,ep=16,batch=512", input_len=4096, output_len=1024,
                            weight_precision="fp8")
    ep = next(a for a in ex["axes"] if a["axis"] == "ep")
    assert ep["collective"] == "dispatch+combine" and ep["fabric"] == "nvlink+network"
    assert ep["bytes_per_token_per_gpu"] > 0


def test_a_64_gpu_search_of_a_671b_moe_takes_under_a_second() -> None:
    cluster = mp.Cluster("h200-sxm", 64)
    started = time.perf_counter()
    r = mp.search_serving("deepseek-v3", cluster, input_len=4096, output_len=1024,
                          weight_precision="fp8", tpot_s=0.05)
    elapsed = time.perf_counter() - started
    assert r.stats["candidates"] > 1000 and r.plans
    # The bound of the issue is 1 s on 2 cores; a loaded shared machine gets twice that.
    assert elapsed < 2.0, elapsed


def test_a_pipelined_deployments_prompts_do_not_queue_for_the_whole_pipeline() -> None:
    # With no SLO the 64-GPU search ranks deep pipelines first (32 stages of 2 layers). Their
    # arrivals' prefill rides in the decode micro-batches and holds a forward's budget for one
    # stage period; priced at the 32-stage crossing instead, it looked saturated and the top
    # plan waited 59,345 s for its prefill.
    r = mp.search_serving("deepseek-v3", mp.Cluster("h200-sxm", 64), input_len=4096, output_len=1024,
                          weight_precision="fp8", space={"top_k": 5})
    assert r.plans and all(p["plan"]["worker"]["pp"] >= 16 for p in r.plans), [p["label"] for p in r.plans]
    for p in r.plans:
        assert p["queue_s"] < p["time"]["ttft_s"] < 10.0, (p["label"], p["time"]["ttft_s"])


def test_metric_relations_and_slos() -> None:
    common = dict(input_len=1024, output_len=256)
    ev = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 1), "tp=1,batch=32", **common)
    t = ev["time"]
    # TPOT excludes the first token: e2e = TTFT + (OSL − 1)·TPOT.
    assert t["e2e_s"] == pytest.approx(t["ttft_s"] + 255 * t["tpot_s"])
    assert ev["tokens_per_s_per_user"] == pytest.approx(1 / t["tpot_s"])
    assert ev["output_tokens_per_s"] == pytest.approx(ev["requests_per_s"] * 256)
    assert ev["feasible"] and not ev["violations"]
    tight = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 1), "tp=1,batch=32",
                                tpot_s=t["tpot_s"] / 2, ttft_s=t["ttft_s"] / 2, **common)
    assert not tight["feasible"]
    assert {v["rule"] for v in tight["violations"]} == {"tpot", "ttft"}


def test_memory_says_how_many_sequences_fit() -> None:
    ev = mp.evaluate_serving("llama3-70b", mp.Cluster("h100-sxm", 1), "tp=1,batch=1",
                             input_len=1024, output_len=128)
    assert not ev["feasible"]
    assert ev["violations"][0]["rule"] == "memory"
    assert ev["memory"]["max_sequences_fit"] == 0
    ok = mp.evaluate_serving("llama3-70b", H100x8, "tp=8,batch=1", input_len=1024, output_len=128)
    fp8 = mp.evaluate_serving("llama3-70b", H100x8, "tp=8,batch=1", input_len=1024, output_len=128,
                              kv_precision="fp8")
    assert fp8["memory"]["max_sequences_fit"] >= 2 * ok["memory"]["max_sequences_fit"] - 1


def test_the_pareto_front_is_non_dominated() -> None:
    r = mp.search_serving("llama3-8b", H100x8, input_len=1024, output_len=256)
    front = r.pareto
    assert len(front) >= 3
    for a, b in zip(front, front[1:]):
        assert a["tokens_per_s_per_user"] >= b["tokens_per_s_per_user"]
        assert a["tokens_per_s_per_gpu"] < b["tokens_per_s_per_gpu"]
    for e in r.plans:
        assert any(f["tokens_per_s_per_gpu"] >= e["tokens_per_s_per_gpu"]
                   and f["tokens_per_s_per_user"] >= e["tokens_per_s_per_user"] for f in front)


def test_disaggregated_deployments_pay_the_kv_transfer() -> None:
    ev = mp.evaluate_serving("llama3-70b", mp.Cluster("h100-sxm", 16), "tp=8,batch=64",
                             prefill="tp=8,batch=4", input_len=4096, output_len=512)
    assert ev["plan"]["prefill_replicas"] == 1 and ev["gpus"] == 16
    t = ev["time"]
    assert t["kv_transfer_s"] > 0
    assert t["ttft_s"] == pytest.approx(t["prefill"]["total_s"] + t["kv_transfer_s"])


def test_plan_spelling() -> None:
    p = parse_serving_plan("tp=2,adp=4,ep=8,batch=64,replicas=3", "tp=8,etp=8,batch=2")
    assert p["worker"] == {"tp": 2, "attention_dp": 4, "ep": 8, "expert_tp": 1, "max_sequences": 64}
    assert p["replicas"] == 3 and p["prefill_replicas"] == 1
    assert p["prefill"]["expert_tp"] == 8
    with pytest.raises(mp.errors.InvalidInputError, match="unknown key 'dp'"):
        parse_serving_plan("tp=2,dp=4")
    with pytest.raises(mp.errors.InvalidInputError, match="serving_plan.tp: 'x'"):
        parse_serving_plan("tp=x")


def test_launch_commands() -> None:
    problem = serving_problem("deepseek-v3", mp.Cluster("h200-sxm", 16), input_len=1024, output_len=256,
                              weight_precision="fp8", kv_precision="fp8")
    plan = parse_serving_plan("tp=1,adp=8,ep=8,batch=512,replicas=1", "tp=8,batch=2")
    vllm = launch_commands(plan, problem, "vllm", "deepseek-ai/DeepSeek-V3")
    decode = vllm[3]
    assert decode.startswith("vllm serve deepseek-ai/DeepSeek-V3 ")
    for flag in ("--tensor-parallel-size 1", "--data-parallel-size 8", "--enable-expert-parallel",
                 "--max-num-seqs 64", "--kv-cache-dtype fp8", "--quantization fp8", "NixlConnector"):
        assert flag in decode, flag
    assert vllm[0].startswith("# 1 prefill workers of 8 GPUs")
    sglang = launch_commands(plan, problem, "sglang")
    for flag in ("--tp-size 8", "--dp-size 8", "--enable-dp-attention", "--ep-size 8",
                 "--max-running-requests 512", "--kv-cache-dtype fp8_e4m3", "--disaggregation-mode decode"):
        assert flag in sglang[3], flag
    assert "--disaggregation-mode prefill" in sglang[1]
    trt = launch_commands(plan, problem, "trtllm")
    assert "--tp_size 8" in trt[3] and "--ep_size 8" in trt[3]
    with pytest.raises(mp.errors.InvalidInputError, match="engine"):
        launch_commands(plan, problem, "tgi")


def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


PROBLEM = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--input-len", "1024",
           "--output-len", "256")


def test_cli_search_table_json_csv() -> None:
    code, text = run_cli("inference", "search", *PROBLEM, "--top-k", "3")
    assert code == 0 and "tok/s/GPU" in text and "Pareto front" in text
    code, text = run_cli("inference", "search", *PROBLEM, "--json", "--top-k", "2")
    data = json.loads(text)
    assert code == 0 and len(data["plans"]) == 2 and data["pareto"]
    code, text = run_cli("inference", "search", *PROBLEM, "--csv", "--top-k", "2")
    lines = text.strip().splitlines()
    assert code == 0 and lines[0].startswith("rank,deployment,gpus,tp") and len(lines) == 3


def test_cli_evaluate_explain_export(capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run_cli("inference", "evaluate", *PROBLEM, "--plan", "tp=1,batch=64,replicas=8")
    assert code == 0 and "TPOT" in text and "feasible" in text
    assert "traffic: 1024 -> 256 tokens per request" in text
    code, text = run_cli("inference", "explain", *PROBLEM, "--plan", "tp=2,batch=64,replicas=4")
    assert code == 0 and "all-reduce" in text and "nvlink" in text
    code, text = run_cli("inference", "evaluate", *PROBLEM, "--plan", "tp=2,batch=64,replicas=4",
                         "--export", "sglang")
    assert code == 0 and "sglang.launch_server" in text and "--tp-size 2" in text
    code = main(["inference", "evaluate", *PROBLEM, "--plan", "tp=4294967296,batch=1"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == ("meshplan: error: invalid serving_plan.worker.tp: 4294967296 "
                           "(allowed: 1..=1048576)")


def test_the_queue_model_takes_the_arrival_process() -> None:
    # Closed loop: 96 in flight on a worker of 64 slots; the 32 others wait 32/X for one, on top
    # of what every prompt waits for the others' prefills (M/D/1 at the loop's rate); a single
    # request in flight waits for nothing.
    kw = dict(input_len=1024, output_len=256)
    alone = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 1), "tp=1,batch=64", concurrency=64, **kw)
    queued = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 1), "tp=1,batch=64", concurrency=96, **kw)
    x = 64 / (256 * queued["time"]["tpot_s"])
    assert 0 < alone["queue_s"] < alone["time"]["prefill"]["total_s"]
    assert queued["queue_s"] == pytest.approx(alone["queue_s"] + 32 / x)
    assert queued["time"]["ttft_s"] == pytest.approx(alone["time"]["ttft_s"] + 32 / x)
    one = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 1), "tp=1,batch=64", concurrency=1, **kw)
    assert one["queue_s"] == 0
    # Open loop at 2 requests/s: the rate keeps n = λ·OSL·TPOT running, the prefill mostly idle
    # (the median request waits nothing); the deployment's capacity (its full batch) is above the
    # rate. At 22/s the prefill is busy more than half the time and the median request waits.
    ev = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 1), "tp=1,batch=256", request_rate=2.0, **kw)
    assert ev["sequences_per_worker"] == pytest.approx(2.0 * 256 * ev["time"]["tpot_s"], rel=1e-3)
    assert ev["requests_per_s"] > 2.0 and ev["queue_s"] == 0
    busy = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 1), "tp=1,batch=256", request_rate=22.0, **kw)
    assert busy["requests_per_s"] > 22.0 and 0 < busy["queue_s"] < busy["time"]["ttft_s"]
    # Waves: a batch submitted at once is prefilled, then decoded alone (no prefill in its steps).
    waves = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 1), "tp=1,batch=4", concurrency=4,
                                arrival="waves", num_requests=4, **kw)
    spread = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 1), "tp=1,batch=4", concurrency=4, **kw)
    assert waves["time"]["tpot_s"] < spread["time"]["tpot_s"]
    with pytest.raises(mp.errors.InvalidInputError, match="traffic.arrival"):
        mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 1), "tp=1,batch=4", arrival="poisson", **kw)


def test_a_worker_token_budget_is_spelled_and_exported() -> None:
    plan = parse_serving_plan("tp=8,batch=64,tokens=16384")
    assert plan["worker"]["max_batched_tokens"] == 16384
    problem = serving_problem("llama3-70b", H100x8, input_len=1024, output_len=256)
    for engine, flag in (("vllm", "--max-num-batched-tokens 16384"), ("sglang", "--chunked-prefill-size 16384"),
                         ("trtllm", "--max_num_tokens 16384")):
        assert flag in "\n".join(launch_commands(plan, problem, engine))
    ev = mp.evaluate_serving("llama3-70b", H100x8, plan, input_len=1024, output_len=256)
    assert "tok16384" in ev["label"] and ev["plan"]["worker"]["max_batched_tokens"] == 16384
    # A bigger forward needs a bigger activation workspace.
    default = mp.evaluate_serving("llama3-70b", H100x8, "tp=8,batch=64", input_len=1024, output_len=256)
    assert ev["memory"]["workspace_gib"] > default["memory"]["workspace_gib"]
    assert "max_batched_tokens" not in default["plan"]["worker"]
    # The engine's own KV size, where known, sets how many sequences fit.
    held = mp.evaluate_serving("llama3-70b", H100x8, "tp=8,batch=64,kv_tokens=100000", input_len=1024,
                               output_len=256)
    assert held["memory"]["kv_capacity_tokens"] == 100000
    assert held["memory"]["max_sequences_fit"] == 100000 // (1024 + 256)


def test_cli_takes_the_arrival_process() -> None:
    code, text = run_cli("inference", "evaluate", *PROBLEM, "--plan", "tp=1,batch=64,replicas=8",
                         "--concurrency", "1024", "--arrival", "waves", "--num-requests", "2048", "--json")
    ev = json.loads(text)
    assert code == 0 and ev["queue_s"] > 0
    code, text = run_cli("inference", "evaluate", *PROBLEM, "--plan", "tp=1,batch=64,replicas=8",
                         "--request-rate", "4")
    assert code == 0 and "queueing" in text


def test_cli_plot_pareto(tmp_path: object) -> None:
    pytest.importorskip("matplotlib")
    from pathlib import Path

    out = Path(str(tmp_path)) / "front.png"
    code, _ = run_cli("inference", "search", *PROBLEM, "--plot", "pareto", "--out", str(out))
    assert code == 0 and out.stat().st_size > 1000


def test_block_scaled_fp8_prefill_runs_at_the_engines_block_kernel_rate() -> None:
    # DeepSeek-V3/R1's FP8 checkpoints are block-scaled (128x128 weight blocks): the preset
    # defaults to it, an HF config's quantization_config.weight_block_size says so, and the
    # dense linears of a prefill run at block_fp8_gemm_efficiency (data/serving.toml).
    h200 = mp.Cluster("h200-sxm", 8)
    kw = dict(weight_precision="fp8", input_len=3200, output_len=800, concurrency=4, arrival="waves",
              num_requests=4)
    default = mp.evaluate_serving("deepseek-v3", h200, "tp=8,batch=4", **kw)
    block = mp.evaluate_serving("deepseek-v3", h200, "tp=8,batch=4", weight_scaling="block", **kw)
    tensor = mp.evaluate_serving("deepseek-v3", h200, "tp=8,batch=4", weight_scaling="tensor", **kw)
    assert default["time"] == block["time"]
    pb, pt = block["time"]["prefill"], tensor["time"]["prefill"]
    # Same FLOPs, slower kernels: the wave's TTFT (its prefill) is longer.
    assert pb["flops"] == pytest.approx(pt["flops"])
    assert pb["linear_s"] > 1.2 * pt["linear_s"]
    assert block["time"]["ttft_s"] - tensor["time"]["ttft_s"] == pytest.approx(pb["total_s"] - pt["total_s"])
    fixture = "tests/fixtures/hf/DeepSeek-V3.json"
    assert serving_problem(fixture, h200, **kw)["weight_scaling"] == "block"
    assert "weight_scaling" not in serving_problem(fixture, h200, input_len=8, output_len=8)
    hf = mp.evaluate_serving(fixture, h200, "tp=8,batch=4", **kw)
    assert hf["time"]["prefill"]["linear_s"] == pytest.approx(pb["linear_s"])
    with pytest.raises(mp.errors.InvalidInputError, match="weight_scaling: block"):
        mp.evaluate_serving("llama3-8b", H100x8, "tp=1,batch=4", weight_scaling="block", input_len=8, output_len=8)


def test_dp_attention_with_tensor_parallel_experts_gathers_and_reduces_each_token_once() -> None:
    # SGLang 0.4's --enable-dp-attention without expert parallelism (tp=1, adp=8, ep=1, etp=8):
    # explain names the all-gather + all-reduce of the expert-TP axis, its time per (pure, waves)
    # decode step is the evaluation's expert-parallel communication, and its message is one
    # h-vector per token of the stage (64 x 7168 x 2 bytes), not one per routed copy.
    kw = dict(input_len=1024, output_len=1024, weight_precision="fp8", concurrency=64, arrival="waves")
    h200 = mp.Cluster("h200-sxm", 8)
    ex = mp.explain_serving("deepseek-v3", h200, "tp=1,adp=8,ep=1,batch=64", **kw)
    etp = next(a for a in ex["axes"] if a["axis"] == "expert_tp")
    assert etp["collective"] == "all-gather+all-reduce"
    ev = mp.evaluate_serving("deepseek-v3", h200, "tp=1,adp=8,ep=1,batch=64", **kw)
    assert etp["seconds_per_step"] == pytest.approx(ev["time"]["decode"]["ep_comm_s"], rel=1e-9)
    assert etp["message_bytes"] == pytest.approx(64 * 7168 * 2)


def test_a_wave_prefilled_in_several_forwards_stalls_its_first_decoders() -> None:
    # 8 prompts of 1024 tokens in forwards of 3072 tokens: the median (4th) prompt completes in
    # the second forward, and the requests then decode through the third, spread over their
    # 255 tokens; the round (three forwards, 255 decode steps) is the e2e latency.
    kw = dict(input_len=1024, output_len=256, arrival="waves")
    h100 = mp.Cluster("h100-sxm", 1)
    ev = mp.evaluate_serving("llama3-8b", h100, "tp=1,batch=8,tokens=3072", concurrency=8, **kw)
    three = mp.evaluate_serving("llama3-8b", h100, "tp=1,batch=3", concurrency=3, **kw)["time"]["ttft_s"]
    two = mp.evaluate_serving("llama3-8b", h100, "tp=1,batch=2", concurrency=2, **kw)["time"]["ttft_s"]
    t = ev["time"]
    assert t["ttft_s"] == pytest.approx(2 * three)
    assert t["tpot_s"] == pytest.approx(t["decode"]["total_s"] + two / 255)
    assert t["e2e_s"] == pytest.approx(2 * three + two + 255 * t["decode"]["total_s"])


def test_host_work_per_sequence_bounds_a_small_model_at_large_batch() -> None:
    # The engine's host work on each running sequence per decode step (34 us, TensorRT-LLM
    # PR 16564; data/serving.toml decode_host_us_per_sequence) overlaps the GPU's forward: Llama 3
    # 8B FP8 on one H200 decoding 2048 sequences in waves is host-bound (2048 x 34 us), while 64
    # sequences run at the GPU's pace and scale no further with the host.
    h200 = mp.Cluster("h200-sxm", 1)
    kw = dict(input_len=128, output_len=128, weight_precision="fp8", kv_precision="fp8", arrival="waves")
    big = mp.evaluate_serving("llama3-8b", h200, "tp=1,batch=2048", concurrency=2048, **kw)["time"]
    assert big["tpot_s"] >= 2048 * 34e-6
    d = big["decode"]
    gpu = d["linear_s"] + d["attention_s"] + d["elementwise_s"] + d["tp_comm_s"]
    assert d["total_s"] == pytest.approx(2048 * 34e-6, rel=1e-9)
    assert d["overhead_s"] == pytest.approx(d["total_s"] - gpu, rel=1e-9)
    small = mp.evaluate_serving("llama3-8b", h200, "tp=1,batch=64", concurrency=64, **kw)["time"]["decode"]
    assert small["total_s"] > 64 * 34e-6
    assert small["overhead_s"] < 2e-3


def test_the_triton_mla_attention_kernel() -> None:
    # SGLang 0.4's Triton MLA backend (attn=triton-mla): the same deployment, a slower prefill.
    cluster = mp.Cluster("h200-sxm", 8)
    kw = dict(input_len=3200, output_len=800, weight_precision="fp8", concurrency=4, arrival="waves",
              num_requests=500)
    flash = mp.evaluate_serving("deepseek-r1", cluster, "tp=1,adp=8,etp=8,batch=8,tokens=4096", **kw)
    triton = mp.evaluate_serving("deepseek-r1", cluster, "tp=1,adp=8,etp=8,batch=8,tokens=4096,attn=triton-mla", **kw)
    assert triton["plan"]["worker"]["attention_kernel"] == "triton-mla"
    assert "attention_kernel" not in flash["plan"]["worker"]
    assert "triton-mla" in triton["label"]
    assert triton["time"]["ttft_s"] > 1.4 * flash["time"]["ttft_s"]
    assert triton["time"]["prefill"]["attention_s"] > 10 * flash["time"]["prefill"]["attention_s"]
    assert triton["time"]["decode"]["total_s"] == pytest.approx(flash["time"]["decode"]["total_s"])
    with pytest.raises(mp.errors.InvalidInputError, match=r"serving_plan.worker.attention_kernel: unknown variant `cuda`.*`flash` or `triton-mla`"):
        mp.evaluate_serving("deepseek-r1", cluster, "tp=8,batch=8,attn=cuda", **kw)
    with pytest.raises(mp.errors.InvalidInputError, match=r"serving_plan.prefill.attention_kernel: triton-mla \(allowed: flash for llama3-70b"):
        mp.evaluate_serving("llama3-70b", cluster, "tp=4,batch=8", prefill="tp=4,batch=1,attn=triton-mla", **kw)
    # The export carries it: SGLang's flag, and a note where another engine runs its own kernels.
    problem = serving_problem("deepseek-r1", cluster, input_len=3200, output_len=800, weight_precision="fp8")
    plan = parse_serving_plan("tp=1,adp=8,etp=8,batch=8,attn=triton-mla")
    assert "--attention-backend triton" in launch_commands(plan, problem, "sglang")[1]
    vllm = launch_commands(plan, problem, "vllm")
    assert "SGLang's Triton MLA attention" in vllm[0] and "--attention-backend" not in vllm[1]


def test_a_search_prices_every_deployment_with_the_spaces_attention_kernel() -> None:
    kw = dict(input_len=8192, output_len=256, weight_precision="fp8", concurrency=8)
    cluster = mp.Cluster("h200-sxm", 8)
    flash = mp.search_serving("deepseek-r1", cluster, space={"top_k": 50}, **kw)
    triton = mp.search_serving("deepseek-r1", cluster, space={"top_k": 50, "attention_kernel": "triton-mla"}, **kw)
    assert triton.plans and all(e["plan"]["worker"]["attention_kernel"] == "triton-mla" for e in triton.plans)
    assert all("attention_kernel" not in e["plan"]["worker"] for e in flash.plans)
    # The same deployments, each with a longer prefill on SGLang 0.4's kernel.
    by_label = {e["label"]: e for e in flash.plans}
    for e in triton.plans:
        twin = by_label[e["label"].replace("·triton-mla", "")]
        assert e["time"]["ttft_s"] > twin["time"]["ttft_s"]
    code, text = run_cli("inference", "search", "--model", "deepseek-r1", "--gpu", "h200-sxm", "--gpus", "8",
                         "--input-len", "8192", "--output-len", "256", "--weight-precision", "fp8",
                         "--attention-kernel", "triton-mla", "--top-k", "2")
    assert code == 0 and "triton-mla" in text
    with pytest.raises(mp.errors.InvalidInputError, match="serving_space.attention_kernel: triton-mla"):
        mp.search_serving("llama3-8b", cluster, space={"attention_kernel": "triton-mla"}, input_len=128, output_len=16)


def test_a_kv_pool_that_keeps_every_token_of_the_sliding_window_layers() -> None:
    # gpt-oss-120b on 2 x H200 at 32k prompts: SGLang's pool for it (swa=full) keeps all 36
    # layers per token where a windowed one keeps 18 and the last 128 tokens of the other 18,
    # so fewer sequences fit; decode reads the window either way.
    cluster = mp.Cluster("h200-sxm", 2)
    kw = dict(input_len=32768, output_len=1024, expert_weights="mxfp4", concurrency=16)
    window = mp.evaluate_serving("gpt-oss-120b", cluster, "tp=2,batch=16", **kw)
    full = mp.evaluate_serving("gpt-oss-120b", cluster, "tp=2,batch=16,swa=full", **kw)
    assert full["plan"]["worker"]["sliding_kv"] == "full" and "sliding_kv" not in window["plan"]["worker"]
    assert "swa-full" in full["label"] and "swa" not in window["label"]
    assert full["memory"]["kv_bytes_per_token"] == 2 * 4 * 64 * 2 * 36
    assert window["memory"]["kv_bytes_per_token"] < 0.52 * full["memory"]["kv_bytes_per_token"]
    assert full["memory"]["max_sequences_fit"] < 0.55 * window["memory"]["max_sequences_fit"]
    assert full["time"]["decode"]["kv_bytes"] == pytest.approx(window["time"]["decode"]["kv_bytes"])
    # A disaggregated hand-over moves what the prefill pool keeps.
    pd = {**kw, "concurrency": 16}
    a = mp.evaluate_serving("gpt-oss-120b", mp.Cluster("h200-sxm", 4), "tp=2,batch=16", prefill="tp=2,batch=1", **pd)
    b = mp.evaluate_serving("gpt-oss-120b", mp.Cluster("h200-sxm", 4), "tp=2,batch=16,swa=full",
                            prefill="tp=2,batch=1,swa=full", **pd)
    assert b["time"]["kv_transfer_s"] > a["time"]["kv_transfer_s"]
    with pytest.raises(mp.errors.InvalidInputError, match=r"serving_plan.worker.sliding_kv: unknown variant `half`.*`window` or `full`"):
        mp.evaluate_serving("gpt-oss-120b", cluster, "tp=2,batch=16,swa=half", **kw)
    # The export carries it: each engine's flag, a note where the engine has none.
    problem = serving_problem("gpt-oss-120b", cluster, **kw)
    plan = parse_serving_plan("tp=2,batch=16,swa=full")
    assert "--disable-hybrid-swa-memory" in launch_commands(plan, problem, "sglang")[1]
    assert "--disable-hybrid-kv-cache-manager" in launch_commands(plan, problem, "vllm")[1]
    assert "max_attention_window" in launch_commands(plan, problem, "trtllm")[0]
    windowed = parse_serving_plan("tp=2,batch=16")
    assert not any("hybrid" in line for e in ("sglang", "vllm") for line in launch_commands(windowed, problem, e))
    # A search sizes every pool the same way; so does the CLI's --sliding-kv.
    space = {"top_k": 20, "sliding_kv": "full"}
    searched = mp.search_serving("gpt-oss-120b", mp.Cluster("h200-sxm", 8), space=space, **kw)
    assert searched.plans and all(e["plan"]["worker"]["sliding_kv"] == "full" for e in searched.plans)
    code, text = run_cli("inference", "search", "--model", "gpt-oss-120b", "--gpu", "h200-sxm", "--gpus", "8",
                         "--input-len", "32768", "--output-len", "1024", "--expert-weights", "mxfp4",
                         "--sliding-kv", "full", "--top-k", "2")
    assert code == 0 and "swa-full" in text, text


def test_mxfp4_experts_as_gpt_oss_publishes_them() -> None:
    # gpt-oss-120b's routed experts in MXFP4 (0.53125 bytes a weight), the rest BF16: one 80 GB
    # H100 holds it, as its model card says, where BF16 experts (217 GiB) do not.
    h100 = mp.Cluster("h100-sxm", 1)
    kw = dict(input_len=1024, output_len=1024)
    mx = mp.evaluate_serving("gpt-oss-120b", h100, "tp=1,batch=16", expert_weights="mxfp4", **kw)
    bf = mp.evaluate_serving("gpt-oss-120b", h100, "tp=1,batch=16", **kw)
    assert mx["feasible"] and not bf["feasible"]
    assert 55 < mx["memory"]["weights_gib"] < 65 < 200 < bf["memory"]["weights_gib"]
    # Weight-only: the decode reads fewer bytes; the experts' GEMMs are the same BF16 FLOPs.
    assert mx["time"]["decode"]["weight_bytes"] < 0.4 * bf["time"]["decode"]["weight_bytes"]
    assert mx["time"]["decode"]["flops"] == pytest.approx(bf["time"]["decode"]["flops"])
    # A Hugging Face config that quantises with quant_method "mxfp4" says so itself.
    fixture = "tests/fixtures/hf/gpt-oss-120b.json"
    assert serving_problem(fixture, h100, **kw)["expert_weights"] == "mxfp4"
    assert "expert_weights" not in serving_problem("tests/fixtures/hf/DeepSeek-V3.json", h100, **kw)
    hf = mp.evaluate_serving(fixture, h100, "tp=1,batch=16", **kw)
    assert hf["memory"]["weights_gib"] == pytest.approx(mx["memory"]["weights_gib"], rel=1e-3)
    # The launch commands load the checkpoint's MXFP4 experts.
    problem = serving_problem("gpt-oss-120b", h100, expert_weights="mxfp4", **kw)
    for engine in ("vllm", "sglang"):
        assert "--quantization mxfp4" in launch_commands(parse_serving_plan("tp=1,batch=16"), problem, engine)[1]
    code, text = run_cli("inference", "evaluate", "--model", "gpt-oss-120b", "--gpu", "h100-sxm", "--gpus", "1",
                         "--input-len", "1024", "--output-len", "1024", "--expert-weights", "mxfp4",
                         "--plan", "tp=1,batch=16")
    assert code == 0 and "feasible" in text and "infeasible" not in text
    with pytest.raises(mp.errors.InvalidInputError, match=r"expert_weights: mxfp4 \(allowed: unset for llama3-8b"):
        mp.evaluate_serving("llama3-8b", h100, "tp=1,batch=1", expert_weights="mxfp4", **kw)
    with pytest.raises(mp.errors.InvalidInputError, match="expert_weights: unknown variant `int4`"):
        mp.evaluate_serving("gpt-oss-120b", h100, "tp=1,batch=1", expert_weights="int4", **kw)


def test_prompts_a_warm_cache_holds_are_not_prefilled_but_held_and_handed_over_in_full() -> None:
    # cached_fraction: each prompt's own tokens found in the prefix cache (a conversation's
    # history, a benchmark re-sending its prompts to a warm server). Prefill skips them, as it
    # skips a shared prefix, but every sequence keeps their KV (a shared prefix is held once),
    # and a disaggregated hand-over moves all of it.
    cluster = mp.Cluster("h100-sxm", 8)
    kw = dict(input_len=4096, output_len=256, concurrency=64)
    cold = mp.evaluate_serving("llama3-70b", cluster, "tp=8,batch=64", **kw)
    warm = mp.evaluate_serving("llama3-70b", cluster, "tp=8,batch=64", cached_fraction=0.75, **kw)
    shared = mp.evaluate_serving("llama3-70b", cluster, "tp=8,batch=64", prefix_fraction=0.75, **kw)
    assert warm["time"]["ttft_s"] < 0.5 * cold["time"]["ttft_s"]
    assert warm["time"]["prefill"]["flops"] == pytest.approx(shared["time"]["prefill"]["flops"])
    assert warm["memory"]["max_sequences_fit"] == cold["memory"]["max_sequences_fit"]
    assert shared["memory"]["max_sequences_fit"] > 2 * cold["memory"]["max_sequences_fit"]
    # A whole prompt in the cache still computes its last token.
    whole = mp.evaluate_serving("llama3-70b", cluster, "tp=8,batch=64", cached_fraction=1.0, **kw)
    assert 0 < whole["time"]["prefill"]["flops"] < warm["time"]["prefill"]["flops"] / 10
    pd = dict(prefill="tp=8,batch=4", input_len=4096, output_len=256, concurrency=64)
    h16 = mp.Cluster("h100-sxm", 16)
    a = mp.evaluate_serving("llama3-70b", h16, "tp=8,batch=64", **pd)
    b = mp.evaluate_serving("llama3-70b", h16, "tp=8,batch=64", cached_fraction=1.0, **pd)
    assert b["time"]["kv_transfer_s"] == pytest.approx(a["time"]["kv_transfer_s"])
    assert b["time"]["prefill"]["total_s"] < 0.2 * a["time"]["prefill"]["total_s"]
    with pytest.raises(mp.errors.InvalidInputError,
                       match=r"^invalid traffic.cached_fraction: 1.5 \(allowed: a number in \[0, 1\]\)$"):
        mp.evaluate_serving("llama3-70b", cluster, "tp=8,batch=64", cached_fraction=1.5, **kw)
    # The CLI's --cached-fraction is the same field.
    code, text = run_cli("inference", "evaluate", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "8",
                         "--input-len", "4096", "--output-len", "256", "--concurrency", "64",
                         "--cached-fraction", "0.75", "--plan", "tp=8,batch=64", "--json")
    assert code == 0 and json.loads(text)["time"]["ttft_s"] == pytest.approx(warm["time"]["ttft_s"])


def test_an_estimate_with_prefix_cache_hits_exports_prefix_caching_on() -> None:
    # The estimate skipped the cached prompt tokens, so the launch must keep the engine's prefix
    # cache on where it prefills: vLLM's flag, a note for TensorRT-LLM (block reuse has no CLI
    # flag); SGLang's radix cache is on by default. A decode pool prefills nothing.
    cluster = mp.Cluster("h100-sxm", 16)
    plan = parse_serving_plan("tp=8,batch=64")
    for kw in ({"cached_fraction": 0.5}, {"prefix_fraction": 0.5}):
        problem = serving_problem("llama3-70b", cluster, input_len=4096, output_len=256, **kw)  # type: ignore[arg-type]
        assert "--enable-prefix-caching" in launch_commands(plan, problem, "vllm")[1]
        assert "enable_block_reuse: true" in launch_commands(plan, problem, "trtllm")[0]
        assert not any("radix" in line for line in launch_commands(plan, problem, "sglang"))
        pd = {"worker": plan["worker"], "prefill": parse_serving_plan("tp=8,batch=4")["worker"],
              "replicas": 1, "prefill_replicas": 1}
        prefill_cmd, decode_cmd = launch_commands(pd, problem, "vllm")[1], launch_commands(pd, problem, "vllm")[3]
        assert "--enable-prefix-caching" in prefill_cmd and "--enable-prefix-caching" not in decode_cmd
    cold = serving_problem("llama3-70b", cluster, input_len=4096, output_len=256)
    assert "--enable-prefix-caching" not in launch_commands(plan, cold, "vllm")[1]
    assert "block_reuse" not in launch_commands(plan, cold, "trtllm")[0]


def test_a_length_distribution_prices_each_class() -> None:
    # One class is the fixed lengths exactly; a mix of the same mean requests decodes longer
    # contexts (the long requests stay in the batch longer) and reports the requests' medians.
    cluster = mp.Cluster("h100-sxm", 8)
    kw = {"concurrency": 64}
    fixed = mp.evaluate_serving("llama3-70b", cluster, "tp=8,batch=64", input_len=1024, output_len=256, **kw)
    one = mp.evaluate_serving("llama3-70b", cluster, "tp=8,batch=64", lengths=[(1024, 256, 5.0)], **kw)
    assert one["time"] == fixed["time"] and one["output_tokens_per_s"] == fixed["output_tokens_per_s"]
    mix = mp.evaluate_serving("llama3-70b", cluster, "tp=8,batch=64",
                              lengths=[{"input_len": 512, "output_len": 128}, (1536, 384)], **kw)
    assert mix["time"]["tpot_s"] > fixed["time"]["tpot_s"]
    x = mix["requests_per_s"]
    assert mix["output_tokens_per_s"] == pytest.approx(256 * x)
    assert x == pytest.approx(64 / (256 * mix["time"]["tpot_s"]))
    # TTFT and e2e: the means of the two classes' (an even count of equal weight), so e2e is
    # TTFT + ((128 - 1) + (384 - 1))/2 · TPOT.
    assert mix["time"]["e2e_s"] == pytest.approx(mix["time"]["ttft_s"] + 255 * mix["time"]["tpot_s"], rel=1e-12)
    skew = mp.evaluate_serving("llama3-70b", cluster, "tp=8,batch=64", lengths=[(512, 128, 3.0), (1536, 384)], **kw)
    assert skew["time"]["e2e_s"] < mix["time"]["e2e_s"]


def test_a_length_distribution_is_given_one_way() -> None:
    cluster = mp.Cluster("h100-sxm", 8)
    cases = [
        ({"lengths": [(512, 64)], "input_len": 512}, "invalid traffic.input_len: 512 (allowed: unset"),
        ({"lengths": []}, "invalid traffic.lengths: 0 classes (allowed: 1..=64 classes"),
        ({"lengths": [(512, 64)] * 65}, "invalid traffic.lengths: 65 classes"),
        ({"lengths": [(512,)]}, "invalid traffic.lengths[0]: (512,)"),
        ({"lengths": "512,64"}, "invalid traffic.lengths: '512,64'"),
        ({"input_len": 512}, "invalid traffic.output_len: None (allowed: 1..=16777216, or a length distribution"),
        ({"lengths": [(512, 64), (1024, 64)], "arrival": "waves"}, "invalid traffic.arrival: waves"),
    ]
    for kw, message in cases:
        with pytest.raises(mp.errors.InvalidInputError) as e:
            mp.search_serving("llama3-8b", cluster, **kw)
        assert str(e.value).startswith(message), str(e.value)
        assert "\n" not in str(e.value)


def test_length_histogram_bins_a_trace_keeping_its_means() -> None:
    from meshplan.serving import length_histogram

    trace = [(100 + 7 * i % 3900, 10 + 13 * i % 1990) for i in range(10_000)]
    classes = length_histogram(trace)
    assert len(classes) == 64
    assert sum(c["weight"] for c in classes) == 10_000
    for k in ("input_len", "output_len"):
        binned = sum(c[k] * c["weight"] for c in classes) / 10_000
        assert binned == pytest.approx(sum(t[0 if k == "input_len" else 1] for t in trace) / 10_000, abs=0.5)
    # Ordered by prompt: each prompt group's classes lie above the group before.
    assert classes[0]["input_len"] < classes[8]["input_len"] < classes[-1]["input_len"]
    assert len(length_histogram([(5, 6)])) == 1
    assert length_histogram([(5, 6), (7, 8)], input_bins=2, output_bins=1) == [
        {"input_len": 5, "output_len": 6, "weight": 1.0}, {"input_len": 7, "output_len": 8, "weight": 1.0}]
    for bad, message in (([], "no samples"), ([(0, 5)], "sample 0 input_len: 0"), ([(5, 5, 5)], "sample 0"),
                         ([(5, True)], "sample 0 output_len: True"),
                         ([(5, 5), (5, 2**64 - 1)], r"sample 1 output_len: 18446744073709551615 \(allowed: 1..=16777216\)")):
        with pytest.raises(mp.errors.InvalidInputError, match=message):
            length_histogram(bad)
    with pytest.raises(mp.errors.InvalidInputError, match="input_bins x output_bins: 100"):
        length_histogram(trace, input_bins=10, output_bins=10)


def test_cli_reads_a_length_distribution(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("input_len,output_len\n" + "".join(f"{200 + 37 * i % 3000},{20 + 11 * i % 900}\n"
                                                       for i in range(500)))
    base = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--concurrency", "32")
    code, text = run_cli("inference", "search", *base, "--lengths", str(trace), "--json", "--top-k", "1")
    assert code == 0
    best = json.loads(text)["plans"][0]
    # The same trace through Python, binned the same way, gives the same best deployment.
    from meshplan.serving import length_histogram

    rows = [tuple(map(int, line.split(","))) for line in trace.read_text().splitlines()[1:]]
    r = mp.search_serving("llama3-8b", mp.Cluster("h100-sxm", 8), lengths=length_histogram(rows),
                          concurrency=32, space={"top_k": 1})
    assert r.best is not None and best["label"] == r.best["label"]
    assert best["time"]["ttft_s"] == pytest.approx(r.best["time"]["ttft_s"])
    hist = tmp_path / "hist.json"
    hist.write_text(json.dumps([[512, 64, 3], {"input_len": 2048, "output_len": 256, "weight": 1}]))
    code, text = run_cli("inference", "evaluate", *base, "--lengths", str(hist), "--plan", "tp=1,batch=32,replicas=1",
                         "--json")
    assert code == 0
    ev = mp.evaluate_serving("llama3-8b", mp.Cluster("h100-sxm", 8), "tp=1,batch=32,replicas=1",
                             lengths=[(512, 64, 3), (2048, 256, 1)], concurrency=32)
    assert json.loads(text)["time"]["tpot_s"] == pytest.approx(ev["time"]["tpot_s"])
    # The text says which lengths the estimate assumed, for evaluate and explain alike.
    for command in ("evaluate", "explain"):
        code, text = run_cli("inference", command, *base, "--lengths", str(hist), "--plan", "tp=1,batch=32,replicas=1")
        assert code == 0
        assert "traffic: 2 length classes, mean 896 -> 112 tokens, longest 2,304" in text
    bad = tmp_path / "bad.csv"
    bad.write_text("512,64\nx,y\n")
    for argv, message in (((*base, "--lengths", str(bad)), "line 2: 'x,y' is not input_len,output_len"),
                          ((*base, "--lengths", str(tmp_path / "none.csv")), "cannot read"),
                          ((*base, "--lengths", str(hist), "--input-len", "5"), "leave out --input-len"),
                          (base, "give --input-len and --output-len, or a length distribution")):
        err = io.StringIO()
        import contextlib

        with contextlib.redirect_stderr(err):
            code, _ = run_cli("inference", "search", *argv)
        assert code == 2 and message in err.getvalue(), err.getvalue()


def test_the_aiconfigurator_comparison_maps_each_case_and_runs_without_it() -> None:
    # benchmarks/serving_vs_aiconfigurator.py hands aiconfigurator the case's own workers: a PD
    # case both pools, a DP-attention case its ranks and the batch per rank; without aiconfigurator
    # installed it still prints meshplan's half of both tables.
    import importlib.util
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("aic_bench", root / "benchmarks" / "serving_vs_aiconfigurator.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cases = {c["id"]: c for c in json.loads((root / "validation" / "serving.json").read_text())["cases"]}
    pd = bench.latency_query(cases["dstack-pd-gpt-oss-120b-h200-sxm-1p3d-tp2-mxfp4-c32-2048-2048"], {"batch": 11})
    assert pd["mode"] == "disagg" and pd["backend_name"] == "sglang"
    assert (pd["prefill_num_workers"], pd["decode_num_workers"], pd["decode_tp_size"]) == (1, 3, 2)
    assert (pd["decode_moe_tp_size"], pd["decode_moe_ep_size"], pd["decode_batch_size"]) == (2, 1, 11)
    adp = bench.latency_query(cases["dstack-deepseek-r1-sglang-h200-sxm-adp8-fp8-c32-3200-800"], {"batch": 32})
    assert (adp["tp_size"], adp["attention_dp_size"], adp["moe_tp_size"], adp["moe_ep_size"]) == (1, 8, 8, 1)
    assert adp["batch_size"] == 4 and "mode" not in adp
    trt = bench.latency_query(cases["dstack-deepseek-r1-trt-llm-h200-sxm-tp8-ep4-fp8-c4-3200-800"], {"batch": 4})
    assert (trt["backend_name"], trt["moe_tp_size"], trt["moe_ep_size"]) == ("trtllm", 2, 4)
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "serving_vs_aiconfigurator.py"), "--limit", "2",
                           "--aic-python", sys.executable + "-absent"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "per case (output tokens/s)" in done.stdout and "TTFT and TPOT" in done.stdout
