"""Fits the calibration constants of meshplan's GPU data file to published training runs.

What is fitted, and how (see docs/calibration.md):

* one value per GPU type and precision of ``gemm_efficiency`` — by bisection, so that the median
  signed throughput error of that group's *dense* runs is zero (dense runs only, so that errors
  of the MoE terms do not leak into the GEMM efficiency); groups with fewer than 3 runs keep
  their data-file value;
* four software constants shared by every GPU — ``elementwise_bytes_per_hidden``,
  ``attention_efficiency``, ``layer_overhead_us`` and ``tp_overlap`` — on a grid; each grid point
  refits the GEMM efficiencies and is scored by
  ``median APE + p90 APE / 4 + median regret`` over all representable runs (the regret term needs
  a search per run, so it is what makes a grid point slow).

``dp_overlap`` is no longer fitted (Dec 2026): with collectives priced as NCCL runs them and
gradient buckets reduced as the backward produces them (docs/costmodel.md §3.1, §3.6), the
megatron-core stack's value is 1 (all of the pass may hide communication), not a fit.

The result is printed as a calibration-overrides JSON (the format ``--calibration`` reads) and
the summary of the best point. Copy the values into ``rust/meshplan-core/data/gpus.toml`` with a
comment naming this script. Run:

    python benchmarks/fidelity/fit_calibration.py validation/cases.json \\
        --elementwise 24,40,66 --attention 0.3,0.4 --overhead 100,300 --tp-overlap 0,0.4,0.7
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

import meshplan as mp
from meshplan.validation import fit_gemm_efficiency


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def fit_gemm(cases: str, shared: dict[str, Any]) -> dict[str, Any]:
    """Overrides with ``shared`` for every GPU and bisected GEMM efficiencies per group
    (:func:`meshplan.validation.fit_gemm_efficiency`, which ``validate --cross-validate`` reuses)."""
    overrides: dict[str, Any] = {"*": dict(shared)}
    for (gpu, prec), value in fit_gemm_efficiency(cases, overrides).items():
        overrides.setdefault(gpu, {}).setdefault("gemm_efficiency", {})[prec] = value
    return overrides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases")
    ap.add_argument("--elementwise", type=_floats, default=[40.0])
    ap.add_argument("--attention", type=_floats, default=[0.30])
    ap.add_argument("--overhead", type=_floats, default=[300.0])
    ap.add_argument("--tp-overlap", type=_floats, default=[0.7])
    args = ap.parse_args()
    best: tuple[float, dict[str, Any], mp.ValidationReport] | None = None
    grid = itertools.product(args.elementwise, args.attention, args.overhead, args.tp_overlap)
    for e, a, o, t in grid:
        shared = {
            "elementwise_bytes_per_hidden": e,
            "attention_efficiency": a,
            "layer_overhead_us": o,
            "tp_overlap": t,
        }
        overrides = fit_gemm(args.cases, shared)
        report = mp.validate(args.cases, search=True, calibration=overrides)
        s = report.summary
        score = s["throughput"]["median_ape"] + s["throughput"]["p90_ape"] / 4 + s["regret"]["median"]
        print(
            f"elementwise={e} attention={a} overhead_us={o} tp_overlap={t}: "
            f"median {s['throughput']['median_ape']:.4f} p90 {s['throughput']['p90_ape']:.4f} "
            f"regret {s['regret']['median']:.4f} recall {s['feasible_recall']:.3f}",
            flush=True,
        )
        if best is None or score < best[0]:
            best = (score, overrides, report)
    assert best is not None
    _, overrides, report = best
    print(json.dumps(overrides, indent=1))
    for name, s in report.summary["by_gpu"].items():
        print(f"{name}: n={s['n']} median {s['median_ape']:.3f} p90 {s['p90_ape']:.3f}")


if __name__ == "__main__":
    main()
