"""``sweep``: the best plan over a grid of GPU counts, GPU types, models, batches and lengths
(locally or on Ray)."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from ..errors import InvalidInputError
from ..workload import Workload
from ._common import (
    UsageError, gpu_overrides, list_of, lora_flags, lora_targets, readable, remaining_s,
    space_flags, space_from,
)
from ._render import table


def add(sub: Any) -> None:
    """``sweep``."""
    sw = sub.add_parser(
        "sweep", help="the best plan over a grid of GPU counts, GPU types, models, batches, lengths",
        description="Searches the cartesian product of the listed values (one batch, in "
        "parallel) and reports the best plan of each point.",
    )
    g = sw.add_argument_group("swept variables (comma-separated lists)")
    g.add_argument("--model", required=True, type=list_of(str, "models"), metavar="A,B")
    g.add_argument("--gpu", required=True, type=list_of(str, "GPU presets"), metavar="h100-sxm,b200")
    g.add_argument("--gpus", required=True, type=list_of(int, "GPU counts"), metavar="64,128")
    g.add_argument("--global-batch", required=True, type=list_of(int, "batch sizes"), metavar="B,...")
    g.add_argument("--seq-len", required=True, type=list_of(int, "sequence lengths"), metavar="S,...")
    g.add_argument(
        "--gpu-sweep", action="append", metavar="FIELD=V1,V2",
        help="what-if hardware axis, e.g. memory_gib=80,141,192 (repeat for more axes; rows "
        "are labelled hypothetical)",
    )
    w = sw.add_argument_group("cluster and workload (fixed)")
    w.add_argument("--gpu-set", action="append", metavar="FIELD=V,...",
                   help="what-if hardware for every point, e.g. network_bandwidth_gbps=100")
    w.add_argument("--gpus-per-node", type=int, metavar="N", help="default: the GPU preset's")
    w.add_argument("--nvlink-domain", type=int, metavar="N", help="GPUs per NVLink domain")
    w.add_argument("--precision", default="bf16", help="bf16 (default), fp16, fp8, mxfp8 or nvfp4")
    w.add_argument("--optimizer", default="adam", help="adam (default) or sgd-momentum")
    w.add_argument("--grad-bytes", type=int, default=4, help="4 (default) or 2")
    w.add_argument("--lora", action="store_true", help="LoRA fine-tuning: frozen base weights")
    lora_flags(w)
    w.add_argument("--no-flash-attention", dest="flash_attention", action="store_false")
    w.add_argument("--unfused-cross-entropy", dest="fused_cross_entropy", action="store_false")
    w.add_argument("--stack", default="megatron-core",
                   help="training stack: megatron-core (default), torchtitan, deepspeed, maxtext")
    w.add_argument("--calibration", metavar="FILE", help="calibration overrides (TOML or JSON)")
    space_flags(sw)
    o = sw.add_argument_group("output")
    fmt = o.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="JSON: a list of rows")
    fmt.add_argument("--csv", action="store_true", help="CSV, one row per point")
    o.add_argument("--out", metavar="FILE", help="write the rows here instead of stdout")
    o.add_argument("--plot", metavar="FILE.png", help="plot best tokens/s/GPU and MFU against the swept variable")
    o.add_argument("--x", choices=("model", "gpu", "gpus", "global_batch", "seq_len"), help="the plot's x axis")
    o.add_argument("--html", metavar="FILE.html", help="also write an interactive HTML report")
    x = sw.add_argument_group("execution")
    x.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="search on a Ray cluster (ADDRESS: 'auto', ray://host:10001; none: a "
                   "local Ray); pip install 'meshplan[ray]'")
    x.add_argument("--chunk-size", type=int, metavar="N", help="queries per Ray task (default: "
                   "about four tasks per cluster CPU)")
    prog = o.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="a progress bar on stderr (default: only on a terminal)")
    prog.add_argument("--no-progress", dest="progress", action="store_false")
    sw.set_defaults(run=_sweep)


def _sweep(args: argparse.Namespace, out: TextIO) -> int:
    from .. import sweep

    from ..whatif import parse_sweep

    hardware: dict[str, list[str]] = {}
    for text in args.gpu_sweep or []:
        field, values = parse_sweep(text)
        if field in hardware:
            raise UsageError(f"--gpu-sweep: {field} given twice")
        hardware[field] = values
    points = sweep.grid(args.model, args.gpu, args.gpus, args.global_batch, args.seq_len, hardware)
    workload = Workload(
        1, 1, args.precision, args.optimizer, args.grad_bytes, args.lora, args.flash_attention,
        args.fused_cross_entropy, args.stack, lora_rank=args.lora_rank,
        lora_targets=lora_targets(args), lora_base=args.lora_base,
    )
    calibration = None if args.calibration is None else readable(args.calibration, "--calibration")
    rows = sweep.sweep(
        points, workload, space_from(args), gpus_per_node=args.gpus_per_node,
        nvlink_domain=args.nvlink_domain, calibration=calibration, threads=args.threads,
        progress=args.progress, timeout_s=remaining_s(args),
        gpu_overrides=gpu_overrides(args),
        executor="local" if args.ray is None else "ray", ray_address=args.ray or None,
        chunk_size=args.chunk_size,
    )
    if args.html:
        from ..report_html import write_sweep_html

        try:
            write_sweep_html(rows, args.html)
        except OSError as e:
            raise InvalidInputError(f"invalid --html: {args.html} ({e.strerror})") from None
    if args.plot:
        sweep.plot(rows, args.plot, args.x)
    try:
        target = open(args.out, "w", newline="") if args.out else out
    except OSError as e:
        raise InvalidInputError(f"invalid --out: {args.out} ({e.strerror})") from None
    try:
        if args.json:
            json.dump(rows, target, indent=2)
            target.write("\n")
        elif args.csv:
            sweep.write_csv(rows, target)
        else:
            header = ["model", "gpu", "gpus", "batch", "seq", "status", "tok/s/GPU", "MFU %", "step s", "plan"]
            table_rows = [
                [r["model"], r["gpu"], r["gpus"], r["global_batch"], r["seq_len"], r["status"],
                 "-" if r["tokens_per_s_per_gpu"] is None else f"{r['tokens_per_s_per_gpu']:,.0f}",
                 "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}",
                 "-" if r["step_time_s"] is None else f"{r['step_time_s']:.3f}",
                 r["plan"] or r["error"] or "-"]
                for r in rows
            ]
            if any(r["hypothetical"] for r in rows):
                target.write("HYPOTHETICAL HARDWARE: rows marked what-if:... use GPUs that "
                             "do not exist (preset fields overridden)\n\n")
            target.write(table(header, table_rows) + "\n")
    finally:
        if target is not out:
            target.close()
    return 0
