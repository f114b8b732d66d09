"""``meshplan.explain`` and ``meshplan explain``: the four facts per axis, docs/costmodel.md §7(a)/(b),
and that the explained times are the evaluation's."""

from __future__ import annotations

import json

import pytest

import meshplan as mp
from meshplan.cli import main
from meshplan.errors import InvalidInputError

H100_64 = mp.Cluster("h100-sxm", 64)
LLAMA70_WORKLOAD = mp.Workload(global_batch=128, seq_len=8192)
EVERY_AXIS = "dp=2,tp=2,pp=2,ep=4,cp=2,zero=1,sp=on,recompute=full"


def moe_400b() -> mp.Model:
    """A 400B-class MoE with docs/costmodel.md §7(b)'s shape: h = 8192, 64 experts, top-2."""
    return mp.Model(
        name="moe-400b", layers=40, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672,
        vocab=128256, activation="swiglu",
        moe=mp.Moe(num_experts=64, top_k=2, expert_ffn_hidden=6144),
    )


def test_costmodel_7a_llama3_70b_tp4_decode_traffic() -> None:
    d = mp.decode_traffic("llama3-70b", mp.Cluster("h100-sxm", 4), tp=4, tokens_per_s=50)
    assert d["all_reduces_per_token"] == 160
    assert d["message_bytes"] == 16384
    assert d["bytes_per_token_per_gpu"] == 3_932_160
    assert d["gb_per_s_per_gpu"] == pytest.approx(0.196608)
    assert d["link_gb_per_s"] == 450
    assert d["fraction_of_link"] == pytest.approx(0.196608 / 450)
    assert d["latency_bound"] is True
    # LL protocol (NCCL picks it for 16 KB): half the bandwidth, 20× less latency than Simple.
    assert d["latency_s_per_token"] > 20 * d["bandwidth_s_per_token"]
    assert d["fabric"] == "nvlink"


def test_decode_traffic_rejects_bad_rates() -> None:
    with pytest.raises(InvalidInputError, match="tokens_per_s"):
        mp.decode_traffic("llama3-70b", mp.Cluster("h100-sxm", 4), tp=4, tokens_per_s=0)
    with pytest.raises(InvalidInputError, match="tp"):
        mp.decode_traffic("llama3-70b", mp.Cluster("h100-sxm", 4), tp=0)


def test_costmodel_7b_all_to_all_bytes_per_token_per_moe_layer() -> None:
    x = mp.explain(moe_400b(), H100_64, mp.Workload(64, 4096), "dp=8,tp=1,pp=1,ep=8,zero=1")
    ep = x.axis("ep")
    forward = ep["collectives"][0]
    assert forward["op"] == "all-to-all" and "forward" in forward["when"]
    # Dispatch + combine, the share leaving the GPU: 57,344 B per token per MoE layer (40 layers).
    assert forward["bytes_per_token_per_gpu"] / 40 == 57_344
    assert "65,536 B" in ep["notes"][0] and "57,344 B" in ep["notes"][0]
    assert (ep["fabric"], ep["group_size"], ep["members_per_domain"]) == ("nvlink", 8, 8)


def test_every_axis_is_explained_with_the_four_facts() -> None:
    x = mp.explain("mixtral-8x7b", H100_64, mp.Workload(128, 4096), EVERY_AXIS)
    assert [a["axis"] for a in x.axes] == ["dp", "tp", "pp", "ep", "cp", "zero"]
    for a in x.axes:
        assert a["state_sharded"].endswith(".")
        assert a["fabric"] in ("nvlink", "network", "nvlink+network")
        assert a["group_size"] == a["members_per_domain"] * a["domains"]
        for c in a["collectives"]:
            assert c["op"] in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
            assert c["count_per_step"] > 0 and c["message_bytes"] > 0
            assert c["bytes_per_step_per_gpu"] == pytest.approx(
                c["bytes_per_token_per_gpu"] * x.evaluation.micro_batches * 1 * 4096 / 2
            )
            assert isinstance(c["latency_bound"], bool)
    # With ZeRO-1 the DP reduction is listed under zero.
    assert x.axis("dp")["collectives"] == []
    assert {c["op"] for c in x.axis("zero")["collectives"]} == {"reduce-scatter", "all-gather"}
    # Full recompute replays the forward collectives.
    assert any("recompute" in c["when"] for c in x.axis("tp")["collectives"])


@pytest.mark.parametrize("plan", [
    EVERY_AXIS,
    "dp=8,tp=8,pp=1,zero=3,micro_batch=2",
    "dp=4,tp=4,pp=4,zero=0,schedule=zb-h1",
    "dp=2,tp=4,pp=4,vpp=5,cp=2,zero=2,sp=on",
])
def test_exposed_times_add_up_to_the_step_time(plan: str) -> None:
    model = "mixtral-8x7b" if "ep=" in plan else "llama3-70b"
    x = mp.explain(model, H100_64, mp.Workload(128, 4096), plan)
    ev = x.evaluation
    total = sum(a["exposed_s"] for a in x.axes) + ev.time_s["compute"] + ev.time_s["optimizer"]
    assert total == pytest.approx(ev.step_time_s, rel=1e-9)
    assert x.evaluation == mp.evaluate(model, H100_64, mp.Workload(128, 4096), plan)


def test_the_mesh_and_the_order() -> None:
    w = mp.Workload(64, 4096)
    cluster = mp.Cluster("h100-sxm", 16)
    x = mp.explain("llama3-8b", cluster, w, "dp=8,tp=2,pp=1")
    assert x.mesh["order"] == "tp-cp-ep-dp-pp" and x.mesh["domain_size"] == 8
    groups = {g["axis"]: g for g in x.mesh["groups"]}
    assert groups["tp"]["example_ranks"] == [0, 1] and not groups["tp"]["crosses_domain"]
    assert groups["dp"]["example_ranks"] == list(range(0, 16, 2))
    assert x.axis("dp")["fabric"] == "nvlink+network"
    y = mp.explain("llama3-8b", cluster, w, "dp=8,tp=2,pp=1,order=dp-tp-cp-ep-pp")
    assert y.plan.order == "dp-tp-cp-ep-pp"
    assert y.axis("tp")["fabric"] == "network" and y.axis("dp")["fabric"] == "nvlink"


def test_explanation_is_a_read_only_mapping() -> None:
    x = mp.explain("llama3-70b", H100_64, LLAMA70_WORKLOAD, "dp=2,tp=8,pp=4")
    assert set(x) == {"plan", "evaluation", "mesh", "axes", "pipeline"}
    assert x["axes"] is x.to_dict()["axes"] and len(x) == 5
    assert x.plan == mp.Plan(2, 8, 4, schedule="1f1b")
    assert json.loads(json.dumps(x.to_dict())) == x.to_dict()
    with pytest.raises(KeyError, match="cp"):
        x.axis("cp")
    assert "Explanation(" in repr(x)


def test_infeasible_plans_are_explained_and_malformed_ones_rejected() -> None:
    x = mp.explain("llama3-70b", H100_64, LLAMA70_WORKLOAD, "dp=64,tp=1,pp=1")
    assert not x.evaluation.feasible and x.axes
    with pytest.raises(InvalidInputError, match="plan"):
        mp.explain("llama3-70b", H100_64, LLAMA70_WORKLOAD, "dp=4,tp=1,pp=1")


PROBLEM = ["--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64",
           "--global-batch", "128", "--seq-len", "8192"]


def test_cli_explain_text_says_the_four_facts(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain", *PROBLEM, "--plan", "dp=2,tp=4,pp=4,cp=2,zero=1,sp=on"])
    out = capsys.readouterr().out
    assert code == 0
    for heading in ("DP = 2", "TP = 4", "PP = 4", "CP = 2", "ZeRO-1"):
        assert heading in out
    for fact in ("sharded", "fabric", "reduce-scatter", "all-gather", "send-recv", "/token",
                 "/step per GPU", "exposed per step", "memory", "time"):
        assert fact in out, fact


def test_cli_explain_says_latency_bound_where_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    # Short sequences on 8 GPUs: each TP all-reduce is a few hundred KB, latency-dominated.
    argv = ["--model", "gpt-1.7b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "8",
            "--seq-len", "128", "--plan", "dp=1,tp=8,pp=1"]
    assert main(["explain", *argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    tp = next(a for a in doc["axes"] if a["axis"] == "tp")
    assert any(c["latency_bound"] for c in tp["collectives"])
    assert main(["explain", *argv]) == 0
    assert "latency-bound" in capsys.readouterr().out


def test_cli_explain_json_is_the_python_explanation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", *PROBLEM, "--plan", "dp=2,tp=8,pp=4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    x = mp.explain("llama3-70b", H100_64, LLAMA70_WORKLOAD, "dp=2,tp=8,pp=4")
    assert doc["axes"] == x.axes and doc["mesh"] == x.mesh and doc["plan"]["order"] == "tp-cp-ep-dp-pp"


def test_cli_explain_bad_plan_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", *PROBLEM, "--plan", "dp=2,tp=8,pp=4,order=tp-tp"]) == 2
    err = capsys.readouterr().err
    assert "plan.order" in err and err.count("\n") == 1
