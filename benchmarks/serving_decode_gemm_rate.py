"""Derive the dense decode GEMM constants of data/serving.toml (``gemm_fixed_us``,
``gemm_bandwidth_fraction``, ``quantized_gemm_fixed_us``, ``quantized_gemm_bandwidth_fraction``)
from NVIDIA's measured GEMM kernel times.

aiconfigurator (``pip install aiconfigurator``, 0.12.0; Apache-2.0) ships, per GPU and engine, a
table of GEMM latencies that NVIDIA measured on the GPU itself
(``aiconfigurator_core/systems/data/<gpu>/gemm/<engine>/<version>/gemm_perf.parquet``): the
engine's own linear layer (vLLM's ``RowParallelLinear``, SGLang's and TensorRT-LLM's equivalents)
on synthetic weights, timed under CUDA graphs over six distinct weight matrices (no L2 reuse),
for M = 1 ... 65,536 rows over a grid of N and K (ai-dynamo/aiconfigurator
collector/vllm/collect_gemm.py). None of it is a run of validation/serving.json.

At decode sizes (M <= 8 rows) the time of a GEMM of B weight bytes is, on every GPU and engine,
a fixed time plus B over a bandwidth (median absolute error of the straight line 3-8 % for
16-bit weights, 4-21 % for FP8):

    t = t0 + B / (f * HBM datasheet bandwidth)

This script fits t0 and f by least squares to every (N, K) of 8 MB to 1 GB per GPU, engine and
weight format, on the Hopper and Blackwell GPUs (H100, H200, B200, GB200), and takes the median
over those cells: 16-bit weights (BF16) and quantized ones (per-tensor FP8, whose time includes
the activation's quantization kernel). The fixed time includes the kernel's ramp-up, tail and
its gap in the graph. Block-scaled FP8 is left out: its tables are timed without CUDA graphs.
The fitted lines are committed below (``CELLS``); with aiconfigurator installed the script
re-fits them from its tables and prints both.

    python benchmarks/serving_decode_gemm_rate.py
"""

from __future__ import annotations

import statistics
import tomllib
from pathlib import Path

SERVING_TOML = Path(__file__).resolve().parent.parent / "rust" / "meshplan-core" / "data" / "serving.toml"

# HBM datasheet bandwidth, TB/s (data/gpus.toml memory_bandwidth_gbps of the same GPUs).
PEAK_TB_S = {"h100_sxm": 3.35, "h200_sxm": 4.8, "b200_sxm": 8.0, "gb200": 8.0}
FORMATS = {"bfloat16": 2.0, "fp8": 1.0}  # bytes per weight
MAX_ROWS = 8
MB_RANGE = (8.0, 1000.0)

# (gpu, engine, version, format) -> (t0 us, bandwidth TB/s): the fits of aiconfigurator 0.12.0's
# tables (this script's `refit`, Dec 2026).
CELLS: dict[tuple[str, str, str, str], tuple[float, float]] = {
    ("h100_sxm", "sglang", "0.5.14", "bfloat16"): (3.9, 2.88),
    ("h100_sxm", "sglang", "0.5.14", "fp8"): (8.2, 2.77),
    ("h100_sxm", "sglang", "0.5.6.post2", "bfloat16"): (2.0, 2.84),
    ("h100_sxm", "sglang", "0.5.6.post2", "fp8"): (7.3, 2.66),
    ("h100_sxm", "trtllm", "1.3.0rc20", "bfloat16"): (4.4, 2.86),
    ("h100_sxm", "trtllm", "1.3.0rc20", "fp8"): (13.7, 2.84),
    ("h100_sxm", "vllm", "0.24.0", "bfloat16"): (3.7, 2.98),
    ("h100_sxm", "vllm", "0.24.0", "fp8"): (9.6, 2.84),
    ("h200_sxm", "sglang", "0.5.14", "bfloat16"): (4.4, 4.17),
    ("h200_sxm", "sglang", "0.5.14", "fp8"): (9.1, 3.87),
    ("h200_sxm", "trtllm", "1.3.0rc20", "bfloat16"): (4.8, 4.15),
    ("h200_sxm", "trtllm", "1.3.0rc20", "fp8"): (13.8, 4.10),
    ("h200_sxm", "vllm", "0.24.0", "bfloat16"): (3.9, 4.07),
    ("h200_sxm", "vllm", "0.24.0", "fp8"): (10.6, 3.97),
    ("b200_sxm", "sglang", "0.5.14", "bfloat16"): (4.7, 6.68),
    ("b200_sxm", "sglang", "0.5.14", "fp8"): (10.6, 5.97),
    ("b200_sxm", "trtllm", "1.3.0rc20", "bfloat16"): (4.7, 6.47),
    ("b200_sxm", "trtllm", "1.3.0rc20", "fp8"): (16.1, 6.34),
    ("b200_sxm", "vllm", "0.24.0", "bfloat16"): (4.5, 6.72),
    ("b200_sxm", "vllm", "0.24.0", "fp8"): (10.3, 6.02),
    ("gb200", "sglang", "0.5.14", "bfloat16"): (4.4, 6.74),
    ("gb200", "sglang", "0.5.14", "fp8"): (10.8, 6.18),
    ("gb200", "trtllm", "1.3.0rc20", "bfloat16"): (4.6, 6.48),
    ("gb200", "trtllm", "1.3.0rc20", "fp8"): (15.4, 6.45),
    ("gb200", "vllm", "0.24.0", "bfloat16"): (4.5, 6.89),
    ("gb200", "vllm", "0.24.0", "fp8"): (10.8, 6.35),
}


def shipped(name: str) -> float:
    return float(tomllib.loads(SERVING_TOML.read_text())[name])


def derive(cells: dict[tuple[str, str, str, str], tuple[float, float]] = CELLS) -> dict[str, tuple[float, float]]:
    """Per weight format, the medians over the cells: (fixed time us, share of the datasheet)."""
    out = {}
    for fmt in FORMATS:
        mine = [(t0, bw / PEAK_TB_S[gpu]) for (gpu, _, _, f), (t0, bw) in cells.items() if f == fmt]
        out[fmt] = (statistics.median(t for t, _ in mine), statistics.median(s for _, s in mine))
    return out


def refit() -> dict[tuple[str, str, str, str], tuple[float, float]] | None:
    """The cells fitted again from an installed aiconfigurator's tables, or None without it."""
    try:
        import numpy as np
        import pandas as pd
        import aiconfigurator_core
    except ImportError:
        return None
    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    cells = {}
    for gpu in PEAK_TB_S:
        for table in sorted((root / gpu / "gemm").glob("*/*/gemm_perf.parquet")):
            engine, version = table.parent.parent.name, table.parent.name
            data = pd.read_parquet(table)
            for fmt, width in FORMATS.items():
                rows = data[(data.gemm_dtype == fmt) & (data.m <= MAX_ROWS)]
                shapes = rows.groupby(["n", "k"]).latency.median().reset_index()
                mb = shapes.n * shapes.k * width / 1e6
                shapes = shapes[(mb >= MB_RANGE[0]) & (mb <= MB_RANGE[1])]
                if len(shapes) < 10:
                    continue
                x = np.vstack([np.ones(len(shapes)), shapes.n * shapes.k * width / 1e6]).T
                (t0, us_per_mb), *_ = np.linalg.lstsq(x, shapes.latency * 1000.0, rcond=None)
                cells[(gpu, engine, version, fmt)] = (round(float(t0), 1), round(1.0 / float(us_per_mb), 2))
    return cells


def main() -> None:
    for fmt, (t0, share) in derive().items():
        prefix = "" if fmt == "bfloat16" else "quantized_"
        print(
            f"{fmt}: {t0:.1f} us fixed, {share:.3f} of the datasheet bandwidth over {sum(f == fmt for *_, f in CELLS)} "
            f"cells (shipped {prefix}gemm_fixed_us {shipped(prefix + 'gemm_fixed_us')}, "
            f"{prefix}gemm_bandwidth_fraction {shipped(prefix + 'gemm_bandwidth_fraction')})"
        )
    fresh = refit()
    if fresh is None:
        print("aiconfigurator is not installed: the committed fits above only")
        return
    for key, (t0, bw) in sorted(fresh.items()):
        kept = CELLS.get(key)
        print(f"{' '.join(key):40s} t0 {t0:5.1f} us  {bw:5.2f} TB/s  (committed: {kept})")


if __name__ == "__main__":
    main()
