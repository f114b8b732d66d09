"""The gRPC planning service ``meshplan.v1.Planner`` (``meshplan serve``).

Each method is a thin adapter: message → typed objects (:mod:`meshplan.wire`) → the same
``meshplan.search`` / ``evaluate`` / ``explain`` a local caller uses → message. The core releases
the GIL, so planning calls run in parallel. ``Explain`` answers with :func:`meshplan.explain`'s
structure as real messages.

- **Planning work has its own capacity.** At most ``workers`` planning calls (Search, Evaluate,
  Explain) run at once and at most ``queue`` more wait for one (:class:`PlanningGate`); beyond
  that a call gets ``RESOURCE_EXHAUSTED`` at once. gRPC's thread pool holds threads beyond those,
  so health checks, ``ListPresets`` and reflection never wait behind planning work.
- **Deadlines and cancellation.** Every planning call gets the call's remaining time as the
  core's ``timeout_s``, and a :class:`~meshplan.CancelToken` that ``context.add_callback``
  cancels when the call ends early (client cancel, deadline, disconnect, shutdown): the core
  stops, the worker is free again. Time spent waiting for a worker counts against the deadline.
- **Errors.** :data:`meshplan.wire.STATUS_CODES` is the one table from ``meshplan.errors`` to
  status codes; anything else is ``INTERNAL`` and logged with its traceback. A request that is not
  even a valid protobuf message is ``INVALID_ARGUMENT``. Messages are one line, and echo at most
  a bounded prefix of any value (:func:`meshplan.wire.bounded_message`). Each error also carries
  ``google.rpc`` details: an ``ErrorInfo`` (domain ``meshplan``, reason the error class) and, for
  a bad field, a ``BadRequest`` field violation naming it.
- **Response size.** A response larger than ``max_response_bytes`` (default 4 MiB, gRPC's
  default receive limit), or than the client's own limit when it sends one as
  ``meshplan-max-response-bytes`` metadata, is refused with ``RESOURCE_EXHAUSTED`` naming the
  cap — before the search runs where the size can be told from the request (``space.top_k``).
- **Auth.** With a token, every call but health checks needs ``authorization: Bearer <token>``
  metadata, else ``UNAUTHENTICATED``; with a certificate and key, the port speaks TLS.
- **Health and reflection** are always on (``grpc.health.v1``, server reflection).
- **Cache.** Answers to Search, Evaluate and Explain are kept in a bounded LRU
  (:mod:`meshplan.server_cache`) keyed by the canonicalised request with presets and calibration
  resolved; errors (deadlines, cancellations, refusals) are never cached. Identical calls that
  arrive while one computes the answer wait for it (single flight; counted by the gate as waiting,
  each within its own deadline) instead of computing it again.
- **Calibration.** ``calibration`` (a TOML or JSON file, as ``--calibration`` elsewhere) is
  applied to every GPU a request names; :meth:`PlannerServicer.set_calibration` (SIGHUP under
  :func:`serve`) reloads it and clears the cache.
- **Operations.** Every call is counted in Prometheus series (``metrics_port``;
  :mod:`meshplan.server_metrics`) and logged as one ``meshplan.access`` record (method, status,
  latency, cache hit, peer), as text or JSON lines.
- **Shutdown.** :meth:`PlannerServer.stop` (and SIGTERM/SIGINT under :func:`serve`) sets every
  health status to NOT_SERVING, refuses new calls and lets in-flight ones finish within the grace
  period; when it ends, the calls still running are cancelled in the core, so the process exits
  within a second of it.
"""

from __future__ import annotations

import functools
import hmac
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Optional, TextIO, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from . import _core, serving_wire, wire
from ._core import CancelToken
from .api import evaluate, search
from .errors import CancelledError, DeadlineExceededError, InvalidInputError, MeshplanError
from .explain import explain
from .hardware import Cluster, Gpu, calibration_notes
from .server_cache import DEFAULT_CACHE_ENTRIES, MAX_CACHE_ENTRIES, ResponseCache, request_key
from .server_metrics import RequestLog, ServerMetrics, configure_logging
from .validation import CalibrationLike, calibrated
from .workload import Workload
from .v1 import planner_pb2 as pb
from .v1 import planner_pb2_grpc as pb_grpc

SERVICE = pb.DESCRIPTOR.services_by_name["Planner"].full_name
"""``meshplan.v1.Planner``."""

RESERVED_THREADS = 8
"""gRPC threads beyond the planning calls' (``workers + queue``): health checks, ListPresets,
reflection and the immediate refusals of calls beyond the queue run on these."""
MAX_STREAMS = 4
"""Streaming calls (server reflection) open at once; more get RESOURCE_EXHAUSTED, so that idle
streams cannot take the reserved threads."""
DEFAULT_MAX_RESPONSE_BYTES = wire.DEFAULT_MAX_MESSAGE_BYTES
"""gRPC's default limit on a message a client receives."""
SEARCH_BYTES_PER_PLAN = 512
"""An upper bound of one ranked plan in a ``SearchResponse`` (about 250 bytes measured)."""
SEARCH_BYTES_FIXED = 4096
"""An upper bound of a ``SearchResponse`` without its plans (the stats)."""
SERVING_BYTES_PER_PLAN = 2048
"""An upper estimate of one serving deployment's message (its figures and ``extra_json``)."""

log = logging.getLogger("meshplan.server")

Observer = Callable[[str, str, float, bool, str], None]
"""Told of every Planner call: (method, status code name, latency in s, cache hit, peer)."""

SHARED_POLL_S = 0.02
"""How often a call waiting for an identical call's answer looks at its deadline, cancellation
and the server's shutdown."""

_call = threading.local()
"""Per call (one thread each): ``cache_hit``, set by the servicer when the answer was cached."""

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


class Refusal(Exception):
    """A call the server refuses on its own account (busy, shutting down, response too large),
    with the status code it is sent as."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str):
        super().__init__(message)
        self.code = code
        self.reason = reason
        """The ``google.rpc.ErrorInfo.reason`` sent with it (``SERVER_BUSY``, ...)."""


class PlanningGate:
    """Admits planning calls: at most ``workers`` run at once, at most ``queue`` more wait for a
    slot (first come, roughly first served); a call beyond those is refused at once, so planning
    work never holds more than ``workers + queue`` of the server's threads. A waiting call gives
    up when its deadline passes or its cancel token is cancelled; :meth:`close` cancels every
    call, running or waiting."""

    def __init__(self, workers: int, queue: int):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if queue < 0:
            raise ValueError(f"queue must be >= 0, got {queue}")
        self.workers = workers
        self.queue = queue
        self._cond = threading.Condition()
        self._running: list[CancelToken] = []
        self._waiting: list[CancelToken] = []
        self._closed = False

    def counts(self) -> tuple[int, int]:
        """(calls running, calls waiting)."""
        with self._cond:
            return len(self._running), len(self._waiting)

    @property
    def busy(self) -> int:
        """Calls running or waiting."""
        with self._cond:
            return len(self._running) + len(self._waiting)

    @contextmanager
    def slot(self, cancel: CancelToken, deadline: Optional[float]) -> Iterator[None]:
        """Holds a slot while the block runs. ``deadline`` is a ``time.monotonic()`` instant
        (None: none). Raises :class:`Refusal` (busy, shutting down),
        :class:`~meshplan.errors.DeadlineExceededError` or
        :class:`~meshplan.errors.CancelledError` instead of waiting on."""
        with self._cond:
            self._check_open()
            self._refuse_if_full()
            self._waiting.append(cancel)
            try:
                while len(self._running) >= self.workers:
                    self._check_open()
                    if cancel.cancelled:
                        raise CancelledError("call cancelled while waiting for a worker")
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise DeadlineExceededError(
                            f"deadline exceeded while waiting for a worker ({self.workers} "
                            "planning calls running)"
                        )
                    self._cond.wait(left)
            finally:
                self._waiting.remove(cancel)
            self._running.append(cancel)
        try:
            yield
        finally:
            with self._cond:
                self._running.remove(cancel)
                self._cond.notify_all()

    @contextmanager
    def sharing(self, cancel: CancelToken) -> Iterator[None]:
        """Counts a call that waits for an identical call's answer (single flight) as waiting,
        so that such calls hold no more threads than the queue allows: refused like
        :meth:`slot` when the queue is full; cancelled by :meth:`close`."""
        with self._cond:
            self._check_open()
            self._refuse_if_full()
            self._waiting.append(cancel)
        try:
            yield
        finally:
            with self._cond:
                self._waiting.remove(cancel)
                self._cond.notify_all()

    def check_open(self) -> None:
        """Raises :class:`Refusal` (``UNAVAILABLE``) once the gate is closed."""
        self._check_open()

    def _refuse_if_full(self) -> None:
        """Raises :class:`Refusal` (``RESOURCE_EXHAUSTED``) when every worker runs and the queue
        is full (the condition's lock held)."""
        if len(self._running) >= self.workers and len(self._waiting) >= self.queue:
            raise Refusal(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"server busy: {len(self._running)} planning calls running and "
                f"{len(self._waiting)} waiting (--workers {self.workers}, --queue "
                f"{self.queue}); try again later",
                "SERVER_BUSY",
            )

    def _check_open(self) -> None:
        if self._closed:
            raise Refusal(grpc.StatusCode.UNAVAILABLE, "the server is shutting down",
                          "SHUTTING_DOWN")

    def wake(self) -> None:
        """Lets waiting calls look at their cancel tokens again (a call was cancelled)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Refuses every new call and cancels every running and waiting one."""
        with self._cond:
            self._closed = True
            for token in self._running + self._waiting:
                token.cancel()
            self._cond.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Blocks until no call runs or waits; False when ``timeout_s`` passed first."""
        until = time.monotonic() + timeout_s
        with self._cond:
            while self._running or self._waiting:
                left = until - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True


class PlannerServicer(pb_grpc.PlannerServicer):
    """``meshplan.v1.Planner`` over the Python API. ``max_candidates`` caps every search space
    (larger spaces get ``RESOURCE_EXHAUSTED``); ``threads`` is each search's core thread count
    (None: ``MESHPLAN_THREADS``, else every core); ``gate`` admits the planning calls (default:
    4 at once, 64 waiting); ``max_response_bytes`` caps every response; ``cache`` keeps answers
    (None: none); ``calibration`` overrides the GPUs' calibration constants."""

    def __init__(
        self,
        *,
        max_candidates: Optional[int] = None,
        threads: Optional[int] = None,
        gate: Optional[PlanningGate] = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        cache: Optional[ResponseCache] = None,
        calibration: Optional[CalibrationLike] = None,
    ):
        self.max_candidates = max_candidates
        self.threads = threads
        self.gate = gate if gate is not None else PlanningGate(4, 64)
        self.max_response_bytes = max_response_bytes
        self.cache = cache if cache is not None else ResponseCache(0)
        self.observers: list[Observer] = []
        """Told of every call (metrics, access log)."""
        self._gpus: dict[str, Gpu] = {}
        self.set_calibration(calibration)

    def set_calibration(self, calibration: Optional[CalibrationLike]) -> None:
        """Applies ``calibration`` (None: the presets' own constants) to every GPU preset and
        clears the cache. Raises :class:`~meshplan.errors.InvalidInputError` naming a bad
        field; the previous calibration then stays."""
        gpus = {}
        for name in Gpu.presets():
            gpu = Gpu.preset(name)
            if calibration is not None:
                gpu = calibrated(Cluster(gpu, 1), calibration).resolved_gpu()
            gpus[name] = gpu
        self._gpus = gpus
        self.cache.clear()

    def cluster_of(self, msg: pb.Cluster) -> Cluster:
        """The cluster of a request, its GPU calibrated."""
        cluster = wire.cluster_from(msg)
        gpu = self._gpus.get(cluster.resolved_gpu().name)
        return cluster if gpu is None else Cluster(gpu, cluster.num_gpus,
                                                  cluster.gpus_per_node, cluster.nvlink_domain)

    def cached(self, key: bytes, compute: Callable[[], Resp],
               context: grpc.ServicerContext) -> Resp:
        """The cached answer of ``key``; else the answer of an identical call computing it now
        (waited for within this call's deadline); else ``compute()`` (kept when it returns)."""

        def wait(done: threading.Event) -> None:
            self.wait_for_identical(done, context)

        response, hit = self.cache.answer(key, compute, wait)
        _call.cache_hit = hit
        return response  # type: ignore[return-value]

    def wait_for_identical(self, done: threading.Event, context: grpc.ServicerContext) -> None:
        """Blocks until ``done`` is set (an identical call's computation ended), counted by the
        gate as a waiting call. Raises :class:`~meshplan.errors.DeadlineExceededError` when this
        call's deadline passes first, :class:`~meshplan.errors.CancelledError` when it is
        cancelled, :class:`Refusal` when the server shuts down."""
        cancel = CancelToken()
        if not context.add_callback(cancel.cancel):
            cancel.cancel()  # the call ended before it could wait
        remaining = wire.remaining_s(context.time_remaining())
        deadline = None if remaining is None else time.monotonic() + remaining
        with self.gate.sharing(cancel):
            while not done.wait(SHARED_POLL_S if deadline is None else
                                max(0.0, min(SHARED_POLL_S, deadline - time.monotonic()))):
                self.gate.check_open()
                if cancel.cancelled:
                    raise CancelledError("call cancelled while waiting for an identical call's "
                                         "answer")
                if deadline is not None and time.monotonic() >= deadline:
                    raise DeadlineExceededError("deadline exceeded while waiting for an "
                                                "identical call's answer")

    @contextmanager
    def planning(
        self, context: grpc.ServicerContext
    ) -> Iterator[tuple[CancelToken, Optional[float]]]:
        """A slot of the gate for one planning call: yields its cancel token (cancelled when
        the call ends early) and the core's ``timeout_s`` (the call's remaining time)."""
        cancel = CancelToken()

        def ended() -> None:
            cancel.cancel()
            self.gate.wake()

        if not context.add_callback(ended):
            cancel.cancel()  # the call ended before it could start
        remaining = wire.remaining_s(context.time_remaining())
        deadline = None if remaining is None else time.monotonic() + remaining
        with self.gate.slot(cancel, deadline):
            yield cancel, wire.remaining_s(context.time_remaining())

    def Search(self, request: pb.SearchRequest, context: grpc.ServicerContext) -> pb.SearchResponse:
        model = wire.model_from(request.model)
        cluster = self.cluster_of(request.cluster)
        workload = wire.workload_from(request.workload)
        space = wire.space_from(request.space, self.max_candidates)
        top_k = int(space.to_dict()["top_k"])
        estimate = SEARCH_BYTES_FIXED + SEARCH_BYTES_PER_PLAN * top_k
        cap, whose = self.response_cap(context)
        if estimate > cap:
            raise _too_large(f"space.top_k = {top_k:,} plans may take up to {estimate:,} bytes",
                             cap, whose, "ask for fewer plans (space.top_k)")

        def compute() -> pb.SearchResponse:
            with self.planning(context) as (cancel, timeout_s):
                result = search(model, cluster, workload, space, threads=self.threads,
                                timeout_s=timeout_s, cancel=cancel)
                response = wire.search_response(result)
                response.notes.extend(_notes(cluster, workload))
                return response

        key = request_key("Search", model=model.to_dict(), cluster=cluster.to_dict(),
                          workload=workload.to_dict(), space=space.to_dict())
        return self.cached(key, compute, context)

    def Evaluate(
        self, request: pb.EvaluateRequest, context: grpc.ServicerContext
    ) -> pb.EvaluateResponse:
        model = wire.model_from(request.model)
        cluster = self.cluster_of(request.cluster)
        workload = wire.workload_from(request.workload)
        plan = wire.plan_from(request.plan)

        def compute() -> pb.EvaluateResponse:
            with self.planning(context) as (cancel, timeout_s):
                ev = evaluate(model, cluster, workload, plan, timeout_s=timeout_s, cancel=cancel)
                return pb.EvaluateResponse(
                    evaluation=wire.evaluation_message(ev),
                    notes=_notes(cluster, workload),
                )

        key = request_key("Evaluate", model=model.to_dict(), cluster=cluster.to_dict(),
                          workload=workload.to_dict(), plan=plan.to_dict())
        return self.cached(key, compute, context)

    def Explain(
        self, request: pb.ExplainRequest, context: grpc.ServicerContext
    ) -> pb.ExplainResponse:
        model = wire.model_from(request.model)
        cluster = self.cluster_of(request.cluster)
        workload = wire.workload_from(request.workload)
        plan = wire.plan_from(request.plan)

        def compute() -> pb.ExplainResponse:
            with self.planning(context) as (cancel, timeout_s):
                x = explain(model, cluster, workload, plan, timeout_s=timeout_s, cancel=cancel)
                response = wire.explain_response(x)
                response.notes.extend(_notes(cluster, workload))
                return response

        key = request_key("Explain", model=model.to_dict(), cluster=cluster.to_dict(),
                          workload=workload.to_dict(), plan=plan.to_dict())
        return self.cached(key, compute, context)

    def ListPresets(
        self, request: pb.ListPresetsRequest, context: grpc.ServicerContext
    ) -> pb.ListPresetsResponse:
        return _presets()

    def SearchServing(
        self, request: pb.SearchServingRequest, context: grpc.ServicerContext
    ) -> pb.SearchServingResponse:
        problem = serving_wire.problem_from(request.problem, self.cluster_of(request.problem.cluster))
        space = serving_wire.space_from(request.space, self.max_candidates)
        top_k = int(space.get("top_k", 10))
        # Each deployment appears in the ranking and maybe on the front.
        estimate = SEARCH_BYTES_FIXED + 2 * SERVING_BYTES_PER_PLAN * top_k
        cap, whose = self.response_cap(context)
        if estimate > cap:
            raise _too_large(f"serving_space.top_k = {top_k:,} deployments may take up to "
                             f"{estimate:,} bytes", cap, whose, "ask for fewer (serving_space.top_k)")

        def compute() -> pb.SearchServingResponse:
            with self.planning(context) as (cancel, timeout_s):
                raw = _core.search_serving(problem, space, timeout_s, cancel)
                return serving_wire.search_response(raw)

        key = request_key("SearchServing", problem=problem, space=space)
        return self.cached(key, compute, context)

    def EvaluateServing(
        self, request: pb.EvaluateServingRequest, context: grpc.ServicerContext
    ) -> pb.EvaluateServingResponse:
        problem = serving_wire.problem_from(request.problem, self.cluster_of(request.problem.cluster))
        plan = serving_wire.plan_from(request.plan)

        def compute() -> pb.EvaluateServingResponse:
            with self.planning(context) as (cancel, timeout_s):
                ev = _core.evaluate_serving(problem, plan, timeout_s, cancel)
                return pb.EvaluateServingResponse(evaluation=serving_wire.evaluation_message(ev))

        key = request_key("EvaluateServing", problem=problem, plan=plan)
        return self.cached(key, compute, context)

    def ExplainServing(
        self, request: pb.ExplainServingRequest, context: grpc.ServicerContext
    ) -> pb.ExplainServingResponse:
        problem = serving_wire.problem_from(request.problem, self.cluster_of(request.problem.cluster))
        plan = serving_wire.plan_from(request.plan)

        def compute() -> pb.ExplainServingResponse:
            with self.planning(context) as (cancel, timeout_s):
                raw = _core.explain_serving(problem, plan, timeout_s, cancel)
                return serving_wire.explain_response(raw)

        key = request_key("ExplainServing", problem=problem, plan=plan)
        return self.cached(key, compute, context)

    def response_cap(self, context: grpc.ServicerContext) -> tuple[int, str]:
        """The largest response this call may get, and whose limit it is: the server's
        :attr:`max_response_bytes`, or the client's own receive limit when it sent a smaller
        one as ``meshplan-max-response-bytes`` metadata (as :class:`~meshplan.client.
        PlannerClient` does)."""
        cap = (self.max_response_bytes, "this server's cap (--max-response-bytes)")
        for key, value in context.invocation_metadata() or ():
            if key == wire.CLIENT_LIMIT_KEY:
                text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
                number = int(text) if text.isascii() and text.isdigit() and len(text) < 20 else 0
                if MIN_RESPONSE_BYTES <= number < cap[0]:
                    cap = (number, f"the client's receive limit ({wire.CLIENT_LIMIT_KEY})")
        return cap

    def checked_size(self, response: Message, context: grpc.ServicerContext) -> bytes:
        """The serialized ``response``; one over :meth:`response_cap` is refused."""
        size = response.ByteSize()
        cap, whose = self.response_cap(context)
        if size > cap:
            raise _too_large(f"the response has {size:,} bytes", cap, whose,
                             "constrain the request")
        return response.SerializeToString()


MIN_RESPONSE_BYTES = 1024
"""The smallest response cap a server or a client may set."""


def _notes(cluster: Cluster, workload: Workload) -> list[str]:
    """The answer's notes: what it rests on that the caller should know
    (:func:`meshplan.hardware.calibration_notes` of the cluster's GPU at the workload's
    precision)."""
    return calibration_notes(cluster.resolved_gpu(), workload.precision)


def _too_large(what: str, cap: int, whose: str, advice: str) -> Refusal:
    return Refusal(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"response too large: {what}, more than {whose} of {cap:,} bytes; {advice}",
        "RESPONSE_TOO_LARGE",
    )


@functools.lru_cache(maxsize=1)
def _presets() -> pb.ListPresetsResponse:
    # The presets are built into the package: one answer for the life of the process.
    return wire.presets_response()


def error_status(code: grpc.StatusCode, message: str, reason: str,
                 field: Optional[str] = None) -> grpc.Status:
    """A status with ``google.rpc`` details: an ``ErrorInfo`` (domain ``meshplan``, ``reason``)
    and, when ``field`` is given, a ``BadRequest`` with one field violation."""
    status = status_pb2.Status(code=code.value[0], message=message)
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason=reason, domain=wire.ERROR_DOMAIN))
    if field:
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=wire.bounded_message(field), description=message
        )
        status.details.add().Pack(error_details_pb2.BadRequest(field_violations=[violation]))
    return rpc_status.to_status(status)


def _status_of(error: Exception, method: str) -> grpc.Status:
    """The status an exception of a call is sent as (see the module docs)."""
    if isinstance(error, Refusal):
        return error_status(error.code, wire.bounded_message(str(error)), error.reason)
    code = wire.status_code(error)
    message = " ".join(str(error).split()) or type(error).__name__
    if code == grpc.StatusCode.INTERNAL:
        log.error("internal error in %s", method, exc_info=error)
        message = f"internal error: {type(error).__name__}: {message}"
    field = getattr(error, "field", None)
    return error_status(
        code,
        wire.bounded_message(message),
        "INTERNAL" if code == grpc.StatusCode.INTERNAL else wire.error_reason(type(error)),
        field if code == grpc.StatusCode.INVALID_ARGUMENT and isinstance(field, str) else None,
    )


def _unary(
    method_name: str,
    method: Callable[[Req, grpc.ServicerContext], Resp],
    request_type: type[Req],
    servicer: PlannerServicer,
) -> grpc.RpcMethodHandler[Any, Any]:
    """The handler of one method: parses the request itself (so that bytes that are not a
    message get INVALID_ARGUMENT rather than gRPC's INTERNAL), serializes the response under the
    size cap, maps errors by the table, and tells the servicer's observers."""
    name = request_type.DESCRIPTOR.full_name

    def behaviour(data: bytes, context: grpc.ServicerContext) -> bytes:
        began = time.monotonic()
        _call.cache_hit = False
        code = "OK"
        try:
            try:
                request = request_type.FromString(data)
            except DecodeError as e:
                raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                              f"invalid request: not a {name} ({e})",
                              wire.error_reason(InvalidInputError)) from None
            return servicer.checked_size(method(request, context), context)
        except Exception as e:  # noqa: BLE001 - the table decides; INTERNAL is the fallback
            status = _status_of(e, name)
            code = status.code.name
            context.abort_with_status(status)
            raise  # abort_with_status raises; this line is for the type checker
        finally:
            if servicer.observers:
                took_s, hit, peer = time.monotonic() - began, bool(_call.cache_hit), context.peer()
                for observe in servicer.observers:
                    observe(method_name, code, took_s, hit, peer)

    return grpc.unary_unary_rpc_method_handler(
        behaviour, request_deserializer=None, response_serializer=None
    )


def _handlers(servicer: PlannerServicer) -> grpc.GenericRpcHandler:
    service = pb.DESCRIPTOR.services_by_name["Planner"]
    methods: dict[str, Any] = {
        "Search": (servicer.Search, pb.SearchRequest),
        "Evaluate": (servicer.Evaluate, pb.EvaluateRequest),
        "Explain": (servicer.Explain, pb.ExplainRequest),
        "ListPresets": (servicer.ListPresets, pb.ListPresetsRequest),
        "SearchServing": (servicer.SearchServing, pb.SearchServingRequest),
        "EvaluateServing": (servicer.EvaluateServing, pb.EvaluateServingRequest),
        "ExplainServing": (servicer.ExplainServing, pb.ExplainServingRequest),
    }
    # A method the proto declares but this table lacks is a bug caught here, at start-up.
    assert set(methods) == {m.name for m in service.methods}, "Planner methods out of date"
    return grpc.method_handlers_generic_handler(
        SERVICE, {name: _unary(name, fn, req, servicer) for name, (fn, req) in methods.items()}
    )


if TYPE_CHECKING:
    Continuation = Callable[
        [grpc.HandlerCallDetails], Optional[grpc.RpcMethodHandler[Any, Any]]
    ]


class TokenAuth(grpc.ServerInterceptor):
    """Requires ``authorization: Bearer <token>`` on every call except health checks (so that
    probes need no secret); anything else gets ``UNAUTHENTICATED``."""

    def __init__(self, token: str):
        if not token:
            raise ValueError("the token is empty")
        self._expected = f"Bearer {token}".encode()

        def deny(request: bytes, context: grpc.ServicerContext) -> bytes:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

        self._deny: grpc.RpcMethodHandler[Any, Any] = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Optional[grpc.RpcMethodHandler[Any, Any]]:
        if handler_call_details.method.startswith("/grpc.health.v1.Health/"):
            return continuation(handler_call_details)
        for key, value in handler_call_details.invocation_metadata or ():
            given = value.encode() if isinstance(value, str) else value
            if key == "authorization" and hmac.compare_digest(given, self._expected):
                return continuation(handler_call_details)
        return self._deny


class StreamLimit(grpc.ServerInterceptor):
    """At most ``limit`` bidirectional streams (server reflection) open at once: each holds a
    thread while open, so idle ones must not take the threads health checks rely on. A stream
    beyond the limit gets ``RESOURCE_EXHAUSTED``."""

    def __init__(self, limit: int):
        self.limit = limit
        self._open = 0
        self._lock = threading.Lock()

    def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> Optional[grpc.RpcMethodHandler[Any, Any]]:
        handler = continuation(handler_call_details)
        if handler is None or handler.stream_stream is None:
            return handler
        inner = handler.stream_stream

        def behaviour(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            with self._lock:
                admitted = self._open < self.limit
                if admitted:
                    self._open += 1
            if not admitted:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"too many open streams (at most {self.limit}); close one and retry")
            try:
                yield from inner(requests, context)
            finally:
                with self._lock:
                    self._open -= 1

        return grpc.stream_stream_rpc_method_handler(
            behaviour,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


@dataclass
class ServerConfig:
    """How :class:`PlannerServer` listens and limits work (the flags of ``meshplan serve``)."""

    host: str = "127.0.0.1"
    port: int = 50051
    """0 picks a free port (see :attr:`PlannerServer.port`)."""
    workers: int = max(4, os.cpu_count() or 1)
    """Planning calls (Search, Evaluate, Explain) served at once."""
    queue: int = 64
    """Planning calls that may wait for a worker; more get RESOURCE_EXHAUSTED at once."""
    threads: Optional[int] = None
    """Core threads per planning call (None: ``MESHPLAN_THREADS`` when set; else 1 when
    ``workers`` >= the cores, so that calls running side by side do not oversubscribe the
    machine, and every core otherwise; see :func:`planning_threads` and docs/grpc.md)."""
    max_candidates: Optional[int] = None
    """Search-space cap: larger spaces get RESOURCE_EXHAUSTED (None: no cap)."""
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    """Largest response built: larger ones get RESOURCE_EXHAUSTED naming this cap."""
    token: Optional[str] = None
    """Bearer token every call but health checks must carry (None: no auth)."""
    tls_cert: Optional[bytes] = None
    """PEM certificate chain; with ``tls_key``, the port speaks TLS."""
    tls_key: Optional[bytes] = None
    grace_s: float = 10.0
    """How long in-flight calls may run on after :meth:`PlannerServer.stop`; then they are
    cancelled."""
    cache_size: int = DEFAULT_CACHE_ENTRIES
    """Answers kept in the response cache (0: no cache)."""
    calibration: Optional[CalibrationLike] = None
    """Calibration overrides applied to every GPU (a TOML/JSON path or a mapping)."""
    metrics_port: Optional[int] = None
    """Serve Prometheus metrics over HTTP on this port (0: a free one; None: no metrics)."""
    metrics_host: str = "127.0.0.1"
    """Address of the metrics endpoint."""


def planning_threads(config: ServerConfig) -> Optional[int]:
    """Core threads each planning call runs on: ``config.threads`` when given; None (the core
    reads ``MESHPLAN_THREADS``, else takes every core) when that variable is set or when fewer
    workers than cores run; else 1. With ``workers`` >= the cores, calls already run side by
    side, and each taking every core only oversubscribes the machine: on 2 cores, 16 clients of
    the realistic mix see p99 56-82 ms with 1 thread per call against 72-103 ms with every core
    (docs/grpc.md). The thread count never changes an answer, only its speed."""
    if config.threads is not None:
        return config.threads
    if os.environ.get("MESHPLAN_THREADS"):
        return None
    return 1 if config.workers >= (os.cpu_count() or 1) else None


SERVER_LIMITS = {
    "port": (0, 65535),
    "workers": (1, 1024),
    "queue": (0, 65536),
    "max_response_bytes": (MIN_RESPONSE_BYTES, 2**31 - 1),
    "cache_size": (0, MAX_CACHE_ENTRIES),
    "metrics_port": (0, 65535),
}
"""The allowed range of each integer of :class:`ServerConfig` (gRPC takes message sizes as
32-bit integers); ``metrics_port`` may also be None (no metrics)."""


def _check(config: ServerConfig) -> None:
    """Raises ``ValueError`` naming the first setting out of range."""
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ValueError("TLS needs both a certificate and a key")
    for name, (lo, hi) in SERVER_LIMITS.items():
        value = getattr(config, name)
        if value is None and name == "metrics_port":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"invalid {name}: {value!r} (allowed: an integer from {lo} to {hi})")
    grace = config.grace_s
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace <= 86400:
        raise ValueError(f"invalid grace_s: {grace!r} (allowed: 0 to 86400 seconds)")


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class PlannerServer:
    """A running ``meshplan.v1.Planner`` with health checking and reflection.

    >>> server = PlannerServer(ServerConfig(port=0)).start()  # doctest: +SKIP
    >>> server.port  # doctest: +SKIP
    >>> server.stop()  # doctest: +SKIP
    """

    def __init__(self, config: ServerConfig):
        _check(config)
        self.config = config
        self.gate = PlanningGate(config.workers, config.queue)
        interceptors: list[grpc.ServerInterceptor] = []
        if config.token is not None:
            interceptors.append(TokenAuth(config.token))
        interceptors.append(StreamLimit(MAX_STREAMS))
        # Planning calls hold at most workers + queue threads (the gate refuses the rest at
        # once); the threads beyond are there for health checks, presets and reflection.
        threads = config.workers + config.queue + MAX_STREAMS + RESERVED_THREADS
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix="meshplan-rpc"),
            interceptors=interceptors,
            options=[
                # Never share the port with another process (a second server would steal calls).
                ("grpc.so_reuseport", 0),
                # The Planner's responses are checked against the cap before they are sent;
                # this also bounds health and reflection, which must fit whatever the cap.
                ("grpc.max_send_message_length",
                 max(config.max_response_bytes, DEFAULT_MAX_RESPONSE_BYTES)),
            ],
            # Calls beyond this many at once (of any kind) are refused before they take memory.
            maximum_concurrent_rpcs=threads + 256,
        )
        self.cache = ResponseCache(config.cache_size)
        self.servicer = PlannerServicer(
            max_candidates=config.max_candidates, threads=planning_threads(config), gate=self.gate,
            max_response_bytes=config.max_response_bytes, cache=self.cache,
            calibration=config.calibration,
        )
        self.servicer.observers.append(RequestLog())
        self.metrics: Optional[ServerMetrics] = None
        """The Prometheus series (when ``config.metrics_port`` is set)."""
        self.metrics_port: Optional[int] = None
        """The metrics endpoint's port as bound, once started."""
        if config.metrics_port is not None:
            self.metrics = ServerMetrics(self.gate.counts, self.cache)
            self.servicer.observers.append(self.metrics)
        self._server.add_generic_rpc_handlers((_handlers(self.servicer),))
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server
        )
        address = _address(config.host, config.port)
        if config.tls_cert is not None and config.tls_key is not None:
            credentials = grpc.ssl_server_credentials([(config.tls_key, config.tls_cert)])
            self.port = self._server.add_secure_port(address, credentials)
        else:
            self.port = self._server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"cannot listen on {address}")
        self.address = _address(config.host, self.port)
        """``host:port`` as bound (the real port when ``config.port`` was 0)."""

    def start(self) -> PlannerServer:
        if self.metrics is not None and self.config.metrics_port is not None:
            self.metrics_port = self.metrics.serve_http(self.config.metrics_host,
                                                        self.config.metrics_port)
        self._server.start()
        serving = health_pb2.HealthCheckResponse.SERVING
        for name in ("", SERVICE):
            self.health.set(name, serving)
        return self

    def stop(self, grace_s: Optional[float] = None) -> threading.Event:
        """Health → NOT_SERVING, refuse new calls, let in-flight ones finish for ``grace_s``
        (default: the config's), then cancel what is left, in gRPC and in the core. Returns an
        event set when gRPC has stopped; :meth:`drain` waits for the core to let go."""
        grace = self.config.grace_s if grace_s is None else grace_s
        self.health.enter_graceful_shutdown()
        done = self._server.stop(grace)
        if grace > 0:
            timer = threading.Timer(grace, self.gate.close)
            timer.daemon = True
            timer.start()
        else:
            self.gate.close()
        if self.metrics is not None:
            # Its HTTP loop takes up to half a second to notice: not on the shutdown path.
            threading.Thread(target=self.metrics.stop_http, daemon=True).start()
        return done

    def drain(self, timeout_s: float = 1.0) -> bool:
        """After :meth:`stop`: blocks until no planning call runs any more (their cancel tokens
        stop the core within milliseconds); False when ``timeout_s`` passed first."""
        return self.gate.wait_idle(timeout_s)

    def wait(self, timeout_s: Optional[float] = None) -> bool:
        """Blocks until the server has stopped; False when ``timeout_s`` passed first."""
        return self._server.wait_for_termination(timeout_s) is False


def serve(config: ServerConfig, out: TextIO = sys.stderr, log_format: Optional[str] = None) -> int:
    """Runs the server until SIGTERM or SIGINT, then shuts down gracefully (a second signal
    cuts the grace period short). SIGHUP reloads ``config.calibration`` (when it is a file) and
    clears the cache. ``log_format``: ``text`` or ``json`` lines on stderr (None: text, unless
    logging is configured already). Prints ``meshplan: serving ... on HOST:PORT`` once listening.
    When the grace period ends, the calls still running are cancelled; the process ends within
    a second of it (a call that does not stop by then is abandoned: the process exits anyway)."""
    if log_format is not None:
        configure_logging(log_format)
    elif not logging.getLogger().handlers:
        configure_logging("text")
    server = PlannerServer(config)
    stopping = threading.Event()

    def on_signal(signum: int, frame: Optional[FrameType]) -> None:
        if stopping.is_set():
            server.stop(0)
        stopping.set()

    def on_hangup(signum: int, frame: Optional[FrameType]) -> None:
        reload.set()

    reload = threading.Event()
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hangup)
    try:
        server.start()
        features = [f"{config.workers} workers", f"queue {config.queue}"]
        threads = planning_threads(config)
        if threads is not None:
            features.append(f"{threads} core thread{'s' if threads != 1 else ''} per call"
                            + (" (workers >= cores)" if config.threads is None else ""))
        if config.tls_cert is not None:
            features.append("TLS")
        if config.token is not None:
            features.append("token auth")
        if config.max_candidates is not None:
            features.append(f"max {config.max_candidates:,} candidates")
        features.append(f"cache {config.cache_size:,}" if config.cache_size else "no cache")
        if server.metrics_port is not None:
            features.append(f"metrics on {_address(config.metrics_host, server.metrics_port)}")
        print(f"meshplan: serving {SERVICE} on {server.address} ({', '.join(features)})",
              file=out, flush=True)
        if config.host not in ("127.0.0.1", "localhost", "::1") and config.token is None:
            log.warning("listening on %s without a token: anyone who reaches it may plan",
                        server.address)
        while not stopping.wait(0.5):
            if reload.is_set():
                reload.clear()
                _reload_calibration(server, config)
        print(f"meshplan: shutting down (grace {config.grace_s:g} s)", file=out, flush=True)
        done = server.stop()
        while not done.wait(0.1):
            pass
        if not server.drain(1.0):
            log.warning("%d planning calls did not stop within 1 s of the grace period; "
                        "exiting without them", server.gate.busy)
            out.flush()
            sys.stdout.flush()
            os._exit(0)
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _reload_calibration(server: PlannerServer, config: ServerConfig) -> None:
    """SIGHUP: reads the calibration again; a bad one is logged and the old one kept."""
    try:
        server.servicer.set_calibration(config.calibration)
        log.info("calibration reloaded; cache cleared")
    except (MeshplanError, OSError) as e:
        log.error("calibration not reloaded (the previous one stays): %s", " ".join(str(e).split()))


__all__ = [
    "PlannerServicer", "PlannerServer", "ServerConfig", "TokenAuth", "StreamLimit",
    "PlanningGate", "Refusal", "serve", "error_status", "SERVICE",
]
