"""``meshplan.search_many``: one result per query in order, each equal to its own ``search``;
a query's failure in its place; the same results whatever the thread count; the progress bar."""

from __future__ import annotations

import io

import pytest

import meshplan as mp
from meshplan.batch import ProgressBar
from meshplan.errors import (
    CancelledError,
    InvalidInputError,
    MeshplanError,
    SpaceTooLargeError,
    UnknownPresetError,
)

SPACE = mp.SearchSpace(max_micro_batch=2, max_vpp=2, top_k=5)


def queries() -> list[mp.Query]:
    out = [
        mp.Query("llama3-8b", mp.Cluster("h100-sxm", n), mp.Workload(64, 4096), SPACE)
        for n in (8, 16, 32)
    ]
    out.append(mp.Query("mixtral-8x7b", mp.Cluster("h100-sxm", 16), mp.Workload(32, 4096), SPACE))
    out.append(mp.Query("gpt-1.7b", mp.Cluster("a100-sxm-40g", 8), mp.Workload(128, 2048), SPACE))
    return out


def same(a: mp.SearchResult, b: mp.SearchResult) -> None:
    assert [p.to_dict() for p in a.plans] == [p.to_dict() for p in b.plans]
    assert (a.stats.candidates, a.stats.feasible, a.stats.pruned) == (
        b.stats.candidates, b.stats.feasible, b.stats.pruned,
    )


def test_one_result_per_query_in_order_equal_to_search() -> None:
    qs = queries()
    results = mp.search_many(qs, progress=False)
    assert len(results) == len(qs)
    for q, r in zip(qs, results):
        assert isinstance(r, mp.SearchResult)
        same(r, mp.search(q.model, q.cluster, q.workload, q.space))
    # Reversed input, reversed output.
    backwards = mp.search_many(list(reversed(qs)), progress=False)
    for r, want in zip(backwards, reversed(results)):
        assert isinstance(r, mp.SearchResult)
        same(r, want)


def test_tuples_are_queries() -> None:
    c, w = mp.Cluster("h100-sxm", 8), mp.Workload(64, 4096)
    [a, b] = mp.search_many([("llama3-8b", c, w), ("llama3-8b", c, w, SPACE)], progress=False)
    assert isinstance(a, mp.SearchResult) and isinstance(b, mp.SearchResult)
    same(a, mp.search("llama3-8b", c, w))
    same(b, mp.search("llama3-8b", c, w, SPACE))


def test_a_failing_query_is_its_error_in_place() -> None:
    c, w = mp.Cluster("h100-sxm", 8), mp.Workload(64, 4096)
    qs: list[object] = [
        ("llama3-8b", c, w, SPACE),
        ("no-such-model", c, w),  # fails in Python (preset lookup)
        # Dicts, so that the bad values fail inside the batch (a constructor would refuse
        # them at once): the space's range, then the workload's.
        ("llama3-8b", c, w, {"zero": [7]}),
        ("llama3-8b", mp.Cluster("h100-sxm", 8), {"global_batch": 0, "seq_len": 4096}),
        ("llama3-8b", c, w, mp.SearchSpace(max_candidates=10)),  # too large
        "not a query",
        ("llama3-8b", c, w, SPACE),
    ]
    results = mp.search_many(qs, progress=False)  # type: ignore[arg-type]
    assert len(results) == len(qs)
    assert isinstance(results[0], mp.SearchResult)
    assert isinstance(results[1], UnknownPresetError)
    assert isinstance(results[2], InvalidInputError) and "space.zero" in str(results[2])
    assert results[2].field == "space.zero" and results[2].allowed == "0..=3"
    assert isinstance(results[3], InvalidInputError) and "global_batch" in str(results[3])
    assert isinstance(results[4], SpaceTooLargeError)
    assert isinstance(results[5], InvalidInputError) and "query" in str(results[5])
    assert isinstance(results[6], mp.SearchResult)
    same(results[0], results[6])


def test_results_do_not_depend_on_the_thread_count() -> None:
    qs = queries()
    one = mp.search_many(qs, threads=1, progress=False)
    two = mp.search_many(qs, threads=2, progress=False)
    four = mp.search_many(qs, threads=4, progress=False)
    for a, b, c in zip(one, two, four):
        assert isinstance(a, mp.SearchResult) and isinstance(b, mp.SearchResult)
        assert isinstance(c, mp.SearchResult)
        same(a, b)
        same(a, c)
        assert (a.stats.threads, b.stats.threads, c.stats.threads) == (1, 2, 4)


def test_bad_threads_raise_for_the_batch() -> None:
    with pytest.raises(InvalidInputError, match="threads"):
        mp.search_many(queries(), threads=0, progress=False)


def test_a_cancelled_batch_returns_cancelled_errors() -> None:
    token = mp.CancelToken()
    token.cancel()
    results = mp.search_many(queries(), cancel=token, progress=False)
    assert results and all(isinstance(r, CancelledError) for r in results)


def test_empty_batch() -> None:
    assert mp.search_many([], progress=False) == []


def test_progress_bar_only_when_asked_or_on_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    mp.search_many(queries()[:2])  # stderr is captured, not a terminal: no bar
    assert capsys.readouterr().err == ""
    mp.search_many(queries()[:2], progress=True)
    err = capsys.readouterr().err
    assert "2/2 queries" in err and err.endswith("\n")


def test_progress_bar_drawing() -> None:
    out = io.StringIO()
    bar = ProgressBar(out, width=10, offset=1)
    bar(4, 9)
    assert "[#####.....] 5/10 queries" in out.getvalue()
    bar.close(10)
    assert "[##########] 10/10 queries" in out.getvalue() and out.getvalue().endswith("\n")


def test_a_progress_callback_that_raises_stops_the_batch() -> None:
    from meshplan import _core
    from meshplan.api import problem_dict

    def boom(done: int, total: int) -> None:
        raise RuntimeError("stop")

    # A batch long enough for the 50 ms poll to call the callback.
    problem = problem_dict("llama3.1-405b", mp.Cluster("h100-sxm", 16384), mp.Workload(2048, 8192))
    with pytest.raises(RuntimeError, match="stop"):
        _core.search_many([(problem, None)] * 200, 1, None, None, boom)


def test_errors_are_meshplan_errors() -> None:
    [r] = mp.search_many([("llama3-8b", mp.Cluster("h100-sxm", 8), mp.Workload(64, 4096),
                           {"top_k": 0})], progress=False)
    assert isinstance(r, MeshplanError) and isinstance(r, ValueError)


def test_an_error_from_the_core_keeps_its_field() -> None:
    [r] = mp.search_many([("llama3-8b", mp.Cluster("h100-sxm", 8),
                           mp.Workload(64, 4096, precision="fp5"))], progress=False)
    assert isinstance(r, InvalidInputError)
    assert (r.field, r.value) == ("workload.precision", "fp5") and r.allowed
