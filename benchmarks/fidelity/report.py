"""Writes meshplan's fidelity report against published training runs.

Runs ``meshplan.validate(CASES, search=True)`` and writes, next to this script:

* ``REPORT.md`` — the summary against the targets, in-sample and leave-one-group-out figures side
  by side (``meshplan.cross_validate`` by GPU, source and model), tables by GPU type and by
  architecture, the largest errors, and the defaults that unknown fields needed;
* ``scatter.png`` — predicted vs measured tokens/s per GPU (log-log), coloured by GPU, with the
  y = x line and ±20 % bands.

    python benchmarks/fidelity/report.py validation/cases.json
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from pathlib import Path
import time
from typing import Any, Mapping, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import meshplan as mp  # noqa: E402

HERE = Path(__file__).parent
TARGETS = {"median_ape": 0.10, "p90_ape": 0.25, "memory_median_ape": 0.10, "feasible_recall": 0.98, "regret_median": 0.10}


def pct(x: Any) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def stats_table(title: str, groups: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = [
        f"| {title} | n | median APE | p90 APE | within 10 % | within 20 % | median signed error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in groups.items():
        lines.append(
            f"| {name} | {s['n']} | {pct(s['median_ape'])} | {pct(s['p90_ape'])} | "
            f"{pct(s['within_10pct'])} | {pct(s['within_20pct'])} | {pct(s['median_signed_error'])} |"
        )
    return lines


def verdict(value: Any, limit: float, below: bool = True) -> str:
    if value is None:
        return "–"
    ok = value <= limit if below else value >= limit
    return "met" if ok else "**not met**"


CV_GROUPS = ("gpu", "source", "model", "stack")


def cross_validation_section(report: mp.ValidationReport, cvs: Mapping[str, Any], seconds: Mapping[str, float]) -> list[str]:
    """In-sample and leave-one-group-out median / p90 APE side by side, overall, per GPU, per arch,
    per stack."""
    s = report.summary
    head = "| group | n | in-sample median | in-sample p90 | " + " | ".join(
        f"LO-{g}-O median | LO-{g}-O p90" for g in cvs
    ) + " |"
    lines = [
        "## In sample and leave one group out",
        "",
        "In sample: the shipped constants, fitted to these runs. Leave one group out "
        "(`meshplan validate validation/cases.json --cross-validate gpu|source|model|stack`): for each "
        "GPU type, source (the case-id prefix: `mbridge`, `dgxc`, `narayanan21`, ...), model or "
        "training stack, the GEMM "
        "efficiency of every (GPU, precision) is refitted on the *other* groups' dense runs and the "
        "group is predicted with it; a held-out GPU (always so when leaving a GPU out) is predicted "
        "from hardware facts where its GPU has a published matmul microbenchmark (its matmul "
        "fraction at that precision, else at BF16, times the fold's realisation: the median, over "
        "the fold's fitted groups with a fraction measured at their precision, of fitted / "
        "fraction, within the GPU's realisation class — Blackwell, or the default class of "
        "Ampere, Hopper and CDNA 3 — when the fold has two or more groups of it, else over all; "
        "the core's rule for a GPU without fits, docs/calibration.md) and gets the "
        "median of the fold's fitted values at its precision "
        "otherwise. The four constants shared by every GPU "
        "(element-wise bytes, attention efficiency, layer overhead, TP overlap) keep their "
        "shipped values in every fold — they were fitted on all runs and a grid per fold is too slow — "
        "so the leave-one-out figures are, if anything, still slightly optimistic. The DP overlap is "
        "not fitted for megatron-core, torchtitan or maxtext (1: collectives are priced as NCCL "
        "runs them and gradient buckets overlap the backward as in Megatron, docs/costmodel.md "
        "§3.1 and §3.6); deepspeed's is (0.5, on its six SC21 ZeRO-3 runs, data/stacks.toml) and "
        "stays in sample in every fold, as do torchtitan's kernel efficiency (0.79, on its two H200 "
        "runs) and the 500 W clock factor in h100-sxm-96g's attention efficiency (0.81, on its own "
        "runs; docs/calibration.md). Time of each "
        "cross-validation on this machine: "
        + ", ".join(f"{g} {seconds[g]:.1f} s" for g in cvs) + ".",
        "",
        head,
        "|---|---:|---:|---:|" + "---:|---:|" * len(cvs),
    ]

    def row(name: str, ins: Mapping[str, Any], pick: Any) -> str:
        cells = [name, str(ins["n"]), pct(ins["median_ape"]), pct(ins["p90_ape"])]
        for cv in cvs.values():
            o = pick(cv.summary) or {}
            cells += [pct(o.get("median_ape")), pct(o.get("p90_ape"))]
        return "| " + " | ".join(cells) + " |"

    lines.append(row("**all**", s["throughput"], lambda c: c["throughput"]))
    for k, v in s["by_gpu"].items():
        lines.append(row(f"gpu {k}", v, lambda c, k=k: c["by_gpu"].get(k)))
    for k, v in s["by_arch"].items():
        lines.append(row(f"arch {k}", v, lambda c, k=k: c["by_arch"].get(k)))
    for k, v in s["by_stack"].items():
        lines.append(row(f"stack {k}", v, lambda c, k=k: c["by_stack"].get(k)))
    src = cvs.get("source")
    if src is not None:
        lines += [
            "",
            "Each source predicted from the others (leave one source out):",
            "",
            "| source | n | median APE | p90 APE |",
            "|---|---:|---:|---:|",
        ]
        lines += [
            f"| {k} | {v['n']} | {pct(v['median_ape'])} | {pct(v['p90_ape'])} |"
            for k, v in src.summary["by_group"].items() if v["n"]
        ]
    return lines + [""]


def markdown(
    report: mp.ValidationReport,
    cases_path: str,
    cvs: Optional[Mapping[str, Any]] = None,
    seconds: Optional[Mapping[str, float]] = None,
) -> str:
    s = report.summary
    t = s["throughput"]
    rows = report.cases
    ok = [r for r in rows if r["status"] == "ok"]
    lines = [
        "# meshplan fidelity report",
        "",
        f"Generated by `benchmarks/fidelity/report.py` on {datetime.date.today()} "
        f"({platform.machine()}, {os.cpu_count()} cores) from `{os.path.basename(cases_path)}`: "
        f"{len(rows)} published runs, {len(ok)} evaluated, "
        f"{sum(r['status'] == 'unrepresentable' for r in rows)} not representable. "
        "Throughput is compared as tokens/s per GPU; APE = |predicted / measured − 1|. "
        "Calibration constants are those of `rust/meshplan-core/data/gpus.toml` "
        "(fitted by `fit_calibration.py`, see `docs/calibration.md`).",
        "",
        "## Against the targets",
        "",
        "| metric | value | target | |",
        "|---|---:|---:|---|",
        f"| throughput median APE | {pct(t['median_ape'])} | ≤ 10 % | {verdict(t['median_ape'], 0.10)} |",
        f"| throughput p90 APE | {pct(t['p90_ape'])} | ≤ 25 % | {verdict(t['p90_ape'], 0.25)} |",
        f"| memory median APE (n = {s['memory']['n']}) | {pct(s['memory']['median_ape'])} | ≤ 10 % | "
        f"{verdict(s['memory']['median_ape'], 0.10)} |",
        f"| feasible recall | {pct(s.get('feasible_recall'))} | ≥ 98 % | "
        f"{verdict(s.get('feasible_recall'), 0.98, below=False)} |",
        f"| regret median (p90) | {pct(s['regret']['median'])} ({pct(s['regret']['p90'])}) | ≤ 10 % | "
        f"{verdict(s['regret']['median'], 0.10)} |",
        "",
        *(cross_validation_section(report, cvs, seconds or {}) if cvs else []),
        "## By GPU type (in sample)",
        "",
        *stats_table("GPU", s["by_gpu"]),
        "",
        "## By architecture (in sample)",
        "",
        *stats_table("arch", s["by_arch"]),
        "",
        "## By training stack",
        "",
        "Each case is timed under the stack that ran it (`rust/meshplan-core/data/sources.toml` maps "
        "its source: torchtitan, DeepSpeed ZeRO-3 for SC21's Table 2, MaxText for the DGX Cloud "
        "MaxText recipe, megatron-core for the rest). In sample, and leave one stack out (the GEMM "
        "efficiencies refitted without that stack's runs, as above):",
        "",
        *stack_table(report, (cvs or {}).get("stack")),
        "",
        "## Largest errors",
        "",
        "| case | GPU | precision | measured tok/s/GPU | predicted | error | plan |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    worst = sorted((r for r in ok if r.get("ape") is not None), key=lambda r: -r["ape"])[:25]
    for r in worst:
        lines.append(
            f"| {r['id']} | {r['gpu']} | {r['precision']} | {r['measured_tokens_per_s_per_gpu']:.1f} | "
            f"{r['predicted_tokens_per_s_per_gpu']:.1f} | {pct(r['signed_error'])} | `{r['plan']}` |"
        )
    defaults: dict[str, int] = {}
    for r in ok:
        for d in r["defaults"]:
            defaults[d] = defaults.get(d, 0) + 1
    lines += ["", "## Defaults used for unknown fields", "", "| field | cases |", "|---|---:|"]
    lines += [f"| `{k}` | {v} |" for k, v in sorted(defaults.items(), key=lambda kv: -kv[1])]
    mem = [r for r in ok if r.get("memory")]
    if mem:
        lines += ["", "## Memory", "", "| case | measured GiB | predicted GiB | APE |", "|---|---:|---:|---:|"]
        lines += [
            f"| {r['id']} | {r['memory']['measured_gib']:.1f} | {r['memory']['predicted_gib']:.1f} | "
            f"{pct(r['memory']['ape'])} |"
            for r in mem
        ]
    return "\n".join(lines) + "\n"


def stack_table(report: mp.ValidationReport, loso: Any) -> list[str]:
    """Per stack: n, in-sample median / p90 APE and median signed error, and the leave-one-stack-out
    median / p90 APE of the held-out stack (– without a cross-validation); then every stack but
    megatron-core pooled, and which stacks are the only ones on their GPUs (their leave-one-out
    figure is then a leave-one-GPU-out one as well)."""
    from meshplan.validation import throughput_stats

    in_sample = report.summary["by_stack"]
    held = loso.summary["by_group"] if loso is not None else {}
    lines = [
        "| stack | n | median APE | p90 APE | median signed | LOSO median APE | LOSO p90 APE |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def row(name: str, v: Mapping[str, Any], o: Mapping[str, Any]) -> str:
        return (
            f"| {name} | {v['n']} | {pct(v['median_ape'])} | {pct(v['p90_ape'])} | "
            f"{pct(v['median_signed_error'])} | {pct(o.get('median_ape'))} | {pct(o.get('p90_ape'))} |"
        )

    for k, v in in_sample.items():
        lines.append(row(k, v, held.get(k, {})))
    others = [r for r in report.cases if r["status"] == "ok" and r["stack"] != "megatron-core"]
    if others:
        held_others = [r for r in (loso.cases if loso is not None else [])
                       if r["status"] == "ok" and r["stack"] != "megatron-core"]
        lines.append(row("*all but megatron-core*", throughput_stats(others),
                         throughput_stats(held_others) if held_others else {}))
    ok = [r for r in report.cases if r["status"] == "ok"]
    alone = []
    for k in in_sample:
        gpus = {r["gpu"] for r in ok if r["stack"] == k}
        if gpus and not gpus & {r["gpu"] for r in ok if r["stack"] != k}:
            alone.append(f"{k} ({', '.join(sorted(gpus))})")
    if alone:
        lines += [
            "",
            "Stacks whose runs are the only ones on their GPUs: " + "; ".join(alone) + ". In sample "
            "those GPUs' GEMM efficiencies are fitted on that stack's own runs; held out, they come "
            "from the other GPUs (hardware prior or fleet median), so the leave-one-stack-out figure mixes the stack "
            "with the GPU and cannot tell which of the two the in-sample fit absorbed.",
        ]
    return lines


def scatter(report: mp.ValidationReport, path: Path) -> None:
    rows = [r for r in report.cases if r["status"] == "ok" and r.get("ape") is not None]
    gpus = sorted({r["gpu"] for r in rows})
    fig, ax = plt.subplots(figsize=(7.5, 7), dpi=120)
    for i, gpu in enumerate(gpus):
        pts = [r for r in rows if r["gpu"] == gpu]
        ax.scatter(
            [r["measured_tokens_per_s_per_gpu"] for r in pts],
            [r["predicted_tokens_per_s_per_gpu"] for r in pts],
            s=22, alpha=0.8, label=f"{gpu} ({len(pts)})", color=plt.cm.tab10(i),
        )
    values = [v for r in rows for v in (r["measured_tokens_per_s_per_gpu"], r["predicted_tokens_per_s_per_gpu"])]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="y = x")
    for f in (0.8, 1.2):
        ax.plot([lo, hi], [lo * f, hi * f], color="grey", lw=0.7, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured tokens/s per GPU")
    ax.set_ylabel("meshplan predicted tokens/s per GPU")
    t = report.summary["throughput"]
    ax.set_title(
        f"meshplan vs {len(rows)} published runs — median APE {100 * t['median_ape']:.1f} %, "
        f"p90 {100 * t['p90_ape']:.1f} %\n(dashed: ±20 %)",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    report = mp.validate(args.cases, search=True)
    cvs: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for by in CV_GROUPS:
        started = time.perf_counter()
        cvs[by] = mp.cross_validate(args.cases, by)
        seconds[by] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "REPORT.md").write_text(markdown(report, args.cases, cvs, seconds))
    scatter(report, args.out / "scatter.png")
    print(f"wrote {args.out / 'REPORT.md'} and {args.out / 'scatter.png'}")


if __name__ == "__main__":
    main()
