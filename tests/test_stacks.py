"""Stack profiles (issue 11): every plan a search returns under a stack exports cleanly for that
stack and parses back into the same plan; the top plans are distinct; a stack's rules are counted."""

from __future__ import annotations

import ast
import importlib
import json

import pytest

import meshplan as mp
from meshplan.errors import InvalidInputError

export = importlib.import_module("meshplan.export")

STACKS = ("megatron-core", "torchtitan", "deepspeed", "maxtext")

#: The README quick start and the four reference problems of docs/performance.md.
REFERENCE = [
    ("llama3-70b", "h100-sxm", 512, 1024, 8192),
    ("llama3.1-405b", "h100-sxm", 16384, 2048, 8192),
    ("deepseek-v3", "h800-sxm", 2048, 4096, 4096),
    ("llama3-70b", "h100-sxm", 1024, 1024, 8192),
    ("gpt3-175b", "a100-sxm-80g", 4096, 1536, 2048),
]

#: Smaller problems for the property: dense and MoE, uneven layer counts, several batches.
SMALL = [
    (model, gpu, n, gb, s)
    for model, gpu in [("llama3-8b", "h100-sxm"), ("gpt-1.7b", "a100-sxm-40g"),
                       ("mixtral-8x7b", "h100-sxm"), ("qwen3-30b-a3b", "gb200-nvl72")]
    for n in (16, 64)
    for gb, s in [(64, 4096), (256, 2048)]
]


def _round_trips(model: str, workload: mp.Workload, plans: list) -> None:
    fmt = export.STACK_FORMATS[workload.stack]
    for e in plans:
        text = export.export(e.plan, model=model, workload=workload)
        back = export.parse(text, fmt, model=model, workload=workload)
        assert back == e.plan, (workload.stack, str(e.plan), str(back))


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("model,gpu,n,gb,s", REFERENCE)
def test_reference_problems_export_and_are_distinct(stack, model, gpu, n, gb, s):
    workload = mp.Workload(global_batch=gb, seq_len=s, stack=stack)
    r = mp.search(model, mp.Cluster(gpu, n), workload)
    # Plain DeepSpeed (no TP, no interleaving) has no plan for 405B on 16,384 GPUs.
    assert bool(r.plans) == (r.stats.feasible > 0)
    _round_trips(model, workload, r.plans)
    keys = {str(e.plan) for e in r.plans}
    assert len(keys) == len(r.plans)
    assert all(e.group_size >= 1 for e in r.plans)
    # Distinct at the model's resolution: no two returned plans within 0.1 % and 0.5 GiB.
    for i, a in enumerate(r.plans):
        for b in r.plans[i + 1:]:
            assert not (b.step_time_s <= a.step_time_s * 1.001
                        and abs(b.peak_memory_gib - a.peak_memory_gib) <= 0.5)


@pytest.mark.parametrize("stack", STACKS)
def test_every_returned_plan_exports_for_its_stack(stack):
    for model, gpu, n, gb, s in SMALL:
        workload = mp.Workload(global_batch=gb, seq_len=s, stack=stack)
        space = mp.SearchSpace(top_k=20, distinct=False,
                               recompute=["none", "selective", "full", "selective-op"])
        try:
            r = mp.search(model, mp.Cluster(gpu, n), workload, space)
        except InvalidInputError:
            continue  # e.g. a precision or GPU the stack lacks
        _round_trips(model, workload, r.plans)


def test_stack_rules_are_counted_and_explained():
    w = mp.Workload(global_batch=1024, seq_len=8192, stack="torchtitan")
    r = mp.search("llama3-70b", mp.Cluster("h100-sxm", 512), w)
    assert r.stats.pruned.get("stack_recompute", 0) > 0  # Megatron's selective
    assert r.stats.pruned.get("stack_schedule", 0) > 0  # zb-h1
    assert r.stats.pruned.get("stack_layer_split", 0) > 0  # e.g. 5 layers a rank in 6 chunks
    assert r.stats.pruned.get("stack_zero", 0) > 0  # FSDP2 is ZeRO-1 under pipelining only
    # The quick start's pp = 4, vpp = 15 (20 layers a rank in 15 chunks) is an explicit layout
    # torchtitan runs; Megatron's core-attention recompute it does not.
    quick_start = "dp=32,tp=4,pp=4,vpp=15,zero=1,sp=on"
    assert mp.evaluate("llama3-70b", mp.Cluster("h100-sxm", 512), w, quick_start).feasible
    ev = mp.evaluate("llama3-70b", mp.Cluster("h100-sxm", 512), w,
                     quick_start + ",recompute=selective")
    assert not ev.feasible
    assert [v.rule for v in ev.reasons] == ["stack_recompute"]


def test_an_unknown_stack_is_one_line_naming_the_known_ones():
    with pytest.raises(InvalidInputError) as e:
        mp.search("llama3-8b", mp.Cluster("h100-sxm", 8),
                  mp.Workload(global_batch=8, seq_len=1024, stack="jax-9000"))
    text = str(e.value)
    assert "\n" not in text and "workload.stack" in text
    for name in STACKS:
        assert name in text


def test_the_ungrouped_list_stays_available():
    w = mp.Workload(global_batch=1024, seq_len=8192)
    c = mp.Cluster("h100-sxm", 512)
    grouped = mp.search("llama3-70b", c, w)
    flat = mp.search("llama3-70b", c, w, mp.SearchSpace(distinct=False))
    assert flat.plans[0].plan == grouped.plans[0].plan
    assert all(e.group_size is None for e in flat.plans)
    assert grouped.plans[0].group_size > 1  # the quick start's best plan stands for several
    assert grouped.stats.groups_complete is True


def test_torchtitan_export_carries_the_modelled_layout():
    # 126 layers on 8 ranks (Llama 3.1 405B, torchtitan's own 3D run): 15, 16 x 6, 15.
    model = mp.Model.preset("llama3.1-405b")
    text = export.export("dp=8,tp=8,pp=8,zero=1,sp=on", "torchtitan", model=model)
    line = next(l for l in text.splitlines() if l.startswith("    module_fqns_per_model_part="))
    parts = ast.literal_eval(line.split("=", 1)[1].rstrip(","))
    assert [sum(m.startswith("layers.") for m in p) for p in parts] == [15] + [16] * 6 + [15]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert export.parse(text, "torchtitan", model=model) == mp.Plan.parse(
        "dp=8,tp=8,pp=8,zero=1,sp=on,schedule=1f1b")


def test_megatron_export_carries_the_modelled_layout():
    text = export.export("dp=32,tp=4,pp=4,vpp=15,zero=1,sp=on", "megatron", model="llama3-70b")
    layout = next(l for l in text.splitlines() if "--pipeline-model-parallel-layout" in l)
    stages = layout.split()[1].split("|")
    assert len(stages) == 60
    assert sum(s.count("t") for s in stages) == 80
    assert stages[0].startswith("E") and stages[-1].endswith("L")


@pytest.mark.parametrize("stack, plan", [
    # The quick start's kind of plan, which torchtitan runs (ZeRO-1 under PP, SP with TP).
    ("torchtitan", "dp=64,tp=4,pp=16,cp=4,vpp=8,micro_batch=1,zero=1,sp=on"),
    ("megatron-core", "dp=64,tp=4,pp=16,cp=4,vpp=8,micro_batch=1,zero=1,sp=on"),
])
def test_the_search_finds_what_evaluate_accepts(stack, plan):
    # A stack's rules are applied to the knobs once; the cells the search then checks must not
    # be judged by the first knob values (ZeRO-0, no SP) a stack may not have (405B on 16,384
    # GPUs under torchtitan once found only tp = 1 plans, 42 tok/s/GPU against 184).
    w = mp.Workload(global_batch=2048, seq_len=8192, stack=stack)
    c = mp.Cluster("h100-sxm", 16384)
    ev = mp.evaluate("llama3.1-405b", c, w, plan)
    assert ev.feasible, ev.reasons
    best = mp.search("llama3.1-405b", c, w, mp.SearchSpace(top_k=1)).plans[0]
    assert best.tokens_per_s_per_gpu >= ev.tokens_per_s_per_gpu
    fixed = mp.SearchSpace(**{k: v for k, v in ev.plan.to_dict().items()
                              if k in ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch")},
                           top_k=1)
    found = mp.search("llama3.1-405b", c, w, fixed).plans
    assert found and found[0].tokens_per_s_per_gpu >= ev.tokens_per_s_per_gpu


def test_exports_carry_the_knobs_each_profile_times():
    # DeepSpeed: its 5e8-element buckets and its own overlap_comm default (on for ZeRO-3 only).
    w = mp.Workload(global_batch=256, seq_len=4096, stack="deepspeed")
    for zero, overlap in ((1, False), (3, True)):
        config = json.loads(export.export(f"dp=64,tp=1,pp=1,zero={zero},recompute=full", workload=w))
        z = config["zero_optimization"]
        assert (z["reduce_bucket_size"], z["overlap_comm"]) == (500_000_000, overlap)
    # MaxText: the latency-hiding scheduler and the 1 GiB combine threshold, as XLA flags.
    text = export.export("dp=64,tp=1,pp=1,zero=3,recompute=full",
                         workload=mp.Workload(global_batch=256, seq_len=4096, stack="maxtext"))
    assert "--xla_gpu_all_reduce_combine_threshold_bytes=1073741824" in text
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in text
    # Megatron: the overlap flags; a bucket flag only for a workload's own bucket size.
    plan = "dp=64,tp=1,pp=1,zero=1"
    assert "--ddp-bucket-size" not in export.export(plan, workload=mp.Workload(256, 4096))
    text = export.export(plan, workload=mp.Workload(256, 4096, bucket_params=10**8))
    assert "--ddp-bucket-size 100000000" in text and "--overlap-param-gather" in text
