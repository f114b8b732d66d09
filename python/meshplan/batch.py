"""``meshplan.search_many``: a batch of searches in one call.

The queries run in parallel in Rust (one binding call, one thread pool, GIL released): several
queries at once and each query's outer tuples over the pool's threads, so a sweep of thousands of
small what-ifs keeps every core busy. The result is one entry per query, **in order**: a
:class:`~meshplan.SearchResult`, or, for a query that failed on its own (a bad model or space, a
space too large, a deadline), the :class:`~meshplan.errors.MeshplanError` it would have raised,
returned in its place rather than raised for the whole batch::

    results = meshplan.search_many([
        meshplan.Query("llama3-70b", meshplan.Cluster("h100-sxm", n), meshplan.Workload(1024, 8192))
        for n in (256, 512, 1024)
    ])
    for r in results:
        if isinstance(r, meshplan.errors.MeshplanError): ...
        else: r.best

Only Ctrl-C (``KeyboardInterrupt``) and an invalid ``threads``/``timeout_s``/``cancel`` raise for
the batch. With ``timeout_s`` or ``cancel``, the queries not finished in time come back as
:class:`~meshplan.errors.DeadlineExceededError` / :class:`~meshplan.errors.CancelledError`.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence, TextIO, Union

from . import _core, errors
from ._core import CancelToken
from ._fields import as_type, invalid, shown
from .api import ModelLike, problem_dict
from .errors import InvalidInputError, MeshplanError
from .hardware import Cluster
from .model import Model
from .report import SearchResult
from .space import SearchSpace
from .workload import Workload


@dataclass
class Query:
    """One search of a batch: what :func:`meshplan.search` takes."""

    model: ModelLike
    cluster: Cluster
    workload: Workload
    space: Optional[SearchSpace] = None

    def __post_init__(self) -> None:
        # Types at once; the values are checked by the objects themselves and the core.
        if not isinstance(self.model, (Model, str, os.PathLike, Mapping)):
            raise _not_a("model", self.model,
                         "a Model, a preset name, a config.json path or a dict")
        for name, cls in (("cluster", Cluster), ("workload", Workload)):
            if not isinstance(getattr(self, name), (cls, Mapping)):
                raise _not_a(name, getattr(self, name), f"a {cls.__name__} or a dict")
        if self.space is not None and not isinstance(self.space, (SearchSpace, Mapping)):
            raise _not_a("space", self.space, "a SearchSpace, a dict or None")


def _not_a(where: str, value: object, allowed: str) -> InvalidInputError:
    return invalid(f"query.{where}", shown(value), allowed)


QueryLike = Union[Query, Sequence[Any]]
"""A :class:`Query`, or a tuple ``(model, cluster, workload[, space])``."""

Outcome = Union[SearchResult, MeshplanError]
"""One entry of :func:`search_many`'s result: the search's result, or its error."""


def _as_query(item: object) -> Query:
    if isinstance(item, Query):
        return item
    if isinstance(item, (tuple, list)) and len(item) in (3, 4):
        return Query(*item)
    raise InvalidInputError(
        f"invalid query: {type(item).__name__} (allowed: a meshplan.Query or a tuple "
        "(model, cluster, workload[, space]))"
    )


def _core_query(item: object) -> tuple[dict[str, Any], Optional[dict[str, Any]]]:
    q = _as_query(item)
    space = as_type(SearchSpace, SearchSpace() if q.space is None else q.space, "space").to_dict()
    return problem_dict(q.model, q.cluster, q.workload), space


def _error(entry: dict[str, Any]) -> MeshplanError:
    cls = getattr(errors, entry["class"], MeshplanError)
    if not (isinstance(cls, type) and issubclass(cls, MeshplanError)):
        cls = MeshplanError
    context = {key: entry.get(key) for key in ("field", "value", "allowed")}
    return cls(entry["message"], **context)


class ProgressBar:
    """``[#####.....]  512/1,000 queries  3.1 s`` redrawn in place on ``stream``."""

    def __init__(self, stream: TextIO, width: int = 30, offset: int = 0) -> None:
        self.stream = stream
        self.width = width
        self.offset = offset
        """Queries already done before the counting starts (added to every report)."""
        self.started = time.monotonic()
        self.last = -1

    def __call__(self, done: int, total: int) -> None:
        done, total = done + self.offset, total + self.offset
        if done == self.last:
            return
        self.last = done
        filled = self.width * done // max(total, 1)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.monotonic() - self.started
        self.stream.write(f"\r[{bar}] {done:,}/{total:,} queries  {elapsed:.1f} s")
        self.stream.flush()

    def close(self, total: int) -> None:
        """Draws the full bar for ``total`` queries and ends the line."""
        self.offset = 0
        self(total, total)
        self.stream.write("\n")
        self.stream.flush()


def _wants_progress(progress: Optional[bool], stream: TextIO) -> bool:
    if progress is not None:
        return progress
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def search_many(
    queries: Iterable[QueryLike],
    threads: Optional[int] = None,
    progress: Optional[bool] = None,
    *,
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
    executor: str = "local",
    ray_address: Optional[str] = None,
    chunk_size: Optional[int] = None,
) -> list[Outcome]:
    """One :func:`meshplan.search` per query, run in parallel in Rust; one entry per query, in
    order: a :class:`~meshplan.SearchResult`, or the query's own
    :class:`~meshplan.errors.MeshplanError` in its place (see the module docs).

    ``threads``: worker threads for the whole batch (default ``MESHPLAN_THREADS``, else every
    core); the results do not depend on it. ``progress``: a bar on stderr; None shows it only
    when stderr is a terminal. ``timeout_s`` bounds the whole batch; ``cancel.cancel()`` stops
    it.

    ``executor="ray"`` sends chunks of ``chunk_size`` queries (default: about four per CPU of
    the cluster) to a Ray cluster at ``ray_address`` (None: the running or a new local Ray;
    ``pip install 'meshplan[ray]'``), with the same results, order and progress bar; a chunk
    whose worker is lost is retried (see :mod:`meshplan.ray_exec`). ``threads`` is then the
    core threads of each chunk (default 1, one Ray CPU per chunk).
    """
    if executor not in ("local", "ray"):
        raise InvalidInputError(f"invalid executor: {shown(executor)} (allowed: local, ray)")
    items = list(queries)
    outcomes: list[Optional[Outcome]] = [None] * len(items)
    core_queries: list[tuple[dict[str, Any], Optional[dict[str, Any]]]] = []
    where: list[int] = []
    for i, item in enumerate(items):
        try:
            core_queries.append(_core_query(item))
            where.append(i)
        except MeshplanError as e:
            outcomes[i] = e
    bar: Optional[ProgressBar] = None
    if _wants_progress(progress, sys.stderr):
        bar = ProgressBar(sys.stderr, offset=len(items) - len(core_queries))
    if executor == "ray":
        from .ray_exec import search_many_ray

        raw = search_many_ray(
            core_queries, threads, timeout_s,
            None if cancel is None else (lambda: cancel.cancelled), bar,
            address=ray_address, chunk_size=chunk_size,
        )
    else:
        raw = _core.search_many(core_queries, threads, timeout_s, cancel, bar)
    if bar is not None:
        bar.close(len(items))
    for i, entry in zip(where, raw):
        outcomes[i] = SearchResult.from_dict(entry["ok"]) if "ok" in entry else _error(entry["error"])
    return [o for o in outcomes if o is not None]


__all__ = ["Query", "QueryLike", "Outcome", "search_many", "ProgressBar"]
