"""The serving messages of the gRPC contract (``SearchServing``, ``EvaluateServing``,
``ExplainServing``) to and from the core's serving dicts (docs/serving.md), both ways: the server
reads requests and writes responses, :class:`~meshplan.client.PlannerClient` the reverse. Integer fields go to the core as sent, so a bad
one is the core's one-line ``invalid {field}: {value} (allowed: lo..=hi)`` error, mapped by the
server's error table like every other."""

from __future__ import annotations

import json
from typing import Any, Final, Optional

from . import wire
from ._fields import invalid
from .hardware import Cluster
from .model import Model
from .v1 import planner_pb2 as pb

SERVER_MAX_SERVING_TOP_K = 1000
"""The most deployments one ``SearchServing`` call may ask for (``serving_space.top_k``)."""

_PLAN_KEYS = {"plan", "label", "feasible", "violations", "gpus", "sequences_per_worker",
              "output_tokens_per_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user",
              "requests_per_s"}


# A worker's fields beyond tp and max_sequences, each optional on the wire.
_WORKER_OPTIONAL: Final = ("pp", "attention_dp", "ep", "expert_tp", "max_batched_tokens",
                           "kv_tokens", "output_lag_steps", "attention_kernel", "sliding_kv")
# Of those, the ones the core leaves out of a plan when unset (the others it always fills in).
_WORKER_UNSET_ABSENT: Final = ("max_batched_tokens", "kv_tokens", "output_lag_steps",
                               "attention_kernel", "sliding_kv")
# A serving space's fields (every one optional).
_SPACE_FIELDS: Final = ("top_k", "disaggregation", "max_tp", "max_pp", "max_attention_dp",
                        "max_sequences", "allow_tp_cross_domain", "attention_kernel", "sliding_kv")


def _opt(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def problem_from(msg: pb.ServingProblem, cluster: Cluster) -> dict[str, Any]:
    """The core's serving-problem dict of a request (``cluster`` already resolved by the
    server)."""
    t, s = msg.traffic, msg.slo
    return {
        "model": wire.model_from(msg.model).to_dict(),
        "cluster": cluster.to_dict(),
        "weight_precision": _opt(msg, "weight_precision") or "bf16",
        "kv_precision": _opt(msg, "kv_precision") or "bf16",
        "traffic": {
            "input_len": t.input_len,
            "output_len": t.output_len,
            **({"lengths": [_length_class_from(c) for c in t.lengths]} if t.lengths else {}),
            "prefix_fraction": _opt(t, "prefix_fraction") or 0.0,
            "cached_fraction": _opt(t, "cached_fraction") or 0.0,
            "concurrency": _opt(t, "concurrency"),
            "request_rate": _opt(t, "request_rate"),
            "arrival": _opt(t, "arrival"),
            "num_requests": _opt(t, "num_requests"),
        },
        "slo": {"ttft_s": _opt(s, "ttft_s"), "tpot_s": _opt(s, "tpot_s"), "e2e_s": _opt(s, "e2e_s")},
        "objective": _opt(msg, "objective") or "throughput",
        **({"weight_scaling": msg.weight_scaling} if msg.HasField("weight_scaling") else {}),
        **({"expert_weights": msg.expert_weights} if msg.HasField("expert_weights") else {}),
    }


def _length_class_from(msg: pb.LengthClass) -> dict[str, Any]:
    c: dict[str, Any] = {"input_len": msg.input_len, "output_len": msg.output_len}
    if msg.HasField("weight"):
        c["weight"] = msg.weight
    return c


def _worker_from(msg: pb.ServingWorker) -> dict[str, Any]:
    w: dict[str, Any] = {"tp": msg.tp, "max_sequences": msg.max_sequences}
    for name in _WORKER_OPTIONAL:
        if msg.HasField(name):
            w[name] = getattr(msg, name)
    if "expert_tp" not in w:
        stage = w["tp"] * w.get("attention_dp", 1)
        ep = w.get("ep", 1)
        # Default: the experts span the stage (a malformed ep is the core's to name).
        w["expert_tp"] = stage // ep if ep > 0 and stage % ep == 0 and stage > 0 else 1
    return w


def plan_from(msg: pb.ServingPlan) -> dict[str, Any]:
    """The core's deployment dict of a request."""
    plan: dict[str, Any] = {"worker": _worker_from(msg.worker)}
    plan["replicas"] = _opt(msg, "replicas") if msg.HasField("replicas") else 1
    if msg.HasField("prefill"):
        plan["prefill"] = _worker_from(msg.prefill)
        plan["prefill_replicas"] = _opt(msg, "prefill_replicas") if msg.HasField("prefill_replicas") else 1
    elif msg.HasField("prefill_replicas"):
        plan["prefill_replicas"] = msg.prefill_replicas
    return plan


def space_from(msg: pb.ServingSpace, max_candidates: Optional[int] = None) -> dict[str, Any]:
    """The core's serving-space dict of a request; ``top_k`` beyond
    :data:`SERVER_MAX_SERVING_TOP_K` is refused naming the field. ``max_candidates`` is the
    server's cap on deployments scored (``--max-candidates``), kept when given."""
    space: dict[str, Any] = {}
    if max_candidates is not None and max_candidates >= 1:
        space["max_candidates"] = max_candidates
    for name in _SPACE_FIELDS:
        if msg.HasField(name):
            space[name] = getattr(msg, name)
    top_k = space.get("top_k")
    if isinstance(top_k, int) and top_k > SERVER_MAX_SERVING_TOP_K:
        lo, hi = 1, SERVER_MAX_SERVING_TOP_K
        raise invalid("serving_space.top_k", str(top_k), f"{lo}..={hi} on a meshplan server")
    return space


def _worker_message(w: dict[str, Any]) -> pb.ServingWorker:
    """A worker dict (a core plan's or a request's) as a message; a field it leaves unset (None) is
    unset on the wire."""
    return pb.ServingWorker(tp=w["tp"], max_sequences=w["max_sequences"],
                            **{name: w.get(name) for name in _WORKER_OPTIONAL})


def evaluation_message(ev: dict[str, Any]) -> pb.ServingEvaluation:
    """One core serving evaluation as a message (the rest of its figures in ``extra_json``)."""
    p = ev["plan"]
    plan = pb.ServingPlan(worker=_worker_message(p["worker"]), replicas=p["replicas"])
    if p.get("prefill") is not None:
        plan.prefill.CopyFrom(_worker_message(p["prefill"]))
        plan.prefill_replicas = p["prefill_replicas"]
    t, m = ev["time"], ev["memory"]
    extra = {k: v for k, v in ev.items() if k not in _PLAN_KEYS}
    return pb.ServingEvaluation(
        plan=plan,
        label=ev["label"],
        feasible=ev["feasible"],
        violations=[pb.Violation(rule=v["rule"], message=v["message"]) for v in ev["violations"]],
        gpus=ev["gpus"],
        sequences_per_worker=ev["sequences_per_worker"],
        ttft_s=t["ttft_s"],
        tpot_s=t["tpot_s"],
        e2e_s=t["e2e_s"],
        output_tokens_per_s=ev["output_tokens_per_s"],
        tokens_per_s_per_gpu=ev["tokens_per_s_per_gpu"],
        tokens_per_s_per_user=ev["tokens_per_s_per_user"],
        requests_per_s=ev["requests_per_s"],
        memory_gib=m["total_gib"],
        weights_gib=m["weights_gib"],
        kv_cache_gib=m["kv_cache_gib"],
        kv_capacity_sequences=m["max_sequences_fit"],
        kv_transfer_s=t["kv_transfer_s"],
        extra_json=json.dumps(extra, sort_keys=True),
    )


def explain_response(raw: dict[str, Any]) -> pb.ExplainServingResponse:
    """A core serving explanation as a message (the axes field for field)."""
    return pb.ExplainServingResponse(
        evaluation=evaluation_message(raw["evaluation"]),
        axes=[pb.ServingAxis(**a) for a in raw["axes"]],
        ridge_flops_per_byte=raw["ridge_flops_per_byte"],
    )


def explanation_from(msg: pb.ExplainServingResponse) -> dict[str, Any]:
    """A serving explanation message back as :func:`meshplan.explain_serving`'s dict."""
    return {
        "evaluation": evaluation_from(msg.evaluation),
        "axes": [wire.plain(a) for a in msg.axes],
        "ridge_flops_per_byte": msg.ridge_flops_per_byte,
    }


# --- Python → messages (the client) ---------------------------------------------------------


def problem_message(problem: dict[str, Any]) -> pb.ServingProblem:
    """A core serving-problem dict (:func:`meshplan.serving.serving_problem`) as a message."""
    t, s = problem["traffic"], problem["slo"]
    return pb.ServingProblem(
        model=wire.model_message(Model.from_dict(problem["model"])),
        cluster=wire.cluster_message(Cluster.from_dict(problem["cluster"])),
        weight_precision=problem["weight_precision"],
        kv_precision=problem["kv_precision"],
        traffic=pb.ServingTraffic(
            input_len=t.get("input_len", 0), output_len=t.get("output_len", 0),
            lengths=[pb.LengthClass(**c) for c in t.get("lengths", [])],
            prefix_fraction=t["prefix_fraction"], cached_fraction=t.get("cached_fraction", 0.0),
            concurrency=t["concurrency"],
            request_rate=t["request_rate"], arrival=t.get("arrival"),
            num_requests=t.get("num_requests"),
        ),
        slo=pb.ServingSlo(ttft_s=s["ttft_s"], tpot_s=s["tpot_s"], e2e_s=s["e2e_s"]),
        objective=problem["objective"],
        weight_scaling=problem.get("weight_scaling"),
        expert_weights=problem.get("expert_weights"),
    )


def plan_message(plan: dict[str, Any]) -> pb.ServingPlan:
    """A core deployment dict (:func:`meshplan.serving.parse_serving_plan`) as a message."""
    msg = pb.ServingPlan(worker=_worker_message(plan["worker"]), replicas=plan.get("replicas", 1))
    if plan.get("prefill") is not None:
        msg.prefill.CopyFrom(_worker_message(plan["prefill"]))
        msg.prefill_replicas = plan.get("prefill_replicas", 1)
    return msg


def space_message(space: Optional[dict[str, Any]]) -> pb.ServingSpace:
    """A serving-space dict as a message (unknown keys are the server's to refuse: they are
    refused here, naming the key, since the message has no place for them)."""
    msg = pb.ServingSpace()
    for key, value in (space or {}).items():
        if key not in _SPACE_FIELDS:
            raise invalid(f"serving_space.{key}", repr(key), "one of " + ", ".join(_SPACE_FIELDS))
        if value is not None:
            setattr(msg, key, value)
    return msg


def search_response(raw: dict[str, Any]) -> pb.SearchServingResponse:
    st = raw["stats"]
    return pb.SearchServingResponse(
        plans=[evaluation_message(e) for e in raw["plans"]],
        pareto=[evaluation_message(e) for e in raw["pareto"]],
        stats=pb.SearchStats(candidates=st["candidates"], feasible=st["feasible"],
                             pruned=st["pruned"], elapsed_s=st["elapsed_s"], threads=1),
    )


def evaluation_from(msg: pb.ServingEvaluation) -> dict[str, Any]:
    """A serving evaluation message back as a flat dict (the client's view)."""
    out: dict[str, Any] = wire.plain(msg)
    # An unset token budget or KV size is absent, as in the core's plan (not a 0).
    for name in ("worker", "prefill"):
        for key in _WORKER_UNSET_ABSENT:
            if isinstance(out["plan"].get(name), dict) and not getattr(msg.plan, name).HasField(key):
                out["plan"][name].pop(key, None)
    extra: Optional[str] = out.pop("extra_json", None)
    if extra:
        out.update(json.loads(extra))
    return out
