"""Every integer field of the serving entry points driven through 0, 2^31, 2^32 and 2^64 − 1:
each value outside the field's range is one line naming the field, the value and the range (the
core's ``limits::TABLE``), never a crash."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import meshplan as mp
from meshplan import _core
from meshplan.serving import serving_problem

EDGES = (0, 2**31, 2**32, 2**64 - 1)
LIMITS = _core.limits()


def problem() -> dict[str, Any]:
    return serving_problem("llama3-8b", mp.Cluster("h100-sxm", 8), input_len=512, output_len=64,
                           concurrency=8)


def moe_problem() -> dict[str, Any]:
    return serving_problem("mixtral-8x7b", mp.Cluster("h100-sxm", 8), input_len=512, output_len=64)


def plan() -> dict[str, Any]:
    worker = {"tp": 2, "pp": 1, "attention_dp": 1, "ep": 1, "expert_tp": 2, "max_sequences": 8}
    return {"worker": worker, "replicas": 1, "prefill": dict(worker), "prefill_replicas": 1}


def put(root: dict[str, Any], path: str, value: int) -> dict[str, Any]:
    out = copy.deepcopy(root)
    at = out
    keys = path.split(".")
    for k in keys[:-1]:
        at = at[k]
    at[keys[-1]] = value
    return out


def expect_one_line(call: Any, field: str, value: int) -> None:
    lo, hi = LIMITS[field]
    if lo <= value <= hi:
        return
    with pytest.raises(mp.errors.InvalidInputError) as e:
        call()
    message = str(e.value)
    assert "\n" not in message
    assert message == f"invalid {field}: {value} (allowed: {lo}..={hi})", message
    assert e.value.field == field


PROBLEM_FIELDS = ["traffic.input_len", "traffic.output_len", "traffic.concurrency", "traffic.num_requests",
                  "cluster.num_gpus", "model.layers", "model.hidden"]
PLAN_FIELDS = [f"serving_plan.{k}" for k in (
    "worker.tp", "worker.pp", "worker.attention_dp", "worker.ep", "worker.expert_tp",
    "worker.max_sequences", "worker.max_batched_tokens", "worker.kv_tokens", "worker.output_lag_steps",
    "replicas", "prefill.tp", "prefill.pp", "prefill.attention_dp", "prefill.ep", "prefill.expert_tp",
    "prefill.max_sequences", "prefill.max_batched_tokens", "prefill.kv_tokens", "prefill.output_lag_steps",
    "prefill_replicas")]
SPACE_FIELDS = ["serving_space.top_k", "serving_space.max_tp", "serving_space.max_pp",
                "serving_space.max_attention_dp", "serving_space.max_sequences",
                "serving_space.max_candidates"]


def test_every_serving_field_is_in_the_limits_table() -> None:
    for f in PROBLEM_FIELDS + PLAN_FIELDS + SPACE_FIELDS:
        assert f in LIMITS, f


@pytest.mark.parametrize("value", EDGES)
@pytest.mark.parametrize("field", PROBLEM_FIELDS)
def test_problem_fields(field: str, value: int) -> None:
    bad = put(problem(), field, value)
    expect_one_line(lambda: _core.search_serving(bad, {"top_k": 1}), field, value)
    expect_one_line(lambda: _core.evaluate_serving(bad, plan()), field, value)
    expect_one_line(lambda: _core.explain_serving(bad, plan()), field, value)


@pytest.mark.parametrize("value", EDGES)
@pytest.mark.parametrize("field", PLAN_FIELDS)
def test_plan_fields(field: str, value: int) -> None:
    bad = put(plan(), field.removeprefix("serving_plan."), value)
    expect_one_line(lambda: _core.evaluate_serving(problem(), bad), field, value)
    expect_one_line(lambda: _core.explain_serving(problem(), bad), field, value)


@pytest.mark.parametrize("value", EDGES)
@pytest.mark.parametrize("field", SPACE_FIELDS)
def test_space_fields(field: str, value: int) -> None:
    bad = put({"top_k": 1}, field.removeprefix("serving_space."), value)
    expect_one_line(lambda: _core.search_serving(moe_problem(), bad), field, value)


@pytest.mark.parametrize("value", [1, 2**20, 2**24])
def test_in_range_extremes_answer_without_hanging(value: int) -> None:
    # In-range extremes of the traffic are answered (maybe with nothing feasible), quickly.
    p = put(put(problem(), "traffic.concurrency", value), "traffic.output_len", value)
    r = _core.search_serving(p, {"top_k": 2}, 20.0)
    assert r["stats"]["candidates"] > 0


def test_structural_errors_name_the_field() -> None:
    with pytest.raises(mp.errors.InvalidInputError, match=r"invalid serving_plan.worker.ep: 4 "):
        _core.evaluate_serving(problem(), put(plan(), "worker.ep", 4))
    with pytest.raises(mp.errors.InvalidInputError, match=r"invalid serving_plan.replicas: 8 "):
        _core.evaluate_serving(problem(), put(plan(), "replicas", 8))
    with pytest.raises(mp.errors.InvalidInputError, match=r"invalid weight_precision: nvfp4 "):
        _core.search_serving(put(problem(), "weight_precision", "nvfp4"))
    with pytest.raises(mp.errors.InvalidInputError, match=r"invalid traffic.prefix_fraction"):
        _core.search_serving(put(problem(), "traffic.prefix_fraction", 1.5))


def lengths_problem() -> dict[str, Any]:
    return serving_problem("llama3-8b", mp.Cluster("h100-sxm", 8), lengths=[(512, 64), (2048, 256, 2.0)],
                           concurrency=8)


@pytest.mark.parametrize("value", EDGES)
@pytest.mark.parametrize("key", ["input_len", "output_len"])
def test_length_class_fields(key: str, value: int) -> None:
    # A class's lengths are named by the list's path, as every list element is (space.zero).
    bad = lengths_problem()
    bad["traffic"]["lengths"][1][key] = value
    field = f"traffic.lengths.{key}"
    expect_one_line(lambda: _core.search_serving(bad, {"top_k": 1}), field, value)
    expect_one_line(lambda: _core.evaluate_serving(bad, plan()), field, value)
    expect_one_line(lambda: _core.explain_serving(bad, plan()), field, value)


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf"), 1e300])
def test_a_length_class_weight_is_finite_and_positive(value: float) -> None:
    bad = lengths_problem()
    bad["traffic"]["lengths"][0]["weight"] = value
    with pytest.raises(mp.errors.InvalidInputError) as e:
        _core.evaluate_serving(bad, plan())
    assert str(e.value).startswith("invalid traffic.lengths.weight: ")
    assert str(e.value).endswith("(allowed: a finite number in (0, 1e15])")
