"""``meshplan.export``: a plan as the configuration a training framework accepts.

Formats:

- ``megatron``: Megatron-LM / Megatron-Bridge command-line arguments. Megatron counts data
  parallelism as ``dp·ep`` (the expert ranks are data parallel for the dense layers), or ``dp``
  for a folded plan (``etp`` set: ``--expert-tensor-parallel-size``), so its data-parallel size
  is implied by the world size and stated in a comment.
- ``torchtitan``: a Python snippet building torchtitan's ``ParallelismConfig``, with the legacy
  job-config TOML (``[parallelism]`` and friends) in the string ``LEGACY_TOML``;
  ``torchtitan-toml`` is that TOML alone.
- ``deepspeed``: a DeepSpeed JSON config (ZeRO stage, micro-batch, gradient accumulation, train
  batch size), for plans plain DeepSpeed can run.
- ``maxtext``: MaxText ``key=value`` overrides of ``configs/base.yml`` (mesh axes, remat
  policy, batch), for plans MaxText can run.
- ``device-mesh``: a runnable snippet building the plan's named
  ``torch.distributed.device_mesh.init_device_mesh`` in its rank order.

A plan a framework cannot run raises :class:`~meshplan.errors.InvalidInputError` saying why,
never a config that silently means something else.

Exports follow the workload's stack (``Workload.stack``): without a format, :func:`export` uses
the stack's own (``megatron-core`` → ``megatron``, ``torchtitan``, ``deepspeed``, ``maxtext``),
and each export carries the knobs that stack's profile models (overlap flags, bucket sizes, the
exact pipeline layer split). :func:`parse` reads an export back into the plan.
"""

from __future__ import annotations

import ast
import json
import re
import tomllib
from typing import Any, Mapping, Optional, Union

from . import _core
from ._fields import as_type, check_int
from .api import ModelLike, as_model
from .errors import InvalidInputError
from .model import Model
from .plan import DEFAULT_ORDER, Plan
from .workload import Workload

FORMATS = ("megatron", "torchtitan", "torchtitan-toml", "deepspeed", "maxtext", "device-mesh")

#: The export format of each training stack (``Workload.stack``).
STACK_FORMATS = {
    "megatron-core": "megatron",
    "torchtitan": "torchtitan",
    "deepspeed": "deepspeed",
    "maxtext": "maxtext",
}

#: The stack whose profile each format's knobs come from.
FORMAT_STACKS = {
    "megatron": "megatron-core",
    "torchtitan": "torchtitan",
    "torchtitan-toml": "torchtitan",
    "deepspeed": "deepspeed",
    "maxtext": "maxtext",
}


def stack_profile(name: str) -> dict[str, Any]:
    """The profile of stack ``name`` (the core's ``data/stacks.toml`` table) as a dict."""
    for profile in _core.stacks():
        if profile["name"] == name:
            return profile
    known = ", ".join(p["name"] for p in _core.stacks())
    raise InvalidInputError(f"invalid workload.stack: {name!r} (allowed: one of {known})")


def rank_layers(
    layers: int, pp: int, first: Optional[int] = None, last: Optional[int] = None
) -> list[int]:
    """Layers on each pipeline rank as the cost model splits them (the core's
    ``stages::rank_layer_counts``): ``L/pp`` each, the remainder to the middle ranks first, then
    the last, then the first; with the first and/or last rank's count fixed
    (``Plan.first_stage_layers``/``last_stage_layers``), those, and the other ranks an equal
    share of the rest. Counts that leave no equal share raise :class:`InvalidInputError`."""
    ends = {
        field: None if count is None else check_int(f"plan.{field}", count)
        for field, count in (("first_stage_layers", first), ("last_stage_layers", last))
    }
    plan = {"dp": 1, "tp": 1, "pp": check_int("plan.pp", pp), **ends}
    runs = _core.rank_layer_counts(check_int("model.layers", layers), plan)
    return [each for ranks, each in runs for _ in range(ranks)]


def chunk_layers(
    layers: int, pp: int, vpp: int, first: Optional[int] = None, last: Optional[int] = None
) -> list[int]:
    """Layers of each model chunk in model order (chunk ``c`` of rank ``r`` is entry ``c·pp + r``):
    each rank's layers (:func:`rank_layers`) split as evenly as its ``vpp`` chunks allow, the
    extra ones to chunks other than the embedding's (rank 0, chunk 0) and the loss's (last
    rank, last chunk)."""
    out = [0] * (pp * vpp)
    for r, n in enumerate(rank_layers(layers, pp, first, last)):
        q, extra = divmod(n, vpp)
        ends = {0} if r == 0 else set()
        if r == pp - 1:
            ends.add(vpp - 1)
        order = [c for c in range(vpp) if c not in ends] + sorted(ends)
        for i, c in enumerate(order):
            out[c * pp + r] = q + (1 if i < extra else 0)
    return out


def megatron_layout(
    layers: int, pp: int, vpp: int, first: Optional[int] = None, last: Optional[int] = None
) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` for the modelled split: stages in model
    order separated by ``|``, ``E`` the embedding, ``t`` a decoder layer, ``L`` the loss."""
    chunks = chunk_layers(layers, pp, vpp, first, last)
    stages = []
    for v, n in enumerate(chunks):
        stage = ("E" if v == 0 else "") + "t" * n + ("L" if v == len(chunks) - 1 else "")
        stages.append(stage)
    return "|".join(stages)

def torchtitan_layout(
    layers: int, pp: int, vpp: int, first: Optional[int] = None, last: Optional[int] = None
) -> list[list[str]]:
    """torchtitan's ``module_fqns_per_model_part`` for the modelled split: one list of module
    names per stage in model order (stage ``c·pp + r`` is chunk ``c`` of rank ``r``, the order its
    interleaved schedules place stages in), ``tok_embeddings`` on the first, ``norm`` and
    ``output`` on the last."""
    chunks = chunk_layers(layers, pp, vpp, first, last)
    out, first = [], 0
    for v, n in enumerate(chunks):
        stage = ["tok_embeddings"] if v == 0 else []
        stage += [f"layers.{i}" for i in range(first, first + n)]
        if v == len(chunks) - 1:
            stage += ["norm", "output"]
        out.append(stage)
        first += n
    return out


#: torchtitan schedule names (``torch.distributed.pipelining``) of meshplan's schedules.
TORCHTITAN_SCHEDULES = {"1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}

#: The rank order Megatron's ``--use-tp-pp-dp-mapping`` selects.
MEGATRON_TP_PP_DP = "tp-cp-ep-pp-dp"


def export(
    plan: Union[Plan, str, Mapping[str, Any]],
    format: Optional[str] = None,
    *,
    model: Optional[ModelLike] = None,
    workload: Optional[Workload] = None,
) -> str:
    """``plan`` in ``format`` (one of :data:`FORMATS`; None: the workload's stack's format,
    :data:`STACK_FORMATS`), as text.

    ``workload`` gives the batch (``megatron``'s ``--global-batch-size``, DeepSpeed's
    ``train_batch_size`` and gradient accumulation, torchtitan's micro-batch count) and is
    required by ``deepspeed``; ``model`` gives the layer count for the pipeline split.
    """
    p = _plan(plan)
    m = None if model is None else as_model(model)
    w = None if workload is None else as_type(Workload, workload, "workload")
    if format is None:
        stack = "megatron-core" if w is None else w.stack
        stack_profile(stack)  # an unknown stack names the known ones
        format = STACK_FORMATS[stack]
    if format == "megatron":
        return megatron(p, m, w)
    if format == "torchtitan":
        return torchtitan(p, m, w)
    if format == "torchtitan-toml":
        return torchtitan_toml(p, m, w)
    if format == "deepspeed":
        return deepspeed(p, w)
    if format == "maxtext":
        return maxtext(p, w)
    if format == "device-mesh":
        return device_mesh(p)
    raise InvalidInputError(f"invalid format: {format!r} (allowed: {', '.join(FORMATS)})")


def _plan(plan: Union[Plan, str, Mapping[str, Any]]) -> Plan:
    p = Plan.parse(plan) if isinstance(plan, str) else as_type(Plan, plan, "plan")
    names = ("dp", "tp", "pp", "ep", "cp", "vpp", "micro_batch") + (("etp",) if p.folded else ())
    for name in names:
        value = getattr(p, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidInputError(f"invalid plan.{name}: {value!r} (allowed: an integer >= 1)")
    if p.zero not in (0, 1, 2, 3):
        raise InvalidInputError(f"invalid plan.zero: {p.zero!r} (allowed: 0, 1, 2 or 3)")
    schedule = schedule_of(p)
    if schedule not in ("1f1b", "interleaved-1f1b", "zb-h1"):
        raise InvalidInputError(
            f"invalid plan.schedule: {schedule!r} (allowed: 1f1b, interleaved-1f1b, zb-h1)"
        )
    if (schedule == "interleaved-1f1b") != (p.vpp > 1):
        raise InvalidInputError(
            f"invalid plan: schedule {schedule} with vpp = {p.vpp} "
            "(interleaved-1f1b needs vpp >= 2, the other schedules vpp = 1)"
        )
    if p.etp is not None and (p.dp * p.tp * p.cp) % (p.etp * p.ep):
        raise InvalidInputError(
            f"invalid plan.etp: {p.etp} (allowed: a degree with etp·ep dividing the "
            f"dp·tp·cp = {p.dp * p.tp * p.cp} ranks of a pipeline stage; ep = {p.ep})"
        )
    order = p.order.split("-")
    if sorted(order) != sorted(DEFAULT_ORDER.split("-")):
        raise InvalidInputError(
            f"invalid plan.order: {p.order!r} (allowed: each of tp, cp, ep, dp, pp exactly once, "
            "joined by '-', innermost first)"
        )
    return p


def _exchange_offered(plan: Plan, stack: str) -> bool:
    """Whether ``stack`` offers the plan's MoE token exchange (dispatcher, EP overlap): its
    ``dispatchers`` and ``ep_overlap`` in data/stacks.toml; no dispatcher is the stack's own."""
    profile = stack_profile(stack)
    dispatcher = plan.dispatcher or profile["default_dispatcher"]
    return dispatcher in profile["dispatchers"] and plan.ep_overlap in profile["ep_overlap"]


def _read_dispatcher(stack: str, ep: int) -> Optional[str]:
    """The dispatcher an export of ``stack`` read back runs: the stack's default with ``ep > 1``
    (its files have no field for it), none without."""
    return str(stack_profile(stack)["default_dispatcher"]) if ep > 1 else None


MEGATRON_CP_COMM = {"ring": "p2p", "allgather": "all_gather", "a2a": "a2a", "a2a+p2p": "a2a+p2p"}
"""Megatron-LM's ``--cp-comm-type`` for each CP exchange of :attr:`Plan.cp_exchange`."""


def _cp_exchange(plan: Plan, stack: str) -> str:
    """The CP exchange the estimate of ``plan`` under ``stack`` assumed: the plan's, else the
    stack's default (data/stacks.toml ``default_cp_exchange``); refused if the stack lacks it."""
    profile = stack_profile(stack)
    exchange = plan.cp_exchange or str(profile["default_cp_exchange"])
    if exchange not in profile["cp_exchanges"]:
        raise InvalidInputError(
            f"cannot export to {stack}: it has no {exchange} context-parallel exchange "
            f"(it has {', '.join(profile['cp_exchanges'])})"
        )
    return exchange


def schedule_of(plan: Plan) -> str:
    """The schedule in effect: the plan's, else interleaved when ``vpp > 1``, else 1F1B."""
    return plan.schedule or ("interleaved-1f1b" if plan.vpp > 1 else "1f1b")


def micro_batches(plan: Plan, workload: Workload) -> int:
    """Micro-batches per pipeline per step, ``B / (b·dp·ep)`` (``B / (b·dp)`` folded); an error
    when not exact."""
    per_step = plan.micro_batch * plan.dense_dp
    if workload.global_batch % per_step:
        raise InvalidInputError(
            f"invalid plan: global_batch = {workload.global_batch} is not a multiple of "
            f"micro_batch·{'dp' if plan.folded else 'dp·ep'} = {per_step}"
        )
    return workload.global_batch // per_step


def _header(plan: Plan, comment: str, target: str) -> list[str]:
    if plan.folded:
        return [
            f"{comment} {target} for the meshplan plan {plan}",
            f"{comment} world size {plan.num_gpus} = dp·tp·pp·cp = "
            f"{plan.dp}·{plan.tp}·{plan.pp}·{plan.cp}; rank order {plan.order} (innermost first)",
            f"{comment} folded experts: etp·ep·edp·pp = {plan.etp}·{plan.ep}·{plan.expert_dp}·"
            f"{plan.pp} over the same ranks (MoE parallel folding)",
        ]
    return [
        f"{comment} {target} for the meshplan plan {plan}",
        f"{comment} world size {plan.num_gpus} = dp·tp·pp·ep·cp = "
        f"{plan.dp}·{plan.tp}·{plan.pp}·{plan.ep}·{plan.cp}; rank order {plan.order} "
        "(innermost first)",
    ]


# --- Megatron-LM ---------------------------------------------------------------------------


def megatron_args(
    plan: Plan, model: Optional[Model] = None, workload: Optional[Workload] = None
) -> list[tuple[str, Optional[str]]]:
    """Megatron-LM arguments as ``(flag, value or None)`` pairs."""
    schedule = schedule_of(plan)
    if schedule == "zb-h1":
        raise InvalidInputError(
            "cannot export to megatron: Megatron-LM has no zb-h1 schedule (it runs 1f1b and "
            "interleaved-1f1b; zero-bubble needs the sail-sg/zero-bubble-pipeline-parallelism fork)"
        )
    if plan.order not in (DEFAULT_ORDER, MEGATRON_TP_PP_DP):
        raise InvalidInputError(
            f"cannot export to megatron: rank order {plan.order} has no Megatron-LM option "
            f"(it builds {DEFAULT_ORDER}, or {MEGATRON_TP_PP_DP} with --use-tp-pp-dp-mapping)"
        )
    if plan.recompute == "selective-op":
        raise InvalidInputError(
            "cannot export to megatron: Megatron-LM has no op-level selective checkpointing "
            "(recompute selective-op is torchtitan's policy); use selective or full"
        )
    args: list[tuple[str, Optional[str]]] = [
        ("--tensor-model-parallel-size", str(plan.tp)),
        ("--pipeline-model-parallel-size", str(plan.pp)),
        ("--context-parallel-size", str(plan.cp)),
        ("--expert-model-parallel-size", str(plan.ep)),
    ]
    if plan.ep > 1 or plan.folded:
        # The experts' tensor parallelism: tp, or a folded plan's etp (MoE parallel folding).
        args.append(("--expert-tensor-parallel-size", str(plan.expert_tp)))
    if plan.ep > 1:
        # The token exchange the estimate assumed: the plan's, else the stack's default.
        dispatcher = plan.dispatcher or stack_profile("megatron-core")["default_dispatcher"]
        args.append(("--moe-token-dispatcher-type", dispatcher))
        if dispatcher == "flex":
            # DeepEP kernels (use hybridep on NVL72 racks); Megatron-Core >= 0.14.
            args.append(("--moe-flex-dispatcher-backend", "deepep"))
    if plan.ep_overlap:
        args.append(("--overlap-moe-expert-parallel-comm", None))
    if plan.cp > 1 and plan.cp_exchange is not None:
        # The K/V exchange the plan names (unnamed: the profile's default, ring, which is
        # Megatron's own default p2p, so no flag and the plan reads back unchanged).
        exchange = _cp_exchange(plan, "megatron-core")
        if exchange == "a2a+p2p":
            raise InvalidInputError(
                "cannot export to megatron: cp_exchange a2a+p2p needs "
                "--hierarchical-context-parallel-sizes, which depends on the cluster's NVLink "
                "domain (meshplan explain names the split); export ring or a2a, or add both "
                "flags by hand"
            )
        args.append(("--cp-comm-type", MEGATRON_CP_COMM[exchange]))
    if plan.folded and plan.tp > 1 and not plan.sequence_parallel:
        raise InvalidInputError(
            "cannot export to megatron: a folded MoE plan with tp > 1 needs sequence "
            "parallelism (Megatron: 'When using MoE and tensor parallelism, sequence "
            "parallelism must be used')"
        )
    chunks = plan.pp * plan.vpp
    ends = (plan.first_stage_layers, plan.last_stage_layers)
    if model is not None and plan.pp > 1 and (model.layers % chunks or ends != (None, None)):
        # Not the standard (L/pp)/vpp layers per chunk: the exact split the cost model timed.
        layout = chunk_layers(model.layers, plan.pp, plan.vpp, *ends)
        empty = [v for v, n in enumerate(layout) if n == 0 and v not in (0, chunks - 1)]
        if empty:
            raise InvalidInputError(
                f"cannot export to megatron: {model.layers} layers leave model chunk {empty[0]} "
                f"of pp·vpp = {chunks} without a layer"
            )
        args.append(
            ("--pipeline-model-parallel-layout", megatron_layout(model.layers, plan.pp, plan.vpp, *ends))
        )
    elif plan.vpp > 1:
        if model is not None:
            args.append(("--num-layers-per-virtual-pipeline-stage", str(model.layers // chunks)))
        else:
            args.append(("--virtual-pipeline-model-parallel-size", str(plan.vpp)))
    if plan.order == MEGATRON_TP_PP_DP:
        args.append(("--use-tp-pp-dp-mapping", None))
    if plan.sequence_parallel and plan.tp > 1:
        args.append(("--sequence-parallel", None))
    profile = stack_profile("megatron-core")
    data_parallel = plan.dense_dp * plan.cp > 1 or plan.expert_dp > 1
    # Megatron's own default bucket is the profile's max(40 M, 1 M · data-parallel ranks); only
    # a workload's bucket size needs the flag.
    bucket = None if workload is None else workload.bucket_params
    if plan.zero <= 1 and data_parallel and bucket is not None:
        args.append(("--ddp-bucket-size", str(bucket)))
    if profile["overlap_grad_reduce"] and data_parallel:
        args.append(("--overlap-grad-reduce", None))
    if profile["overlap_param_gather"] and data_parallel and plan.zero >= 1:
        args.append(("--overlap-param-gather", None))
    if profile["tp_overlap"] > 0 and plan.tp > 1 and plan.sequence_parallel:
        args.append(("--tp-comm-overlap", None))
    if plan.zero >= 1:
        args.append(("--use-distributed-optimizer", None))
    if plan.zero >= 2:
        strategy = "optim_grads" if plan.zero == 2 else "optim_grads_params"
        args += [
            ("--use-megatron-fsdp", None),
            ("--data-parallel-sharding-strategy", strategy),
            ("--no-gradient-accumulation-fusion", None),
            ("--ckpt-format", "fsdp_dtensor"),
        ]
    if plan.recompute == "full":
        args += [
            ("--recompute-granularity", "full"),
            ("--recompute-method", "uniform"),
            ("--recompute-num-layers", "1"),
        ]
    elif plan.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
        if plan.recompute_modules is not None:
            # Megatron-Core's fine-grained modules, space-separated (default core_attn)
            # [megatron/core/transformer/transformer_config.py recompute_modules; e.g.
            # examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh "--recompute-modules mlp moe
            # mla_up_proj layernorm"].
            args.append(("--recompute-modules", plan.recompute_modules.replace("+", " ")))
    if plan.offload_layers:
        if plan.pp > 1 or plan.recompute != "none":
            raise InvalidInputError(
                "cannot export to megatron: offload_layers needs pp = 1 and recompute none "
                "(Megatron-Core: 'Currently there is no support for Pipeline parallelism with CPU "
                "offloading', 'CPU offloading does not work when activation recomputation is "
                "enabled')"
            )
        # Activations only (cpu_offloading_weights defaults to False)
        # [megatron/core/model_parallel_config.py cpu_offloading*].
        args += [
            ("--cpu-offloading", None),
            ("--cpu-offloading-num-layers", str(plan.offload_layers)),
        ]
    args.append(("--micro-batch-size", str(plan.micro_batch)))
    if workload is not None:
        micro_batches(plan, workload)  # checks that the batch splits evenly
        args += [
            ("--global-batch-size", str(workload.global_batch)),
            ("--seq-length", str(workload.seq_len)),
        ]
        if workload.precision in ("bf16", "fp16"):
            args.append((f"--{workload.precision}", None))
        if workload.grad_bytes == 2:
            args.append(("--grad-reduce-in-bf16", None))
    return args


def megatron(plan: Plan, model: Optional[Model] = None, workload: Optional[Workload] = None) -> str:
    """Megatron-LM / Megatron-Bridge arguments, one per line, continued with ``\\``."""
    args = megatron_args(plan, model, workload)
    lines = _header(plan, "#", "Megatron-LM arguments")
    if plan.folded:
        lines.append(
            f"# data-parallel size (implied by the world size, not an argument): dp = {plan.dp}; "
            f"expert data-parallel size dp·tp·cp/(etp·ep) = {plan.expert_dp}"
        )
    else:
        lines.append(
            f"# data-parallel size (implied by the world size, not an argument): dp·ep = "
            f"{plan.dp}·{plan.ep} = {plan.dp * plan.ep}"
        )
    if workload is not None:
        m = micro_batches(plan, workload)
        lines.append(
            f"# {m} micro-batches per step = global batch {workload.global_batch} / "
            f"(micro-batch {plan.micro_batch} · data-parallel size {plan.dense_dp})"
        )
        if workload.precision not in ("bf16", "fp16"):
            lines.append(
                f"# precision {workload.precision}: add your Transformer Engine recipe flags"
            )
    else:
        lines.append("# give the workload for --global-batch-size and --seq-length")
    if plan.vpp > 1 and not any(flag == "--num-layers-per-virtual-pipeline-stage" for flag, _ in args):
        lines.append(f"# {plan.vpp} model chunks per pipeline rank")
    body = [flag if value is None else f"{flag} {value}" for flag, value in args]
    lines += [f"{a} \\" for a in body[:-1]] + body[-1:]
    return "\n".join(lines) + "\n"


# --- torchtitan ----------------------------------------------------------------------------


def torchtitan_fields(
    plan: Plan, model: Optional[Model] = None, workload: Optional[Workload] = None
) -> dict[str, Any]:
    """torchtitan's ``[parallelism]`` fields for ``plan`` (current names)."""
    if plan.order != DEFAULT_ORDER:
        raise InvalidInputError(
            f"cannot export to torchtitan: rank order {plan.order} (torchtitan builds its mesh "
            f"pp, dp_replicate, dp_shard, cp, tp from the outside in, i.e. {DEFAULT_ORDER})"
        )
    if plan.offload_layers:
        raise InvalidInputError(
            "cannot export to torchtitan: it has no activation offloading (offload_layers; its "
            "enable_cpu_offload moves FSDP parameters, gradients and optimizer states)"
        )
    if plan.recompute == "selective":
        raise InvalidInputError(
            "cannot export to torchtitan: it has no core-attention-only recompute (recompute "
            "selective is Megatron's); use selective-op (its op-level policy), full or none"
        )
    schedule = schedule_of(plan)
    data_parallel = plan.dense_dp
    if not _exchange_offered(plan, "torchtitan"):
        raise InvalidInputError(
            "cannot export to torchtitan: its expert parallelism exchanges tokens with "
            f"all-to-all only (dispatcher {plan.dispatcher}, ep_overlap {plan.ep_overlap})"
        )
    if plan.folded and plan.etp not in (1, plan.tp):
        raise InvalidInputError(
            f"cannot export to torchtitan: etp = {plan.etp} with tp = {plan.tp} (its expert "
            "tensor parallelism is 1 or tp: ParallelDims)"
        )
    if plan.zero == 0 and plan.ep > 1:
        raise InvalidInputError(
            "cannot export to torchtitan: its expert parallelism borrows ranks from the FSDP "
            "shard dimension, which a zero = 0 (replicated) plan does not have; use zero >= 1"
        )
    fields: dict[str, Any] = {
        "data_parallel_replicate_degree": data_parallel if plan.zero == 0 else 1,
        "data_parallel_shard_degree": 1 if plan.zero == 0 else data_parallel,
    }
    if plan.zero == 0 and (plan.tp > 1 or plan.cp > 1):
        raise InvalidInputError(
            f"cannot export to torchtitan: zero = 0 (DDP) with tp = {plan.tp}, cp = {plan.cp}: "
            "torchtitan runs DDP without other parallelism only, and shards the weights over "
            "the context-parallel ranks; use zero 2 or 3"
        )
    if plan.pp > 1 and plan.zero != 1:
        raise InvalidInputError(
            f"cannot export to torchtitan: pp = {plan.pp} with zero = {plan.zero} (under "
            "pipelining FSDP2 reduces gradients and gathers weights once per step, ZeRO-1, and "
            "DDP does not combine with other parallelisms); use zero 1"
        )
    if plan.pp == 1 and plan.zero == 1:
        raise InvalidInputError(
            "cannot export to torchtitan: without pipelining it has no ZeRO-1 (FSDP2 "
            "reduce-scatters every micro-batch's gradients); use zero 2 "
            "(fsdp_reshard_after_forward never), 3 or 0"
        )
    if plan.zero == 1:
        # Under PP, "default" keeps FSDP2's parameters unsharded through the step and the
        # schedule syncs gradients on the last micro-batch only: ZeRO-1.
        fields["fsdp_reshard_after_forward"] = "default"
    elif plan.zero == 2:
        # FSDP2 without resharding after forward: gradients and optimizer states sharded,
        # weights kept whole between forward and backward (ZeRO-2).
        fields["fsdp_reshard_after_forward"] = "never"
    elif plan.zero == 3:
        fields["fsdp_reshard_after_forward"] = "always"
    fields["tensor_parallel_degree"] = plan.tp
    if plan.tp > 1:
        fields["enable_sequence_parallel"] = plan.sequence_parallel
        if stack_profile("torchtitan")["tp_overlap"] > 0:
            # The profile's TP overlap is async TP, which needs torch.compile (compile.enable).
            fields["enable_async_tensor_parallel"] = True
    fields["pipeline_parallel_degree"] = plan.pp
    if plan.pp > 1:
        if schedule == "zb-h1":
            # ZBVZeroBubble is zero-bubble on a V of exactly two model chunks per rank.
            if plan.vpp != 2:
                raise InvalidInputError(
                    "cannot export to torchtitan: zb-h1 keeps one model chunk per pipeline rank, "
                    "but torchtitan's zero-bubble schedule (ZBVZeroBubble) needs two; use 1f1b "
                    "or interleaved-1f1b"
                )
            fields["pipeline_parallel_schedule"] = "ZBVZeroBubble"
        else:
            fields["pipeline_parallel_schedule"] = TORCHTITAN_SCHEDULES[schedule]
        if model is not None:
            ends = (plan.first_stage_layers, plan.last_stage_layers)
            chunks = chunk_layers(model.layers, plan.pp, plan.vpp, *ends)
            if len(set(chunks)) == 1:
                # Equal chunks: pp·vpp stages of L/(pp·vpp) layers; torchtitan would otherwise
                # count the embedding and the output as first/last_stage_less_layers layers.
                fields["pipeline_parallel_layers_per_stage"] = chunks[0]
                fields["pipeline_parallel_first_stage_less_layers"] = 0
                fields["pipeline_parallel_last_stage_less_layers"] = 0
            else:
                # The modelled split, module by module (torchtitan's explicit layout).
                fields["module_fqns_per_model_part"] = torchtitan_layout(
                    model.layers, plan.pp, plan.vpp, *ends
                )
        if workload is not None:
            fields["num_pp_microbatches"] = micro_batches(plan, workload)
    fields["context_parallel_degree"] = plan.cp
    if plan.cp > 1:
        # The K/V exchange the estimate assumed (the plan's, else the profile's default).
        fields["context_parallel_rotate_method"] = _cp_exchange(plan, "torchtitan")
    fields["expert_parallel_degree"] = plan.ep
    if plan.ep > 1 and (plan.tp > 1 or plan.folded):
        # Experts split tp ways, or a folded plan's etp (1: EP borrows the TP ranks too).
        fields["expert_tensor_parallel_degree"] = plan.expert_tp
    return fields


def torchtitan_toml(
    plan: Plan, model: Optional[Model] = None, workload: Optional[Workload] = None
) -> str:
    """The legacy torchtitan job-config TOML: ``[parallelism]``, ``[activation_checkpoint]``
    and, with a workload, ``[training]``."""
    fields = torchtitan_fields(plan, model, workload)
    legacy = dict(fields)
    legacy.pop("num_pp_microbatches", None)
    legacy.pop("enable_sequence_parallel", None)  # older releases always sequence-shard
    if plan.pp > 1:
        legacy["pipeline_parallel_microbatch_size"] = plan.micro_batch
    lines = _header(plan, "#", "torchtitan job config")
    lines.append("[parallelism]")
    lines += [f"{k} = {_toml(v)}" for k, v in legacy.items()]
    if plan.recompute == "selective-op":
        lines += ["", "[activation_checkpoint]", 'mode = "selective"', 'selective_ac_option = "op"']
    else:
        lines += ["", "[activation_checkpoint]", f"mode = {_toml(plan.recompute)}"]
    if workload is not None:
        lines += [
            "",
            "[training]",
            # Without a pipeline the local batch is one micro-batch and torchtitan accumulates
            # gradients up to the global batch; with one, the pipeline splits it.
            f"local_batch_size = {workload.global_batch // plan.dense_dp if plan.pp > 1 else plan.micro_batch}",
            f"global_batch_size = {workload.global_batch}",
            f"seq_len = {workload.seq_len}",
        ]
    return "\n".join(lines) + "\n"


def torchtitan(plan: Plan, model: Optional[Model] = None, workload: Optional[Workload] = None) -> str:
    """A Python snippet: torchtitan's ``ParallelismConfig`` for the plan, and the legacy TOML."""
    fields = torchtitan_fields(plan, model, workload)
    toml = torchtitan_toml(plan, model, workload)
    lines = _header(plan, "#", "torchtitan parallelism")
    if plan.tp > 1 and not plan.sequence_parallel:
        lines.append("# (older torchtitan releases always use sequence parallelism with TP)")
    if plan.ep > 1 and (plan.tp > 1 or plan.folded):
        lines.append(
            f"# experts are tensor-parallel over {plan.expert_tp} ranks in this plan "
            "(expert_tensor_parallel_degree)"
        )
    lines += [
        "from torchtitan.config.parallelism import ParallelismConfig",
        "",
        "parallelism = ParallelismConfig(",
    ]
    lines += [f"    {k}={v!r}," for k, v in fields.items()]
    lines += [")", "", "# The same for job-config TOML files of older torchtitan releases.",
              f"LEGACY_TOML = {toml!r}"]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


# --- DeepSpeed -----------------------------------------------------------------------------


def deepspeed_config(plan: Plan, workload: Workload) -> dict[str, Any]:
    """The DeepSpeed config dict for ``plan``; an error for plans DeepSpeed cannot run."""
    why = []
    if plan.tp > 1:
        why.append(f"tp = {plan.tp} (tensor parallelism needs Megatron-DeepSpeed)")
    if plan.ep > 1:
        why.append(f"ep = {plan.ep} (expert parallelism is not part of a DeepSpeed config)")
    if plan.cp > 1:
        why.append(f"cp = {plan.cp} (no context parallelism)")
    if plan.folded:
        why.append(f"etp = {plan.etp} (no MoE parallel folding)")
    if plan.pp > 1 and plan.zero >= 2:
        why.append(f"pp = {plan.pp} with ZeRO-{plan.zero} (the pipeline engine allows ZeRO 0-1)")
    if plan.vpp > 1:
        why.append(f"vpp = {plan.vpp} (no interleaved pipeline)")
    if plan.first_stage_layers is not None or plan.last_stage_layers is not None:
        why.append("fixed first/last stage layers (PipelineModule splits the layers evenly)")
    if schedule_of(plan) == "zb-h1":
        why.append("the zb-h1 schedule")
    if plan.offload_layers:
        why.append(
            f"offload_layers = {plan.offload_layers} (cpu_checkpointing offloads only full "
            "recompute's checkpoints)"
        )
    if workload.precision not in ("bf16", "fp16"):
        why.append(f"precision {workload.precision} (a DeepSpeed config trains in bf16 or fp16)")
    if plan.recompute == "selective":
        why.append("selective recompute (deepspeed.checkpointing recomputes whole layers)")
    if plan.recompute == "selective-op":
        why.append("op-level selective checkpointing (selective-op)")
    if why:
        raise InvalidInputError("cannot export to deepspeed: " + "; ".join(why))
    m = micro_batches(plan, workload)
    config: dict[str, Any] = {
        "train_batch_size": workload.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": m,
        "zero_optimization": {"stage": plan.zero},
        workload.precision: {"enabled": True},
        "communication_data_type": "fp32" if workload.grad_bytes == 4 else workload.precision,
    }
    profile = stack_profile("deepspeed")
    buckets = int(profile["ddp_bucket_params"] if workload.bucket_params is None
                  else workload.bucket_params)
    config["zero_optimization"].update(
        reduce_bucket_size=buckets,
        allgather_bucket_size=buckets,
        # DeepSpeed's own default, which the profile models: ZeRO-3 overlaps (its prefetch),
        # stages 0-2 reduce after the backward.
        overlap_comm=plan.zero == 3 or bool(profile["overlap_grad_reduce"]),
    )
    if plan.pp > 1:
        config["pipeline"] = {"stages": plan.pp, "partition": "uniform"}
    if plan.recompute == "full":
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    return config


def deepspeed(plan: Plan, workload: Optional[Workload]) -> str:
    """The DeepSpeed JSON config. With ``pp > 1`` the stages are set in code
    (``deepspeed.pipe.PipelineModule(num_stages=pp)``); the data-parallel world is then
    ``world / pp``."""
    if workload is None:
        raise InvalidInputError(
            "cannot export to deepspeed without the workload (its train_batch_size and "
            "gradient_accumulation_steps come from the global batch)"
        )
    return json.dumps(deepspeed_config(plan, workload), indent=2) + "\n"


# --- MaxText -------------------------------------------------------------------------------


#: MaxText ``remat_policy`` of meshplan's recompute modes (``minimal`` keeps every matmul output
#: and recomputes only element-wise work: MaxText's closest to none).
MAXTEXT_REMAT = {"none": "minimal", "full": "full"}


def maxtext_overrides(plan: Plan, workload: Workload) -> list[tuple[str, Any]]:
    """MaxText ``key=value`` overrides of ``configs/base.yml`` for ``plan``; an error for plans
    MaxText cannot run."""
    why = []
    if plan.pp > 1:
        why.append(f"pp = {plan.pp} (MaxText's circular pipeline is not a schedule meshplan models)")
    if plan.offload_layers:
        why.append(f"offload_layers = {plan.offload_layers} (its offloading remat policies are per tensor)")
    if plan.tp > 1 and plan.sequence_parallel:
        why.append("sequence parallelism (its tensor axis has no such switch)")
    if plan.zero not in (0, 3):
        why.append(f"ZeRO-{plan.zero} (MaxText replicates, data axis, or shards everything, fsdp axis)")
    if plan.recompute not in MAXTEXT_REMAT:
        why.append(f"recompute {plan.recompute}")
    if plan.order != DEFAULT_ORDER:
        why.append(f"rank order {plan.order}")
    if plan.folded:
        why.append(f"etp = {plan.etp} (its expert axis is carved out of the data axes, no folding)")
    if plan.dispatcher not in (None, *stack_profile("maxtext")["dispatchers"]):
        why.append(f"the {plan.dispatcher} dispatcher (its experts exchange tokens by all-to-all)")
    if plan.ep_overlap not in stack_profile("maxtext")["ep_overlap"]:
        why.append("EP communication overlap")
    if plan.cp > 1 and plan.cp_exchange not in (None, *stack_profile("maxtext")["cp_exchanges"]):
        why.append(f"the {plan.cp_exchange} context-parallel exchange")
    if workload.precision not in ("bf16", "fp8"):
        why.append(f"precision {workload.precision}")
    if why:
        raise InvalidInputError("cannot export to maxtext: " + "; ".join(why))
    m = micro_batches(plan, workload)
    data_axis = "fsdp" if plan.zero == 3 else "data"
    other_axis = "data" if plan.zero == 3 else "fsdp"
    return [
        # Inside a node (ICI/NVLink): tensor, context and expert; the data-parallel axis fills
        # the rest of the node (-1) and every other node (DCN, -1).
        ("ici_tensor_parallelism", plan.tp),
        ("ici_context_parallelism", plan.cp),
        ("ici_expert_parallelism", plan.ep),
        (f"ici_{data_axis}_parallelism", -1),
        (f"ici_{other_axis}_parallelism", 1),
        ("ici_pipeline_parallelism", 1),
        (f"dcn_{data_axis}_parallelism", -1),
        (f"dcn_{other_axis}_parallelism", 1),
        ("dcn_pipeline_parallelism", 1),
        ("remat_policy", MAXTEXT_REMAT[plan.recompute]),
        # Sequences per GPU per step, over the gradient-accumulation steps.
        ("per_device_batch_size", workload.global_batch / plan.num_gpus),
        ("gradient_accumulation_steps", m),
        ("max_target_length", workload.seq_len),
        ("dtype", "bfloat16"),
        ("quantization", "fp8" if workload.precision == "fp8" else ""),
    ]


def maxtext_xla_flags() -> str:
    """The XLA flags behind the maxtext profile's overlap and bucket (the latency-hiding
    scheduler that overlaps the data-parallel collectives; the all-reduce combine threshold that
    is its bucket, in bytes of fp32 gradients)."""
    profile = stack_profile("maxtext")
    flags = []
    if profile["overlap_grad_reduce"] or profile["overlap_param_gather"]:
        flags.append("--xla_gpu_enable_latency_hiding_scheduler=true")
    flags.append(f"--xla_gpu_all_reduce_combine_threshold_bytes={round(profile['ddp_bucket_params'] * 4)}")
    return " ".join(flags)


def maxtext(plan: Plan, workload: Optional[Workload]) -> str:
    """MaxText overrides, one ``key=value`` per line (``python -m MaxText.train base.yml ...``)."""
    if workload is None:
        raise InvalidInputError(
            "cannot export to maxtext without the workload (per_device_batch_size and "
            "gradient_accumulation_steps come from the global batch)"
        )
    lines = _header(plan, "#", "MaxText overrides of configs/base.yml")
    lines.append(f"# XLA_FLAGS the maxtext profile times: {maxtext_xla_flags()}")
    lines += [f"{k}={_maxtext_value(v)}" for k, v in maxtext_overrides(plan, workload)]
    return "\n".join(lines) + "\n"


def _maxtext_value(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if value == "" else value
    return str(value)


# --- reading an export back -------------------------------------------------------------------

_WORLD = re.compile(r"world size (\d+) = dp·tp·pp·(ep·)?cp")
_ORDER = re.compile(r"rank order (\S+) \(innermost first\)")


def _world(text: str) -> tuple[int, str]:
    world, order = _WORLD.search(text), _ORDER.search(text)
    if world is None or order is None:
        raise InvalidInputError("invalid export: no meshplan header (world size and rank order)")
    return int(world.group(1)), order.group(1)


def _folded(text: str) -> bool:
    """Whether the export's header is a folded plan's (world size ``dp·tp·pp·cp``)."""
    world = _WORLD.search(text)
    return world is not None and world.group(2) is None


def _with_dp(world: int, **degrees: Any) -> Plan:
    rest = degrees["tp"] * degrees["pp"] * degrees["cp"]
    if degrees.get("etp") is None:
        rest *= degrees["ep"]
    return Plan(dp=world // rest, **degrees)


def parse(text: str, format: str, *, model: Optional[ModelLike] = None,
          workload: Optional[Workload] = None) -> Plan:
    """The plan an export of ``format`` describes (the inverse of :func:`export` for the same
    model and workload)."""
    m = None if model is None else as_model(model)
    w = None if workload is None else as_type(Workload, workload, "workload")
    if format == "deepspeed":
        return _parse_deepspeed(json.loads(text))
    world, _ = _world(text)
    if format == "megatron":
        return _parse_megatron(text, world, m)
    if format == "torchtitan":
        literal = text.split("LEGACY_TOML = ", 1)[1].strip()
        return _parse_torchtitan_toml(ast.literal_eval(literal), world, m, w)
    if format == "torchtitan-toml":
        return _parse_torchtitan_toml(text, world, m, w)
    if format == "maxtext":
        return _parse_maxtext(text, world, w)
    raise InvalidInputError(f"invalid format: {format!r} (allowed: megatron, torchtitan, "
                            "torchtitan-toml, deepspeed, maxtext)")


def _parse_megatron(text: str, world: int, model: Optional[Model]) -> Plan:
    flags: dict[str, Optional[str]] = {}
    for line in text.splitlines():
        line = line.rstrip(" \\").strip()
        if line.startswith("--"):
            flag, _, value = line.partition(" ")
            flags[flag] = value or None
    pp = int(flags["--pipeline-model-parallel-size"] or 1)
    vpp = 1
    if "--pipeline-model-parallel-layout" in flags:
        vpp = (flags["--pipeline-model-parallel-layout"] or "").count("|") // pp + 1 if pp else 1
    elif "--num-layers-per-virtual-pipeline-stage" in flags and model is not None:
        vpp = model.layers // (pp * int(flags["--num-layers-per-virtual-pipeline-stage"] or 1))
    elif "--virtual-pipeline-model-parallel-size" in flags:
        vpp = int(flags["--virtual-pipeline-model-parallel-size"] or 1)
    zero = 0
    if "--use-distributed-optimizer" in flags:
        zero = 1
    strategy = flags.get("--data-parallel-sharding-strategy")
    if strategy:
        zero = 2 if strategy == "optim_grads" else 3
    recompute = flags.get("--recompute-granularity") or "none"
    modules = flags.get("--recompute-modules") if recompute == "selective" else None
    etp = flags.get("--expert-tensor-parallel-size")
    return _with_dp(
        world,
        tp=int(flags["--tensor-model-parallel-size"] or 1), pp=pp,
        cp=int(flags["--context-parallel-size"] or 1),
        ep=int(flags["--expert-model-parallel-size"] or 1), vpp=vpp,
        micro_batch=int(flags["--micro-batch-size"] or 1), zero=zero, recompute=recompute,
        sequence_parallel="--sequence-parallel" in flags,
        schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
        order=MEGATRON_TP_PP_DP if "--use-tp-pp-dp-mapping" in flags else DEFAULT_ORDER,
        etp=int(etp) if etp is not None and _folded(text) else None,
        dispatcher=flags.get("--moe-token-dispatcher-type"),
        ep_overlap="--overlap-moe-expert-parallel-comm" in flags,
        cp_exchange={v: k for k, v in MEGATRON_CP_COMM.items()}.get(flags.get("--cp-comm-type") or ""),
        recompute_modules=modules or None,
        offload_layers=int(flags.get("--cpu-offloading-num-layers") or 0) or None,
    )


def _parse_torchtitan_toml(text: str, world: int, model: Optional[Model],
                           workload: Optional[Workload]) -> Plan:
    config = tomllib.loads(text)
    par = config["parallelism"]
    pp = par["pipeline_parallel_degree"]
    vpp = 1
    if par.get("module_fqns_per_model_part"):
        vpp = len(par["module_fqns_per_model_part"]) // pp
    elif par.get("pipeline_parallel_layers_per_stage") and model is not None:
        vpp = model.layers // (pp * par["pipeline_parallel_layers_per_stage"])
    zero = {None: 0, "default": 1, "never": 2, "always": 3}[par.get("fsdp_reshard_after_forward")]
    ac = config.get("activation_checkpoint", {})
    recompute = "selective-op" if ac.get("mode") == "selective" else ac.get("mode", "none")
    if pp > 1:
        micro_batch = par["pipeline_parallel_microbatch_size"]
    elif workload is not None:
        micro_batch = config["training"]["local_batch_size"]
    else:
        micro_batch = 1
    tp = par["tensor_parallel_degree"]
    etp = par.get("expert_tensor_parallel_degree")
    return _with_dp(
        world, tp=tp, pp=pp, cp=par["context_parallel_degree"],
        ep=par["expert_parallel_degree"], vpp=vpp, micro_batch=micro_batch, zero=zero,
        recompute=recompute, sequence_parallel=tp > 1,
        schedule="interleaved-1f1b" if vpp > 1 else "1f1b", order=DEFAULT_ORDER,
        etp=etp if etp is not None and _folded(text) else None,
        # No field for the exchange: the stack's default.
        dispatcher=_read_dispatcher("torchtitan", par["expert_parallel_degree"]),
    )


def _parse_deepspeed(config: Mapping[str, Any]) -> Plan:
    pp = config.get("pipeline", {}).get("stages", 1)
    micro_batch = config["train_micro_batch_size_per_gpu"]
    dp = config["train_batch_size"] // (micro_batch * config["gradient_accumulation_steps"])
    return Plan(
        dp=dp, tp=1, pp=pp, ep=1, cp=1, vpp=1, micro_batch=micro_batch,
        zero=config["zero_optimization"]["stage"],
        recompute="full" if "activation_checkpointing" in config else "none",
        sequence_parallel=False, schedule="1f1b", order=DEFAULT_ORDER,
    )


def _parse_maxtext(text: str, world: int, workload: Optional[Workload]) -> Plan:
    kv = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    tp, cp, ep = (int(kv[f"ici_{a}_parallelism"]) for a in ("tensor", "context", "expert"))
    dp = world // (tp * cp * ep)
    m = int(kv["gradient_accumulation_steps"])
    batch = round(float(kv["per_device_batch_size"]) * world)
    return Plan(
        dp=dp, tp=tp, pp=1, ep=ep, cp=cp, vpp=1, micro_batch=batch // (dp * ep * m),
        zero=3 if kv["ici_fsdp_parallelism"] == "-1" else 0,
        recompute={v: k for k, v in MAXTEXT_REMAT.items()}[kv["remat_policy"]],
        sequence_parallel=False, schedule="1f1b", order=DEFAULT_ORDER,
        # No field for the exchange: the stack's default.
        dispatcher=_read_dispatcher("maxtext", ep),
    )


# --- torch.distributed device mesh ---------------------------------------------------------


def mesh_dims(plan: Plan) -> list[tuple[str, int]]:
    """``(name, size)`` of the mesh dimensions, outermost first (the reverse of the order); a
    folded plan's dense mesh has ``ep`` of size 1."""
    def size(axis: str) -> int:
        return 1 if plan.folded and axis == "ep" else int(getattr(plan, axis))

    return [(axis, size(axis)) for axis in reversed(plan.order.split("-"))]


def expert_mesh_dims(plan: Plan) -> list[tuple[str, int]]:
    """A folded plan's expert mesh, outermost first: the same order with the expert TP in TP's
    place, EP in EP's, the expert DP in DP's and no CP (Megatron's expert rank generator)."""
    sizes = {"tp": ("etp", plan.expert_tp), "ep": ("ep", plan.ep), "dp": ("edp", plan.expert_dp),
             "pp": ("pp", plan.pp)}
    return [sizes[axis] for axis in reversed(plan.order.split("-")) if axis != "cp"]


def device_mesh(plan: Plan) -> str:
    """A runnable snippet building the plan's named device mesh (under ``torchrun``); a folded
    plan's expert mesh beside it."""
    dims = mesh_dims(plan)
    names = tuple(name for name, _ in dims)
    sizes = tuple(size for _, size in dims)
    dense = [n for n in names if n in ("dp", "ep", "cp")]
    expert = [n for n in names if n in ("dp", "cp")]
    lines = _header(plan, "#", "torch.distributed device mesh")
    lines += [
        f"# Run under torchrun with {plan.num_gpus} processes; consecutive ranks vary the last "
        "(innermost) dimension fastest.",
        "from torch.distributed.device_mesh import init_device_mesh",
        "",
        "mesh = init_device_mesh(",
        '    "cuda",',
        f"    {sizes!r},",
        f"    mesh_dim_names={names!r},",
        ")",
    ]
    lines += [f'{name}_mesh = mesh["{name}"]' for name in reversed(names)]
    if plan.folded:
        edims = expert_mesh_dims(plan)
        enames = tuple(name for name, _ in edims)
        esizes = tuple(size for _, size in edims)
        lines += [
            "# Gradient reduction of the dense parameters (dp·cp ranks).",
            "dense_dp_mesh = mesh[" + ", ".join(f'"{n}"' for n in names if n in ("dp", "cp")) + "]",
            "# The expert layers' own mesh over the same ranks (MoE parallel folding).",
            "expert_mesh = init_device_mesh(",
            '    "cuda",',
            f"    {esizes!r},",
            f"    mesh_dim_names={enames!r},",
            ")",
            'ep_mesh = expert_mesh["ep"]',
            'etp_mesh = expert_mesh["etp"]',
            "# Gradient reduction of the experts (edp ranks).",
            'expert_dp_mesh = expert_mesh["edp"]',
        ]
        return "\n".join(lines) + "\n"
    lines += [
        "# Gradient reduction of the dense parameters (dp·ep·cp ranks) and of the experts (dp·cp).",
        "dense_dp_mesh = mesh[" + ", ".join(f'"{n}"' for n in dense) + "]",
        "expert_dp_mesh = mesh[" + ", ".join(f'"{n}"' for n in expert) + "]",
    ]
    return "\n".join(lines) + "\n"


__all__ = [
    "FORMATS",
    "export",
    "megatron",
    "megatron_args",
    "torchtitan",
    "torchtitan_fields",
    "torchtitan_toml",
    "deepspeed",
    "deepspeed_config",
    "maxtext",
    "maxtext_overrides",
    "parse",
    "stack_profile",
    "STACK_FORMATS",
    "megatron_layout",
    "torchtitan_layout",
    "chunk_layers",
    "rank_layers",
    "device_mesh",
    "mesh_dims",
    "schedule_of",
    "micro_batches",
]
