"""The gRPC planning service ``meshplan.v1.Planner`` (``meshplan serve``).

Each method is a thin adapter: message → typed objects (:mod:`meshplan.wire`) → the same
``meshplan.search`` / ``evaluate`` a local caller uses → message. The core releases the GIL, so
the ``workers`` threads of the server run searches in parallel. ``Explain`` answers with
:func:`meshplan.explain`'s structure as real messages.

- **Deadlines and cancellation.** A search gets the call's remaining time as its ``timeout_s``,
  and a :class:`~meshplan.CancelToken` that ``context.add_callback`` cancels when the call ends
  early (client cancel, deadline, disconnect): the core stops, the worker is free again.
- **Errors.** :data:`meshplan.wire.STATUS_CODES` is the one table from ``meshplan.errors`` to
  status codes; anything else is ``INTERNAL`` and logged with its traceback. A request that is not
  even a valid protobuf message is ``INVALID_ARGUMENT``.
- **Auth.** With a token, every call but health checks needs ``authorization: Bearer <token>``
  metadata, else ``UNAUTHENTICATED``; with a certificate and key, the port speaks TLS.
- **Health and reflection** are always on (``grpc.health.v1``, server reflection).
- **Shutdown.** :meth:`PlannerServer.stop` (and SIGTERM/SIGINT under :func:`serve`) sets every
  health status to NOT_SERVING, refuses new calls and lets in-flight ones finish within the grace
  period.
"""

from __future__ import annotations

import hmac
import logging
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import FrameType
from typing import Any, Callable, Optional, TextIO, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from . import wire
from ._core import CancelToken
from .api import evaluate, search
from .explain import explain
from .v1 import planner_pb2 as pb
from .v1 import planner_pb2_grpc as pb_grpc

SERVICE = pb.DESCRIPTOR.services_by_name["Planner"].full_name
"""``meshplan.v1.Planner``."""

log = logging.getLogger("meshplan.server")

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


class PlannerServicer(pb_grpc.PlannerServicer):
    """``meshplan.v1.Planner`` over the Python API. ``max_candidates`` caps every search space
    (larger spaces get ``RESOURCE_EXHAUSTED``); ``threads`` is each search's core thread count
    (None: ``MESHPLAN_THREADS``, else every core)."""

    def __init__(self, *, max_candidates: Optional[int] = None, threads: Optional[int] = None):
        self.max_candidates = max_candidates
        self.threads = threads

    def Search(self, request: pb.SearchRequest, context: grpc.ServicerContext) -> pb.SearchResponse:
        cancel = CancelToken()
        if not context.add_callback(cancel.cancel):
            cancel.cancel()  # the call ended before the search could start
        result = search(
            wire.model_from(request.model),
            wire.cluster_from(request.cluster),
            wire.workload_from(request.workload),
            wire.space_from(request.space, self.max_candidates),
            threads=self.threads,
            timeout_s=wire.remaining_s(context.time_remaining()),
            cancel=cancel,
        )
        return wire.search_response(result)

    def Evaluate(
        self, request: pb.EvaluateRequest, context: grpc.ServicerContext
    ) -> pb.EvaluateResponse:
        ev = evaluate(
            wire.model_from(request.model),
            wire.cluster_from(request.cluster),
            wire.workload_from(request.workload),
            wire.plan_from(request.plan),
        )
        return pb.EvaluateResponse(evaluation=wire.evaluation_message(ev))

    def Explain(
        self, request: pb.ExplainRequest, context: grpc.ServicerContext
    ) -> pb.ExplainResponse:
        x = explain(
            wire.model_from(request.model),
            wire.cluster_from(request.cluster),
            wire.workload_from(request.workload),
            wire.plan_from(request.plan),
        )
        return wire.explain_response(x)

    def ListPresets(
        self, request: pb.ListPresetsRequest, context: grpc.ServicerContext
    ) -> pb.ListPresetsResponse:
        return wire.presets_response()


def _unary(
    method: Callable[[Req, grpc.ServicerContext], Resp],
    request_type: type[Req],
) -> grpc.RpcMethodHandler[Any, Any]:
    """The handler of one method: parses the request itself (so that bytes that are not a
    message get INVALID_ARGUMENT rather than gRPC's INTERNAL) and maps errors by the table."""

    def behaviour(data: bytes, context: grpc.ServicerContext) -> Resp:
        try:
            request = request_type.FromString(data)
        except DecodeError as e:
            name = request_type.DESCRIPTOR.full_name
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid request: not a {name} ({e})")
        try:
            return method(request, context)
        except Exception as e:  # noqa: BLE001 - the table decides; INTERNAL is the fallback
            code = wire.status_code(e)
            message = " ".join(str(e).split()) or type(e).__name__
            if code == grpc.StatusCode.INTERNAL:
                log.exception("internal error in %s", request_type.DESCRIPTOR.full_name)
                message = f"internal error: {type(e).__name__}: {message}"
            context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(
        behaviour, request_deserializer=None, response_serializer=_serialize
    )


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def _handlers(servicer: PlannerServicer) -> grpc.GenericRpcHandler:
    service = pb.DESCRIPTOR.services_by_name["Planner"]
    methods: dict[str, Any] = {
        "Search": (servicer.Search, pb.SearchRequest),
        "Evaluate": (servicer.Evaluate, pb.EvaluateRequest),
        "Explain": (servicer.Explain, pb.ExplainRequest),
        "ListPresets": (servicer.ListPresets, pb.ListPresetsRequest),
    }
    # A method the proto declares but this table lacks is a bug caught here, at start-up.
    assert set(methods) == {m.name for m in service.methods}, "Planner methods out of date"
    return grpc.method_handlers_generic_handler(
        SERVICE, {name: _unary(fn, req) for name, (fn, req) in methods.items()}
    )


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
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Optional[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Optional[grpc.RpcMethodHandler[Any, Any]]:
        if handler_call_details.method.startswith("/grpc.health.v1.Health/"):
            return continuation(handler_call_details)
        for key, value in handler_call_details.invocation_metadata or ():
            given = value.encode() if isinstance(value, str) else value
            if key == "authorization" and hmac.compare_digest(given, self._expected):
                return continuation(handler_call_details)
        return self._deny


@dataclass
class ServerConfig:
    """How :class:`PlannerServer` listens and limits work (the flags of ``meshplan serve``)."""

    host: str = "127.0.0.1"
    port: int = 50051
    """0 picks a free port (see :attr:`PlannerServer.port`)."""
    workers: int = max(4, os.cpu_count() or 1)
    """Calls served at once; more wait in gRPC's queue."""
    threads: Optional[int] = None
    """Core threads per search (None: ``MESHPLAN_THREADS``, else every core)."""
    max_candidates: Optional[int] = None
    """Search-space cap: larger spaces get RESOURCE_EXHAUSTED (None: no cap)."""
    token: Optional[str] = None
    """Bearer token every call but health checks must carry (None: no auth)."""
    tls_cert: Optional[bytes] = None
    """PEM certificate chain; with ``tls_key``, the port speaks TLS."""
    tls_key: Optional[bytes] = None
    grace_s: float = 10.0
    """How long in-flight calls may run on after :meth:`PlannerServer.stop`."""


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class PlannerServer:
    """A running ``meshplan.v1.Planner`` with health checking and reflection.

    >>> server = PlannerServer(ServerConfig(port=0)).start()  # doctest: +SKIP
    >>> server.port  # doctest: +SKIP
    >>> server.stop()  # doctest: +SKIP
    """

    def __init__(self, config: ServerConfig):
        if (config.tls_cert is None) != (config.tls_key is None):
            raise ValueError("TLS needs both a certificate and a key")
        if config.workers < 1:
            raise ValueError(f"workers must be >= 1, got {config.workers}")
        self.config = config
        interceptors: list[grpc.ServerInterceptor] = []
        if config.token is not None:
            interceptors.append(TokenAuth(config.token))
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="meshplan-rpc"),
            interceptors=interceptors,
            # Never share the port with another process (a second server would steal calls).
            options=[("grpc.so_reuseport", 0)],
        )
        self.servicer = PlannerServicer(
            max_candidates=config.max_candidates, threads=config.threads
        )
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
        self._server.start()
        serving = health_pb2.HealthCheckResponse.SERVING
        for name in ("", SERVICE):
            self.health.set(name, serving)
        return self

    def stop(self, grace_s: Optional[float] = None) -> threading.Event:
        """Health → NOT_SERVING, refuse new calls, let in-flight ones finish for ``grace_s``
        (default: the config's), then cancel what is left. Returns an event set when done."""
        self.health.enter_graceful_shutdown()
        return self._server.stop(self.config.grace_s if grace_s is None else grace_s)

    def wait(self, timeout_s: Optional[float] = None) -> bool:
        """Blocks until the server has stopped; False when ``timeout_s`` passed first."""
        return self._server.wait_for_termination(timeout_s) is False


def serve(config: ServerConfig, out: TextIO = sys.stderr) -> int:
    """Runs the server until SIGTERM or SIGINT, then shuts down gracefully (a second signal
    cuts the grace period short). Prints ``meshplan: serving ... on HOST:PORT`` once listening."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="meshplan: %(levelname)s %(name)s: %(message)s"
        )
    server = PlannerServer(config)
    stopping = threading.Event()

    def on_signal(signum: int, frame: Optional[FrameType]) -> None:
        if stopping.is_set():
            server.stop(0)
        stopping.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start()
        features = [f"{config.workers} workers"]
        if config.tls_cert is not None:
            features.append("TLS")
        if config.token is not None:
            features.append("token auth")
        if config.max_candidates is not None:
            features.append(f"max {config.max_candidates:,} candidates")
        print(f"meshplan: serving {SERVICE} on {server.address} ({', '.join(features)})",
              file=out, flush=True)
        if config.host not in ("127.0.0.1", "localhost", "::1") and config.token is None:
            log.warning("listening on %s without a token: anyone who reaches it may plan",
                        server.address)
        while not stopping.wait(0.5):
            pass
        print(f"meshplan: shutting down (grace {config.grace_s:g} s)", file=out, flush=True)
        done = server.stop()
        while not done.wait(0.2):
            pass
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


__all__ = ["PlannerServicer", "PlannerServer", "ServerConfig", "TokenAuth", "serve", "SERVICE"]
