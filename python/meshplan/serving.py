"""Serving plans: ``search_serving``, ``evaluate_serving``, ``explain_serving`` and the launch
commands of a deployment for vLLM, SGLang and TensorRT-LLM (docs/serving.md).

Thin by design: the problem is a plain dict the Rust core validates (so every field error is the
core's one line), and the results are the core's dicts. A deployment is
``{"worker": {"tp", "pp", "attention_dp", "ep", "expert_tp", "max_sequences"}, "replicas",
"prefill": None or a worker, "prefill_replicas"}``; :func:`parse_serving_plan` reads the short
``tp=8,batch=16,replicas=1`` spelling.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from . import _core
from ._core import CancelToken
from ._fields import as_type
from .api import ModelLike, as_model, hf_config_path
from .errors import InvalidInputError
from .hardware import Cluster

__all__ = [
    "ServingResult",
    "serving_problem",
    "length_histogram",
    "MAX_LENGTH_CLASSES",
    "search_serving",
    "evaluate_serving",
    "explain_serving",
    "parse_serving_plan",
    "launch_commands",
    "ENGINES",
]

PlanLike = Union[str, dict[str, Any]]
"""A deployment dict, or the ``tp=8,batch=16,replicas=1`` spelling."""

# Short names of the ``k=v`` spelling, and the worker fields they set.
_WORKER_KEYS = {
    "tp": "tp",
    "pp": "pp",
    "attention_dp": "attention_dp",
    "adp": "attention_dp",
    "dp_attention": "attention_dp",
    "ep": "ep",
    "expert_tp": "expert_tp",
    "etp": "expert_tp",
    "max_sequences": "max_sequences",
    "batch": "max_sequences",
    "max_batched_tokens": "max_batched_tokens",
    "tokens": "max_batched_tokens",
    "kv_tokens": "kv_tokens",
    "output_lag_steps": "output_lag_steps",
    "lag": "output_lag_steps",
    "attention_kernel": "attention_kernel",
    "attn": "attention_kernel",
    "sliding_kv": "sliding_kv",
    "swa": "sliding_kv",
}

# Worker keys whose value is a name, not an integer (the core names the allowed values).
_NAMED_WORKER_KEYS = ("attention_kernel", "sliding_kv")


@dataclass
class ServingResult:
    """A serving search: ``plans`` best first, the ``pareto`` front (fastest per user first)
    and ``stats`` (``candidates``, ``feasible``, ``pruned`` by rule, ``elapsed_s``)."""

    plans: list[dict[str, Any]]
    pareto: list[dict[str, Any]]
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> Optional[dict[str, Any]]:
        """The best deployment, None when nothing meets the SLOs."""
        return self.plans[0] if self.plans else None


MAX_LENGTH_CLASSES: int = _core.MAX_LENGTH_CLASSES
"""Most classes of a length distribution (the core's ``MAX_LENGTH_CLASSES``): a trace is binned
into at most this many by :func:`length_histogram`."""

LengthsLike = Sequence[Union[dict[str, Any], Sequence[Any]]]
"""A length distribution: classes as ``{"input_len", "output_len", "weight"}`` dicts or
``(input_len, output_len[, weight])`` tuples; a class without a weight weighs 1."""


def _length_class(c: Any, i: int) -> dict[str, Any]:
    """One class of ``lengths`` as the core's dict (the core checks the values)."""
    if isinstance(c, dict):
        return dict(c)
    if isinstance(c, (list, tuple)) and len(c) in (2, 3):
        out = {"input_len": c[0], "output_len": c[1]}
        if len(c) == 3:
            out["weight"] = c[2]
        return out
    raise InvalidInputError(
        f"invalid traffic.lengths[{i}]: {c!r:.60} (allowed: a dict with input_len, output_len and "
        "weight, or an (input_len, output_len[, weight]) tuple)"
    )


def length_histogram(
    samples: Iterable[Sequence[int]], *, input_bins: int = 8, output_bins: int = 8
) -> list[dict[str, Any]]:
    """A trace's ``(input_len, output_len)`` pairs binned into at most ``input_bins ×
    output_bins`` classes for ``serving_problem(lengths=...)``: the requests split into
    ``input_bins`` groups of equal count by prompt length, each group into ``output_bins`` by
    output length; a class is a group's mean lengths (rounded) weighted by its count. Means
    are kept per group, so the mean prompt and output stay the trace's (to rounding).
    """
    pairs: list[tuple[int, int]] = []
    for i, s in enumerate(samples):
        try:
            a, b = s
        except (TypeError, ValueError):
            raise InvalidInputError(
                f"invalid lengths sample {i}: {s!r:.60} (allowed: an (input_len, output_len) pair)"
            ) from None
        for name, v in (("input_len", a), ("output_len", b)):
            lo, hi = _core.limits()[f"traffic.lengths.{name}"]
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise InvalidInputError(
                    f"invalid lengths sample {i} {name}: {v!r:.40} (allowed: {lo}..={hi})"
                )
        pairs.append((a, b))
    if not pairs:
        raise InvalidInputError("invalid lengths: no samples (allowed: at least one (input_len, output_len) pair)")
    for name, k in (("input_bins", input_bins), ("output_bins", output_bins)):
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_LENGTH_CLASSES:
            raise InvalidInputError(f"invalid {name}: {k!r:.40} (allowed: 1..={MAX_LENGTH_CLASSES})")
    if input_bins * output_bins > MAX_LENGTH_CLASSES:
        raise InvalidInputError(
            f"invalid input_bins x output_bins: {input_bins * output_bins} "
            f"(allowed: 1..={MAX_LENGTH_CLASSES} classes)"
        )
    classes: list[dict[str, Any]] = []
    for group in _equal_count_groups(sorted(pairs), input_bins):
        for part in _equal_count_groups(sorted(group, key=lambda p: p[1]), output_bins):
            n = len(part)
            classes.append({
                "input_len": max(1, round(sum(p[0] for p in part) / n)),
                "output_len": max(1, round(sum(p[1] for p in part) / n)),
                "weight": float(n),
            })
    return classes


def _equal_count_groups(items: list[tuple[int, int]], k: int) -> list[list[tuple[int, int]]]:
    """``items`` (sorted) cut into at most ``k`` consecutive groups of equal count (±1)."""
    k = min(k, len(items))
    return [items[len(items) * j // k: len(items) * (j + 1) // k] for j in range(k)]


def serving_problem(
    model: ModelLike,
    cluster: Cluster,
    *,
    input_len: Optional[int] = None,
    output_len: Optional[int] = None,
    lengths: Optional[LengthsLike] = None,
    weight_precision: str = "bf16",
    kv_precision: str = "bf16",
    weight_scaling: Optional[str] = None,
    expert_weights: Optional[str] = None,
    prefix_fraction: float = 0.0,
    cached_fraction: float = 0.0,
    concurrency: Optional[int] = None,
    request_rate: Optional[float] = None,
    arrival: Optional[str] = None,
    num_requests: Optional[int] = None,
    ttft_s: Optional[float] = None,
    tpot_s: Optional[float] = None,
    e2e_s: Optional[float] = None,
    objective: str = "throughput",
) -> dict[str, Any]:
    """The core's serving-problem dict (the core checks every field).

    The requests' lengths: ``input_len`` and ``output_len`` for requests all alike, or
    ``lengths``, a length distribution (at most :data:`MAX_LENGTH_CLASSES` classes of
    ``(input_len, output_len[, weight])``; :func:`length_histogram` bins a trace), not both.

    ``weight_scaling`` (``tensor`` or ``block``, FP8 only): None takes it from a Hugging Face
    config's ``quantization_config.weight_block_size`` when ``model`` is one, else the core's
    default (``block`` for presets whose published FP8 checkpoint is block-scaled).
    ``expert_weights`` (``mxfp4``): the routed experts' weight-only storage format where it differs
    from ``weight_precision``; None takes it from a Hugging Face config whose ``quant_method`` is
    "mxfp4" (gpt-oss), else the experts are stored like every other layer.
    """
    problem: dict[str, Any] = {
        "model": as_model(model).to_dict(),
        "cluster": as_type(Cluster, cluster, "cluster").to_dict(),
        "weight_precision": weight_precision,
        "kv_precision": kv_precision,
        "traffic": {
            **_lengths_fields(input_len, output_len, lengths),
            "prefix_fraction": prefix_fraction,
            "cached_fraction": cached_fraction,
            "concurrency": concurrency,
            "request_rate": request_rate,
            "arrival": arrival,
            "num_requests": num_requests,
        },
        "slo": {"ttft_s": ttft_s, "tpot_s": tpot_s, "e2e_s": e2e_s},
        "objective": objective,
    }
    scaling = weight_scaling if weight_scaling is not None else _hf_weight_scaling(model, weight_precision)
    if scaling is not None:
        problem["weight_scaling"] = scaling
    experts = expert_weights if expert_weights is not None else _hf_expert_weights(model)
    if experts is not None:
        problem["expert_weights"] = experts
    return problem


def _hf_quantization(model: ModelLike) -> Optional[dict[str, Any]]:
    """A Hugging Face config's ``quantization_config`` (None for a preset or none stated)."""
    path = hf_config_path(model)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None  # as_model has already read it; nothing more to say here
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    return quant if isinstance(quant, dict) else None


def _lengths_fields(
    input_len: Optional[int], output_len: Optional[int], lengths: Optional[LengthsLike]
) -> dict[str, Any]:
    """The traffic's length fields: fixed lengths, or a distribution (the lengths unset)."""
    if lengths is None:
        if input_len is None or output_len is None:
            missing = "input_len" if input_len is None else "output_len"
            lo, hi = _core.limits()[f"traffic.{missing}"]
            raise InvalidInputError(
                f"invalid traffic.{missing}: None (allowed: {lo}..={hi}, or a length distribution in lengths)"
            )
        return {"input_len": input_len, "output_len": output_len}
    if isinstance(lengths, (str, bytes, dict)) or not isinstance(lengths, Sequence):
        raise InvalidInputError(
            f"invalid traffic.lengths: {lengths!r:.60} (allowed: a list of (input_len, output_len[, weight]))"
        )
    if not 1 <= len(lengths) <= MAX_LENGTH_CLASSES:
        raise InvalidInputError(
            f"invalid traffic.lengths: {len(lengths)} classes (allowed: 1..={MAX_LENGTH_CLASSES} classes: bin "
            "a trace into a histogram (meshplan.serving.length_histogram, the CLI's --lengths))"
        )
    for name, v in (("input_len", input_len), ("output_len", output_len)):
        if v is not None:
            raise InvalidInputError(
                f"invalid traffic.{name}: {v!r:.40} (allowed: unset (0) with traffic.lengths, whose classes give "
                "the lengths)"
            )
    return {"lengths": [_length_class(c, i) for i, c in enumerate(lengths)]}


def _hf_expert_weights(model: ModelLike) -> Optional[str]:
    """``mxfp4`` when a Hugging Face config quantises with ``quant_method`` "mxfp4" (gpt-oss:
    the routed experts, attention, router, embedding and head kept in ``modules_to_not_convert``),
    None otherwise."""
    quant = _hf_quantization(model)
    return "mxfp4" if quant is not None and quant.get("quant_method") == "mxfp4" else None


def _hf_weight_scaling(model: ModelLike, weight_precision: str) -> Optional[str]:
    """``block`` when ``model`` is a Hugging Face config whose FP8 ``quantization_config``
    has a ``weight_block_size`` (DeepSeek-V3's ``[128, 128]``), ``tensor`` for another FP8
    ``quantization_config``, None otherwise (a preset, or no quantisation stated)."""
    quant = _hf_quantization(model) if weight_precision == "fp8" else None
    if quant is None or quant.get("quant_method") != "fp8":
        return None
    return "block" if quant.get("weight_block_size") else "tensor"


def search_serving(
    model: ModelLike,
    cluster: Cluster,
    *,
    space: Optional[dict[str, Any]] = None,
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
    **problem: Any,
) -> ServingResult:
    """The deployments of ``model`` on ``cluster`` that meet the SLOs, best first by tokens/s
    per GPU (``objective="latency"``: by end-to-end latency), and the Pareto front.

    ``problem`` takes the keywords of :func:`serving_problem` (``input_len`` and ``output_len``,
    or a length distribution in ``lengths``). ``space``: ``{"top_k", "disaggregation", "max_tp", "max_pp",
    "max_attention_dp", "max_sequences", "allow_tp_cross_domain", "attention_kernel",
    "sliding_kv"}``, each optional (``attention_kernel``: ``flash`` or ``triton-mla``;
    ``sliding_kv``: ``window`` or ``full``; both for every deployment scored).
    """
    raw = _core.search_serving(serving_problem(model, cluster, **problem), space, timeout_s, cancel)
    return ServingResult(raw["plans"], raw["pareto"], raw["stats"])


def evaluate_serving(
    model: ModelLike,
    cluster: Cluster,
    plan: PlanLike,
    *,
    prefill: Optional[PlanLike] = None,
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
    **problem: Any,
) -> dict[str, Any]:
    """One deployment scored: ``feasible``, ``violations``, ``memory``, ``time`` (TTFT, TPOT,
    e2e, the decode and prefill breakdowns) and the throughput figures."""
    problem_dict = serving_problem(model, cluster, **problem)
    return dict(_core.evaluate_serving(problem_dict, parse_serving_plan(plan, prefill), timeout_s, cancel))


def explain_serving(
    model: ModelLike,
    cluster: Cluster,
    plan: PlanLike,
    *,
    prefill: Optional[PlanLike] = None,
    timeout_s: Optional[float] = None,
    cancel: Optional[CancelToken] = None,
    **problem: Any,
) -> dict[str, Any]:
    """One deployment explained per axis (what is sharded, which collective, bytes per token,
    which fabric, seconds per decode step)."""
    problem_dict = serving_problem(model, cluster, **problem)
    return dict(_core.explain_serving(problem_dict, parse_serving_plan(plan, prefill), timeout_s, cancel))


def _parse_pairs(text: str, what: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise InvalidInputError(f"invalid {what}: {item!r} (allowed: key=value pairs such as tp=8,batch=16)")
        pairs[key.lower().replace("-", "_")] = value
    return pairs


def _integer(value: str, field_path: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InvalidInputError(
            f"invalid {field_path}: {value!r} (allowed: an integer)", field=field_path, value=value,
            allowed="an integer",
        ) from None


def _worker(text: str, what: str) -> tuple[dict[str, Any], Optional[int]]:
    """A worker dict and its replica count (None when not given) from ``k=v`` pairs."""
    worker: dict[str, Any] = {}
    replicas: Optional[int] = None
    for key, value in _parse_pairs(text, what).items():
        if key in ("replicas", "workers"):
            replicas = _integer(value, f"{what}.replicas")
        elif key in _WORKER_KEYS:
            name = _WORKER_KEYS[key]
            worker[name] = value if name in _NAMED_WORKER_KEYS else _integer(value, f"{what}.{name}")
        else:
            keys = ", ".join(sorted(set(_WORKER_KEYS) | {"replicas"}))
            raise InvalidInputError(f"invalid {what}: unknown key {key!r} (allowed: {keys})")
    worker.setdefault("max_sequences", 1)
    if "tp" not in worker:
        raise InvalidInputError(f"invalid {what}: no tp (allowed: key=value pairs with tp=N)")
    return worker, replicas


def parse_serving_plan(plan: PlanLike, prefill: Optional[PlanLike] = None) -> dict[str, Any]:
    """A deployment dict from a dict or ``tp=8,batch=16,replicas=2`` (plus, for a
    disaggregated one, ``prefill`` as ``tp=4,batch=4,replicas=1``). Keys: tp, pp, attention_dp
    (adp), ep, expert_tp (etp; default: the stage's GPUs over ep), max_sequences (batch),
    max_batched_tokens (tokens: one forward's tokens per attention-DP rank), kv_tokens (the KV
    cache's tokens per rank as the engine reports them), output_lag_steps (lag: engine steps
    before a step's tokens are returned; vLLM V0's asynchronous output processing: 1),
    attention_kernel (attn: ``flash``, the default, or ``triton-mla``, SGLang 0.4's Triton MLA
    backend), sliding_kv (swa: what the KV pool keeps of a sliding-window layer, ``window``, the
    default, or ``full``, SGLang's pool for gpt-oss), replicas."""
    if isinstance(plan, dict):
        if prefill is not None:
            raise InvalidInputError("invalid prefill: give the prefill pool inside the plan dict")
        return plan
    worker, replicas = _worker(plan, "serving_plan")
    out: dict[str, Any] = {"worker": _complete(worker), "replicas": 1 if replicas is None else replicas}
    if prefill is not None:
        if isinstance(prefill, dict):
            pw, prefill_replicas = dict(prefill), None
        else:
            pw, prefill_replicas = _worker(prefill, "serving_plan.prefill")
        out["prefill"] = _complete(pw)
        out["prefill_replicas"] = 1 if prefill_replicas is None else prefill_replicas
    return out


def _complete(worker: dict[str, Any]) -> dict[str, Any]:
    """``expert_tp`` defaulted so that ``ep × expert_tp = tp × attention_dp``."""
    w = dict(worker)
    stage = int(w.get("tp", 1)) * int(w.get("attention_dp", 1))
    ep = int(w.get("ep", 1))
    if "expert_tp" not in w and ep > 0 and stage % ep == 0:
        w["expert_tp"] = stage // ep
    return w


# --- launch commands ---------------------------------------------------------------------------

ENGINES = ("vllm", "sglang", "trtllm")
"""Engines :func:`launch_commands` writes commands for."""

_VLLM_KV = {"bf16": "auto", "fp16": "auto", "fp8": "fp8", "nvfp4": "fp8"}
_SGLANG_KV = {"bf16": "auto", "fp16": "auto", "fp8": "fp8_e4m3", "nvfp4": "fp8_e4m3"}
_VLLM_QUANT = {"fp8": "fp8", "nvfp4": "modelopt_fp4", "mxfp8": "mxfp8"}
_SGLANG_QUANT = {"fp8": "fp8", "nvfp4": "modelopt_fp4"}


def _prefix_hits(problem: dict[str, Any]) -> bool:
    """Whether the estimate assumed prompt tokens found in the prefix cache (a shared prefix or a
    cached share of each prompt), which the engine's prefix caching must then be on for. SGLang's
    radix cache is on by default; vLLM's flag and TensorRT-LLM's block reuse are set explicitly."""
    t = problem.get("traffic", {})
    return bool(t.get("prefix_fraction") or t.get("cached_fraction"))


def _engine_flags(engine: str, w: dict[str, Any], problem: dict[str, Any], role: Optional[str]) -> list[str]:
    """The parallelism, batch, precision and disaggregation flags of one worker."""
    tp, pp = int(w["tp"]), int(w.get("pp", 1))
    adp, ep = int(w.get("attention_dp", 1)), int(w.get("ep", 1))
    batch = int(w["max_sequences"])
    tokens = w.get("max_batched_tokens")
    weights, kv = problem.get("weight_precision", "bf16"), problem.get("kv_precision", "bf16")
    flags: list[str] = []
    if engine == "vllm":
        flags += ["--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp)]
        if adp > 1:
            flags += ["--data-parallel-size", str(adp)]
        if ep > 1:
            flags += ["--enable-expert-parallel"]
        # vLLM's limit is per engine (each data-parallel rank runs its own scheduler).
        flags += ["--max-num-seqs", str(max(1, batch // adp))]
        if tokens is not None:
            flags += ["--max-num-batched-tokens", str(tokens)]
        flags += ["--kv-cache-dtype", _VLLM_KV.get(kv, "auto")]
        if w.get("sliding_kv") == "full":
            flags += ["--disable-hybrid-kv-cache-manager"]
        if problem.get("expert_weights") == "mxfp4":
            flags += ["--quantization", "mxfp4"]
        elif weights in _VLLM_QUANT:
            flags += ["--quantization", _VLLM_QUANT[weights]]
        if _prefix_hits(problem) and role != "decode":
            flags += ["--enable-prefix-caching"]
        if role is not None:
            flags += ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
    elif engine == "sglang":
        # SGLang's --tp-size counts every GPU of a stage; attention TP is tp-size / dp-size.
        flags += ["--tp-size", str(tp * adp), "--pp-size", str(pp)]
        if adp > 1:
            flags += ["--dp-size", str(adp), "--enable-dp-attention"]
        if ep > 1:
            flags += ["--ep-size", str(ep)]
        flags += ["--max-running-requests", str(batch)]
        if tokens is not None:
            flags += ["--chunked-prefill-size", str(tokens)]
        flags += ["--kv-cache-dtype", _SGLANG_KV.get(kv, "auto")]
        if w.get("attention_kernel") == "triton-mla":
            flags += ["--attention-backend", "triton"]
        if w.get("sliding_kv") == "full":
            flags += ["--disable-hybrid-swa-memory"]
        if problem.get("expert_weights") == "mxfp4":
            flags += ["--quantization", "mxfp4"]
        elif weights in _SGLANG_QUANT:
            flags += ["--quantization", _SGLANG_QUANT[weights]]
        if role is not None:
            flags += ["--disaggregation-mode", role]
    else:
        flags += ["--tp_size", str(tp * adp), "--pp_size", str(pp), "--ep_size", str(ep)]
        flags += ["--max_batch_size", str(batch)]
        if tokens is not None:
            flags += ["--max_num_tokens", str(tokens)]
        if adp > 1:
            flags += ["--extra_llm_api_options", "attention_dp.yaml"]
    return flags


def launch_commands(
    evaluation_or_plan: dict[str, Any], problem: dict[str, Any], engine: str = "vllm",
    model_path: Optional[str] = None,
) -> list[str]:
    """Shell commands that launch the deployment on ``engine`` (vllm, sglang, trtllm), one per
    worker kind with the replica count as a comment. ``problem`` is the serving-problem dict
    (:func:`serving_problem`); ``model_path`` defaults to the model's name."""
    if engine not in ENGINES:
        raise InvalidInputError(f"invalid engine: {engine!r} (allowed: {', '.join(ENGINES)})")
    plan = evaluation_or_plan.get("plan", evaluation_or_plan)
    model = model_path or problem["model"]["name"]
    base = {
        "vllm": ["vllm", "serve", model],
        "sglang": ["python", "-m", "sglang.launch_server", "--model-path", model],
        "trtllm": ["trtllm-serve", model],
    }[engine]
    out: list[str] = []
    pools = [("decode" if plan.get("prefill") else None, plan["worker"], plan.get("replicas", 1))]
    if plan.get("prefill"):
        pools.insert(0, ("prefill", plan["prefill"], plan.get("prefill_replicas", 1)))
    for role, worker, count in pools:
        label = f"{role} workers" if role else "workers"
        stage = int(worker["tp"]) * int(worker.get("attention_dp", 1))
        ep = int(worker.get("ep", 1))
        note = ""
        if engine == "vllm" and 1 < ep < stage:
            # vLLM's expert parallelism spans the whole stage (or nothing).
            note = f" (vLLM runs the experts at ep={stage}, not ep={ep})"
        if engine != "sglang" and worker.get("attention_kernel") == "triton-mla":
            # The estimate priced SGLang's Triton MLA kernel; this engine runs its own.
            note += f" (the estimate assumed SGLang's Triton MLA attention; {engine} runs its own kernels)"
        if engine == "trtllm" and _prefix_hits(problem) and role != "decode":
            # trtllm-serve has no flag for it: the KV-cache config's block reuse.
            note += (" (the estimate assumed prefix-cache hits on the prompts; set"
                     " kv_cache_config.enable_block_reuse: true)")
        if engine == "trtllm" and worker.get("sliding_kv") == "full":
            # TensorRT-LLM sizes the pools of sliding-window layers by its KV-cache config.
            note += (" (the estimate assumed a KV pool that keeps every token of the sliding-window layers;"
                     " set kv_cache_config.max_attention_window to match)")
        command = " ".join(shlex.quote(a) for a in base + _engine_flags(engine, worker, problem, role))
        out.append(f"# {count} {label} of {stage * int(worker.get('pp', 1))} GPUs each{note}")
        out.append(command)
    return out
