"""meshplan's objects on the wire: conversions to and from the ``meshplan.v1`` messages, and the
one table that maps ``meshplan.errors`` onto gRPC status codes.

Transport-free by design: the server's methods and the client's calls are thin adapters over the
functions here. Conversions are exact: a :class:`~meshplan.SearchResult` sent through
:func:`search_response` and read back with :func:`search_result` compares equal to the original.

A request never makes the server read a file: a model arrives as a preset name, the *text* of a
Hugging Face ``config.json``, or explicit dimensions, and the cluster names a GPU preset.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping, Optional, Sequence, Union

import grpc

from . import _core
from ._fields import as_type, invalid
from .api import as_model
from .errors import (
    CancelledError,
    DeadlineExceededError,
    InvalidInputError,
    MeshplanError,
    SpaceTooLargeError,
)
from .explain import Explanation, offload_lines, recompute_lines
from .hardware import Cluster, Gpu
from .model import LinearAttention, Mamba, Mla, Model, Moe
from .plan import Plan
from .report import Evaluation, SearchResult, SearchStats, Violation
from .space import DEGREES, SearchSpace
from .v1 import planner_pb2 as pb
from .workload import Workload

# --- errors ------------------------------------------------------------------------------------

STATUS_CODES: tuple[tuple[type[MeshplanError], grpc.StatusCode], ...] = (
    (InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
    (SpaceTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (CancelledError, grpc.StatusCode.CANCELLED),
)
"""The one table: a ``meshplan.errors`` class (and its subclasses) → the status code it travels
as. The server answers anything else with ``INTERNAL`` (and logs it: a bug); a missing or wrong
token is ``UNAUTHENTICATED``, from the server's interceptor. The client reads the table
backwards, so a remote error raises the same class a local call would."""


def status_code(error: BaseException) -> grpc.StatusCode:
    """The status code ``error`` is sent as (``INTERNAL`` when the table has no row for it)."""
    return class_code(type(error))


def class_code(cls: type[BaseException]) -> grpc.StatusCode:
    """The status code errors of class ``cls`` are sent as."""
    for row, code in STATUS_CODES:
        if issubclass(cls, row):
            return code
    return grpc.StatusCode.INTERNAL


def error_class(code: grpc.StatusCode) -> Optional[type[MeshplanError]]:
    """The ``meshplan.errors`` class a status code stands for; None for the codes without one."""
    for cls, row_code in STATUS_CODES:
        if row_code == code:
            return cls
    return None


MAX_DETAILS_BYTES = 1000
"""The longest status message the server sends, in UTF-8 bytes. Status messages travel in HTTP/2
trailers, which clients cap (8-16 KiB by default, all trailers together); an error that echoed a
20,000-character value whole would arrive as RESOURCE_EXHAUSTED instead of its own status."""
MAX_WORD_CHARS = 80
"""The longest run of non-blank characters (a value, usually) a status message keeps whole."""


def bounded_message(text: str) -> str:
    """``text`` as one line of at most :data:`MAX_DETAILS_BYTES` bytes: every word longer than
    :data:`MAX_WORD_CHARS` keeps its start and says how long it was, and what is still too long
    is cut with a note."""
    words = []
    for word in text.split():
        if len(word) > MAX_WORD_CHARS:
            word = f"{word[:MAX_WORD_CHARS]}…({len(word):,} characters)"
        words.append(word)
    line = " ".join(words)
    data = line.encode("utf-8")
    if len(data) <= MAX_DETAILS_BYTES:
        return line
    note = f"… (message cut: {len(text):,} characters)"
    room = MAX_DETAILS_BYTES - len(note.encode("utf-8"))
    return data[:room].decode("utf-8", errors="ignore") + note


DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""gRPC's default limit on a message a channel receives."""
CLIENT_LIMIT_KEY = "meshplan-max-response-bytes"
"""Request metadata by which a client tells the server its receive limit, in bytes: the server
refuses a larger response by name (RESOURCE_EXHAUSTED) instead of sending what gRPC would drop."""

ERROR_DOMAIN = "meshplan"
"""``google.rpc.ErrorInfo.domain`` of the errors the server sends."""


def error_reason(cls: type[BaseException]) -> str:
    """The ``google.rpc.ErrorInfo.reason`` of an error class: its name in UPPER_SNAKE_CASE
    without ``Error`` (``UnknownPresetError`` → ``UNKNOWN_PRESET``)."""
    name = cls.__name__.removesuffix("Error")
    return "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(name)).upper()


def class_of_reason(reason: str) -> Optional[type[MeshplanError]]:
    """The ``meshplan.errors`` class whose :func:`error_reason` is ``reason``, or None."""
    from . import errors

    for name in errors.__all__:
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, MeshplanError) and error_reason(cls) == reason:
            return cls
    return None


# --- inputs: Python → messages (the client) ----------------------------------------------------


def _looks_like_path(text: str) -> bool:
    # The rule of ``meshplan.api.as_model``: preset names have no separator and no ".json".
    return text.endswith(".json") or "/" in text or os.sep in text or os.path.exists(text)


def model_message(model: object) -> pb.Model:
    """A preset name travels as ``preset``; a :class:`Model`, a dict or a path (read here, on the
    client) travels as explicit ``dims``."""
    if isinstance(model, str) and not _looks_like_path(model):
        return pb.Model(preset=model)
    return pb.Model(dims=dims_message(as_model(model)))


def dims_message(model: Model) -> pb.ModelDims:
    """A :class:`Model` as explicit dimensions."""
    moe = None
    if model.moe is not None:
        moe = pb.Moe(
            num_experts=model.moe.num_experts,
            top_k=model.moe.top_k,
            expert_ffn_hidden=model.moe.expert_ffn_hidden,
            shared_experts=model.moe.shared_experts,
            shared_expert_ffn_hidden=model.moe.shared_expert_ffn_hidden,
            first_dense_layers=model.moe.first_dense_layers,
            latent_size=model.moe.latent_size,
        )
    mla = None
    if model.mla is not None:
        mla = pb.Mla(
            kv_lora_rank=model.mla.kv_lora_rank,
            qk_rope_head_dim=model.mla.qk_rope_head_dim,
            qk_nope_head_dim=model.mla.qk_nope_head_dim,
            v_head_dim=model.mla.v_head_dim,
            q_lora_rank=model.mla.q_lora_rank,
        )
    mamba = None
    if model.mamba is not None:
        mamba = pb.Mamba(**model.mamba.to_dict())
    linear = None
    if model.linear_attention is not None:
        linear = pb.LinearAttention(**model.linear_attention.to_dict())
    return pb.ModelDims(
        name=model.name,
        layers=model.layers,
        hidden=model.hidden,
        heads=model.heads,
        kv_heads=model.kv_heads,
        ffn_hidden=model.ffn_hidden,
        vocab=model.vocab,
        activation=model.activation,
        head_dim=model.head_dim,
        norm=model.norm,
        tied_embeddings=model.tied_embeddings,
        dropout=model.dropout,
        moe=moe,
        mla=mla,
        layer_pattern=model.layer_pattern,
        mamba=mamba,
        linear_attention=linear,
        sliding_window=model.sliding_window,
        mtp_layers=model.mtp_layers,
        mtp_pattern=model.mtp_pattern,
        attention_output_gate=model.attention_output_gate,
    )


def cluster_message(cluster: object) -> pb.Cluster:
    """A cluster of a GPU preset. A :class:`Gpu` that differs from its preset cannot travel (the
    contract names GPUs by preset) and raises :class:`InvalidInputError`."""
    c = as_type(Cluster, cluster, "cluster")
    if isinstance(c.gpu, Gpu):
        if c.gpu != Gpu.preset(c.gpu.name):
            raise InvalidInputError(
                f"invalid cluster.gpu: {c.gpu.name!r} differs from the preset of that name "
                "(allowed over gRPC: an unmodified GPU preset)"
            )
        gpu = c.gpu.name
    elif isinstance(c.gpu, str):
        gpu = c.gpu
    else:
        raise InvalidInputError(
            f"invalid cluster.gpu: expected a Gpu or a preset name, got {type(c.gpu).__name__}"
        )
    return pb.Cluster(
        gpu=gpu,
        num_gpus=c.num_gpus,
        gpus_per_node=c.gpus_per_node,
        nvlink_domain=c.nvlink_domain,
    )


def workload_message(workload: object) -> pb.Workload:
    w = as_type(Workload, workload, "workload")
    return pb.Workload(
        global_batch=w.global_batch,
        seq_len=w.seq_len,
        precision=w.precision,
        optimizer=w.optimizer,
        grad_bytes=w.grad_bytes,
        lora=w.lora,
        flash_attention=w.flash_attention,
        fused_cross_entropy=w.fused_cross_entropy,
        stack=w.stack,
        bucket_params=w.bucket_params,
        moe_imbalance=w.moe_imbalance,
        lora_rank=w.lora_rank,
        lora_targets=list(w.lora_targets),
        lora_base=w.lora_base,
        precision_recipe=w.precision_recipe,
        cross_entropy_in_place=w.cross_entropy_in_place,
        cuda_graphs=w.cuda_graphs,
    )


_LISTS = ("zero", "recompute", "sequence_parallel", "schedules", "orders")
_OPTIONAL_LISTS = ("dispatchers", "ep_overlap", "cp_exchanges", "recompute_modules")
"""Lists whose empty value means the stack's default (sent only when set)."""
_SCALARS = (
    "memory_headroom_gib",
    "tp_within_domain",
    "cp_within_domain",
    "ep_within_domain",
    "top_k",
    "max_candidates",
    "distinct",
    "fold",
)


def space_message(space: object) -> pb.SearchSpace:
    """The space as the core sees it: a degree that differs from the default space travels whole;
    lists and scalars that are set travel as they are."""
    full = as_type(SearchSpace, space, "space").to_dict()
    default = _core.default_space()
    msg = pb.SearchSpace()
    for name in DEGREES:
        degree = full[name]
        if degree != default[name]:
            getattr(msg, name).SetInParent()
            for bound in ("fixed", "min", "max"):
                if degree[bound] is not None:
                    setattr(getattr(msg, name), bound, degree[bound])
    for name in _LISTS:
        values = full[name]
        if isinstance(values, (list, tuple)) and not values:
            # A repeated field cannot say "empty"; the core would refuse it, so refuse it here.
            raise InvalidInputError(f"invalid space.{name}: [] (allowed: a non-empty list)")
        getattr(msg, name).extend(values)
    for name in _OPTIONAL_LISTS:
        getattr(msg, name).extend(full[name] or [])
    for name in _SCALARS:
        if full[name] is not None:
            setattr(msg, name, full[name])
    return msg


def plan_message(plan: Union[Plan, str, Mapping[str, Any]]) -> pb.Plan:
    """A plan with every field set (``schedule`` only when chosen)."""
    p = Plan.parse(plan) if isinstance(plan, str) else as_type(Plan, plan, "plan")
    msg = pb.Plan(
        dp=p.dp,
        tp=p.tp,
        pp=p.pp,
        ep=p.ep,
        cp=p.cp,
        vpp=p.vpp,
        micro_batch=p.micro_batch,
        zero=p.zero,
        recompute=p.recompute,
        sequence_parallel=p.sequence_parallel,
        schedule=p.schedule,
        order=p.order,
        etp=p.etp,
        dispatcher=p.dispatcher,
        ep_overlap=p.ep_overlap,
        cp_exchange=p.cp_exchange,
        recompute_modules=p.recompute_modules,
        first_stage_layers=p.first_stage_layers,
        last_stage_layers=p.last_stage_layers,
        offload_layers=p.offload_layers,
    )
    return msg


# --- inputs: messages → Python (the server) ----------------------------------------------------


def model_from(msg: pb.Model) -> Model:
    """The model of a request; never reads a file (a preset name is only ever a preset name)."""
    source = msg.WhichOneof("source")
    if source == "preset":
        return Model.preset(msg.preset)
    if source == "hf_config_json":
        name = msg.name if msg.HasField("name") else None
        return Model.from_dict(_core.model_from_hf_config(msg.hf_config_json, name))
    if source == "dims":
        return _model_from_dims(msg.dims)
    raise InvalidInputError(
        "missing model (allowed: one of model.preset, model.hf_config_json, model.dims)"
    )


def _model_from_dims(d: pb.ModelDims) -> Model:
    moe = mla = None
    if d.HasField("moe"):
        moe = Moe(
            num_experts=d.moe.num_experts,
            top_k=d.moe.top_k,
            expert_ffn_hidden=d.moe.expert_ffn_hidden,
            shared_experts=d.moe.shared_experts,
            shared_expert_ffn_hidden=_opt(d.moe, "shared_expert_ffn_hidden"),
            first_dense_layers=d.moe.first_dense_layers,
            latent_size=_opt(d.moe, "latent_size"),
        )
    if d.HasField("mla"):
        mla = Mla(
            kv_lora_rank=d.mla.kv_lora_rank,
            qk_rope_head_dim=d.mla.qk_rope_head_dim,
            qk_nope_head_dim=d.mla.qk_nope_head_dim,
            v_head_dim=d.mla.v_head_dim,
            q_lora_rank=_opt(d.mla, "q_lora_rank"),
        )
    mamba = linear = None
    if d.HasField("mamba"):
        mamba = Mamba(
            heads=d.mamba.heads,
            head_dim=d.mamba.head_dim,
            state=d.mamba.state,
            groups=d.mamba.groups,
            conv_kernel=d.mamba.conv_kernel,
            chunk=d.mamba.chunk,
        )
    if d.HasField("linear_attention"):
        la = d.linear_attention
        linear = LinearAttention(
            key_heads=la.key_heads,
            key_head_dim=la.key_head_dim,
            value_heads=la.value_heads,
            value_head_dim=la.value_head_dim,
            conv_kernel=la.conv_kernel,
            chunk=la.chunk,
        )
    return Model(
        name=d.name,
        layers=d.layers,
        hidden=d.hidden,
        heads=d.heads,
        kv_heads=d.kv_heads,
        ffn_hidden=d.ffn_hidden,
        vocab=d.vocab,
        activation=d.activation if d.HasField("activation") else "swiglu",
        head_dim=_opt(d, "head_dim"),
        norm=d.norm if d.HasField("norm") else "rmsnorm",
        tied_embeddings=d.tied_embeddings,
        dropout=d.dropout,
        moe=moe,
        mla=mla,
        layer_pattern=_opt(d, "layer_pattern"),
        mamba=mamba,
        linear_attention=linear,
        sliding_window=_opt(d, "sliding_window"),
        mtp_layers=_opt(d, "mtp_layers"),
        mtp_pattern=_opt(d, "mtp_pattern"),
        attention_output_gate=d.attention_output_gate,
    )


def _opt(msg: Any, name: str) -> Any:
    """The value of the optional field ``name``, None when unset."""
    return getattr(msg, name) if msg.HasField(name) else None


SERVER_MAX_DOMAIN = 65536
"""The largest ``gpus_per_node`` and ``nvlink_domain`` a request may give. The core's layout
looks for the largest divisor of the GPU count below the domain size by counting down from it,
so a domain of 2^31 costs seconds per plan (and ``Evaluate`` has no deadline to stop it); real
domains are at most a few hundred GPUs."""


def cluster_from(msg: pb.Cluster) -> Cluster:
    """The cluster of a request; its GPU is looked up in the presets."""
    for name in ("gpus_per_node", "nvlink_domain"):
        if msg.HasField(name) and getattr(msg, name) > SERVER_MAX_DOMAIN:
            raise invalid(f"cluster.{name}", str(getattr(msg, name)),
                          f"at most {SERVER_MAX_DOMAIN} on a meshplan server")
    return Cluster(
        Gpu.preset(msg.gpu),
        msg.num_gpus,
        _opt(msg, "gpus_per_node"),
        _opt(msg, "nvlink_domain"),
    )


def workload_from(msg: Any) -> Workload:
    """The workload of a request (a ``Workload`` message)."""
    given = {
        name: getattr(msg, name)
        for name in ("precision", "optimizer", "grad_bytes", "flash_attention",
                     "fused_cross_entropy", "stack", "bucket_params", "moe_imbalance",
                     "lora_rank", "lora_base", "precision_recipe", "cross_entropy_in_place",
                     "cuda_graphs")
        if msg.HasField(name)
    }
    if msg.lora_targets:
        given["lora_targets"] = tuple(msg.lora_targets)
    return Workload(msg.global_batch, msg.seq_len, lora=msg.lora, **given)


SERVER_MAX_TOP_K = 1000
"""The most plans one ``Search`` call may ask for (``space.top_k``)."""
SERVER_MAX_KNOB = 4096
"""The largest ``fixed`` or ``max`` a request may give ``vpp`` and ``micro_batch``. The core
enumerates these knobs value by value up to the bound, so an absurd bound (2^31) would cost the
server gigabytes before any candidate cap applies; real plans stay far below (vpp <= layers)."""


def space_from(msg: Any, max_candidates: Optional[int] = None) -> SearchSpace:
    """The space of a request (a ``SearchSpace`` message); ``max_candidates`` is the server's
    cap (the smaller one wins). Bounds beyond :data:`SERVER_MAX_TOP_K` and
    :data:`SERVER_MAX_KNOB` raise :class:`InvalidInputError` naming the field."""
    full = _core.default_space()
    for name in DEGREES:
        if msg.HasField(name):
            degree = getattr(msg, name)
            full[name] = {bound: _opt(degree, bound) for bound in ("fixed", "min", "max")}
    for name in ("vpp", "micro_batch"):
        for bound in ("fixed", "max"):
            value = full[name][bound]
            if value is not None and value > SERVER_MAX_KNOB:
                raise invalid(f"space.{name}.{bound}", str(value),
                              f"at most {SERVER_MAX_KNOB} on a meshplan server")
    if msg.HasField("top_k") and msg.top_k > SERVER_MAX_TOP_K:
        raise invalid("space.top_k", str(msg.top_k),
                      f"at most {SERVER_MAX_TOP_K} on a meshplan server")
    for name in _LISTS + _OPTIONAL_LISTS:
        values = list(getattr(msg, name))
        if values:
            full[name] = values
    for name in _SCALARS:
        if msg.HasField(name):
            full[name] = getattr(msg, name)
    if max_candidates is not None:
        asked = full["max_candidates"]
        # A negative request is the core's to refuse (INVALID_ARGUMENT), not ours to clamp.
        if asked is None or 0 <= max_candidates < asked:
            full["max_candidates"] = max_candidates
    return SearchSpace.from_dict(full)


def plan_from(msg: Any) -> Plan:
    """The plan of a request (a ``Plan`` message); unset optional fields take the :class:`Plan`
    defaults."""
    fields: dict[str, Any] = {"dp": msg.dp, "tp": msg.tp, "pp": msg.pp}
    for name in ("ep", "cp", "vpp", "micro_batch", "zero", "recompute", "sequence_parallel",
                 "schedule", "order", "etp", "dispatcher", "ep_overlap", "cp_exchange",
                 "recompute_modules", "first_stage_layers", "last_stage_layers",
                 "offload_layers"):
        if msg.HasField(name):
            fields[name] = getattr(msg, name)
    return Plan.from_dict(fields)


# --- results: Python → messages (the server) ---------------------------------------------------

_MEMORY = ("weights", "gradients", "optimizer", "activations", "transient", "fixed")
_TIME = ("compute", "tp", "cp", "ep", "pp_p2p", "bubble", "dp", "optimizer")


def _extra_json(extra: Mapping[str, Any]) -> str:
    return json.dumps(dict(extra), sort_keys=True) if extra else ""


def _breakdown(msg: Any, named: Sequence[str], values: Mapping[str, float]) -> None:
    for key, value in values.items():
        if key in named:
            setattr(msg, key, value)
        else:
            msg.other[key] = value


def evaluation_message(ev: Evaluation) -> pb.Evaluation:
    msg = pb.Evaluation(
        rank=ev.rank,
        plan=plan_message(ev.plan),
        feasible=ev.feasible,
        reasons=[pb.Violation(rule=r.rule, message=r.message) for r in ev.reasons],
        step_time_s=ev.step_time_s,
        tokens_per_s_per_gpu=ev.tokens_per_s_per_gpu,
        mfu=ev.mfu,
        model_tflops_per_gpu=ev.model_tflops_per_gpu,
        hardware_tflops_per_gpu=ev.hardware_tflops_per_gpu,
        peak_memory_gib=ev.peak_memory_gib,
        micro_batches=ev.micro_batches,
        worst_stage=ev.worst_stage,
        extra_json=_extra_json(ev.extra),
        group_size=ev.group_size,
    )
    _breakdown(msg.memory_gib, _MEMORY, ev.memory_gib)
    _breakdown(msg.time_s, _TIME, ev.time_s)
    return msg


def stats_message(stats: SearchStats) -> pb.SearchStats:
    return pb.SearchStats(
        candidates=stats.candidates,
        feasible=stats.feasible,
        pruned=stats.pruned,
        elapsed_s=stats.elapsed_s,
        threads=stats.threads,
        extra_json=_extra_json(stats.extra),
        groups_complete=stats.groups_complete,
    )


def search_response(result: SearchResult) -> pb.SearchResponse:
    return pb.SearchResponse(
        plans=[evaluation_message(p) for p in result.plans],
        stats=stats_message(result.stats),
    )


def explain_response(x: Explanation) -> pb.ExplainResponse:
    """An explanation as a message. The core's field names are the message's, so a key the
    contract lacks fails loudly (ValueError, hence INTERNAL) rather than vanishing."""
    data = x.to_dict()
    return pb.ExplainResponse(
        plan=plan_message(x.plan),
        evaluation=evaluation_message(x.evaluation),
        mesh=data["mesh"],
        axes=data["axes"],
        pipeline=data["pipeline"],
        # Recompute modules and offloading have no message of their own: explain's lines for
        # them as notes.
        notes=[" ".join(line.split()) for line in recompute_lines(data)[2:] + offload_lines(data)[2:]],
    )


def presets_response() -> pb.ListPresetsResponse:
    """Every model preset with its dimensions and every GPU preset in brief, sorted by name."""
    msg = pb.ListPresetsResponse(models=[dims_message(Model.preset(n)) for n in Model.presets()])
    for name in Gpu.presets():
        g = Gpu.preset(name)
        msg.gpus.add(
            name=g.name,
            description=g.description,
            memory_gib=g.memory_gib,
            peak_tflops=g.peak_tflops,
            memory_bandwidth_gbps=g.memory_bandwidth_gbps,
            scaleup_bandwidth_gbps=g.scaleup_bandwidth_gbps,
            scaleup_domain=g.scaleup_domain,
            gpus_per_node=g.gpus_per_node,
            network_bandwidth_gbps=g.network_bandwidth_gbps,
            host_bandwidth_gbps=g.host_bandwidth_gbps,
            architecture=g.architecture,
        )
    return msg


# --- results: messages → Python (the client) ---------------------------------------------------


def _plan_from_result(msg: pb.Plan) -> Plan:
    fields: dict[str, Any] = {
        "dp": msg.dp,
        "tp": msg.tp,
        "pp": msg.pp,
        "ep": msg.ep,
        "cp": msg.cp,
        "vpp": msg.vpp,
        "micro_batch": msg.micro_batch,
        "zero": msg.zero,
        "recompute": msg.recompute,
        "sequence_parallel": msg.sequence_parallel,
        "schedule": _opt(msg, "schedule"),
        "order": msg.order,
        "etp": _opt(msg, "etp"),
        "dispatcher": _opt(msg, "dispatcher"),
        "ep_overlap": msg.ep_overlap,
        "cp_exchange": _opt(msg, "cp_exchange"),
        "recompute_modules": _opt(msg, "recompute_modules"),
        "first_stage_layers": _opt(msg, "first_stage_layers"),
        "last_stage_layers": _opt(msg, "last_stage_layers"),
        "offload_layers": _opt(msg, "offload_layers"),
    }
    return Plan.from_dict(fields)


def _dict_from_breakdown(msg: Any, named: Sequence[str]) -> dict[str, float]:
    out = {key: float(getattr(msg, key)) for key in named}
    out.update(sorted(msg.other.items()))
    return out


def _extra_from(text: str, where: str) -> dict[str, Any]:
    if not text:
        return {}
    value = json.loads(text)
    if not isinstance(value, dict):
        raise InvalidInputError(f"invalid {where}.extra_json: expected a JSON object")
    return value


def evaluation_from(msg: pb.Evaluation) -> Evaluation:
    return Evaluation(
        plan=_plan_from_result(msg.plan),
        feasible=msg.feasible,
        reasons=[Violation(r.rule, r.message) for r in msg.reasons],
        step_time_s=msg.step_time_s,
        tokens_per_s_per_gpu=msg.tokens_per_s_per_gpu,
        mfu=msg.mfu,
        model_tflops_per_gpu=msg.model_tflops_per_gpu,
        hardware_tflops_per_gpu=msg.hardware_tflops_per_gpu,
        peak_memory_gib=msg.peak_memory_gib,
        memory_gib=_dict_from_breakdown(msg.memory_gib, _MEMORY),
        time_s=_dict_from_breakdown(msg.time_s, _TIME),
        micro_batches=msg.micro_batches,
        worst_stage=msg.worst_stage,
        rank=_opt(msg, "rank"),
        extra=_extra_from(msg.extra_json, "evaluation"),
        group_size=_opt(msg, "group_size"),
    )


def stats_from(msg: pb.SearchStats) -> SearchStats:
    return SearchStats(
        candidates=msg.candidates,
        feasible=msg.feasible,
        # The core reports rules in name order.
        pruned=dict(sorted(msg.pruned.items())),
        elapsed_s=msg.elapsed_s,
        threads=msg.threads,
        extra=_extra_from(msg.extra_json, "stats"),
        groups_complete=_opt(msg, "groups_complete"),
    )


def search_result(msg: pb.SearchResponse) -> SearchResult:
    return SearchResult([evaluation_from(p) for p in msg.plans], stats_from(msg.stats))


def _is_repeated(field: Any) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 6.31; ``label`` is deprecated
    if flag is None:
        return bool(field.label == field.LABEL_REPEATED)
    return bool(flag() if callable(flag) else flag)


def plain(msg: Any) -> dict[str, Any]:
    """A message of scalars, repeated scalars and nested messages as plain data, every field
    present, in declaration order (the core's shape where the names are the core's)."""
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None:
            out[field.name] = [plain(v) for v in value] if _is_repeated(field) else plain(value)
        else:
            out[field.name] = list(value) if _is_repeated(field) else value
    return out


def explanation_from(msg: pb.ExplainResponse) -> Explanation:
    evaluation = evaluation_from(msg.evaluation).to_dict()
    evaluation.pop("rank", None)
    return Explanation({
        "plan": _plan_from_result(msg.plan).to_dict(),
        "evaluation": evaluation,
        "mesh": plain(msg.mesh),
        "axes": [plain(a) for a in msg.axes],
        "pipeline": plain(msg.pipeline),
    })


def remaining_s(time_remaining: Optional[float]) -> Optional[float]:
    """A gRPC ``time_remaining()`` as the core's ``timeout_s``: None when the call has no
    deadline (gRPC reports an effectively infinite one), never negative."""
    if time_remaining is None or not math.isfinite(time_remaining) or time_remaining > 1e8:
        return None
    return max(time_remaining, 0.0)
