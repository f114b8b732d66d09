"""Sweeps on a Ray cluster: :func:`meshplan.search_many` with ``executor="ray"``.

The queries (already turned into the core's dicts on the caller's machine) are cut into chunks;
each chunk is one Ray task that runs the core's own batch search (``_core.search_many``) on its
worker, so a chunk keeps that worker's cores busy exactly as a local batch does. Results come
back **in order**: chunk *i* is handed on as soon as chunks 0..i are done, and the progress bar
counts finished queries as chunks land. A chunk whose worker dies (the process is killed, the
node goes away) is submitted again, up to ``retries`` times; a chunk is pure computation, so a
rerun gives the same answer.

``pip install 'meshplan[ray]'``. ``address`` is passed to ``ray.init`` (``"auto"``, a
``ray://host:10001`` client address, or None to start a local Ray); an already initialised Ray
is used as it is. The workers need the same meshplan version importable (a shared environment,
or ``runtime_env={"pip": ["meshplan==X"]}`` set by whoever starts the cluster).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional, Sequence

from .errors import InvalidInputError, MeshplanError

DEFAULT_RETRIES = 3
"""Times a chunk is resubmitted after its worker was lost."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MeshplanError("executor='ray' needs Ray: pip install 'meshplan[ray]'") from None
    return ray


def ensure_ray(address: Optional[str] = None) -> Any:
    """The ``ray`` module, initialised (connects to ``address``; None: an existing or a new
    local Ray)."""
    ray = _ray()
    if not ray.is_initialized():
        # A Ray started here listens on the loopback address only.
        local = {"_node_ip_address": "127.0.0.1"} if address is None else {}
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, **local)
    return ray


def search_chunk(
    chunk: Sequence[Any], threads: Optional[int], deadline_unix_s: Optional[float]
) -> list[dict[str, Any]]:
    """One chunk's core batch search, run on a Ray worker (the deadline is wall-clock time)."""
    from . import _core

    timeout_s = None if deadline_unix_s is None else max(0.0, deadline_unix_s - time.time())
    return list(_core.search_many(list(chunk), threads, timeout_s, None, None))


def chunks_of(items: Sequence[Any], size: int) -> list[list[Any]]:
    """``items`` cut into consecutive lists of at most ``size``."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def default_chunk_size(total: int, cpus: int) -> int:
    """About four chunks per CPU of the cluster (load balance), at least one query each and at
    most 256 (so a lost worker costs little)."""
    return max(1, min(256, -(-total // max(1, 4 * cpus))))


def run_ordered(
    fn: Callable[..., list[Any]],
    chunks: Sequence[Sequence[Any]],
    args: tuple[Any, ...] = (),
    *,
    retries: int = DEFAULT_RETRIES,
    on_progress: Optional[Callable[[int], None]] = None,
    is_cancelled: Optional[Callable[[], bool]] = None,
    num_cpus: float = 1,
) -> Iterator[list[Any]]:
    """``fn(chunk, *args)`` for every chunk as Ray tasks; yields the results in chunk order as
    soon as each is available. A chunk whose worker was lost is resubmitted up to ``retries``
    times; any other task error is raised. ``on_progress(n)`` gets the items finished so far;
    ``is_cancelled()`` true stops waiting (the tasks still running are cancelled) and raises
    :class:`~meshplan.errors.CancelledError`."""
    from .errors import CancelledError

    ray = _ray()
    if retries < 0:
        raise InvalidInputError(f"invalid retries: {retries} (allowed: 0 or more)")
    # max_retries=0: the retry is ours, counted per chunk, so that a test can see it happen.
    remote = ray.remote(num_cpus=num_cpus, max_retries=0)(fn)
    lost = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
            ray.exceptions.ActorDiedError, ray.exceptions.LocalRayletDiedError,
            ray.exceptions.OwnerDiedError, ray.exceptions.ObjectLostError)
    pending = {remote.remote(c, *args): i for i, c in enumerate(chunks)}
    attempts = [0] * len(chunks)
    done: dict[int, list[Any]] = {}
    finished_items = 0
    next_out = 0
    try:
        while next_out < len(chunks):
            if is_cancelled is not None and is_cancelled():
                raise CancelledError("the sweep was cancelled")
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    done[i] = ray.get(ref)
                except lost:
                    attempts[i] += 1
                    if attempts[i] > retries:
                        raise MeshplanError(
                            f"chunk {i} lost its Ray worker {attempts[i]} times; giving up"
                        ) from None
                    pending[remote.remote(chunks[i], *args)] = i
                    continue
                finished_items += len(chunks[i])
                if on_progress is not None:
                    on_progress(finished_items)
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)


def search_many_ray(
    core_queries: Sequence[Any],
    threads: Optional[int],
    timeout_s: Optional[float],
    is_cancelled: Optional[Callable[[], bool]],
    progress: Optional[Callable[[int, int], None]],
    *,
    address: Optional[str] = None,
    chunk_size: Optional[int] = None,
    retries: int = DEFAULT_RETRIES,
) -> list[dict[str, Any]]:
    """The core's ``search_many`` entries for ``core_queries``, computed on Ray (in order)."""
    ray = ensure_ray(address)
    if chunk_size is None:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        chunk_size = default_chunk_size(len(core_queries), cpus)
    if chunk_size < 1:
        raise InvalidInputError(f"invalid chunk_size: {chunk_size} (allowed: 1 or more)")
    deadline = None if timeout_s is None else time.time() + timeout_s
    total = len(core_queries)
    # One core thread per task by default: Ray runs one task per CPU it schedules.
    per_task_threads = 1 if threads is None else threads
    out: list[dict[str, Any]] = []
    for part in run_ordered(
        search_chunk, chunks_of(core_queries, chunk_size), (per_task_threads, deadline),
        retries=retries, is_cancelled=is_cancelled,
        on_progress=None if progress is None else (lambda n: progress(n, total)),
        num_cpus=per_task_threads,
    ):
        out.extend(part)
    return out


__all__ = ["search_many_ray", "run_ordered", "ensure_ray", "chunks_of", "default_chunk_size",
           "search_chunk", "DEFAULT_RETRIES"]
