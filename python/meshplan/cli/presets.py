"""``models``, ``gpus`` and ``stacks``: the presets and training-stack profiles as tables or
JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from .. import _core
from ..hardware import Gpu, provenance
from ..model import Model
from ._render import table


def add(sub: Any) -> None:
    """``models`` and ``gpus``."""
    m = sub.add_parser("models", help="list the model presets")
    m.add_argument("--json", action="store_true", help="print the full presets as JSON")
    m.set_defaults(run=_models)

    g = sub.add_parser("gpus", help="list the GPU presets and how each was calibrated")
    g.add_argument("--json", action="store_true",
                   help="print the full presets as JSON (with each one's provenance)")
    g.add_argument("--provenance", action="store_true",
                   help="where each calibration constant comes from: fitted on the GPU's own runs, "
                   "measured by a published benchmark, derived by a stated rule, shared or assumed")
    g.add_argument("--gpu", metavar="NAME", help="only this preset")
    g.set_defaults(run=_gpus)

    st = sub.add_parser("stacks", help="list the training-stack profiles (--stack)")
    st.add_argument("--json", action="store_true", help="print every profile value as JSON")
    st.set_defaults(run=_stacks)


def _models(args: argparse.Namespace, out: TextIO) -> int:
    models = [Model.preset(name) for name in Model.presets()]
    if args.json:
        json.dump([m.to_dict() for m in models], out, indent=2)
        out.write("\n")
        return 0
    rows = []
    for m in models:
        experts = "-" if m.moe is None else f"{m.moe.num_experts} (top {m.moe.top_k})"
        attention = "MLA" if m.mla is not None else ("MHA" if m.kv_heads == m.heads else "GQA")
        rows.append([
            m.name, m.layers, m.hidden, m.heads, m.kv_heads, attention,
            m.ffn_hidden, m.vocab, m.activation, experts,
        ])
    header = ["name", "layers", "hidden", "heads", "kv", "attn", "ffn", "vocab", "act", "experts"]
    out.write(table(header, rows) + "\n")
    aliases = Model.aliases()
    if aliases:
        out.write("\naliases (resolve to the preset with the same dimensions):\n")
        out.write(table(["alias", "preset", "why"], [[a["name"], a["preset"], a["why"]] for a in aliases]) + "\n")
    return 0


def _gpus(args: argparse.Namespace, out: TextIO) -> int:
    gpus = [Gpu.preset(name) for name in ([args.gpu] if args.gpu else Gpu.presets())]
    if args.json:
        json.dump([{**g.to_dict(), "provenance": provenance(g)} for g in gpus], out, indent=2)
        out.write("\n")
        return 0
    if args.provenance:
        for g in gpus:
            p = provenance(g)
            out.write(f"{g.name}: calibrated {p['summary']} ({g.description})\n")
            rows = [[name, _value(g, name), o["kind"], o["note"]]
                    for name, o in p["constants"].items() if name not in _SOFTWARE]
            out.write(table(["constant", "value", "source", "from"], rows) + "\n")
            out.write(f"(software constants, shared by every GPU: {', '.join(_SOFTWARE)})\n\n")
        return 0
    rows = []
    for g in gpus:
        peak = g.peak_tflops
        rows.append([
            g.name,
            f"{g.memory_gib:g}",
            *(f"{peak[p]:g}" if p in peak else "-" for p in ("bf16", "fp8", "nvfp4")),
            f"{g.memory_bandwidth_gbps:g}",
            f"{g.scaleup_bandwidth_gbps:g} x{g.scaleup_domain}",
            f"{g.network_bandwidth_gbps:g}",
            "-" if g.host_bandwidth_gbps is None else f"{g.host_bandwidth_gbps:g}",
            provenance(g)["summary"],
            g.description,
        ])
    header = [
        "name", "HBM GiB", "bf16 TF/s", "fp8 TF/s", "nvfp4 TF/s", "HBM GB/s",
        "NVLink GB/s x domain", "net GB/s", "host GB/s", "calibrated", "description",
    ]
    out.write(table(header, rows) + "\n")
    return 0


_SOFTWARE = (
    "elementwise_bytes_per_hidden", "layer_overhead_us", "fixed_memory_gib", "fragmentation",
    "ep_overlap", "tp_overlap", "dp_overlap",
)
"""Calibration constants that belong to the software, not the GPU (their origin is shared)."""


def _value(gpu: Gpu, constant: str) -> str:
    """The value of the calibration constant ``constant`` (``gemm_efficiency.bf16`` style)."""
    node: Any = gpu.calibration
    for part in constant.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return "-" if node is None else f"{node:g}"


def _stacks(args: argparse.Namespace, out: TextIO) -> int:
    stacks = _core.stacks()
    if args.json:
        json.dump(stacks, out, indent=2)
        out.write("\n")
        return 0

    def names(values: Any) -> str:
        return ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in values)

    rows = [[
        s["name"], f"{s['ddp_bucket_params']:.3g}",
        "yes" if s["overlap_grad_reduce"] else "no", f"{s['dp_overlap']:g}", f"{s['tp_overlap']:g}",
        names(s["precisions"]), names(["dp", *s["parallelism"]]), names(s["schedules"]),
        s["pipeline_split"], f"{names(s['zero'])} / {names(s['zero_with_pp']) or '-'}",
        # "+modules": selective recompute takes --recompute-modules (Plan.recompute_modules).
        names(s["recompute"]) + (" +modules" if s["recompute_modules"] else ""),
        s["expert_folding"],
        # The default dispatcher first, marked.
        names(f"{d}*" if d == s["default_dispatcher"] else d for d in s["dispatchers"]),
        "yes" if True in s["ep_overlap"] else "no",
        names(f"{x}*" if x == s["default_cp_exchange"] else x for x in s["cp_exchanges"])
        if "cp" in s["parallelism"] else "-",
    ] for s in stacks]
    header = [
        "stack", "bucket", "grads overlapped", "dp ω", "tp ω", "precisions", "axes", "schedules",
        "layer split", "zero (pp=1 / pp>1)", "recompute", "expert folding",
        "dispatchers (*default)", "ep overlap", "cp exchanges (*default)",
    ]
    out.write(table(header, rows) + "\n")
    out.write("every value and its source: rust/meshplan-core/data/stacks.toml\n")
    return 0
