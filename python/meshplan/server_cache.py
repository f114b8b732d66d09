"""The server's response cache: a bounded, thread-safe LRU of answers to canonicalised requests.

Schedulers ask the same questions again and again; a search is deterministic, so its answer can
be kept. The key of a request is the SHA-256 of a canonical serialisation of what the answer
depends on, with presets *resolved*: the method, the model's full dimensions, the cluster with
its GPU's full descriptor (calibration constants included), the workload, the search space (with
the server's candidate cap) or the plan. So a request that names a preset and one that spells the
same model out share an entry, and a calibration change gives every request a new key (the
server also clears the cache when it reloads its calibration).

Only answers are cached: an error (a deadline, a cancellation, a refusal, bad input) never is.
The cache is bounded by entries and by bytes (the serialised size of the responses it holds);
the least recently used entry goes first.

Single flight: while one call computes the answer of a key, identical calls that arrive wait for
that computation instead of computing it again (counted as ``shared``). How a waiter waits is
the caller's (the server's waits honour each waiter's own deadline and cancellation). When the
computing call fails (its own deadline, cancellation, a refusal), its error is not handed on: a
waiter computes the answer itself.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:  # no protobuf import at run time: the CLI reads the defaults without grpc
    from google.protobuf.message import Message

DEFAULT_CACHE_ENTRIES = 1024
"""Responses kept by default (``meshplan serve --cache-size``)."""
MAX_CACHE_ENTRIES = 1_000_000
"""The largest ``--cache-size``."""
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
"""The most bytes of serialised responses kept (a 10-plan search answer is about 3 KiB)."""


def request_key(method: str, **parts: Any) -> bytes:
    """The cache key of a request: SHA-256 over ``method`` and the JSON of ``parts`` (the
    resolved inputs as plain dicts) with sorted keys and no whitespace."""
    text = json.dumps({"method": method, **parts}, sort_keys=True, separators=(",", ":"),
                      allow_nan=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).digest()


class _Flight:
    """One computation in progress: ``done`` is set when it ends, with ``response`` None when it
    failed."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.response: Optional[Message] = None


@dataclass
class CacheStats:
    """What the cache has done since it was made."""

    hits: int = 0
    """Answers found in the cache."""
    misses: int = 0
    """Answers computed (one per computation, however many identical calls shared it)."""
    shared: int = 0
    """Calls answered by waiting for an identical call's computation (single flight)."""
    evictions: int = 0
    entries: int = 0
    bytes: int = 0


class ResponseCache:
    """A least-recently-used map from request keys to response messages, bounded by
    ``max_entries`` and ``max_bytes``. ``max_entries`` 0 disables it (every lookup misses and
    nothing is stored). Safe to use from many threads; a response is computed outside the lock,
    once for all the identical requests that arrive while it is computed (single flight)."""

    def __init__(self, max_entries: int = DEFAULT_CACHE_ENTRIES,
                 max_bytes: int = DEFAULT_CACHE_BYTES):
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or not (
            0 <= max_entries <= MAX_CACHE_ENTRIES
        ):
            raise ValueError(f"invalid cache_size: {max_entries!r} (allowed: an integer from 0 "
                             f"to {MAX_CACHE_ENTRIES})")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"invalid cache max_bytes: {max_bytes!r} (allowed: >= 0)")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, tuple[Message, int]] = OrderedDict()
        self._flights: dict[bytes, _Flight] = {}
        self._stats = CacheStats()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def get(self, key: bytes) -> Optional[Message]:
        """The response stored under ``key`` (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._stats.misses += 1
            else:
                self._entries.move_to_end(key)
                self._stats.hits += 1
        return None if entry is None else entry[0]

    def put(self, key: bytes, response: Message) -> None:
        """Stores ``response`` under ``key``, evicting the least recently used entries beyond
        the bounds. A response larger than ``max_bytes`` alone is not stored."""
        if not self.enabled:
            return
        size = response.ByteSize()
        with self._lock:
            self._store(key, response, size)

    def _store(self, key: bytes, response: Message, size_bytes: int) -> None:
        """``put`` with the lock held and the size known."""
        if size_bytes > self.max_bytes:
            return
        evicted = 0
        old = self._entries.pop(key, None)
        if old is not None:
            self._stats.bytes -= old[1]
        self._entries[key] = (response, size_bytes)
        self._stats.bytes += size_bytes
        while len(self._entries) > self.max_entries or self._stats.bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self._stats.bytes -= dropped
            evicted += 1
        self._stats.evictions += evicted

    def answer(
        self,
        key: bytes,
        compute: Callable[[], Message],
        wait: Optional[Callable[[threading.Event], None]] = None,
    ) -> tuple[Message, bool]:
        """The cached response for ``key``; else, when an identical call is computing it, that
        call's response; else ``compute()``, stored when it returns (an exception is never
        cached). Returns (response, whether this call was spared the computation).

        ``wait(done)`` blocks until the event ``done`` is set (the computing call ended) or
        raises to give up (a deadline, a cancellation); None: wait as long as it takes. When
        the computing call failed, a waiter computes the answer itself."""
        if not self.enabled:
            return compute(), False
        while True:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
                    self._stats.hits += 1
                    return entry[0], True
                flight = self._flights.get(key)
                leading = flight is None
                if flight is None:
                    flight = self._flights[key] = _Flight()
                    self._stats.misses += 1
            if leading:
                return self._lead(key, flight, compute), False
            if wait is None:
                flight.done.wait()
            else:
                wait(flight.done)
            if flight.response is not None:
                with self._lock:
                    self._stats.shared += 1
                return flight.response, True
            # The computing call failed on its own account: try again (compute, or join
            # another call that started computing meanwhile).

    def _lead(self, key: bytes, flight: _Flight, compute: Callable[[], Message]) -> Message:
        """Computes the answer of ``flight`` and hands it to its waiters."""
        try:
            response = compute()
            size = response.ByteSize()
        except BaseException:
            with self._lock:
                del self._flights[key]
            flight.done.set()
            raise
        with self._lock:
            self._store(key, response, size)
            flight.response = response
            del self._flights[key]
        flight.done.set()
        return response

    def in_flight(self) -> int:
        """Answers being computed now (each shared by every identical call that waits)."""
        with self._lock:
            return len(self._flights)

    def clear(self) -> None:
        """Drops every entry (a calibration change)."""
        with self._lock:
            dropped = len(self._entries)
            self._entries.clear()
            self._stats.bytes = 0
            self._stats.evictions += dropped

    def stats(self) -> CacheStats:
        """A snapshot of the counters."""
        with self._lock:
            return CacheStats(self._stats.hits, self._stats.misses, self._stats.shared,
                              self._stats.evictions, len(self._entries), self._stats.bytes)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


__all__ = ["ResponseCache", "CacheStats", "request_key", "DEFAULT_CACHE_ENTRIES",
           "DEFAULT_CACHE_BYTES", "MAX_CACHE_ENTRIES"]
