"""Rank order: in every plan, settable, validated, searched over where it changes a fabric."""

from __future__ import annotations

import csv
import io
import itertools
import json

import pytest

import meshplan as mp
from meshplan import _core
from meshplan.cli import main
from meshplan.errors import InvalidInputError

DEFAULT = "tp-cp-ep-dp-pp"
TWO_NODES = mp.Cluster("h100-sxm", 16)
WORKLOAD = mp.Workload(global_batch=64, seq_len=4096)
SPACE = mp.SearchSpace(max_micro_batch=2, zero=[1], recompute=["none"], top_k=200)


def test_every_plan_reports_its_order() -> None:
    assert mp.Plan(8, 1, 1).order == DEFAULT
    ev = mp.evaluate("llama3-8b", TWO_NODES, WORKLOAD, "dp=8,tp=2,pp=1")
    assert ev.plan.order == DEFAULT
    assert ev.to_flat_dict()["order"] == DEFAULT
    result = mp.search("llama3-8b", TWO_NODES, WORKLOAD, SPACE)
    assert result.plans and all(p.plan.order == DEFAULT for p in result.plans)


def test_plan_text_round_trips_with_an_order() -> None:
    p = mp.Plan.parse("dp=8,tp=2,pp=1,order=dp-tp-cp-ep-pp")
    assert p.order == "dp-tp-cp-ep-pp"
    assert str(p).endswith("order=dp-tp-cp-ep-pp")
    assert mp.Plan.parse(str(p)) == p
    assert "order" not in str(mp.Plan(8, 2, 1))  # the default is left out of the text


@pytest.mark.parametrize("order", ["tp-cp-ep-dp", "tp-tp-ep-dp-pp", "tp-cp-ep-dp-pp-pp", "x", ""])
def test_bad_orders_name_plan_order(order: str) -> None:
    with pytest.raises(InvalidInputError, match="plan.order"):
        mp.evaluate("llama3-8b", TWO_NODES, WORKLOAD, mp.Plan(8, 2, 1, order=order))


def test_the_order_moves_groups_between_fabrics() -> None:
    inner_tp = mp.evaluate("llama3-8b", TWO_NODES, WORKLOAD, "dp=8,tp=2,pp=1,zero=1")
    inner_dp = mp.evaluate(
        "llama3-8b", TWO_NODES, WORKLOAD, "dp=8,tp=2,pp=1,zero=1,order=dp-tp-cp-ep-pp"
    )
    # TP across the network costs more; the ZeRO collectives inside one node cost less.
    assert inner_dp.time_s["tp"] > 2 * inner_tp.time_s["tp"]
    assert inner_dp.time_s["compute"] == inner_tp.time_s["compute"]

    def zero_s(plan: mp.Plan) -> float:
        x = mp.explain("llama3-8b", TWO_NODES, WORKLOAD, plan)
        return sum(c["seconds_per_step"] for c in x.axis("zero")["collectives"])

    assert zero_s(inner_dp.plan) < zero_s(inner_tp.plan) / 2


def test_rank_orders_are_the_120_permutations_default_first() -> None:
    orders = _core.rank_orders()
    assert orders[0] == DEFAULT and len(orders) == 120
    assert set(orders) == {"-".join(p) for p in itertools.permutations(DEFAULT.split("-"))}


def test_default_orders_search_is_the_plain_search() -> None:
    plain = mp.search("llama3-8b", TWO_NODES, WORKLOAD, SPACE)
    explicit = mp.search(
        "llama3-8b", TWO_NODES, WORKLOAD,
        mp.SearchSpace(max_micro_batch=2, zero=[1], recompute=["none"], top_k=200,
                       orders=[DEFAULT, DEFAULT]),
    )
    assert explicit.plans == plain.plans
    assert explicit.stats.candidates == plain.stats.candidates
    assert mp.SearchSpace().to_dict()["orders"] == [DEFAULT]


def test_all_orders_add_only_plans_that_move_a_group() -> None:
    plain = mp.search("llama3-8b", TWO_NODES, WORKLOAD, SPACE)
    every = mp.search(
        "llama3-8b", TWO_NODES, WORKLOAD,
        mp.SearchSpace(max_micro_batch=2, zero=[1], recompute=["none"], top_k=200,
                       orders=_core.rank_orders()),
    )
    assert plain.stats.candidates < every.stats.candidates < 120 * plain.stats.candidates
    assert every.plans[0].tokens_per_s_per_gpu >= plain.plans[0].tokens_per_s_per_gpu
    assert any(p.plan.order != DEFAULT for p in every.plans)
    # No two returned plans differ only in an order that leaves every group where it was.
    seen: dict[tuple[object, ...], list[tuple[str, ...]]] = {}
    for p in every.plans:
        x = mp.explain("llama3-8b", TWO_NODES, WORKLOAD, p.plan)
        placement = tuple(
            (a["axis"], a["members_per_domain"], a["domains"]) for a in x.axes
        )
        key = tuple(v for k, v in p.plan.to_dict().items() if k != "order")
        assert placement not in seen.setdefault(key, []), p.plan
        seen[key].append(placement)


def test_one_node_jobs_gain_nothing_from_other_orders() -> None:
    one_node = mp.Cluster("h100-sxm", 8)
    plain = mp.search("llama3-8b", one_node, WORKLOAD, SPACE)
    every = mp.search(
        "llama3-8b", one_node, WORKLOAD,
        mp.SearchSpace(max_micro_batch=2, zero=[1], recompute=["none"], top_k=200,
                       orders=_core.rank_orders()),
    )
    assert every.plans == plain.plans and every.stats.candidates == plain.stats.candidates


PROBLEM = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "32", "--global-batch", "64",
           "--seq-len", "4096", "--max-micro-batch", "2", "--zero", "1", "--recompute", "none"]


def test_cli_orders_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", *PROBLEM, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert all(p["order"] == DEFAULT for p in plain["plans"])
    assert main(["search", *PROBLEM, "--json", "--all-orders"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert every["stats"]["candidates"] > plain["stats"]["candidates"]
    two = ["--orders", f"{DEFAULT},tp-cp-ep-pp-dp"]
    assert main(["search", *PROBLEM, "--json", *two]) == 0
    some = json.loads(capsys.readouterr().out)
    assert {p["order"] for p in some["plans"]} <= {DEFAULT, "tp-cp-ep-pp-dp"}
    assert plain["stats"]["candidates"] < some["stats"]["candidates"] <= every["stats"]["candidates"]
    # The table shows an order column once a plan leaves the default.
    assert main(["search", *PROBLEM, "--all-orders", "--top-k", "5"]) == 0
    table = capsys.readouterr().out
    assert ("order" in table) == any(p["order"] != DEFAULT for p in every["plans"][:5])
    assert main(["search", *PROBLEM, "--csv", "--top-k", "3"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["order"] for r in rows] == [DEFAULT] * 3


def test_cli_bad_orders_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", *PROBLEM, "--orders", "tp-cp-ep-dp"]) == 2
    assert "space.orders" in capsys.readouterr().err
    assert main(["search", *PROBLEM, "--orders", DEFAULT, "--all-orders"]) == 2
    assert "--all-orders" in capsys.readouterr().err
