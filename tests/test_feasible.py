"""``meshplan.feasible_space`` and ``meshplan search --all``: every feasible plan as NumPy
columns, as long as the search's feasible count, with the documented dtypes, ranked so that the
first row is the search's best plan, each row equal to ``evaluate`` of its plan; the cap."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

import meshplan as mp
from meshplan.cli import main
from meshplan.errors import InvalidInputError, SpaceTooLargeError
from meshplan.feasible import CATEGORICAL, DEFAULT_MAX_PLANS

CLUSTER = mp.Cluster("h100-sxm", 64)
WORKLOAD = mp.Workload(128, 8192)
SPACE = mp.SearchSpace(max_micro_batch=4, max_vpp=4)

DTYPES = {
    **{k: np.uint32 for k in ("rank", "dp", "tp", "pp", "ep", "cp", "vpp", "micro_batch",
                              "micro_batches", "worst_stage", "etp")},
    **{k: np.uint8 for k in ("zero", "recompute", "schedule", "order", "dispatcher", "cp_exchange",
                            "recompute_modules")},
    "sequence_parallel": np.bool_,
    "ep_overlap": np.bool_,
    **{k: np.float64 for k in ("step_time_s", "tokens_per_s_per_gpu", "mfu", "model_tflops_per_gpu",
                               "hardware_tflops_per_gpu", "peak_memory_gib")},
    **{f"memory_gib.{k}": np.float64 for k in ("weights", "gradients", "optimizer", "activations",
                                               "transient", "fixed")},
    **{f"time_s.{k}": np.float64 for k in ("compute", "tp", "cp", "ep", "pp_p2p", "bubble", "dp",
                                           "optimizer")},
}


@pytest.fixture(scope="module")
def space() -> mp.FeasibleSpace:
    return mp.feasible_space("llama3-70b", CLUSTER, WORKLOAD, SPACE)


def test_columns_lengths_and_dtypes(space: mp.FeasibleSpace) -> None:
    result = mp.search("llama3-70b", CLUSTER, WORKLOAD, SPACE)
    assert space.num_plans == result.stats.feasible == space.stats.feasible > 100
    assert space.stats.candidates == result.stats.candidates
    assert space.stats.pruned == result.stats.pruned
    # The columns of `search --csv` less `feasible`, in its order.
    from meshplan.cli import METRIC_COLUMNS, PLAN_COLUMNS

    breakdowns = [n for n in DTYPES if "." in n]
    assert list(space) == [*PLAN_COLUMNS, *(c for c in METRIC_COLUMNS if c != "feasible"),
                           *breakdowns]
    assert set(space) == set(DTYPES)
    for name, dtype in DTYPES.items():
        assert space[name].dtype == dtype, name
        assert space[name].shape == (space.num_plans,), name
    assert list(space["rank"]) == list(range(1, space.num_plans + 1))
    assert set(space.categories) == set(CATEGORICAL)
    assert space.categories["recompute"] == ("none", "selective", "full", "selective-op")
    assert space.categories["schedule"] == ("1f1b", "interleaved-1f1b", "zb-h1")
    assert space.categories["order"] == ("tp-cp-ep-dp-pp",)
    for name in CATEGORICAL:
        assert int(space[name].max()) < len(space.categories[name])
    # Every plan uses all 64 GPUs, and the rows are ranked.
    product = space["dp"] * space["tp"] * space["pp"] * space["ep"] * space["cp"]
    assert (product == 64).all()
    tps = space["tokens_per_s_per_gpu"]
    assert (np.diff(tps) <= 0).all()


def test_best_row_is_the_search_top_plan(space: mp.FeasibleSpace) -> None:
    # The plain list (distinct=False): the feasible space keeps every plan, not groups.
    result = mp.search("llama3-70b", CLUSTER, WORKLOAD, mp.SearchSpace(max_micro_batch=4,
                                                                        max_vpp=4, top_k=20,
                                                                        distinct=False))
    grouped = mp.search("llama3-70b", CLUSTER, WORKLOAD, mp.SearchSpace(max_micro_batch=4,
                                                                         max_vpp=4, top_k=20))
    assert result.best is not None and grouped.best is not None
    assert grouped.best.plan == result.best.plan
    assert space.plan(0) == result.best.plan
    assert int(np.argmax(space["tokens_per_s_per_gpu"])) == 0
    for i, ev in enumerate(result.plans):
        assert space.plan(i) == ev.plan
        assert space["tokens_per_s_per_gpu"][i] == ev.tokens_per_s_per_gpu
        assert space["step_time_s"][i] == ev.step_time_s
        assert space["peak_memory_gib"][i] == ev.peak_memory_gib
        assert space["mfu"][i] == ev.mfu


def test_rows_equal_evaluate(space: mp.FeasibleSpace) -> None:
    rows = np.random.default_rng(6).choice(space.num_plans, size=40, replace=False)
    for i in sorted(int(r) for r in rows):
        ev = mp.evaluate("llama3-70b", CLUSTER, WORKLOAD, space.plan(i))
        assert ev.feasible
        assert space["step_time_s"][i] == ev.step_time_s
        assert space["tokens_per_s_per_gpu"][i] == ev.tokens_per_s_per_gpu
        assert space["hardware_tflops_per_gpu"][i] == ev.hardware_tflops_per_gpu
        assert space["worst_stage"][i] == ev.worst_stage
        assert space["micro_batches"][i] == ev.micro_batches
        for k, v in ev.memory_gib.items():
            assert space[f"memory_gib.{k}"][i] == v, k
        for k, v in ev.time_s.items():
            assert space[f"time_s.{k}"][i] == v, k


def test_decode_and_read_only(space: mp.FeasibleSpace) -> None:
    labels = space.decode("schedule")
    codes = space["schedule"]
    assert [space.categories["schedule"][c] for c in codes[:10]] == list(labels[:10])
    assert space.decode("tp") is space["tp"]
    assert set(space.decoded()) == set(space)
    assert not space["mfu"].flags.writeable
    assert space["mfu"].copy().flags.writeable
    assert "plans" in repr(space)


def test_orders_are_coded() -> None:
    # The two rank orders the default stack (megatron-core) builds; it prunes the others.
    orders = ["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"]
    fs = mp.feasible_space("llama3-8b", mp.Cluster("h100-sxm", 16), mp.Workload(32, 4096),
                           mp.SearchSpace(max_micro_batch=2, max_vpp=2, orders=orders))
    assert fs.categories["order"] == tuple(orders)
    assert set(fs.decode("order")) == set(orders)


def test_cap_raises_space_too_large(space: mp.FeasibleSpace) -> None:
    n = space.num_plans
    exact = mp.feasible_space("llama3-70b", CLUSTER, WORKLOAD, SPACE, max_plans=n)
    assert exact.num_plans == n
    with pytest.raises(SpaceTooLargeError, match=f"more than {n - 1} feasible plans"):
        mp.feasible_space("llama3-70b", CLUSTER, WORKLOAD, SPACE, max_plans=n - 1)
    with pytest.raises(InvalidInputError, match="max_plans"):
        mp.feasible_space("llama3-70b", CLUSTER, WORKLOAD, SPACE, max_plans=0)
    assert DEFAULT_MAX_PLANS == 5_000_000


def test_empty_space() -> None:
    fs = mp.feasible_space("llama3.1-405b", mp.Cluster("a100-sxm-40g", 8), mp.Workload(8, 4096))
    assert fs.num_plans == 0 and fs.stats.feasible == 0 and fs.stats.candidates > 0
    assert all(fs[name].shape == (0,) for name in fs)


def test_search_all_csv_and_json(space: mp.FeasibleSpace, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["search", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64",
            "--global-batch", "128", "--seq-len", "8192", "--max-micro-batch", "4",
            "--max-vpp", "4", "--all"]
    assert main(argv + ["--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == space.num_plans
    assert list(rows[0]) == list(space)
    assert rows[0]["schedule"] == space.decode("schedule")[0]
    assert float(rows[-1]["step_time_s"]) == space["step_time_s"][-1]
    assert main(argv + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["stats"]["feasible"] == space.num_plans
    assert data["columns"]["tokens_per_s_per_gpu"] == space["tokens_per_s_per_gpu"].tolist()
    assert main(argv) == 2
    assert "--csv or --json" in capsys.readouterr().err
    assert main(argv + ["--csv", "--max-plans", "3"]) == 1
    assert "more than 3 feasible plans" in capsys.readouterr().err
