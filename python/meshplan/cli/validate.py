"""``validate``: the cost model held against published training runs."""

from __future__ import annotations

import argparse
import json
from typing import Any, Mapping, TextIO

from ..errors import InvalidInputError
from ..serving_validation import is_serving_file, validate_serving
from ..serving_validation import report_text as serving_report_text
from ..validation import CROSS_VALIDATION_GROUPS, CrossValidationReport, ValidationReport, cross_validate, validate
from ._common import readable
from ._render import table


def add(sub: Any) -> None:
    """``validate``."""
    v = sub.add_parser("validate", help="hold the cost model against published training (or serving) runs")
    v.add_argument("cases", metavar="FILE", help="a case file (schema: validation/README.md; "
                   "validation/serving.json for serving runs)")
    v.add_argument("--search", action="store_true", help="also search each case: rank, regret, feasible recall")
    v.add_argument("--calibration", metavar="FILE", help="calibration overrides (TOML or JSON)")
    v.add_argument("--threads", type=int, metavar="N", help="search threads (default: all cores)")
    v.add_argument("--worst", type=int, default=10, metavar="K", help="largest errors listed (default 10)")
    v.add_argument(
        "--cross-validate", choices=CROSS_VALIDATION_GROUPS, metavar="GROUP",
        help="leave one gpu|model|source|stack out at a time: refit the GEMM efficiencies without it, "
        "predict it, and show in-sample and leave-one-out figures side by side",
    )
    v.add_argument("--json", action="store_true", help="print the full report as JSON")
    v.set_defaults(run=_validate)


def _validate(args: argparse.Namespace, out: TextIO) -> int:
    cases = readable(args.cases, "FILE")
    with open(cases, encoding="utf-8") as f:
        text = f.read()
    if is_serving_file(text):
        # validation/serving.json: published serving runs (TTFT, TPOT, throughput by GPU).
        serving = validate_serving(text)
        if args.json:
            json.dump(serving.to_dict(), out, indent=2)
            out.write("\n")
        else:
            out.write(serving_report_text(serving, args.worst))
        return 0
    calibration = None if args.calibration is None else readable(args.calibration, "--calibration")
    if args.cross_validate is not None:
        if args.search:
            raise InvalidInputError("--search: cannot be combined with --cross-validate (run them separately)")
        in_sample = validate(cases, calibration=calibration, threads=args.threads)
        cv = cross_validate(cases, args.cross_validate, calibration=calibration)
        if args.json:
            json.dump({"in_sample": in_sample.summary, "cross_validation": cv.to_dict()}, out, indent=2)
            out.write("\n")
        else:
            out.write(cross_validation_text(in_sample, cv))
        return 0
    report = validate(cases, search=args.search, calibration=calibration, threads=args.threads)
    if args.json:
        json.dump(report.to_dict(), out, indent=2)
        out.write("\n")
    else:
        out.write(validation_text(report, args.worst))
    return 0


def _side_by_side(name: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Any]:
    return [name, a["n"], _pct(a["median_ape"]), _pct(b["median_ape"]), _pct(a["p90_ape"]), _pct(b["p90_ape"])]


def cross_validation_text(in_sample: ValidationReport, cv: CrossValidationReport) -> str:
    """In-sample and leave-one-group-out figures side by side, then each fold."""
    s, c = in_sample.summary, cv.summary
    lines = [
        f"leave one {cv.by} out: GEMM efficiency per (GPU, precision) refitted on the other groups' "
        "dense runs; the five shared constants keep their data-file values (fitted in sample).",
        "",
    ]
    header = ["throughput APE", "n", "median in", f"median LO-{cv.by}-O", "p90 in", f"p90 LO-{cv.by}-O"]
    body = [_side_by_side("all", s["throughput"], c["throughput"])]
    body += [_side_by_side(f"gpu {k}", v, c["by_gpu"][k]) for k, v in s["by_gpu"].items() if k in c["by_gpu"]]
    body += [_side_by_side(f"arch {k}", v, c["by_arch"][k]) for k, v in s["by_arch"].items() if k in c["by_arch"]]
    body += [_side_by_side(f"stack {k}", v, c["by_stack"][k]) for k, v in s["by_stack"].items() if k in c["by_stack"]]
    lines += [table(header, body), "", f"held-out {cv.by} groups:"]
    lines.append(table(
        [cv.by, "n", "median APE", "p90 APE", "GEMM efficiency used"],
        [[f["group"], c["by_group"].get(f["group"], {"n": 0})["n"],
          _pct(c["by_group"].get(f["group"], {}).get("median_ape")),
          _pct(c["by_group"].get(f["group"], {}).get("p90_ape")),
          ", ".join(f"{k}={v} ({f['origin'][k]})" for k, v in f["gemm_efficiency"].items()) or "-"]
         for f in cv.folds],
    ))
    return "\n".join(lines) + "\n"


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _stats_row(name: str, s: Mapping[str, Any]) -> list[Any]:
    return [
        name, s["n"], _pct(s["median_ape"]), _pct(s["p90_ape"]), _pct(s["within_10pct"]),
        _pct(s["within_20pct"]), _pct(s["median_signed_error"]),
    ]


def validation_text(report: ValidationReport, worst: int) -> str:
    """The human report of ``meshplan validate``."""
    rows = report.cases
    ok = [r for r in rows if r["status"] == "ok"]
    skipped = [r for r in rows if r["status"] == "unrepresentable"]
    failed = [r for r in rows if r["status"] == "error"]
    s = report.summary
    lines = [
        f"{len(rows)} cases: {len(ok)} evaluated, {len(skipped)} not representable, "
        f"{len(failed)} failed. Throughput compared as tokens/s per GPU; APE = |predicted/measured - 1|.",
        "",
    ]
    header = ["throughput", "n", "median APE", "p90 APE", "within 10%", "within 20%", "median signed"]
    body = [_stats_row("all", s["throughput"])]
    body += [_stats_row(f"gpu {k}", v) for k, v in s["by_gpu"].items()]
    body += [_stats_row(f"arch {k}", v) for k, v in s["by_arch"].items()]
    body += [_stats_row(f"stack {k}", v) for k, v in s["by_stack"].items()]
    lines += [table(header, body), ""]
    lines.append(f"memory: n={s['memory']['n']}, median APE {_pct(s['memory']['median_ape'])}")
    if "feasible_recall" in s:
        regret = s["regret"]
        lines.append(
            f"search: published plans judged feasible {_pct(s['feasible_recall'])}; "
            f"regret median {_pct(regret['median'])}, p90 {_pct(regret['p90'])} (n={regret['n']})"
        )
    scored = sorted((r for r in ok if r.get("ape") is not None), key=lambda r: -r["ape"])[:worst]
    if scored:
        lines += ["", f"largest errors (top {len(scored)}):"]
        lines.append(table(
            ["case", "gpu", "measured tok/s/GPU", "predicted", "error", "feasible"],
            [[r["id"], r["gpu"], round(r["measured_tokens_per_s_per_gpu"], 1),
              round(r["predicted_tokens_per_s_per_gpu"], 1), _pct(r["signed_error"]),
              "yes" if r["feasible"] else "no"] for r in scored],
        ))
    defaults: dict[str, int] = {}
    for r in ok:
        for d in r["defaults"]:
            defaults[d] = defaults.get(d, 0) + 1
    if defaults:
        lines += ["", "defaults filled in for unknown fields (cases): " + ", ".join(
            f"{k} ({v})" for k, v in sorted(defaults.items(), key=lambda kv: -kv[1])
        )]
    for title, group in (("not representable", skipped), ("failed", failed)):
        if group:
            lines += ["", f"{title}:"] + [f"  {r['id']}: {r['reason']}" for r in group]
    return "\n".join(lines) + "\n"
