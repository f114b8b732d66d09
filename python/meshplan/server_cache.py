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


@dataclass
class CacheStats:
    """What the cache has done since it was made."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    entries: int = 0
    bytes: int = 0


class ResponseCache:
    """A least-recently-used map from request keys to response messages, bounded by
    ``max_entries`` and ``max_bytes``. ``max_entries`` 0 disables it (every lookup misses and
    nothing is stored). Safe to use from many threads; the response is computed outside the
    lock, so two identical requests arriving together may both compute it (both answers are the
    same)."""

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
        if size > self.max_bytes:
            return
        with self._lock:
            evicted = 0
            old = self._entries.pop(key, None)
            if old is not None:
                self._stats.bytes -= old[1]
            self._entries[key] = (response, size)
            self._stats.bytes += size
            while len(self._entries) > self.max_entries or self._stats.bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._stats.bytes -= dropped
                evicted += 1
            self._stats.evictions += evicted

    def answer(self, key: bytes, compute: Callable[[], Message]) -> tuple[Message, bool]:
        """The cached response for ``key``, else ``compute()`` stored (when it returns; an
        exception is never cached). Returns (response, whether it was a hit)."""
        if not self.enabled:
            return compute(), False
        cached = self.get(key)
        if cached is not None:
            return cached, True
        response = compute()
        self.put(key, response)
        return response, False

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
            return CacheStats(self._stats.hits, self._stats.misses, self._stats.evictions,
                              len(self._entries), self._stats.bytes)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


__all__ = ["ResponseCache", "CacheStats", "request_key", "DEFAULT_CACHE_ENTRIES",
           "DEFAULT_CACHE_BYTES", "MAX_CACHE_ENTRIES"]
