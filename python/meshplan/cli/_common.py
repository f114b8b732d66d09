"""What the ``meshplan`` commands share: the usage error and its parser, the problem and
search-space argument groups, building the model, cluster, workload and space from them, files
that must be readable, secrets, and the optional ``grpc`` extra."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, NoReturn, Optional

from .. import _core
from ..api import as_model
from ..errors import InvalidInputError
from ..hardware import Cluster, Gpu
from ..model import Model, read_text
from ..space import DEGREES, SearchSpace
from ..validation import calibrated
from ..workload import Workload


class UsageError(Exception):
    """A command line that argparse rejects (reported like any other bad input)."""


class Parser(argparse.ArgumentParser):
    """An argument parser that raises :class:`UsageError` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def list_of(kind: Callable[[str], Any], what: str) -> Callable[[str], list[Any]]:
    """An argparse type for comma-separated lists such as ``--zero 0,1,2``."""

    def parse(text: str) -> list[Any]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}")
        try:
            return [kind(t) for t in items]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {what}, got {text!r}"
            ) from None

    return parse


def problem_flags() -> Parser:
    """The model, cluster and workload flags (a parent parser of the commands that take one problem)."""
    p = Parser(add_help=False)
    g = p.add_argument_group("model, cluster and workload")
    g.add_argument(
        "--model", required=True, metavar="NAME|config.json",
        help="a model preset (see `meshplan models`) or a Hugging Face config.json",
    )
    g.add_argument("--model-name", help="name for a model read from a config.json")
    g.add_argument("--gpu", metavar="NAME", help="a GPU preset (see `meshplan gpus`)")
    g.add_argument(
        "--gpu-set", action="append", metavar="FIELD=V,...",
        help="what-if hardware: change the GPU's fields, e.g. memory_gib=141,scaleup_domain=72 "
        "(labelled hypothetical)",
    )
    g.add_argument("--gpu-file", metavar="hw.toml", help="what-if hardware from a file (instead of --gpu)")
    g.add_argument("--gpus", required=True, type=int, metavar="N", help="number of GPUs")
    g.add_argument("--gpus-per-node", type=int, metavar="N", help="default: the GPU preset's")
    g.add_argument("--nvlink-domain", type=int, metavar="N", help="GPUs per NVLink domain (default: the preset's)")
    g.add_argument("--global-batch", required=True, type=int, metavar="B", help="sequences per step")
    g.add_argument("--seq-len", required=True, type=int, metavar="S", help="tokens per sequence")
    g.add_argument("--precision", default="bf16", help="bf16 (default), fp16, fp8, mxfp8 or nvfp4")
    g.add_argument("--optimizer", default="adam", help="adam (default) or sgd-momentum")
    g.add_argument("--grad-bytes", type=int, default=4, help="gradient bytes per element, 4 (default) or 2")
    g.add_argument(
        "--bucket-params", type=int, default=None, metavar="N",
        help="parameters per DP gradient bucket (default: the stack's, max(40 M, 1 M per DP rank))",
    )
    g.add_argument(
        "--moe-imbalance", type=float, default=1.1, metavar="λ",
        help="MoE routing imbalance: busiest expert rank's routed tokens over the mean, 1-100 "
        "(default 1.1, aux-loss balanced; 1.0 for force-balanced routing)",
    )
    g.add_argument(
        "--precision-recipe", default=None, metavar="NAME",
        help="low-precision recipe of an fp8/mxfp8/nvfp4 run (data/precision.toml): which linears "
        "stay BF16 or run MXFP8, e.g. nemotron3-super-nvfp4, nemotron3-fp8, "
        "mxfp8-fused-expert-mlp (default: none)",
    )
    g.add_argument(
        "--cuda-graphs", default="none", choices=("none", "partial", "full"),
        help="CUDA graphs of the run: none (default), partial (attn/router/preprocess scopes: the "
        "routed experts stay eager) or full (the MoE block graphed: no host-issue floor of a "
        "dropless MoE layer)",
    )
    g.add_argument("--lora", action="store_true", help="LoRA fine-tuning: frozen base weights")
    lora_flags(g)
    g.add_argument(
        "--no-flash-attention", dest="flash_attention", action="store_false",
        help="model unfused attention (stores the attention scores)",
    )
    g.add_argument(
        "--unfused-cross-entropy", dest="fused_cross_entropy", action="store_false",
        help="model an eager fp32 loss (torchtitan): 14 bytes per logit instead of 8",
    )
    g.add_argument(
        "--cross-entropy-in-place", action="store_true",
        help="model TransformerEngine's fused loss (Megatron --cross-entropy-fusion-impl te): "
        "the gradient written into the 16-bit logits, 2 bytes per logit instead of 8",
    )
    g.add_argument(
        "--stack", default="megatron-core",
        help="training stack: megatron-core (default), torchtitan, deepspeed or maxtext; how "
        "plans are timed and which ones it can run",
    )
    g.add_argument(
        "--calibration", metavar="FILE",
        help="calibration overrides (TOML or JSON; see docs/calibration.md)",
    )
    return p


def space_flags(p: argparse.ArgumentParser) -> None:
    """Adds the search-space flags to ``p``."""
    g = p.add_argument_group(
        "search space",
        "Everything is open by default. Fix a degree with --dp/--tp/--pp/--ep/--cp/--vpp/"
        "--micro-batch N, or bound it with --min-X N / --max-X N (e.g. --max-pp 16).",
    )
    for name in DEGREES:
        flag = name.replace("_", "-")
        g.add_argument(f"--{flag}", type=int, metavar="N", help=f"fix {name}")
        g.add_argument(f"--min-{flag}", type=int, metavar="N", help=argparse.SUPPRESS)
        g.add_argument(f"--max-{flag}", type=int, metavar="N", help=argparse.SUPPRESS)
    g.add_argument(
        "--no-fold", action="store_true",
        help="do not try folded MoE plans (MoE parallel folding: experts on their own "
        "etp x ep x edp mesh; --etp N fixes the experts' tensor parallelism)",
    )
    g.add_argument(
        "--dispatchers", type=list_of(str, "dispatchers"), metavar="alltoall,allgather,flex",
        help="MoE token dispatchers to try (default: the stack's, flex for megatron-core)",
    )
    g.add_argument(
        "--cp-exchanges", type=list_of(str, "CP exchanges"), metavar="ring,allgather,a2a,a2a+p2p",
        help="context-parallel exchanges to try for cp > 1 (Megatron --cp-comm-type p2p, "
        "all_gather, a2a, a2a+p2p; default: the stack's, ring for megatron-core)",
    )
    g.add_argument(
        "--recompute-modules", type=list_of(str, "recompute module sets"),
        metavar="layernorm+moe_act,core_attn",
        help="Megatron-Core selective-recompute module sets to try with recompute selective, "
        "comma-separated, modules joined by '+' (core_attn, moe_act, layernorm, mla_up_proj, "
        "mlp, moe, shared_experts; --recompute-granularity selective --recompute-modules; "
        "default: core_attn alone)",
    )
    g.add_argument(
        "--ep-overlap", choices=("on", "off", "both"),
        help="EP communication overlap to try (Megatron --overlap-moe-expert-parallel-comm; "
        "default: the stack's, off)",
    )
    g.add_argument("--zero", type=list_of(int, "ZeRO stages"), metavar="0,1,2,3")
    g.add_argument("--recompute", type=list_of(str, "modes"), metavar="none,selective,full,selective-op")
    g.add_argument("--sequence-parallel", choices=("on", "off", "both"))
    g.add_argument("--schedules", type=list_of(str, "schedules"), metavar="1f1b,interleaved-1f1b,zb-h1")
    orders = g.add_mutually_exclusive_group()
    orders.add_argument(
        "--orders", type=list_of(str, "rank orders"), metavar="tp-cp-ep-dp-pp,tp-dp-...",
        help="rank orders to try, innermost axis first (default: tp-cp-ep-dp-pp); an order is "
        "only tried where it moves some group to another fabric",
    )
    orders.add_argument("--all-orders", action="store_true", help="try all 120 rank orders (same rule)")
    g.add_argument("--memory-headroom-gib", type=float, metavar="GIB", help="kept free per GPU (default 1)")
    g.add_argument("--allow-tp-cross-domain", action="store_true", help="let TP groups leave the NVLink domain")
    g.add_argument("--cp-within-domain", action="store_true", help="keep CP groups inside one NVLink domain")
    g.add_argument("--ep-within-domain", action="store_true", help="keep EP groups inside one NVLink domain")
    g.add_argument(
        "--top-k", type=int, metavar="K",
        help="distinct plans shown (default 10): groups of plans within 0.1%% step time and "
        "0.5 GiB memory of each other, the best of each with its group size",
    )
    g.add_argument(
        "--ungrouped", action="store_true",
        help="list the --top-k best plans one by one (near-identical ones included)",
    )
    g.add_argument("--max-candidates", type=int, metavar="N", help="refuse larger spaces")
    g.add_argument("--threads", type=int, metavar="N", help="default: MESHPLAN_THREADS, else all cores")
    g.add_argument("--timeout-s", type=float, metavar="S", help="give up after S seconds")


def remaining_s(args: argparse.Namespace) -> Optional[float]:
    """What is left of ``--timeout-s`` (None: no timeout): the clock starts with the command, so
    that the time spent building the inputs counts too."""
    timeout_s: Optional[float] = args.timeout_s
    if timeout_s is None or not 0 <= timeout_s < float("inf"):
        return timeout_s  # the core names a bad one
    started_s: float = args.started_s
    return max(0.0, timeout_s - (time.monotonic() - started_s))


def fail(error: Exception, code: int) -> int:
    """Prints ``error`` as one ``meshplan: error:`` line on stderr; returns ``code``."""
    message = " ".join(str(error).split("\n")) or type(error).__name__
    print(f"meshplan: error: {message}", file=sys.stderr)
    return code


# --- building inputs ---------------------------------------------------------------------------


def model_from(args: argparse.Namespace) -> Model:
    """``--model`` (a preset or a config.json), renamed by ``--model-name``."""
    model = as_model(args.model)
    if args.model_name:
        model.name = args.model_name
    return model


def base_gpu(args: argparse.Namespace) -> Gpu:
    """``--gpu`` or ``--gpu-file`` (exactly one), with the calibration file applied."""
    if (args.gpu is None) == (getattr(args, "gpu_file", None) is None):
        raise UsageError("give one of --gpu NAME or --gpu-file FILE")
    if args.gpu is not None:
        gpu = Gpu.preset(args.gpu)
    else:
        gpu = Gpu.from_file(readable(args.gpu_file, "--gpu-file"))
    if getattr(args, "calibration", None):
        # Calibration first: the file names the preset, not the what-if label.
        gpu = calibrated(Cluster(gpu, 1), readable(args.calibration, "--calibration")).resolved_gpu()
    return gpu


def gpu_overrides(args: argparse.Namespace) -> dict[str, str]:
    """The ``--gpu-set FIELD=V,...`` changes, later ones winning."""
    from ..whatif import parse_assignments

    changes: dict[str, str] = {}
    for text in getattr(args, "gpu_set", None) or []:
        changes.update(parse_assignments(text))
    return changes


def cluster_from(args: argparse.Namespace) -> Cluster:
    """The cluster of ``--gpus`` GPUs, with the what-if ``--gpu-set`` changes applied."""
    gpu = base_gpu(args)
    changes = gpu_overrides(args)
    if changes:
        gpu = gpu.with_overrides(changes)
    return Cluster(gpu, args.gpus, args.gpus_per_node, args.nvlink_domain)


def readable(path: str, flag: str) -> str:
    """``path`` if it is a readable file, else a usage error naming ``flag``."""
    if not os.path.isfile(path):
        raise UsageError(f"{flag}: no such file: {path}")
    return path


def lora_flags(g: Any) -> None:
    """``--lora-rank``, ``--lora-targets`` and ``--lora-base`` on the argument group ``g``."""
    g.add_argument(
        "--lora-rank", type=int, default=32, metavar="R",
        help="LoRA adapter rank (default 32, Megatron-Bridge's)",
    )
    g.add_argument(
        "--lora-targets", default="qkv,o,fc1,fc2", metavar="T,...",
        help="linears with a LoRA adapter, of q,k,v (separate), qkv (fused), o, mlp (separate "
        "gate, up, down), fc1 (fused gate/up), fc2 (down); default qkv,o,fc1,fc2 "
        "(Megatron-Bridge's: every linear)",
    )
    g.add_argument(
        "--lora-base", default="bf16",
        help="frozen base weights under --lora: bf16 (default), fp8 or nf4 (QLoRA)",
    )


def lora_targets(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``--lora-targets`` list."""
    return tuple(t.strip() for t in str(args.lora_targets).split(",") if t.strip())


def workload_from(args: argparse.Namespace) -> Workload:
    """The workload flags as a :class:`Workload`."""
    return Workload(
        args.global_batch, args.seq_len, args.precision, args.optimizer, args.grad_bytes,
        args.lora, args.flash_attention, args.fused_cross_entropy, args.stack, args.bucket_params,
        args.moe_imbalance, args.lora_rank, lora_targets(args), args.lora_base,
        args.precision_recipe, getattr(args, "cross_entropy_in_place", False),
        getattr(args, "cuda_graphs", "none"),
    )


def space_from(args: argparse.Namespace) -> SearchSpace:
    """The search-space flags as a :class:`SearchSpace`."""
    degrees = {
        attr: getattr(args, attr)
        for name in DEGREES
        for attr in (name, f"min_{name}", f"max_{name}")
    }
    return SearchSpace(
        **degrees,
        zero=args.zero,
        recompute=args.recompute,
        schedules=args.schedules,
        sequence_parallel={"on": [True], "off": [False], "both": [False, True], None: None}[
            args.sequence_parallel
        ],
        memory_headroom_gib=args.memory_headroom_gib,
        tp_within_domain=False if args.allow_tp_cross_domain else None,
        cp_within_domain=True if args.cp_within_domain else None,
        ep_within_domain=True if args.ep_within_domain else None,
        top_k=args.top_k,
        max_candidates=args.max_candidates,
        distinct=False if getattr(args, "ungrouped", False) else None,
        fold=False if getattr(args, "no_fold", False) else None,
        dispatchers=getattr(args, "dispatchers", None),
        cp_exchanges=getattr(args, "cp_exchanges", None),
        recompute_modules=getattr(args, "recompute_modules", None),
        ep_overlap={"on": [True], "off": [False], "both": [False, True], None: None}[
            getattr(args, "ep_overlap", None)
        ],
        orders=_core.rank_orders() if getattr(args, "all_orders", False) else getattr(args, "orders", None),
    )


def secret(path: Optional[str], what: str) -> Optional[str]:
    """The stripped text of ``path`` (None when no path); empty or unreadable is bad input."""
    if path is None:
        return None
    text = read_text(path, what).strip()
    if not text:
        raise InvalidInputError(f"invalid {what} {path!r}: empty")
    return text


def pem(path: str, what: str) -> bytes:
    """The PEM file at ``path`` as bytes (unreadable is bad input naming ``what``)."""
    return read_text(path, what).encode()


def grpc_extra(command: str, module: str) -> Any:
    """``meshplan.<module>``, which needs the ``grpc`` extra; without it, a usage error that
    says which ``pip install`` fixes it."""
    import importlib

    try:
        return importlib.import_module(f"meshplan.{module}")
    except ImportError as e:
        missing = e.name or "grpc"
        raise UsageError(
            f"{command} needs the grpc extra (missing module {missing}): "
            "pip install 'meshplan[grpc]'"
        ) from None
