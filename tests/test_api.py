"""The Python API: typed objects in, typed objects out, numbers from the core."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from pathlib import Path

import pytest
from conftest import HF_CONFIGS, llama2_7b

import meshplan as mp
from meshplan import _core

FSDP = "dp=8,tp=1,pp=1,micro_batch=1,zero=3,recompute=none"


# --- typed objects ---------------------------------------------------------------------------


def test_public_names() -> None:
    for name in ["search", "evaluate", "Model", "Gpu", "Cluster", "Workload", "Plan",
                 "SearchSpace", "Evaluation", "SearchResult", "errors", "__version__"]:
        assert hasattr(mp, name), name
    assert mp.__version__ == _core.__version__
    assert mp.__version__.count(".") == 2


def test_model_round_trip_with_moe_and_mla() -> None:
    m = mp.Model(
        "tiny-moe", 4, 1024, 16, 4, 2048, 32000,
        moe=mp.Moe(num_experts=8, top_k=2, expert_ffn_hidden=512, shared_experts=1),
        mla=mp.Mla(kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64),
    )
    d = m.to_dict()
    assert d["moe"]["num_experts"] == 8 and d["mla"]["q_lora_rank"] is None
    assert mp.Model.from_dict(d) == m
    assert mp.Model.from_dict(json.loads(json.dumps(d))) == m


def test_workload_defaults_and_round_trip() -> None:
    w = mp.Workload(512, 2048)
    assert w.to_dict() == {
        "global_batch": 512, "seq_len": 2048, "precision": "bf16", "optimizer": "adam",
        "grad_bytes": 4, "lora": False, "flash_attention": True, "fused_cross_entropy": True,
        "stack": "megatron-core", "moe_imbalance": 1.1, "lora_rank": 32,
        "lora_targets": ["qkv", "o", "fc1", "fc2"], "lora_base": "bf16",
    }
    assert mp.Workload.from_dict(w.to_dict()) == w


def test_lora_reaches_the_core(model: mp.Model, cluster: mp.Cluster) -> None:
    full = mp.evaluate(model, cluster, mp.Workload(64, 4096), FSDP)
    lora = mp.evaluate(model, cluster, mp.Workload(64, 4096, lora=True), FSDP)
    # Frozen base weights: no gradients or optimizer state for them.
    assert lora.memory_gib["optimizer"] < full.memory_gib["optimizer"]
    assert lora.peak_memory_gib < full.peak_memory_gib


def test_lora_adapters_and_base_format_reach_the_core(
    model: mp.Model, cluster: mp.Cluster
) -> None:
    """Adapter states grow with the rank, frozen linears without adapters store no input, an
    NF4 base is about a quarter of a bf16 one (docs/costmodel.md §2.7)."""
    def ev(**kw: object) -> mp.Evaluation:
        return mp.evaluate(model, cluster, mp.Workload(64, 4096, lora=True, **kw), FSDP)  # type: ignore[arg-type]

    small, big = ev(lora_rank=8), ev(lora_rank=64)
    assert 0 < small.memory_gib["optimizer"] < big.memory_gib["optimizer"]
    assert small.memory_gib["gradients"] < big.memory_gib["gradients"]
    # q, v only: the FFN's frozen linears keep no inputs.
    qv = ev(lora_rank=8, lora_targets=("q", "v"))
    assert qv.memory_gib["activations"] < small.memory_gib["activations"]
    # NF4 base: 4.127 bits per layer weight instead of 16 (the embedding and head stay 16-bit).
    nf4 = ev(lora_rank=8, lora_base="nf4")
    ratio = nf4.memory_gib["weights"] / small.memory_gib["weights"]
    assert 0.25 < ratio < 0.45, ratio
    # Only the adapters are reduced, but FSDP still gathers the frozen base: DP time stays.
    assert small.time_s["dp"] > 0
    with pytest.raises(mp.errors.InvalidInputError, match="lora_targets"):
        ev(lora_targets=("q", "x"))
    with pytest.raises(mp.errors.InvalidInputError, match="lora_rank"):
        ev(lora_rank=0)


def test_unfused_attention_stores_more_activations(
    model: mp.Model, cluster: mp.Cluster
) -> None:
    fused = mp.evaluate(model, cluster, mp.Workload(64, 4096), FSDP)
    unfused = mp.evaluate(model, cluster, mp.Workload(64, 4096, flash_attention=False), FSDP)
    assert unfused.memory_gib["activations"] > fused.memory_gib["activations"]


def test_an_eager_fp32_loss_holds_six_more_bytes_per_logit(
    model: mp.Model, cluster: mp.Cluster
) -> None:
    fused = mp.evaluate(model, cluster, mp.Workload(64, 4096), FSDP)
    eager = mp.evaluate(model, cluster, mp.Workload(64, 4096, fused_cross_entropy=False), FSDP)
    logits = 4096 * model.vocab  # one micro-batch of one sequence on the last (only) stage
    # The allocator margin charged on transients (the GPU's `fragmentation` calibration).
    frag = 1.0 + mp.Gpu.preset(str(cluster.gpu)).calibration["fragmentation"]
    extra = eager.memory_gib["transient"] - fused.memory_gib["transient"]
    assert extra * 2**30 == pytest.approx(6 * logits * frag, rel=1e-9)
    assert eager.step_time_s == fused.step_time_s


def test_op_level_checkpointing_sits_between_none_and_full(
    model: mp.Model, cluster: mp.Cluster, workload: mp.Workload
) -> None:
    ev = {r: mp.evaluate(model, cluster, workload, f"dp=8,tp=1,pp=1,zero=3,recompute={r}")
          for r in ("none", "selective-op", "full")}
    act = {r: e.memory_gib["activations"] for r, e in ev.items()}
    assert act["full"] < act["selective-op"] < act["none"]
    step = {r: e.step_time_s for r, e in ev.items()}
    assert step["none"] < step["selective-op"] < step["full"]
    assert ev["selective-op"].plan.recompute == "selective-op"


def test_op_level_checkpointing_is_searched_only_when_asked(
    model: mp.Model, cluster: mp.Cluster, workload: mp.Workload
) -> None:
    default = mp.search(model, cluster, workload, mp.SearchSpace(top_k=1000))
    assert {p.plan.recompute for p in default.plans} <= {"none", "selective", "full"}
    space = mp.SearchSpace(recompute=["selective-op"], top_k=1000)
    # Op-level checkpointing is torchtitan's (selective_ac_option = "op"); Megatron has none.
    titan = dataclasses.replace(workload, stack="torchtitan")
    only = mp.search(model, cluster, titan, space)
    assert only.plans and {p.plan.recompute for p in only.plans} == {"selective-op"}
    megatron = mp.search(model, cluster, workload, space)
    assert not megatron.plans and megatron.stats.pruned["stack_recompute"] > 0
    with pytest.raises(mp.errors.InvalidInputError, match="selective-op"):
        mp.search(model, cluster, workload, mp.SearchSpace(recompute=["ops"]))


def test_cluster_from_dict_accepts_a_gpu_dict_or_a_name() -> None:
    full = mp.Cluster.preset("h100-sxm", 16).to_dict()
    assert mp.Cluster.from_dict(full).to_dict() == full
    by_name = mp.Cluster.from_dict({"gpu": "h100-sxm", "num_gpus": 16})
    assert by_name.to_dict() == full


def test_plan_parse_and_str_round_trip() -> None:
    p = mp.Plan.parse(
        "dp=8, tp=8, pp=4, ep=1, cp=2, micro_batch=2, zero=1, recompute=selective, vpp=5, "
        "sequence_parallel=true, schedule=interleaved-1f1b"
    )
    assert p == mp.Plan(8, 8, 4, 1, 2, 5, 2, 1, "selective", True, "interleaved-1f1b")
    assert p.num_gpus == 512
    assert mp.Plan.parse(str(p)) == p
    assert mp.Plan.from_dict(p.to_dict()) == p


@pytest.mark.parametrize("text, expected", [("on", True), ("off", False), ("1", True),
                                            ("no", False), ("TRUE", True)])
def test_plan_parse_booleans_and_aliases(text: str, expected: bool) -> None:
    p = mp.Plan.parse(f"dp=2,tp=2,pp=1,mb=4,sp={text}")
    assert p.micro_batch == 4 and p.sequence_parallel is expected


def test_space_defaults_come_from_the_core() -> None:
    # Every default is the core's, except that the Python layer (and the CLI and server through
    # it) asks for distinct plans unless told otherwise; the core's own default is the plain list.
    assert _core.default_space()["distinct"] is False
    assert mp.SearchSpace().to_dict() == {**_core.default_space(), "distinct": True}
    assert mp.SearchSpace(distinct=False).to_dict() == _core.default_space()


def test_space_fixes_and_bounds_degrees() -> None:
    d = mp.SearchSpace(tp=8, max_pp=16, min_dp=2, max_micro_batch=4, zero=(1, 3),
                       tp_within_domain=False).to_dict()
    default = _core.default_space()
    assert d["tp"] == {"fixed": 8, "min": None, "max": None}
    assert d["pp"] == {"fixed": None, "min": None, "max": 16}
    assert d["dp"] == {"fixed": None, "min": 2, "max": None}
    # A bound on one side keeps the core's default on the other.
    assert d["micro_batch"] == {**default["micro_batch"], "max": 4}
    assert d["vpp"] == default["vpp"]
    assert d["zero"] == [1, 3] and d["tp_within_domain"] is False
    assert d["recompute"] == default["recompute"]


def test_space_degree_object_and_from_dict_round_trip() -> None:
    s = mp.SearchSpace(cp=mp.Degree(min=2, max=4), top_k=3)
    d = s.to_dict()
    assert d["cp"] == {"fixed": None, "min": 2, "max": 4} and d["top_k"] == 3
    assert mp.SearchSpace.from_dict(d).to_dict() == d


def test_space_has_min_and_max_for_every_degree() -> None:
    from meshplan.space import DEGREES

    for degree in DEGREES:
        s = mp.SearchSpace(**{f"min_{degree}": 2, f"max_{degree}": 3})
        assert s.to_dict()[degree] == {"fixed": None, "min": 2, "max": 3}


# --- evaluate -------------------------------------------------------------------------------


def test_evaluate_fsdp_plan(model: mp.Model, cluster: mp.Cluster, workload: mp.Workload) -> None:
    ev = mp.evaluate(model, cluster, workload, FSDP)
    assert isinstance(ev, mp.Evaluation)
    assert ev.feasible and ev.reasons == []
    assert ev.rank is None
    assert ev.plan.zero == 3 and ev.plan.schedule == "1f1b"  # the schedule comes back resolved
    assert 0 < ev.mfu < 1 and ev.step_time_s > 0 and ev.tokens_per_s_per_gpu > 0
    # tokens/s per GPU is the step's tokens over step time and GPUs.
    tokens = workload.global_batch * workload.seq_len
    assert math.isclose(ev.tokens_per_s_per_gpu, tokens / ev.step_time_s / 8, rel_tol=1e-9)
    assert set(ev.memory_gib) >= {"weights", "gradients", "optimizer", "activations", "fixed"}
    assert set(ev.time_s) >= {"compute", "tp", "pp_p2p", "bubble", "dp", "optimizer"}
    # The breakdowns add up to their totals.
    assert math.isclose(sum(ev.memory_gib.values()), ev.peak_memory_gib, rel_tol=1e-9)
    assert math.isclose(sum(ev.time_s.values()), ev.step_time_s, rel_tol=1e-9)
    # ZeRO-3 on 8 GPUs keeps about 1/8 of Adam's 12 bytes/param of state per GPU.
    assert ev.memory_gib["optimizer"] < 12 * 6.74e9 / 2**30 / 4


def test_evaluate_reports_an_infeasible_plan_with_reasons(
    cluster: mp.Cluster, workload: mp.Workload
) -> None:
    ev = mp.evaluate("llama3-70b", cluster, workload, mp.Plan(dp=8, tp=1, pp=1, zero=0))
    assert not ev.feasible
    assert ev.reasons and all(r.rule and r.message for r in ev.reasons)
    assert "memory" in {r.rule for r in ev.reasons}
    assert ev.peak_memory_gib > cluster.resolved_gpu().memory_gib


def test_evaluate_accepts_model_by_preset_path_and_dict(
    cluster: mp.Cluster, workload: mp.Workload, tmp_path: Path
) -> None:
    hf = HF_CONFIGS / "Mixtral-8x7B-v0.1.json"
    by_path = mp.evaluate(str(hf), mp.Cluster("h100-sxm", 8), workload, "dp=1,tp=1,pp=1,ep=8")
    by_pathlib = mp.evaluate(hf, mp.Cluster("h100-sxm", 8), workload, "dp=1,tp=1,pp=1,ep=8")
    assert by_path == by_pathlib
    snapshot = tmp_path / "Mixtral-8x7B"
    snapshot.mkdir()
    (snapshot / "config.json").write_text(hf.read_text())
    by_dir = mp.evaluate(snapshot, mp.Cluster("h100-sxm", 8), workload, "dp=1,tp=1,pp=1,ep=8")
    assert by_dir == by_path
    m = llama2_7b()
    by_obj = mp.evaluate(m, cluster, workload, FSDP)
    by_dict = mp.evaluate(m.to_dict(), cluster.to_dict(), workload.to_dict(), FSDP)  # type: ignore[arg-type]
    assert by_obj == by_dict


def test_evaluate_to_flat_dict_flattens_the_plan(
    model: mp.Model, cluster: mp.Cluster, workload: mp.Workload
) -> None:
    flat = mp.evaluate(model, cluster, workload, FSDP).to_flat_dict()
    assert "plan" not in flat
    for key in ["rank", "dp", "tp", "pp", "ep", "cp", "vpp", "micro_batch", "zero", "recompute",
                "sequence_parallel", "schedule", "step_time_s", "tokens_per_s_per_gpu", "mfu",
                "peak_memory_gib", "memory_gib", "time_s", "feasible", "reasons"]:
        assert key in flat, key


def test_evaluation_round_trips_through_its_dict(
    model: mp.Model, cluster: mp.Cluster, workload: mp.Workload
) -> None:
    ev = mp.evaluate(model, cluster, workload, FSDP)
    assert mp.Evaluation.from_dict(ev.to_dict()) == ev
    raw = ev.to_dict()
    raw["future_metric"] = 1.5  # keys the core adds later are kept, not dropped
    again = mp.Evaluation.from_dict(raw)
    assert again.extra == {"future_metric": 1.5} and again.to_dict() == raw


# --- search -------------------------------------------------------------------------------


def test_search_ranks_feasible_plans(
    model: mp.Model, cluster: mp.Cluster, workload: mp.Workload, small_space: mp.SearchSpace
) -> None:
    result = mp.search(model, cluster, workload, small_space)
    assert isinstance(result, mp.SearchResult)
    plans = result.plans
    assert plans and result.best is plans[0]
    assert [p.rank for p in plans] == list(range(1, len(plans) + 1))
    assert all(p.feasible and p.plan.num_gpus == 8 for p in plans)
    speeds = [p.tokens_per_s_per_gpu for p in plans]
    assert speeds == sorted(speeds, reverse=True)
    assert all(p.plan.micro_batch <= 2 and p.plan.zero in (0, 1, 3) for p in plans)
    assert all(p.plan.recompute in ("none", "full") and p.plan.schedule == "1f1b" for p in plans)
    stats = result.stats
    assert stats.candidates >= stats.feasible >= len(plans)
    assert stats.feasible + sum(stats.pruned.values()) == stats.candidates
    assert stats.elapsed_s >= 0 and stats.threads >= 1


def test_search_plan_agrees_with_evaluate(
    model: mp.Model, cluster: mp.Cluster, workload: mp.Workload, small_space: mp.SearchSpace
) -> None:
    best = mp.search(model, cluster, workload, small_space).plans[0]
    again = mp.evaluate(model, cluster, workload, best.plan)
    assert again.step_time_s == best.step_time_s
    assert again.peak_memory_gib == best.peak_memory_gib


def test_search_respects_fixed_degrees_and_top_k(
    model: mp.Model, cluster: mp.Cluster, workload: mp.Workload
) -> None:
    result = mp.search(model, cluster, workload, mp.SearchSpace(tp=2, top_k=3, max_micro_batch=2))
    assert 0 < len(result.plans) <= 3
    assert all(p.plan.tp == 2 for p in result.plans)


def test_search_ranking_does_not_depend_on_threads(
    model: mp.Model, cluster: mp.Cluster, workload: mp.Workload, small_space: mp.SearchSpace
) -> None:
    one = mp.search(model, cluster, workload, small_space, threads=1)
    two = mp.search(model, cluster, workload, small_space, threads=2)
    assert [p.to_dict() for p in one.plans] == [p.to_dict() for p in two.plans]
    assert one.stats.candidates == two.stats.candidates
    assert one.stats.pruned == two.stats.pruned


# A search long enough to be caught running (about a second on one thread): 405B on 16,384
# GPUs with every knob open, every rank order, TP across domains, vpp and micro-batch up to 64
# (275 million candidates). The default space of the same problem takes a few milliseconds.
LONG = (
    "llama3.1-405b", mp.Cluster("h100-sxm", 16384), mp.Workload(2048, 8192),
    mp.SearchSpace(max_vpp=64, max_micro_batch=64, tp_within_domain=False,
                   orders=mp._core.rank_orders()),
)


def test_search_releases_the_gil() -> None:
    """While a long search runs in a thread, the main thread keeps running Python code."""
    started, done = threading.Event(), threading.Event()

    def work() -> None:
        started.set()
        mp.search(*LONG, threads=1)
        done.set()

    t = threading.Thread(target=work)
    t.start()
    started.wait()
    ticks = 0
    while not done.is_set():
        ticks += 1
        done.wait(0.001)
    t.join()
    # Holding the GIL for the whole search would leave the loop one or two turns at most.
    assert ticks > 20


def test_cancel_token() -> None:
    token = mp.CancelToken()
    assert not token.cancelled
    token.cancel()
    assert token.cancelled and "True" in repr(token)


def test_ctrl_c_cancels_a_running_search() -> None:
    """SIGINT during a search raises KeyboardInterrupt and raises the search's cancel flag."""
    import _thread
    import time

    token = mp.CancelToken()

    def interrupt() -> None:
        time.sleep(0.05)
        _thread.interrupt_main()

    threading.Thread(target=interrupt).start()
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        mp.search(*LONG, threads=1, cancel=token)
        time.sleep(5)  # only reached when the search ended before the interrupt
    # The wait loop saw the signal while the core was still working and told it to stop.
    assert token.cancelled
    assert time.perf_counter() - start < 5
