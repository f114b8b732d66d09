"""The typed objects check their arguments when they are made (issue 9): a wrong type or an
integer outside the core's limits is an ``InvalidInputError`` at once, one line naming the field,
with the core's own message for a range — not a ``TypeError`` from deep inside a later call."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import meshplan as mp
from meshplan import _core
from meshplan._fields import limits, shown
from meshplan.errors import InvalidInputError

GPUS = limits()["cluster.num_gpus"][1]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: mp.Workload("64", 4096),
         "invalid workload.global_batch: '64' (allowed: 1..=16777216)"),
        (lambda: mp.Workload(64, 4096.0),
         "invalid workload.seq_len: 4096.0 (allowed: 1..=16777216)"),
        (lambda: mp.Workload(True, 4096),
         "invalid workload.global_batch: True (allowed: 1..=16777216)"),
        (lambda: mp.Workload(64, 4096, precision=16),
         "invalid workload.precision: 16 (allowed: a string)"),
        (lambda: mp.Workload(64, 4096, lora="yes"),
         "invalid workload.lora: 'yes' (allowed: true or false)"),
        (lambda: mp.Workload(64, -5), "invalid workload.seq_len: -5 (allowed: 1..=16777216)"),
        (lambda: mp.Cluster("h100-sxm", -8), f"invalid cluster.num_gpus: -8 (allowed: 1..={GPUS})"),
        (lambda: mp.Cluster("h100-sxm", 2**32),
         f"invalid cluster.num_gpus: 4294967296 (allowed: 1..={GPUS})"),
        (lambda: mp.Cluster("h100-sxm", 8, nvlink_domain=0),
         f"invalid cluster.nvlink_domain: 0 (allowed: 1..={GPUS})"),
        (lambda: mp.Cluster(8, 8), "invalid cluster.gpu: 8 (allowed: a GPU preset name or a Gpu)"),
        (lambda: mp.Plan(dp=-64, tp=1, pp=1), f"invalid plan.dp: -64 (allowed: 1..={GPUS})"),
        (lambda: mp.Plan(dp=1, tp=1, pp=1, zero=4), "invalid plan.zero: 4 (allowed: 0..=3)"),
        (lambda: mp.Plan(dp=1, tp=1, pp=1, recompute=None),
         "invalid plan.recompute: None (allowed: a string)"),
        (lambda: mp.Plan.parse("dp=8,tp=1,pp=1,vpp=99999999999999999999"),
         "invalid plan.vpp: 99999999999999999999 (allowed: 1..=65536)"),
        (lambda: mp.Model("m", "32", 4096, 32, 8, 14336, 128256),
         "invalid model.layers: '32' (allowed: 1..=65536)"),
        (lambda: mp.Model("m", 32, 4096, 32, 8, 14336, 128256, moe=5),
         "invalid model.moe: 5 (allowed: a Moe, a dict or None)"),
        (lambda: mp.Moe(0, 2, 1024), "invalid model.moe.num_experts: 0 (allowed: 1..=65536)"),
        (lambda: mp.Mla(512, 64, 128, 128, q_lora_rank=-1),
         "invalid model.mla.q_lora_rank: -1 (allowed: 1..=1048576)"),
        (lambda: mp.SearchSpace(tp="8"),
         f"invalid space.tp.fixed: '8' (allowed: 1..={GPUS})"),
        (lambda: mp.SearchSpace(max_pp=0), f"invalid space.pp.max: 0 (allowed: 1..={GPUS})"),
        (lambda: mp.SearchSpace(vpp=mp.Degree(max=2**31)),
         "invalid space.vpp.max: 2147483648 (allowed: 1..=65536)"),
        (lambda: mp.SearchSpace(recompute="none"),
         "invalid space.recompute: 'none' (allowed: a list of strings)"),
        (lambda: mp.SearchSpace(zero=[0, 7]), "invalid space.zero: 7 (allowed: 0..=3)"),
        (lambda: mp.SearchSpace(sequence_parallel=[1]),
         "invalid space.sequence_parallel: 1 (allowed: true or false)"),
        (lambda: mp.SearchSpace(memory_headroom_gib="1"),
         "invalid space.memory_headroom_gib: '1' (allowed: a number)"),
        (lambda: mp.SearchSpace(top_k=0), "invalid space.top_k: 0 (allowed: 1..=1048576)"),
        (lambda: mp.Degree(fixed=1.5), "invalid degree.fixed: 1.5 (allowed: an integer)"),
        (lambda: mp.Query("llama3-8b", "h100-sxm", mp.Workload(64, 4096)),
         "invalid query.cluster: 'h100-sxm' (allowed: a Cluster or a dict)"),
        (lambda: mp.Query(8, mp.Cluster("h100-sxm", 8), mp.Workload(64, 4096)),
         "invalid query.model: 8 (allowed: a Model, a preset name, a config.json path or a "
         "dict)"),
    ],
)
def test_constructors_refuse_bad_arguments_at_once(make: Callable[[], Any], message: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        make()
    assert str(info.value) == message
    field = message.split(":")[0].removeprefix("invalid ")
    assert getattr(info.value, "field") == field


@pytest.mark.parametrize("path, lo, hi", sorted(
    (path, lo, hi) for path, (lo, hi) in limits().items()
    if path.startswith(("workload.", "cluster.", "plan."))
))
def test_range_messages_are_the_cores(path: str, lo: int, hi: int) -> None:
    # The same value refused by the constructor and by the core says the same thing.
    part, name = path.split(".")
    good = {
        "workload": lambda **kw: mp.Workload(**{"global_batch": 64, "seq_len": 4096, **kw}),
        "cluster": lambda **kw: mp.Cluster(**{"gpu": "h100-sxm", "num_gpus": 8, **kw}),
        "plan": lambda **kw: mp.Plan(**{"dp": 8, "tp": 1, "pp": 1, **kw}),
    }[part]
    for value in (lo - 1, hi + 1, 2**64 - 1, "64", 1.5):
        with pytest.raises(InvalidInputError) as here:
            good(**{name: value})
        problem = {"model": mp.Model.preset("llama3-8b").to_dict(),
                   "cluster": mp.Cluster("h100-sxm", 8).to_dict(),
                   "workload": mp.Workload(64, 4096).to_dict()}
        plan = mp.Plan(8, 1, 1).to_dict()
        if part == "plan":
            plan[name] = value
        else:
            problem[part][name] = value
        with pytest.raises(InvalidInputError) as core:
            _core.evaluate(problem, plan)
        assert str(here.value) == str(core.value), (path, value)


def test_numpy_integers_are_integers() -> None:
    cluster = mp.Cluster("h100-sxm", np.int64(64))
    assert cluster.num_gpus == 64 and type(cluster.num_gpus) is int
    assert mp.search("llama3-8b", cluster, mp.Workload(np.int32(64), 4096),
                     mp.SearchSpace(tp=np.int64(8), top_k=1)).plans


def test_good_arguments_pass_unchanged() -> None:
    w = mp.Workload(64, 4096, "fp8", "adam", 2, True, False, False)
    assert mp.Workload.from_dict(w.to_dict()) == w
    space = mp.SearchSpace(tp=8, max_pp=4, vpp={"min": 1, "max": 2}, zero=(1, 2))
    assert space.vpp == mp.Degree(min=1, max=2) and space.zero == [1, 2]
    assert mp.Model.from_dict(mp.Model.preset("deepseek-v3").to_dict()) == \
        mp.Model.preset("deepseek-v3")


def test_shown_values_are_bounded() -> None:
    assert shown("abc") == "'abc'"
    text = shown("x" * 20_000)
    assert text.startswith("'xxxx") and text.endswith("… (20,000 characters)") and len(text) < 100
    with pytest.raises(InvalidInputError) as info:
        mp.Workload("6" * 20_000, 4096)
    assert len(str(info.value)) < 200
