"""A typed client of ``meshplan.v1.Planner``: the local API's calls, answered by a server.

>>> from meshplan.client import PlannerClient
>>> with PlannerClient("127.0.0.1:50051") as planner:  # doctest: +SKIP
...     result = planner.search("llama3-70b", Cluster("h100-sxm", 1024), Workload(1024, 8192))

Methods take and return the same objects as :func:`meshplan.search`, :func:`meshplan.evaluate`
and :func:`meshplan.explain` (a :class:`~meshplan.SearchResult` that compares equal to the local
one), and raise the same :mod:`meshplan.errors` classes: the server's status codes are mapped
back through :data:`meshplan.wire.STATUS_CODES`. Any other failure (unreachable server, bad token,
a server bug) raises :class:`RemoteError` with the status code.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

import grpc
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_health.v1 import health_pb2
from grpc_status import rpc_status

from . import serving_wire, wire
from .errors import MeshplanError
from .explain import Explanation
from .hardware import Cluster
from .model import Model
from .plan import Plan
from .report import Evaluation, SearchResult
from .serving import PlanLike, ServingResult, parse_serving_plan, serving_problem
from .space import SearchSpace
from .v1 import planner_pb2 as pb
from .v1 import planner_pb2_grpc as pb_grpc
from .workload import Workload

T = TypeVar("T")



class RemoteError(MeshplanError):
    """A call failed with a status code that has no ``meshplan.errors`` class (UNAVAILABLE,
    UNAUTHENTICATED, INTERNAL, ...)."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}" if details else code.name)
        self.code = code
        self.details = details


@dataclass
class GpuPreset:
    """A GPU preset in brief, as ``ListPresets`` reports it."""

    name: str
    description: str
    memory_gib: float
    peak_tflops: dict[str, float]
    memory_bandwidth_gbps: float
    scaleup_bandwidth_gbps: float
    scaleup_domain: int
    gpus_per_node: int
    network_bandwidth_gbps: float
    #: Host link per GPU per direction (activation offloading's copies); None where none is stated.
    host_bandwidth_gbps: Optional[float] = None
    #: The die's GPU architecture (the cost model's matmul-realisation class); None where unstated.
    architecture: Optional[str] = None


@dataclass
class Presets:
    """The server's presets: model descriptors and GPUs in brief, sorted by name."""

    models: list[Model]
    gpus: list[GpuPreset]


class PlannerClient:
    """A connection to a planner server at ``target`` (``host:port``).

    ``token`` is sent as ``authorization: Bearer <token>``; ``root_certificates`` (PEM bytes)
    switches to TLS and trusts that CA (an empty ``b""`` trusts the system's roots).
    ``timeout_s`` is every call's deadline (None: no deadline); a call's own ``timeout_s``
    replaces it for that call.
    """

    def __init__(
        self,
        target: str,
        *,
        token: Optional[str] = None,
        root_certificates: Optional[bytes] = None,
        timeout_s: Optional[float] = 60.0,
        options: Sequence[tuple[str, Union[str, int]]] = (),
    ):
        self.target = target
        self.timeout_s = timeout_s
        # The server refuses a response larger than this channel may receive, by name, rather
        # than build it for gRPC to drop on arrival.
        receive = dict(options).get(
            "grpc.max_receive_message_length", wire.DEFAULT_MAX_MESSAGE_BYTES
        )
        metadata = [(wire.CLIENT_LIMIT_KEY, str(receive))]
        if token is not None:
            metadata.append(("authorization", f"Bearer {token}"))
        self._metadata = tuple(metadata)
        if root_certificates is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates or None)
            self._channel = grpc.secure_channel(target, credentials, options=list(options))
        else:
            self._channel = grpc.insecure_channel(target, options=list(options))
        self._stub = pb_grpc.PlannerStub(self._channel)
        # Typed by hand: the health stubs' HealthStub declares no methods.
        self._health_check: grpc.UnaryUnaryMultiCallable[
            health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
        ] = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )

    # -- the API ---------------------------------------------------------------------------------

    def search(
        self,
        model: Union[Model, str],
        cluster: Cluster,
        workload: Workload,
        space: Optional[SearchSpace] = None,
        *,
        timeout_s: Optional[float] = None,
    ) -> SearchResult:
        """:func:`meshplan.search` on the server (its thread count, its candidate cap).

        A deadline that passes raises :class:`~meshplan.errors.DeadlineExceededError`, and the
        server stops the search."""
        request = pb.SearchRequest(
            model=wire.model_message(model),
            cluster=wire.cluster_message(cluster),
            workload=wire.workload_message(workload),
            space=None if space is None else wire.space_message(space),
        )
        response = self._call(self._stub.Search, request, timeout_s)
        return wire.search_result(response)

    def evaluate(
        self,
        model: Union[Model, str],
        cluster: Cluster,
        workload: Workload,
        plan: Union[Plan, str],
        *,
        timeout_s: Optional[float] = None,
    ) -> Evaluation:
        """:func:`meshplan.evaluate` on the server."""
        request = pb.EvaluateRequest(
            model=wire.model_message(model),
            cluster=wire.cluster_message(cluster),
            workload=wire.workload_message(workload),
            plan=wire.plan_message(plan),
        )
        response = self._call(self._stub.Evaluate, request, timeout_s)
        return wire.evaluation_from(response.evaluation)

    def explain(
        self,
        model: Union[Model, str],
        cluster: Cluster,
        workload: Workload,
        plan: Union[Plan, str],
        *,
        timeout_s: Optional[float] = None,
    ) -> Explanation:
        """:func:`meshplan.explain` on the server: the same :class:`~meshplan.explain.Explanation`
        (its ``to_dict()`` equals the local one's)."""
        request = pb.ExplainRequest(
            model=wire.model_message(model),
            cluster=wire.cluster_message(cluster),
            workload=wire.workload_message(workload),
            plan=wire.plan_message(plan),
        )
        response = self._call(self._stub.Explain, request, timeout_s)
        return wire.explanation_from(response)

    def search_serving(
        self,
        model: Union[Model, str],
        cluster: Cluster,
        *,
        space: Optional[dict[str, Any]] = None,
        timeout_s: Optional[float] = None,
        **problem: Any,
    ) -> ServingResult:
        """:func:`meshplan.search_serving` on the server: the same deployments, each a dict with
        the local one's keys (``plan``, ``label``, ``time``, ``memory``, ...) and the message's
        flat figures (``ttft_s``, ``tpot_s``, ``memory_gib``, ...) beside them."""
        request = pb.SearchServingRequest(
            problem=serving_wire.problem_message(serving_problem(model, cluster, **problem)),
            space=serving_wire.space_message(space),
        )
        response = self._call(self._stub.SearchServing, request, timeout_s)
        st = response.stats
        return ServingResult(
            plans=[serving_wire.evaluation_from(e) for e in response.plans],
            pareto=[serving_wire.evaluation_from(e) for e in response.pareto],
            stats={"candidates": st.candidates, "feasible": st.feasible,
                   "pruned": dict(st.pruned), "elapsed_s": st.elapsed_s},
        )

    def evaluate_serving(
        self,
        model: Union[Model, str],
        cluster: Cluster,
        plan: PlanLike,
        *,
        prefill: Optional[PlanLike] = None,
        timeout_s: Optional[float] = None,
        **problem: Any,
    ) -> dict[str, Any]:
        """:func:`meshplan.evaluate_serving` on the server."""
        request = pb.EvaluateServingRequest(**_serving_request(model, cluster, plan, prefill, problem))
        response = self._call(self._stub.EvaluateServing, request, timeout_s)
        return serving_wire.evaluation_from(response.evaluation)

    def explain_serving(
        self,
        model: Union[Model, str],
        cluster: Cluster,
        plan: PlanLike,
        *,
        prefill: Optional[PlanLike] = None,
        timeout_s: Optional[float] = None,
        **problem: Any,
    ) -> dict[str, Any]:
        """:func:`meshplan.explain_serving` on the server: ``evaluation``, ``axes`` (equal to the
        local ones) and ``ridge_flops_per_byte``."""
        request = pb.ExplainServingRequest(**_serving_request(model, cluster, plan, prefill, problem))
        response = self._call(self._stub.ExplainServing, request, timeout_s)
        return serving_wire.explanation_from(response)

    def list_presets(self, *, timeout_s: Optional[float] = None) -> Presets:
        """The server's model and GPU presets."""
        response = self._call(self._stub.ListPresets, pb.ListPresetsRequest(), timeout_s)
        return Presets(
            models=[wire._model_from_dims(m) for m in response.models],
            gpus=[
                GpuPreset(
                    name=g.name,
                    description=g.description,
                    memory_gib=g.memory_gib,
                    peak_tflops=dict(g.peak_tflops),
                    memory_bandwidth_gbps=g.memory_bandwidth_gbps,
                    scaleup_bandwidth_gbps=g.scaleup_bandwidth_gbps,
                    scaleup_domain=g.scaleup_domain,
                    gpus_per_node=g.gpus_per_node,
                    network_bandwidth_gbps=g.network_bandwidth_gbps,
                    host_bandwidth_gbps=(g.host_bandwidth_gbps
                                         if g.HasField("host_bandwidth_gbps") else None),
                    architecture=g.architecture if g.HasField("architecture") else None,
                )
                for g in response.gpus
            ],
        )

    def health(self, service: str = "", *, timeout_s: Optional[float] = None) -> str:
        """The server's ``grpc.health.v1`` status of ``service`` ("" is the whole server):
        ``"SERVING"``, ``"NOT_SERVING"``, ..."""
        request = health_pb2.HealthCheckRequest(service=service)
        response = self._call(self._health_check, request, timeout_s)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    # -- plumbing --------------------------------------------------------------------------------

    def _call(
        self,
        method: Callable[..., T],
        request: object,
        timeout_s: Optional[float],
    ) -> T:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            return method(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise remote_error(e) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PlannerClient:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()


def _serving_request(
    model: Union[Model, str],
    cluster: Cluster,
    plan: PlanLike,
    prefill: Optional[PlanLike],
    problem: dict[str, Any],
) -> dict[str, Any]:
    """The ``problem`` and ``plan`` fields of an Evaluate/ExplainServing request."""
    return {
        "problem": serving_wire.problem_message(serving_problem(model, cluster, **problem)),
        "plan": serving_wire.plan_message(parse_serving_plan(plan, prefill)),
    }


def remote_error(error: grpc.RpcError) -> MeshplanError:
    """The ``meshplan.errors`` exception a failed call stands for, else a :class:`RemoteError`.

    The server names the class in the ``google.rpc.ErrorInfo`` of the status (its ``reason``,
    see :func:`meshplan.wire.error_reason`), and a bad field in a ``BadRequest`` (set as the
    exception's ``field``). A status without them comes from gRPC itself: a passed deadline or a
    cancelled call are still :class:`~meshplan.errors.DeadlineExceededError` and
    :class:`~meshplan.errors.CancelledError` (the status table read backwards); anything else,
    and the server's own refusals (busy, response too large), are :class:`RemoteError`."""
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (error.details() if isinstance(error, grpc.Call) else None) or ""
    reason, field = _error_details(error)
    if reason is not None:
        cls = wire.class_of_reason(reason)
    elif code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        cls = wire.error_class(code)
    else:
        cls = None
    if cls is None or wire.class_code(cls) != code:
        return RemoteError(code, details)
    return cls(details, field=field)


def _error_details(error: grpc.RpcError) -> tuple[Optional[str], Optional[str]]:
    """The ``ErrorInfo`` reason and the first ``BadRequest`` field of a failed call's status
    (None where absent or unreadable)."""
    if not isinstance(error, grpc.Call):
        return None, None
    try:
        status = rpc_status.from_call(error)
    except ValueError:  # a status whose details do not match its code: ignore the details
        return None, None
    if status is None:
        return None, None
    reason = field = None
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        bad = error_details_pb2.BadRequest()
        if detail.Is(info.DESCRIPTOR) and detail.Unpack(info):
            if info.domain == wire.ERROR_DOMAIN:
                reason = info.reason
        elif detail.Is(bad.DESCRIPTOR) and detail.Unpack(bad) and bad.field_violations:
            field = bad.field_violations[0].field
    return reason, field


__all__ = ["PlannerClient", "RemoteError", "Presets", "GpuPreset", "remote_error"]
