"""``meshplan calibrate``: fit the calibration constants of one's own cluster.

Reads nccl-tests (or rccl-tests) output — the standard ``all_reduce_perf``, ``all_gather_perf``,
``reduce_scatter_perf`` and ``alltoall_perf`` tables — and fits the collective constants of a
GPU preset by least squares of meshplan's own collective model (``_core.collective_times``, the
very function the planner prices collectives with, docs/costmodel.md §3.1):

* logs whose ranks share one scale-up domain fit ``scaleup_bus_efficiency``,
  ``scaleup_latency_us`` and, where the switch has NVLink SHARP, ``nvls_efficiency``;
* logs that span domains fit ``network_bus_efficiency`` and ``network_latency_us``, with the
  scale-up constants held at their fitted (or preset) values.

The objective is the squared log ratio of modelled to measured time, summed over every row, so
that small messages (latency) and large ones (bandwidth) count alike. A constant the logs cannot
move (its RMS elasticity over the rows is under :data:`MIN_ELASTICITY`) is reported as not
determined and left out of the file.

Where PyTorch with a CUDA (or ROCm) GPU is importable, :func:`run_microbenchmarks` also times
GEMMs of the model's own shapes, a grouped GEMM, causal flash attention
(``scaled_dot_product_attention``) and an element-wise kernel, and :func:`fit_compute` turns them
into ``gemm_efficiency``, ``attention_efficiency`` and ``memory_efficiency`` by inverting the
same time model (``_core.gemm_times``; attention and element-wise rates as
docs/costmodel.md §5.2–5.3 charge them). Without one the microbenchmarks are skipped with the
reason.

The result writes the calibration TOML that ``--calibration`` reads and a markdown report of
what was measured, the fitted values and the residuals.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

from . import _core
from .errors import InvalidInputError

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
"""The collectives meshplan prices, with the nccl-tests binaries that measure them."""

_KIND_OF_BINARY = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
}

MIN_ELASTICITY = 0.05
"""A constant is *determined* by the logs when the modelled times move, root mean square over
the rows, by at least this fraction of its own relative change (d ln t / d ln c)."""

MAX_ROWS = 20_000
"""Most table rows one fit takes (a full 8 B–16 GiB sweep has 32 per collective; the fit prices
every row some thousand times)."""

MAX_LOG_BYTES = 64 * 1024 * 1024
"""Largest log file read (nccl-tests output of a full sweep is a few kB; verbose NCCL_DEBUG
output a few MB)."""


@dataclass(frozen=True)
class NcclRow:
    """One row of an nccl-tests table: the out-of-place time (and in-place, when printed)."""

    size_bytes: int
    count: int
    dtype: str
    time_us: float
    busbw_gbps: float
    in_place_time_us: Optional[float] = None


@dataclass(frozen=True)
class NcclLog:
    """One nccl-tests run: which collective, over how many ranks on how many hosts, and its rows."""

    source: str
    kind: str
    ranks: int
    nodes: int
    rows: tuple[NcclRow, ...]
    device: str = ""

    @property
    def ranks_per_node(self) -> int:
        return max(1, self.ranks // max(1, self.nodes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "kind": self.kind, "ranks": self.ranks, "nodes": self.nodes,
            "device": self.device, "rows": len(self.rows),
        }


# `[1,0]<stdout>:` (Open MPI --tag-output) and similar per-rank prefixes.
_PREFIX = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_HEADER = re.compile(r"^#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")
_STARTING = re.compile(r"Collective test starting:\s*([A-Za-z_]+)")
_DEVICE = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+"
    r"(?:\s+\[[^\]]*\])?\s*(.*)$"
)


def _kind_from(text: str) -> Optional[str]:
    """The collective a binary or file name names (``all_reduce_perf_mpi`` → ``all_reduce``)."""
    name = os.path.basename(text).lower()
    for binary, kind in _KIND_OF_BINARY.items():
        if binary in name:
            return kind
    return None


def _check_count(field_name: str, value: Optional[int]) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 1 <= value <= 1 << 20):
        raise InvalidInputError(
            f"invalid {field_name}: {value!r} (allowed: an integer in 1..={1 << 20})"
        )


def parse_nccl_tests(
    text: str,
    source: str = "<text>",
    kind: Optional[str] = None,
    ranks: Optional[int] = None,
    nodes: Optional[int] = None,
) -> list[NcclLog]:
    """Every run in the nccl-tests output ``text`` (one file may hold several).

    The collective comes from ``kind``, else the ``# Collective test starting:`` line, else the
    name of ``source``; ranks and hosts from ``ranks``/``nodes``, else the ``# Rank N ... on
    HOST`` device lines. Raises :class:`InvalidInputError` naming the source when a table has
    no collective or no rank count, or when there is no table at all.
    """
    if kind is not None and kind not in KINDS and _kind_from(kind) is None:
        raise InvalidInputError(f"invalid kind: {kind!r} (allowed: {', '.join(KINDS)})")
    _check_count("ranks", ranks)
    _check_count("nodes", nodes)
    fixed_kind = None if kind is None else (kind if kind in KINDS else _kind_from(kind))
    runs: list[NcclLog] = []
    state: dict[str, Any] = {"kind": None, "devices": {}, "columns": None, "rows": []}

    def finish() -> None:
        if not state["rows"]:
            return
        the_kind = fixed_kind or state["kind"] or _kind_from(source)
        if the_kind is None:
            raise InvalidInputError(
                f"invalid nccl-tests log {source}: cannot tell which collective it measured "
                "(name the file after the binary, e.g. all_reduce_perf.txt, or pass --kind)"
            )
        devices: dict[int, tuple[str, str]] = state["devices"]
        n_ranks = ranks or len(devices)
        hosts = {host for host, _ in devices.values()}
        n_nodes = nodes or len(hosts) or 1
        if not n_ranks:
            raise InvalidInputError(
                f"invalid nccl-tests log {source}: no '# Rank N ... on HOST' device lines to "
                "count its ranks (pass --ranks and --nodes)"
            )
        if n_nodes > n_ranks:
            raise InvalidInputError(
                f"invalid nodes: {n_nodes} (allowed: at most the {n_ranks} ranks of {source})"
            )
        names = sorted({name for _, name in devices.values() if name})
        runs.append(NcclLog(
            source=source, kind=the_kind, ranks=n_ranks, nodes=n_nodes,
            rows=tuple(state["rows"]), device=", ".join(names),
        ))
        state["rows"] = []

    for raw in text.splitlines():
        line = _PREFIX.sub("", raw).rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        m = _STARTING.search(stripped)
        if m:
            finish()
            state["kind"] = _kind_from(m.group(1))
            continue
        if _HEADER.match(stripped):
            finish()
            state["devices"] = {}
            state["columns"] = None
            continue
        m = _DEVICE.match(stripped)
        if m:
            state["devices"][int(m.group(1))] = (m.group(2), m.group(3).strip())
            continue
        if stripped.startswith("#"):
            words = stripped.lstrip("#").split()
            if words[:2] == ["size", "count"] and "time" in words:
                finish()
                state["columns"] = words
            elif stripped.startswith("# Out of bounds") or stripped.startswith("# Avg bus"):
                finish()
            continue
        row = _row(stripped.split(), state["columns"])
        if row is not None:
            state["rows"].append(row)
    finish()
    if not runs:
        raise InvalidInputError(
            f"invalid nccl-tests log {source}: no result table (size, count, type, ..., time, "
            "algbw, busbw) found"
        )
    return runs


def _row(words: list[str], columns: Optional[list[str]]) -> Optional[NcclRow]:
    """A table row, or None for any other line (a row needs the column header before it)."""
    if columns is None or len(words) != len(columns) or not words[0].isdigit():
        return None
    at = columns.index("time")
    try:
        size = int(words[0])
        count = int(words[1])
        time_us = float(words[at])
        busbw = float(words[at + 2])
        later = [i for i, c in enumerate(columns) if c == "time" and i > at]
        in_place = float(words[later[0]]) if later else None
    except (ValueError, IndexError):
        return None
    if size <= 0 or not (time_us > 0 and math.isfinite(time_us)):
        return None
    return NcclRow(size, count, words[2], time_us, busbw, in_place)


def read_logs(
    paths: Sequence[Union[str, "os.PathLike[str]"]],
    kind: Optional[str] = None,
    ranks: Optional[int] = None,
    nodes: Optional[int] = None,
) -> list[NcclLog]:
    """Every run in the files of ``paths`` (a directory contributes every regular file in it,
    sorted by name; files without a result table there are skipped, a named file without one is
    an error)."""
    files: list[tuple[str, bool]] = []
    for path in paths:
        p = os.fspath(path)
        if os.path.isdir(p):
            files += [(os.path.join(p, n), False) for n in sorted(os.listdir(p))
                      if os.path.isfile(os.path.join(p, n)) and not n.startswith(".")]
        elif os.path.isfile(p):
            files.append((p, True))
        else:
            raise InvalidInputError(f"invalid logs: {p!r} (allowed: an existing file or directory)")
    logs: list[NcclLog] = []
    for path, named in files:
        if os.path.getsize(path) > MAX_LOG_BYTES:
            raise InvalidInputError(
                f"invalid logs: {path!r} is {os.path.getsize(path)} bytes (allowed: at most "
                f"{MAX_LOG_BYTES})"
            )
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        try:
            logs += parse_nccl_tests(text, path, kind=kind, ranks=ranks, nodes=nodes)
        except InvalidInputError as e:
            if named or "no result table" not in str(e):
                raise
    if not logs:
        raise InvalidInputError(
            f"invalid logs: no nccl-tests result table in {', '.join(os.fspath(p) for p in paths)}"
        )
    return logs


# ----------------------------------------------------------------------------------------------
# Fitting the collective constants


@dataclass(frozen=True)
class Residual:
    """One measured row against the model, before and after the fit."""

    source: str
    kind: str
    ranks: int
    per_domain: int
    size_bytes: int
    measured_us: float
    preset_us: float
    fitted_us: float
    algorithm: str

    @property
    def error(self) -> float:
        """Fitted model over measured, minus one."""
        return self.fitted_us / self.measured_us - 1.0

    @property
    def preset_error(self) -> float:
        return self.preset_us / self.measured_us - 1.0


@dataclass
class FittedValue:
    """One calibration constant: its value, the preset's, and whether the data determined it."""

    name: str
    value: float
    preset: Optional[float]
    determined: bool
    evidence: str
    elasticity: float = 0.0


@dataclass
class CollectiveFit:
    values: list[FittedValue]
    residuals: list[Residual]


def per_domain_of(log: NcclLog, gpu: Mapping[str, Any], ranks_per_domain: Optional[int]) -> int:
    """Ranks of ``log`` per scale-up domain: ``ranks_per_domain`` if given; on rack-scale
    domains larger than a host (NVL72) every rank up to the domain size; else the ranks per
    host, capped at the domain."""
    domain = int(gpu["scaleup_domain"])
    if ranks_per_domain is not None:
        _check_count("ranks_per_domain", ranks_per_domain)
        return min(ranks_per_domain, log.ranks)
    if domain > int(gpu["gpus_per_node"]):
        return min(log.ranks, domain)
    return min(log.ranks_per_node, domain)


def _with(gpu: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(gpu)
    out["calibration"] = {**gpu["calibration"], **values}
    return out


def _times_us(gpu: Mapping[str, Any], queries: list[dict[str, Any]]) -> list[tuple[float, str]]:
    priced = _core.collective_times(dict(gpu), queries)
    return [(p["total_s"] * 1e6, p["algorithm"] + "/" + p["protocol"]) for p in priced]


def _minimise(
    objective: Callable[[dict[str, float]], float],
    start: dict[str, float],
    bounds: Mapping[str, tuple[float, float]],
    sweeps: int = 4,
) -> dict[str, float]:
    """Coordinate descent in log space: a 33-point grid over each constant's bounds, then a
    golden-section search between the grid neighbours of the best point, repeated ``sweeps``
    times (the objective is a minimum over algorithms, so only piecewise smooth)."""
    x = dict(start)
    best = objective(x)
    golden = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(sweeps):
        before = best
        for name, (lo, hi) in bounds.items():
            a, b = math.log(lo), math.log(hi)
            grid = [a + (b - a) * i / 32 for i in range(33)]

            def f(u: float, name: str = name) -> float:
                return objective({**x, name: math.exp(u)})

            scores = [f(u) for u in grid]
            i = min(range(len(grid)), key=scores.__getitem__)
            lo_u, hi_u = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
            c, d = hi_u - golden * (hi_u - lo_u), lo_u + golden * (hi_u - lo_u)
            fc, fd = f(c), f(d)
            for _ in range(40):
                if fc < fd:
                    hi_u, d, fd = d, c, fc
                    c = hi_u - golden * (hi_u - lo_u)
                    fc = f(c)
                else:
                    lo_u, c, fc = c, d, fd
                    d = lo_u + golden * (hi_u - lo_u)
                    fd = f(d)
            candidates = [(scores[i], grid[i]), (fc, c), (fd, d)]
            score, u = min(candidates)
            if score <= best:
                best = score
                x[name] = math.exp(u)
        if before - best <= 1e-12 * max(1.0, before):
            break
    return x


_SCALEUP_BOUNDS = {
    "scaleup_bus_efficiency": (0.05, 1.5),
    "scaleup_latency_us": (0.1, 300.0),
    "nvls_efficiency": (0.05, 1.5),
}
_NETWORK_BOUNDS = {
    "network_bus_efficiency": (0.05, 1.5),
    "network_latency_us": (0.1, 1000.0),
}
# NCCL's tables, which an unset latency constant stands for (data/collectives.toml, ring Simple).
_NCCL_STEP_US = {"scaleup_latency_us": 3.4, "network_latency_us": 14.0}


def fit_collectives(
    gpu: Mapping[str, Any],
    logs: Sequence[NcclLog],
    ranks_per_domain: Optional[int] = None,
) -> CollectiveFit:
    """Fits the collective constants of ``gpu`` (a GPU dict, core shape) to ``logs``."""
    gpu = dict(gpu)
    cal = gpu["calibration"]
    rows: list[tuple[NcclLog, int, NcclRow]] = []
    for log in logs:
        p1 = per_domain_of(log, gpu, ranks_per_domain)
        rows += [(log, p1, row) for row in log.rows]
    if len(rows) > MAX_ROWS:
        raise InvalidInputError(
            f"invalid logs: {len(rows)} table rows (allowed: at most {MAX_ROWS} in one fit)"
        )
    single = [r for r in rows if r[1] >= r[0].ranks]
    multi = [r for r in rows if r[1] < r[0].ranks]
    has_nvls = cal.get("nvls_efficiency") is not None and gpu.get("scaleup_topology") == "switch"

    def queries(selected: list[tuple[NcclLog, int, NcclRow]]) -> list[dict[str, Any]]:
        return [{"kind": log.kind, "bytes": float(row.size_bytes), "group_size": log.ranks,
                 "per_domain": p1} for log, p1, row in selected]

    def preset_value(name: str) -> float:
        v = cal.get(name)
        return float(v) if v is not None else _NCCL_STEP_US[name]

    values: list[FittedValue] = []
    fitted: dict[str, float] = {}
    for selected, bounds, what in (
        (single, _SCALEUP_BOUNDS, "scale-up"),
        (multi, _NETWORK_BOUNDS, "network"),
    ):
        if not selected:
            continue
        names = [n for n in bounds if n != "nvls_efficiency" or has_nvls]
        q = queries(selected)
        measured = [math.log(row.time_us) for _, _, row in selected]

        def objective(x: dict[str, float], q: list[dict[str, Any]] = q,
                      measured: list[float] = measured) -> float:
            model = _times_us(_with(gpu, {**fitted, **x}), q)
            return sum((math.log(t) - m) ** 2 for (t, _), m in zip(model, measured))

        start = {n: preset_value(n) for n in names}
        x = _minimise(objective, start, {n: bounds[n] for n in names})
        for name in names:
            e = _elasticity(gpu, {**fitted, **x}, name, q)
            kinds = sorted({log.kind for log, _, _ in selected})
            shapes = sorted({f"{log.ranks}x{p1}" for log, p1, _ in selected})
            values.append(FittedValue(
                name=name, value=x[name], preset=cal.get(name), determined=e >= MIN_ELASTICITY,
                elasticity=e,
                evidence=f"{what}: {len(selected)} rows of {', '.join(kinds)} "
                f"(ranks x per-domain {', '.join(shapes)})",
            ))
        fitted.update({v.name: v.value for v in values if v.determined})

    residuals: list[Residual] = []
    if rows:
        q = queries(rows)
        before = _times_us(gpu, q)
        after = _times_us(_with(gpu, fitted), q)
        for (log, p1, row), (t0, _), (t1, algo) in zip(rows, before, after):
            residuals.append(Residual(log.source, log.kind, log.ranks, p1, row.size_bytes,
                                      row.time_us, t0, t1, algo))
    return CollectiveFit(values, residuals)


def _elasticity(gpu: Mapping[str, Any], x: Mapping[str, float], name: str,
                q: list[dict[str, Any]]) -> float:
    """RMS over the rows of d ln t / d ln c for the constant ``name`` at ``x`` (±5 %)."""
    up = _times_us(_with(gpu, {**x, name: x[name] * 1.05}), q)
    down = _times_us(_with(gpu, {**x, name: x[name] / 1.05}), q)
    slopes = [(math.log(a) - math.log(b)) / (2 * math.log(1.05)) for (a, _), (b, _) in zip(up, down)]
    return math.sqrt(sum(s * s for s in slopes) / len(slopes)) if slopes else 0.0


# ----------------------------------------------------------------------------------------------
# GPU microbenchmarks (PyTorch) and the compute constants


@dataclass
class Microbenchmarks:
    """What the GPU microbenchmarks measured; ``skipped`` says why they did not run."""

    skipped: Optional[str] = None
    device: str = ""
    precision: str = "bf16"
    gemm: list[dict[str, float]] = field(default_factory=list)
    """``{m, n, k, seconds}`` per linear-layer GEMM of the model."""
    grouped_gemm: list[dict[str, float]] = field(default_factory=list)
    """``{groups, m, n, k, seconds}``: equal groups as one batched GEMM (MoE experts)."""
    attention: list[dict[str, float]] = field(default_factory=list)
    """``{batch, seq, heads, head_dim, forward_s, backward_s}``: causal flash attention."""
    elementwise: list[dict[str, float]] = field(default_factory=list)
    """``{bytes, seconds}``: bytes read and written by ``out = a + b``."""


def _torch() -> Any:
    """PyTorch, an optional dependency (imported by name so that typing does not need it)."""
    return importlib.import_module("torch")


def torch_unavailable() -> Optional[str]:
    """Why the GPU microbenchmarks cannot run here, or None when PyTorch sees a GPU."""
    try:
        torch = _torch()
    except ImportError:
        return "PyTorch is not installed"
    try:
        available = bool(torch.cuda.is_available())
    except Exception as e:  # a broken driver install raises instead of answering
        return f"PyTorch cannot query CUDA ({type(e).__name__}: {e})"
    if not available:
        return "PyTorch sees no CUDA/ROCm GPU"
    return None


def model_gemm_shapes(model: Mapping[str, Any], tokens: int) -> list[tuple[int, int, int]]:
    """The linear layers' forward GEMMs ``(m, n, k)`` of ``model`` (a model dict) at ``tokens``
    tokens: QKV, attention output, MLP up (gate and up fused where gated) and down; for MoE
    models the dense MLP is the expert's at ``tokens · top_k / num_experts`` rows (see
    :func:`model_grouped_shape`)."""
    h = int(model["hidden"])
    heads, kv = int(model["heads"]), int(model["kv_heads"])
    head_dim = int(model.get("head_dim") or h // heads)
    ffn = int(model["ffn_hidden"])
    gated = model.get("activation", "swiglu") in ("swiglu", "geglu")
    shapes = [
        (tokens, (heads + 2 * kv) * head_dim, h),
        (tokens, h, heads * head_dim),
        (tokens, ffn * (2 if gated else 1), h),
        (tokens, h, ffn),
    ]
    return shapes


def model_grouped_shape(model: Mapping[str, Any], tokens: int) -> Optional[tuple[int, int, int, int]]:
    """``(groups, m, n, k)`` of the MoE expert up-projection at ``tokens`` tokens (8 local
    experts at most), or None for a dense model."""
    moe = model.get("moe")
    if not moe:
        return None
    experts = int(moe["num_experts"])
    groups = min(experts, 8)
    rows = max(1, tokens * int(moe["top_k"]) // experts)
    ffn = int(moe["expert_ffn_hidden"])
    gated = model.get("activation", "swiglu") in ("swiglu", "geglu")
    return groups, rows, ffn * (2 if gated else 1), int(model["hidden"])


def run_microbenchmarks(
    model: Optional[Mapping[str, Any]],
    precision: str = "bf16",
    tokens: int = 8192,
    repeats: int = 10,
) -> Microbenchmarks:
    """Times GEMMs of ``model``'s shapes (a default 8192-wide layer without one), a grouped GEMM,
    causal flash attention and an element-wise add on the first GPU PyTorch sees; returns a
    :class:`Microbenchmarks` with ``skipped`` set (and nothing measured) when there is none.
    Only 16-bit precisions run (FP8/FP4 GEMMs need Transformer Engine)."""
    reason = torch_unavailable()
    if reason is not None:
        return Microbenchmarks(skipped=reason, precision=precision)
    if precision not in ("bf16", "fp16"):
        return Microbenchmarks(
            skipped=f"precision {precision} needs Transformer Engine; only bf16/fp16 are timed",
            precision=precision,
        )
    torch = _torch()
    F = torch.nn.functional
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    dev = torch.device("cuda")
    layer = model or {"hidden": 8192, "heads": 64, "kv_heads": 8, "ffn_hidden": 28672,
                      "activation": "swiglu"}
    out = Microbenchmarks(device=torch.cuda.get_device_name(0), precision=precision)

    def timed(fn: Callable[[], Any]) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(float(start.elapsed_time(end)) / 1e3)
        return float(statistics.median(times))

    for m, n, k in model_gemm_shapes(layer, tokens):
        a = torch.randn(m, k, device=dev, dtype=dtype)
        b = torch.randn(k, n, device=dev, dtype=dtype)
        out.gemm.append({"m": m, "n": n, "k": k, "seconds": timed(lambda: a @ b)})
        del a, b
    grouped = model_grouped_shape(layer, tokens)
    if grouped is not None:
        g, m, n, k = grouped
        a = torch.randn(g, m, k, device=dev, dtype=dtype)
        b = torch.randn(g, k, n, device=dev, dtype=dtype)
        out.grouped_gemm.append({"groups": g, "m": m, "n": n, "k": k,
                                 "seconds": timed(lambda: torch.bmm(a, b))})
        del a, b
    heads = int(layer["heads"])
    head_dim = int(layer.get("head_dim") or int(layer["hidden"]) // heads)
    for seq in (2048, 8192):
        batch = max(1, tokens // seq)
        q = torch.randn(batch, heads, seq, head_dim, device=dev, dtype=dtype, requires_grad=True)
        kk = torch.randn_like(q, requires_grad=True)
        v = torch.randn_like(q, requires_grad=True)
        fwd = timed(lambda: F.scaled_dot_product_attention(q, kk, v, is_causal=True))
        o = F.scaled_dot_product_attention(q, kk, v, is_causal=True)
        grad = torch.randn_like(o)

        def both() -> None:
            F.scaled_dot_product_attention(q, kk, v, is_causal=True).backward(grad)

        total = timed(both)
        out.attention.append({"batch": batch, "seq": seq, "heads": heads, "head_dim": head_dim,
                              "forward_s": fwd, "backward_s": max(total - fwd, 0.0)})
        del q, kk, v, o, grad
    n = 1 << 28
    x = torch.empty(n, device=dev, dtype=dtype)
    y = torch.empty(n, device=dev, dtype=dtype)
    z = torch.empty(n, device=dev, dtype=dtype)
    out.elementwise.append({"bytes": 3.0 * n * x.element_size(),
                            "seconds": timed(lambda: torch.add(x, y, out=z))})
    del x, y, z
    torch.cuda.empty_cache()
    return out


def fit_compute(gpu: Mapping[str, Any], bench: Microbenchmarks) -> tuple[list[FittedValue], list[str]]:
    """``gemm_efficiency.<precision>``, ``attention_efficiency`` and ``memory_efficiency`` from
    ``bench``, each inverting the time model: the GEMM efficiency by least squares of
    ``_core.gemm_times`` on log time, the attention efficiency from the causal forward FLOPs the
    time model counts (``tokens·2·heads·(d_qk + d_v)·s/2``, §5.2) over the 16-bit peak, the
    memory efficiency from the element-wise bytes over the HBM bandwidth (geometric means).
    Returns the values and report lines on the rows (grouped GEMM against the fit)."""
    cal = gpu["calibration"]
    values: list[FittedValue] = []
    lines: list[str] = []
    p = bench.precision
    if bench.gemm:
        shapes = [[s["m"], s["n"], s["k"]] for s in bench.gemm]
        measured = [math.log(s["seconds"]) for s in bench.gemm]
        preset = (cal.get("gemm_efficiency") or {}).get(p)

        def objective(x: dict[str, float]) -> float:
            g = _with(gpu, {"gemm_efficiency": {**(cal.get("gemm_efficiency") or {}),
                                                p: x["e"]}})
            model = _core.gemm_times(g, p, shapes)
            return sum((math.log(t) - m) ** 2 for t, m in zip(model, measured))

        e = _minimise(objective, {"e": float(preset or 0.6)}, {"e": (0.02, 1.0)})["e"]
        values.append(FittedValue(f"gemm_efficiency.{p}", e, preset, True,
                                  f"{len(shapes)} GEMMs of the model's linear layers"))
        fitted = _with(gpu, {"gemm_efficiency": {**(cal.get("gemm_efficiency") or {}), p: e}})
        model = _core.gemm_times(fitted, p, shapes)
        for s, t in zip(bench.gemm, model):
            lines.append(f"GEMM {s['m']}x{s['n']}x{s['k']}: measured {s['seconds'] * 1e6:.1f} us,"
                         f" model {t * 1e6:.1f} us ({t / s['seconds'] - 1:+.1%})")
        for s in bench.grouped_gemm:
            t = s["groups"] * _core.gemm_times(fitted, p, [[s["m"], s["n"], s["k"]]])[0]
            lines.append(f"grouped GEMM {s['groups']} x {s['m']}x{s['n']}x{s['k']}: measured "
                         f"{s['seconds'] * 1e6:.1f} us, model {t * 1e6:.1f} us "
                         f"({t / s['seconds'] - 1:+.1%})")
    peak16 = gpu["peak_tflops"].get(p) or gpu["peak_tflops"].get("bf16")
    if bench.attention and peak16:
        estimates = []
        # Each call's rate read back to the reference length (docs/costmodel.md §5.2).
        factors = _core.attention_length_factors([float(a["seq"]) for a in bench.attention])
        for a, f in zip(bench.attention, factors):
            tokens = a["batch"] * a["seq"]
            flops = tokens * 2.0 * a["heads"] * (2 * a["head_dim"]) * (a["seq"] / 2.0)
            estimates.append(flops / (a["forward_s"] * peak16 * 1e12) / f)
            ratio = a["backward_s"] / a["forward_s"] if a["forward_s"] > 0 else float("nan")
            lines.append(f"attention b={a['batch']} s={a['seq']} heads={a['heads']} "
                         f"d={a['head_dim']}: forward {a['forward_s'] * 1e6:.1f} us "
                         f"({estimates[-1]:.3f} of peak), backward/forward {ratio:.2f}")
        values.append(FittedValue("attention_efficiency", _geomean(estimates),
                                  cal.get("attention_efficiency"), True,
                                  f"{len(estimates)} causal flash-attention forwards"))
    if bench.elementwise:
        bw = float(gpu["memory_bandwidth_gbps"]) * 1e9
        estimates = [e["bytes"] / (e["seconds"] * bw) for e in bench.elementwise]
        values.append(FittedValue("memory_efficiency", min(_geomean(estimates), 1.0),
                                  cal.get("memory_efficiency"), True,
                                  f"{len(estimates)} element-wise adds"))
    return values, lines


def _geomean(xs: Iterable[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


# ----------------------------------------------------------------------------------------------
# The whole calibration, its file and its report


@dataclass
class CalibrationResult:
    """What :func:`run_calibration` measured and fitted, ready to write."""

    gpu: str
    logs: list[NcclLog]
    values: list[FittedValue]
    residuals: list[Residual]
    microbenchmarks: Microbenchmarks
    compute_lines: list[str] = field(default_factory=list)

    def overrides(self) -> dict[str, Any]:
        """The determined values as a calibration overrides table for :attr:`gpu`."""
        table: dict[str, Any] = {}
        for v in self.values:
            if not v.determined:
                continue
            if v.name.startswith("gemm_efficiency."):
                table.setdefault("gemm_efficiency", {})[v.name.split(".", 1)[1]] = round(v.value, 4)
            else:
                table[v.name] = round(v.value, 4)
        return {self.gpu: table}

    def toml_text(self) -> str:
        """The calibration file ``--calibration`` reads, each value with where it came from."""
        lines = [
            "# meshplan calibration written by `meshplan calibrate` (docs/calibration.md)",
            f"# from {len(self.logs)} nccl-tests runs"
            + (f" and GPU microbenchmarks on {self.microbenchmarks.device}"
               if self.microbenchmarks.skipped is None else
               f"; GPU microbenchmarks skipped: {self.microbenchmarks.skipped}"),
            f"[{_toml_key(self.gpu)}]",
        ]
        gemm: list[str] = []
        for v in self.values:
            if not v.determined:
                lines.append(f"# {v.name}: not determined by these measurements ({v.evidence})")
                continue
            note = f"  # {v.evidence}; preset {_shown(v.preset, v.name)}"
            if v.name.startswith("gemm_efficiency."):
                gemm.append(f"{v.name.split('.', 1)[1]} = {v.value:.4f}")
                lines.append(f"# gemm_efficiency.{v.name.split('.', 1)[1]}: {v.evidence}; "
                             f"preset {_shown(v.preset)}")
            else:
                lines.append(f"{v.name} = {v.value:.4f}{note}")
        if gemm:
            lines.append("gemm_efficiency = { " + ", ".join(gemm) + " }")
        return "\n".join(lines) + "\n"

    def summary(self) -> dict[str, Any]:
        errs = [abs(r.error) for r in self.residuals]
        before = [abs(r.preset_error) for r in self.residuals]
        return {
            "rows": len(self.residuals),
            "median_abs_error_fitted": statistics.median(errs) if errs else None,
            "median_abs_error_preset": statistics.median(before) if before else None,
            "max_abs_error_fitted": max(errs) if errs else None,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "logs": [log.to_dict() for log in self.logs],
            "values": [{"name": v.name, "value": v.value, "preset": v.preset,
                        "determined": v.determined, "elasticity": v.elasticity,
                        "evidence": v.evidence} for v in self.values],
            "overrides": self.overrides(),
            "summary": self.summary(),
            "microbenchmarks": {"skipped": self.microbenchmarks.skipped,
                                "device": self.microbenchmarks.device},
        }

    def report_markdown(self) -> str:
        """What was measured, the fitted values and the residuals."""
        s = self.summary()
        out = [f"# Calibration of `{self.gpu}`", "", "## What was measured", ""]
        out += ["| source | collective | ranks | hosts | rows | device |", "|---|---|---|---|---|---|"]
        out += [f"| {os.path.basename(log.source)} | {log.kind} | {log.ranks} | {log.nodes} | "
                f"{len(log.rows)} | {log.device or '-'} |" for log in self.logs]
        mb = self.microbenchmarks
        out += ["", "GPU microbenchmarks: " + (f"skipped ({mb.skipped})." if mb.skipped else
                                               f"run on {mb.device} at {mb.precision}.")]
        out += ["", "## Fitted values", "", "| constant | fitted | preset | determined | elasticity | from |",
                "|---|---|---|---|---|---|"]
        out += [f"| `{v.name}` | {v.value:.4g} | {_shown(v.preset, v.name)} | {'yes' if v.determined else 'no'}"
                f" | {v.elasticity:.2f} | {v.evidence} |" for v in self.values]
        if s["rows"]:
            out += ["", "## Residuals", "",
                    f"Model over measured time, {s['rows']} rows: median |error| "
                    f"{s['median_abs_error_preset']:.1%} with the preset's constants, "
                    f"{s['median_abs_error_fitted']:.1%} fitted (max {s['max_abs_error_fitted']:.1%}).",
                    "", "| source | collective | ranks/domain | bytes | measured µs | preset µs | "
                    "fitted µs | error | algorithm |", "|---|---|---|---|---|---|---|---|---|"]
            out += [f"| {os.path.basename(r.source)} | {r.kind} | {r.ranks}/{r.per_domain} | "
                    f"{r.size_bytes} | {r.measured_us:.1f} | {r.preset_us:.1f} | {r.fitted_us:.1f} | "
                    f"{r.error:+.1%} | {r.algorithm} |" for r in self.residuals]
        if self.compute_lines:
            out += ["", "## Microbenchmark rows", ""] + [f"- {line}" for line in self.compute_lines]
        return "\n".join(out) + "\n"


def _shown(v: Any, name: str = "") -> str:
    if v is None and name in _NCCL_STEP_US:
        return f"unset (NCCL's table: {_NCCL_STEP_US[name]:g})"
    return "unset" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


def _toml_key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else '"' + name.replace('"', '\\"') + '"'


def run_calibration(
    gpu: str,
    logs: Sequence[Union[str, "os.PathLike[str]"]] = (),
    kind: Optional[str] = None,
    ranks: Optional[int] = None,
    nodes: Optional[int] = None,
    ranks_per_domain: Optional[int] = None,
    model: Optional[str] = None,
    precision: str = "bf16",
    microbenchmarks: bool = True,
) -> CalibrationResult:
    """Fits ``gpu``'s (a preset name) calibration constants to the nccl-tests logs in ``logs``
    (files or directories) and, with ``microbenchmarks`` and a GPU visible to PyTorch, to GEMM,
    attention and element-wise timings of ``model`` (a preset name or config.json path).
    Raises :class:`InvalidInputError` naming the bad input."""
    gpu_dict = _core.gpu_preset(gpu)
    name = gpu_dict["name"]
    parsed = read_logs(logs, kind=kind, ranks=ranks, nodes=nodes) if logs else []
    fit = fit_collectives(gpu_dict, parsed, ranks_per_domain) if parsed else CollectiveFit([], [])
    if microbenchmarks:
        model_dict = None
        if model is not None:
            from .api import as_model

            model_dict = as_model(model).to_dict()
        bench = run_microbenchmarks(model_dict, precision=precision)
    else:
        bench = Microbenchmarks(skipped="not requested (--no-microbenchmarks)", precision=precision)
    compute, lines = fit_compute(gpu_dict, bench) if bench.skipped is None else ([], [])
    if not parsed and not compute:
        raise InvalidInputError(
            "invalid calibrate: nothing to fit (give nccl-tests logs, or run where PyTorch sees a "
            f"GPU; microbenchmarks: {bench.skipped})"
        )
    return CalibrationResult(name, parsed, fit.values + compute, fit.residuals, bench, lines)
