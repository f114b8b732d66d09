#!/usr/bin/env python3
"""Writes ``docs/exercises.md``: the seed's three exercises answered from meshplan's own output.

    python scripts/gen_exercises.py           # print the page
    python scripts/gen_exercises.py --write   # rewrite docs/exercises.md

Every number on the page comes from a meshplan call shown next to it (``decode_traffic``,
``explain``, ``evaluate``, ``search``), so the page moves with the cost model;
``tests/test_exercises.py`` fails when the committed page is not what this script prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Sequence

import meshplan as mp
from meshplan import _core

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "exercises.md"


def b(n: float) -> str:
    """Bytes, exact with separators."""
    return f"{n:,.0f} B"


def gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def ms(s: float) -> str:
    return f"{s * 1e3:,.1f} ms"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def critical_stage_layers(x: mp.Explanation) -> int:
    """Layers of the stage the step time is built from (the core's pick: last of the slowest)."""
    stages = x.pipeline["stages"]
    worst = max(reversed(stages), key=lambda s: s["fwd_s"] + s["bwd_s"])
    return int(worst["layers"])


# --- 1 -------------------------------------------------------------------------------------


def exercise_1() -> list[str]:
    rate = 50.0
    d = mp.decode_traffic("llama3-70b", mp.Cluster("h100-sxm", 4), tp=4, tokens_per_s=rate)
    model = mp.Model.preset("llama3-70b")
    budget = 1.0 / rate
    out = [
        "## 1. Llama-3-70B with TP = 4 decoding at 50 tokens/s: TP traffic against NVLink",
        "",
        "```python",
        'mp.decode_traffic("llama3-70b", mp.Cluster("h100-sxm", 4), tp=4, tokens_per_s=50)',
        "```",
        "",
        f"Every generated token crosses {model.layers} layers, each with two tensor-parallel "
        "all-reduces (after the attention output projection and after the MLP) of one token's "
        "hidden state:",
        "",
    ]
    out += table(
        ["quantity", "meshplan"],
        [
            ["all-reduces per token", f"{d['all_reduces_per_token']} (2 × {model.layers} layers)"],
            ["message (one hidden state, h·2 B)", b(d["message_bytes"])],
            ["ring all-reduce bytes each GPU sends per all-reduce, 2(t−1)/t of it",
             b(d["message_bytes"] * 2 * (d["tp"] - 1) / d["tp"])],
            ["**bytes per token per GPU**", f"**{b(d['bytes_per_token_per_gpu'])}**"],
            [f"at {rate:g} tokens/s", f"{d['gb_per_s_per_gpu']:.3f} GB/s per GPU per direction"],
            [f"share of NVLink 4 ({d['link_gb_per_s']:g} GB/s per direction)",
             f"**{100 * d['fraction_of_link']:.3f} %**"],
            ["latency terms per token", ms(d["latency_s_per_token"])],
            ["bandwidth terms per token", f"{d['bandwidth_s_per_token'] * 1e6:,.1f} µs"],
            ["latency-bound", "**yes**" if d["latency_bound"] else "no"],
        ],
    )
    out += [
        "",
        f"The link is essentially idle: {d['gb_per_s_per_gpu']:.3f} GB/s is "
        f"{100 * d['fraction_of_link']:.3f} % of it. What costs time is the number of "
        f"all-reduces, each paying the fabric's latency: {ms(d['latency_s_per_token'])} per token "
        f"of latency against {d['bandwidth_s_per_token'] * 1e6:,.1f} µs of transfer, "
        f"{100 * d['latency_s_per_token'] / budget:.0f} % of the {ms(budget)} a token may take at "
        f"{rate:g} tokens/s. Decode TP traffic is **latency-bound**: fewer, fused all-reduces "
        "(or a smaller TP) help; more bandwidth would not.",
        "",
    ]
    return out


# --- 2 -------------------------------------------------------------------------------------


def moe_400b() -> mp.Model:
    return mp.Model(
        name="moe-400b", layers=40, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672,
        vocab=128256, activation="swiglu",
        moe=mp.Moe(num_experts=64, top_k=2, expert_ffn_hidden=6144),
    )


def exercise_2() -> list[str]:
    model = moe_400b()
    assert model.moe is not None
    cluster = mp.Cluster("h100-sxm", 256)
    workload = mp.Workload(global_batch=512, seq_len=4096)
    space = dict(ep=8, tp=1, cp=2, max_micro_batch=2, top_k=1)
    default = mp.search(model, cluster, workload, mp.SearchSpace(**space))  # type: ignore[arg-type]
    every = mp.search(model, cluster, workload,
                      mp.SearchSpace(**space, orders=_core.rank_orders()))  # type: ignore[arg-type]
    assert default.best is not None and every.best is not None
    x = mp.explain(model, cluster, workload, default.best.plan)
    y = mp.explain(model, cluster, workload, every.best.plan)
    ep = x.axis("ep")
    layers = critical_stage_layers(x)
    fwd, bwd = ep["collectives"][0], ep["collectives"][1]
    per_layer_fwd = fwd["bytes_per_token_per_gpu"] / layers
    per_layer_bwd = bwd["bytes_per_token_per_gpu"] / layers
    total = 2 * model.moe.top_k * model.hidden * 2  # the note's figure, checked below
    assert f"{total:,} B" in ep["notes"][0]
    e = x.plan.ep
    out = [
        "## 2. A 400B MoE (top-2, h = 8192, 64 experts) with EP = 8: all-to-all bytes",
        "",
        f"The model: {model.layers} MoE layers, hidden {model.hidden}, {model.moe.num_experts} "
        f"routed experts of width {model.moe.expert_ffn_hidden}, top-{model.moe.top_k} "
        "(about 400B parameters). The plan: the best one the search finds with EP = 8, TP = 1 and CP = 2 "
        f"on {cluster.num_gpus} H100s, global batch {workload.global_batch} × {workload.seq_len}:",
        "",
        "```python",
        'best = mp.search(model, mp.Cluster("h100-sxm", 256), mp.Workload(512, 4096),',
        "                 mp.SearchSpace(ep=8, tp=1, cp=2, max_micro_batch=2, top_k=1)).best",
        'ep = mp.explain(model, cluster, workload, best.plan).axis("ep")',
        "```",
        "",
        f"`{x.plan}`",
        "",
        "Per token, per MoE layer, per pass: the token's hidden state goes to each of its "
        f"{model.moe.top_k} experts (dispatch) and each expert's output comes back (combine), "
        f"{model.moe.top_k} × {model.hidden} × 2 B each way:",
        "",
    ]
    out += table(
        ["quantity", "meshplan"],
        [
            ["dispatch + combine, forward", f"**{b(total)}** per token per MoE layer"],
            [f"leaving the GPU under uniform routing ((e−1)/e = {e - 1}/{e})",
             f"**{b(per_layer_fwd)}** forward, {b(per_layer_bwd)} backward"],
            ["forward + backward per training step", b(per_layer_fwd + per_layer_bwd)],
            [f"all-to-alls per step on the critical stage ({layers} MoE layers)",
             f"{fwd['count_per_step'] + bwd['count_per_step']:,}, "
             f"{gb(fwd['bytes_per_step_per_gpu'] + bwd['bytes_per_step_per_gpu'])} sent per GPU"],
            ["EP group", f"{ep['group_size']} GPUs, {ep['members_per_domain']} per NVLink domain "
             f"({ep['fabric']})"],
            ["exposed all-to-all time per step", f"{ep['exposed_s']:.3f} s of "
             f"{x.evaluation.step_time_s:.3f} s"],
        ],
    )
    ey = y.axis("ep")
    cy = y.axis("cp")
    out += [
        "",
        "The bytes do not depend on where the ranks sit; the time does. In Megatron's default "
        f"order ({x.mesh['order']}) the CP pair is innermost, so the EP group straddles two "
        f"nodes ({ep['members_per_domain']} GPUs in each) and every token also crosses the "
        "network. Letting the search try every rank order (`--all-orders`) picks order "
        f"**{y.plan.order}**: EP on {ey['fabric']} ({ey['members_per_domain']} of its "
        f"{ey['group_size']} GPUs per domain), exposed all-to-all {ey['exposed_s']:.3f} s "
        f"instead of {ep['exposed_s']:.3f} s; CP on {cy['fabric']}, exposing "
        f"{cy['exposed_s']:.3f} s of its {cy['exposed_s'] + cy['overlapped_s']:.3f} s (the rest "
        f"hides behind attention); data-parallel gradient reduction on {y.axis('zero' if y.plan.zero else 'dp')['fabric']}; "
        f"step {y.evaluation.step_time_s:.3f} s instead of {x.evaluation.step_time_s:.3f} s "
        f"({100 * (1 - y.evaluation.step_time_s / x.evaluation.step_time_s):.1f} % faster).",
        "",
    ]
    return out


# --- 3 -------------------------------------------------------------------------------------


def exercise_3() -> list[str]:
    cluster = mp.Cluster("a100-sxm-40g", 8)
    workload = mp.Workload(global_batch=8, seq_len=4096)
    plans = {
        "FSDP (ZeRO-3), dp = 8": "dp=8,tp=1,pp=1,zero=3,micro_batch=1",
        "TP = 8 + sequence parallel": "dp=1,tp=8,pp=1,micro_batch=1,sequence_parallel=true",
        "TP = 8, no sequence parallel": "dp=1,tp=8,pp=1,micro_batch=1",
    }
    result = mp.search("llama2-7b", cluster, workload, mp.SearchSpace(top_k=100_000))
    ranked = {str(e.plan): e.rank for e in result.plans}
    rows = []
    comm = []
    evs = {}
    for name, text in plans.items():
        x = mp.explain("llama2-7b", cluster, workload, text)
        ev = x.evaluation
        evs[name] = ev
        m = ev.memory_gib
        axis = x.axis("zero") if ev.plan.zero == 3 else x.axis("tp")
        sent = sum(c["bytes_per_step_per_gpu"] for c in axis["collectives"])
        comm.append([name, axis["fabric"], gb(sent), f"{axis['exposed_s']:.3f} s",
                     f"{axis['overlapped_s']:.3f} s"])
        rows.append([
            name, "yes" if ev.feasible else "no", f"{ev.peak_memory_gib:.1f}",
            f"{m['weights'] + m['gradients'] + m['optimizer']:.1f}", f"{m['activations']:.1f}",
            f"{ev.step_time_s:.3f}", f"{ev.tokens_per_s_per_gpu:,.0f}", f"{100 * ev.mfu:.1f}",
            _rank(ranked, ev.plan),
        ])
    best = result.best
    assert best is not None
    fsdp, tp = evs["FSDP (ZeRO-3), dp = 8"], evs["TP = 8 + sequence parallel"]
    out = [
        "## 3. A 7B Llama-2 on 8 × A100-40GB, global batch 8 × 4096: FSDP vs TP = 8",
        "",
        "```python",
        'cluster, workload = mp.Cluster("a100-sxm-40g", 8), mp.Workload(8, 4096)',
        'mp.explain("llama2-7b", cluster, workload, "dp=8,tp=1,pp=1,zero=3")',
        'mp.explain("llama2-7b", cluster, workload, "dp=1,tp=8,pp=1,sp=on")',
        'mp.search("llama2-7b", cluster, workload, mp.SearchSpace(top_k=100_000))',
        "```",
        "",
    ]
    out += table(
        ["plan", "fits", "peak GiB", "model states GiB", "activations GiB", "step s",
         "tokens/s/GPU", "MFU %", f"rank of {result.stats.feasible:,}"],
        rows,
    )
    out += ["", "Their communication per step (per GPU):", ""]
    out += table(["plan", "fabric", "sent per GPU", "exposed", "overlapped"], comm)
    out += [
        "",
        "Both split the model states 8 ways — ZeRO-3 shards them, TP splits every matrix — "
        f"({_states(fsdp):.1f} against {_states(tp):.1f} GiB: TP keeps the bf16 working copy of "
        "its weight shard, FSDP gathers each layer's weights only while it runs). FSDP keeps "
        f"every GPU's full activations ({fsdp.memory_gib['activations']:.1f} GiB) and hides its "
        "gathers behind the compute; TP = 8 divides the activations by 8 "
        f"({tp.memory_gib['activations']:.1f} GiB with sequence parallelism) but puts four "
        "all-reduce points per layer (two forward, two backward) on the critical path and runs "
        "every GEMM 8 times narrower.",
        "",
        f"**Verdict:** FSDP is {100 * (tp.step_time_s / fsdp.step_time_s - 1):.0f} % faster per "
        f"step ({fsdp.step_time_s:.3f} s against {tp.step_time_s:.3f} s); TP = 8 frees "
        f"{fsdp.peak_memory_gib - tp.peak_memory_gib:.1f} GiB per GPU. "
        f"Over all {result.stats.feasible:,} feasible plans the planner's best is "
        f"`{best.plan}` at {best.step_time_s:.3f} s ({best.tokens_per_s_per_gpu:,.0f} "
        f"tokens/s per GPU); FSDP is rank {_rank(ranked, fsdp.plan)}, within "
        f"{100 * (fsdp.step_time_s / best.step_time_s - 1):.1f} % of it.",
        "",
    ]
    return out


def _states(ev: mp.Evaluation) -> float:
    m = ev.memory_gib
    return float(m["weights"] + m["gradients"] + m["optimizer"])


def _rank(ranked: dict[str, Any], plan: mp.Plan) -> str:
    rank = ranked.get(str(plan))
    return "-" if rank is None else f"{rank:,}"


def page() -> str:
    lines = [
        "# Exercises, answered by meshplan",
        "",
        "The seed's three exercises, answered from meshplan's own output. This page is "
        "generated: `python scripts/gen_exercises.py --write` rewrites it, and "
        "`tests/test_exercises.py` fails when it no longer matches the cost model. Bytes are "
        "exact; GB = 10⁹ bytes, GiB = 2³⁰; times come from the calibrated cost model "
        "(docs/costmodel.md) and move with it.",
        "",
    ]
    lines += exercise_1() + exercise_2() + exercise_3()
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", action="store_true", help=f"rewrite {PAGE.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    text = page()
    if args.write:
        PAGE.parent.mkdir(parents=True, exist_ok=True)
        PAGE.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
