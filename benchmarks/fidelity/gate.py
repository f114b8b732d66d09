"""Fidelity regression gate: fails when the cost model's error on the published runs gets worse.

Measures the throughput error of ``meshplan.validate`` on ``validation/cases.json`` — overall, per
GPU type, per architecture and per training stack — in sample (the shipped constants) and
leave-one-group-out (``meshplan.cross_validate`` by GPU, by source, by model and by stack), and
compares it with the committed
baseline ``benchmarks/fidelity/baseline.json``. It fails (exit 1) when the median or the p90 APE
gets worse by more than 1 point overall, or by more than 3 points in any group that has at least
10 cases in the baseline, and prints every figure that moved. ``.ci/run`` runs it after the tests.

After a deliberate change of the numbers (a better model, a refitted constant), refresh the
baseline in the same commit with one command, from the repository root:

    python benchmarks/fidelity/gate.py --update

``--calibration FILE`` applies calibration overrides (as ``meshplan validate --calibration``),
``--sections`` restricts the comparison (for example ``in_sample`` alone, about 0.1 s; all five
take about 30 s on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional

import meshplan as mp

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CASES = ROOT / "validation" / "cases.json"
DEFAULT_BASELINE = Path(__file__).resolve().parent / "baseline.json"

SECTIONS: dict[str, Optional[str]] = {
    "in_sample": None,
    "loo_gpu": "gpu",
    "loo_source": "source",
    "loo_model": "model",
    "loo_stack": "stack",
}
"""Baseline section → the group ``cross_validate`` leaves out (None: in sample)."""

OVERALL_LIMIT = 0.01
"""Largest allowed worsening of the overall median or p90 APE (1 point)."""

GROUP_LIMIT = 0.03
"""Largest allowed worsening of a group's median or p90 APE (3 points) ..."""

GROUP_MIN_CASES = 10
"""... for groups with at least this many cases in the baseline (smaller ones are reported only)."""

METRICS = ("median_ape", "p90_ape")

SCOPES = ("by_gpu", "by_arch", "by_stack")
"""The grouped scopes gated besides the overall figures."""


def _stats(s: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "n": s["n"],
        **{m: None if s[m] is None else round(float(s[m]), 6) for m in METRICS},
    }


def compact(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The gated part of a validate summary: overall, per GPU, per architecture, per stack."""
    return {
        "overall": _stats(summary["throughput"]),
        **{scope: {k: _stats(v) for k, v in summary[scope].items()} for scope in SCOPES},
    }


def measure(cases: Path, calibration: Optional[Path], sections: list[str]) -> dict[str, Any]:
    """The gated figures of ``sections`` for ``cases`` under ``calibration``."""
    out: dict[str, Any] = {}
    for name in sections:
        by = SECTIONS[name]
        if by is None:
            summary = mp.validate(cases, calibration=calibration).summary
        else:
            summary = mp.cross_validate(cases, by, calibration=calibration).summary
        out[name] = compact(summary)
    return out


def compare(baseline: Mapping[str, Any], current: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(failures, moves): every gated figure that got worse beyond its limit, and every figure
    of the sections in ``current`` that moved by 0.1 point or more (or whose case count changed)."""
    failures: list[str] = []
    moves: list[str] = []
    for section, scopes in current.items():
        base_scopes = baseline.get(section)
        if base_scopes is None:
            moves.append(f"{section}: not in the baseline (run with --update to add it)")
            continue
        for scope in ("overall", *SCOPES):
            if scope not in scopes:
                continue  # not measured (a hand-made section)
            if scope not in base_scopes:
                moves.append(f"{section} {scope}: not in the baseline (run with --update to add it)")
                continue
            base_groups = {"all": base_scopes["overall"]} if scope == "overall" else base_scopes[scope]
            cur_groups = {"all": scopes["overall"]} if scope == "overall" else scopes[scope]
            for group in sorted(set(base_groups) | set(cur_groups)):
                label = f"{section} {scope} {group}"
                base, cur = base_groups.get(group), cur_groups.get(group)
                if base is None:
                    moves.append(f"{label}: new group (n={cur['n']})")
                    continue
                gated = scope == "overall" or base["n"] >= GROUP_MIN_CASES
                limit = OVERALL_LIMIT if scope == "overall" else GROUP_LIMIT
                if cur is None:
                    line = f"{label}: no longer scored (baseline n={base['n']})"
                    (failures if gated else moves).append(line)
                    continue
                if cur["n"] != base["n"]:
                    moves.append(f"{label}: n {base['n']} -> {cur['n']}")
                for metric in METRICS:
                    b, c = base[metric], cur[metric]
                    if b is None or c is None:
                        continue
                    delta = c - b
                    if abs(delta) < 0.001:
                        continue
                    line = (
                        f"{label} {metric}: {100 * b:.1f}% -> {100 * c:.1f}% "
                        f"({100 * delta:+.1f} points, n={cur['n']})"
                    )
                    if gated and delta > limit:
                        failures.append(f"{line}: worse by more than {100 * limit:.0f} points")
                    else:
                        moves.append(line)
    return failures, moves


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=Path, default=DEFAULT_CASES, help="case file (default validation/cases.json)")
    ap.add_argument("--baseline", type=Path, default=DEFAULT_BASELINE, help="baseline JSON (default: next to this script)")
    ap.add_argument("--calibration", type=Path, help="calibration overrides (TOML or JSON)")
    ap.add_argument(
        "--sections", default=",".join(SECTIONS),
        help=f"comma-separated sections to measure (default all: {','.join(SECTIONS)})",
    )
    ap.add_argument("--update", action="store_true", help="write the measured figures into the baseline")
    args = ap.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or not sections:
        print(f"gate: --sections {args.sections!r}: allowed {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    current = measure(args.cases, args.calibration, sections)
    elapsed = time.perf_counter() - started
    baseline: dict[str, Any] = {}
    if args.baseline.exists():
        baseline = json.loads(args.baseline.read_text(encoding="utf-8"))
    elif not args.update:
        print(f"gate: no baseline at {args.baseline}; create it with --update", file=sys.stderr)
        return 2
    failures, moves = compare(baseline.get("sections", {}), current)
    for line in moves:
        print(f"  moved: {line}")
    if args.update:
        sections_out = dict(baseline.get("sections", {}))
        sections_out.update(current)
        doc = {
            "about": "meshplan validate summary gated by benchmarks/fidelity/gate.py (APE as fractions); "
            "refresh with: python benchmarks/fidelity/gate.py --update",
            "cases": "validation/cases.json",
            "sections": {k: sections_out[k] for k in SECTIONS if k in sections_out},
        }
        args.baseline.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        for line in failures:
            print(f"  accepted: {line}")
        print(f"gate: baseline {args.baseline} updated ({', '.join(sections)}; {elapsed:.1f} s)")
        return 0
    for line in failures:
        print(f"  WORSE: {line}")
    if failures:
        print(
            f"gate: FAILED, {len(failures)} figure(s) worse than the baseline beyond "
            f"{100 * OVERALL_LIMIT:.0f} point overall / {100 * GROUP_LIMIT:.0f} points per group of "
            f"≥ {GROUP_MIN_CASES} cases; if the change is deliberate, run "
            "'python benchmarks/fidelity/gate.py --update' and commit the baseline"
        )
        return 1
    print(f"gate: ok ({', '.join(sections)}; {len(moves)} figure(s) moved within limits; {elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
