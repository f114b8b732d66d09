"""Shared inputs of the test suite: small problems that search in well under a second."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import meshplan as mp

FIXTURES = Path(__file__).parent / "fixtures"
HF_CONFIGS = FIXTURES / "hf"
REPO_CASES = Path(__file__).parent.parent / "validation" / "cases.json"
"""The published training runs shipped with the repository (validation/README.md)."""


def llama2_7b() -> mp.Model:
    """Llama-2-7B's shape (docs/costmodel.md §7(c)), built field by field rather than from a preset."""
    return mp.Model(
        name="llama2-7b", layers=32, hidden=4096, heads=32, kv_heads=32,
        ffn_hidden=11008, vocab=32000, activation="swiglu",
    )


@pytest.fixture
def model() -> mp.Model:
    return llama2_7b()


@pytest.fixture
def cluster() -> mp.Cluster:
    return mp.Cluster("a100-sxm-40g", 8)


@pytest.fixture
def workload() -> mp.Workload:
    return mp.Workload(global_batch=64, seq_len=4096)


@pytest.fixture
def small_space() -> mp.SearchSpace:
    """A space of a few hundred candidates: fast, still with feasible and pruned plans."""
    return mp.SearchSpace(
        max_micro_batch=2, recompute=["none", "full"], zero=[0, 1, 3], schedules=["1f1b"],
    )


@pytest.fixture(scope="module")
def planner() -> Iterator[Any]:
    """A real :class:`~meshplan.server.PlannerServer` on 127.0.0.1, port 0, two workers, shared by
    a test module (test files that need another configuration define their own)."""
    from meshplan.server import PlannerServer, ServerConfig

    server = PlannerServer(ServerConfig(host="127.0.0.1", port=0, workers=2)).start()
    yield server
    server.stop(0).wait()


@pytest.fixture(scope="module")
def planner_client() -> Iterator[Any]:
    """A :class:`~meshplan.client.PlannerClient` on a real server on 127.0.0.1, port 0."""
    from meshplan.client import PlannerClient
    from meshplan.server import PlannerServer, ServerConfig

    server = PlannerServer(ServerConfig(host="127.0.0.1", port=0, workers=2)).start()
    client = PlannerClient(f"127.0.0.1:{server.port}")
    try:
        yield client
    finally:
        client.close()
        server.stop(0)
