"""What the server tells operations: Prometheus metrics and one structured log line per request.

:class:`RequestLog` writes each planning-service call to the ``meshplan.access`` logger (method,
status, latency, cache hit, peer); :class:`JsonFormatter` turns every log record into one JSON
line (``meshplan serve --log-format json``). :class:`ServerMetrics` keeps the Prometheus series
in a registry of its own and serves them over HTTP (``--metrics-port``, on 127.0.0.1 unless told
otherwise); it needs the ``metrics`` extra (``prometheus_client``).

Series (all prefixed ``meshplan_``):

- ``requests_total{method}``, ``request_duration_seconds{method}`` (histogram),
  ``errors_total{method,code}`` (gRPC status code name);
- ``cache_hits_total``, ``cache_misses_total`` (answers computed), ``cache_shared_total`` (calls
  that waited for an identical call's computation), ``cache_evictions_total``, ``cache_entries``,
  ``cache_bytes``;
- ``planning_calls_running`` (searches, evaluations and explanations in flight) and
  ``planning_calls_waiting`` (queued for a worker or for an identical call's answer).
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

if TYPE_CHECKING:
    from .server_cache import ResponseCache

access_log = logging.getLogger("meshplan.access")
"""One INFO record per call of the planning service."""

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                     10.0, 30.0, 60.0)
"""Upper bounds of the latency histogram, in seconds (1 ms to 1 min)."""


class JsonFormatter(logging.Formatter):
    """A log record as one JSON object per line: ``time`` (RFC 3339, UTC), ``level``,
    ``logger``, ``message`` and, for access records, the request's fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "request", None)
        if isinstance(fields, dict):
            data.update(fields)
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, separators=(",", ":"), default=str)


class RequestLog:
    """Writes one access record per call; cheap when INFO is off for ``meshplan.access``."""

    def __call__(self, method: str, code: str, latency_s: float, cache_hit: bool,
                 peer: str) -> None:
        if not access_log.isEnabledFor(logging.INFO):
            return
        fields = {
            "method": method, "status": code, "latency_ms": round(1e3 * latency_s, 3),
            "cache_hit": cache_hit, "peer": peer,
        }
        access_log.info(
            "%s %s %.1f ms cache=%s peer=%s", method, code, 1e3 * latency_s,
            "hit" if cache_hit else "miss", peer, extra={"request": fields},
        )


def configure_logging(log_format: str) -> None:
    """Sends INFO and above to stderr as ``text`` (``meshplan: INFO name: message``) or as
    ``json`` lines. Replaces the root logger's handlers."""
    if log_format not in ("text", "json"):
        raise ValueError(f"invalid log_format: {log_format!r} (allowed: text, json)")
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("meshplan: %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)


class ServerMetrics:
    """The Prometheus series of one server, in a registry of their own (so that several servers
    in one process do not collide). ``planning`` returns (running, waiting) planning calls;
    ``cache`` is the server's response cache."""

    def __init__(self, planning: Callable[[], tuple[int, int]],
                 cache: Optional[ResponseCache]):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("meshplan_requests", "Calls of the planning service, by method.",
                                ["method"], registry=self.registry)
        self.latency = Histogram(
            "meshplan_request_duration_seconds",
            "Latency of calls of the planning service (in the server), by method.",
            ["method"], buckets=LATENCY_BUCKETS_S, registry=self.registry,
        )
        self.errors = Counter("meshplan_errors", "Calls answered with an error, by method and "
                              "gRPC status code.", ["method", "code"], registry=self.registry)
        self.registry.register(_LiveCollector(planning, cache))
        self._http: Any = None
        self._thread: Any = None

    def __call__(self, method: str, code: str, latency_s: float, cache_hit: bool,
                 peer: str) -> None:
        """Counts one call."""
        self.requests.labels(method).inc()
        self.latency.labels(method).observe(latency_s)
        if code != "OK":
            self.errors.labels(method, code).inc()

    def serve_http(self, host: str, port: int) -> int:
        """Serves ``/metrics`` on ``host:port`` (0 picks a free port) in a daemon thread;
        returns the port bound."""
        from prometheus_client import start_http_server

        self._http, self._thread = start_http_server(port, addr=host, registry=self.registry)
        bound: int = self._http.server_port
        return bound

    def stop_http(self) -> None:
        """Stops serving ``/metrics``."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class _LiveCollector:
    """The series read when scraped: the cache's counters and the planning calls in flight."""

    def __init__(self, planning: Callable[[], tuple[int, int]],
                 cache: Optional[ResponseCache]):
        self.planning = planning
        self.cache = cache

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        running, waiting = self.planning()
        yield GaugeMetricFamily("meshplan_planning_calls_running",
                                "Searches, evaluations and explanations running now.", running)
        yield GaugeMetricFamily("meshplan_planning_calls_waiting",
                                "Planning calls waiting for a worker now.", waiting)
        stats = self.cache.stats() if self.cache is not None else None
        for name, text, value in (
            ("hits", "Answers served from the response cache.", 0 if stats is None else stats.hits),
            ("misses", "Cacheable answers computed afresh.", 0 if stats is None else stats.misses),
            ("shared", "Calls answered by waiting for an identical call's computation.",
             0 if stats is None else stats.shared),
            ("evictions", "Cache entries dropped (size bound or calibration change).",
             0 if stats is None else stats.evictions),
        ):
            yield CounterMetricFamily(f"meshplan_cache_{name}", text, value)
        yield GaugeMetricFamily("meshplan_cache_entries", "Responses in the cache.",
                                0 if stats is None else stats.entries)
        yield GaugeMetricFamily("meshplan_cache_bytes", "Serialised bytes of the cached responses.",
                                0 if stats is None else stats.bytes)


__all__ = ["ServerMetrics", "RequestLog", "JsonFormatter", "configure_logging", "access_log",
           "LATENCY_BUCKETS_S"]
