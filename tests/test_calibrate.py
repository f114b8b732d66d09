"""``meshplan calibrate``: parsing real published nccl-tests logs, fitting synthetic logs made
from known constants (the fit must recover them), the GPU microbenchmark path on synthetic
timings, the skip without PyTorch, and ``search --calibration`` with the written file."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path
from typing import Any

import pytest

import meshplan as mp
from meshplan import _core
from meshplan import calibrate as cal
from meshplan.cli import main
from meshplan.errors import InvalidInputError

FIXTURES = Path(__file__).parent / "fixtures" / "nccl-tests"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------------
# Parsing real logs


def test_real_logs_parse_with_their_ranks_hosts_and_rows() -> None:
    logs = {Path(log.source).name: log for log in cal.read_logs([FIXTURES])}
    assert sorted(logs) == [
        "h100-2node-all_reduce_perf.txt", "mi300x-1node-all_reduce_perf.txt",
        "mi300x-2node-all_reduce_perf.txt", "mi355x-2node-all_reduce_perf.txt",
    ]
    one = logs["mi300x-1node-all_reduce_perf.txt"]
    assert (one.kind, one.ranks, one.nodes, len(one.rows)) == ("all_reduce", 8, 1, 31)
    assert one.device == "AMD Instinct MI300X"
    assert one.rows[0] == cal.NcclRow(8, 2, "float", 19.28, 0.0, 17.24)
    assert one.rows[-1].size_bytes == 8589934592 and one.rows[-1].time_us == 47617.0
    assert one.rows[-1].busbw_gbps == 315.69
    # Legacy device lines (no Group column) and RCCL's version lines before the table.
    two = logs["mi300x-2node-all_reduce_perf.txt"]
    assert (two.ranks, two.nodes, two.ranks_per_node, len(two.rows)) == (16, 2, 8, 32)
    assert two.rows[-1].size_bytes == 17179869184 and two.rows[-1].time_us == 90115.0
    h100 = logs["h100-2node-all_reduce_perf.txt"]
    assert (h100.ranks, h100.nodes, len(h100.rows)) == (16, 2, 31)
    assert h100.device == "NVIDIA H100 80GB HBM3"
    assert h100.rows[28].time_us == 12646.0  # printed without decimals
    # No `# nThread` header and device lines without a device name; a `# Testing` line.
    mi355 = logs["mi355x-2node-all_reduce_perf.txt"]
    assert (mi355.ranks, mi355.nodes, len(mi355.rows), mi355.device) == (16, 2, 31, "")


def test_the_mi355x_network_efficiency_is_this_logs_fit() -> None:
    """The `mi355x` preset's network_bus_efficiency is `meshplan calibrate` on the published
    2 x 8 MI355X log (its provenance says so)."""
    logs = cal.read_logs([FIXTURES / "mi355x-2node-all_reduce_perf.txt"])
    fit = cal.fit_collectives(_core.gpu_preset("mi355x"), logs)
    values = {v.name: v for v in fit.values}
    assert values["network_bus_efficiency"].determined
    assert values["network_bus_efficiency"].value == pytest.approx(
        mp.Gpu.preset("mi355x").calibration["network_bus_efficiency"], abs=0.01)
    origin = mp.hardware.provenance("mi355x")["constants"]["network_bus_efficiency"]
    assert origin["kind"] == "measured"


def test_real_logs_fit_the_published_mi300x_bus_efficiency() -> None:
    """The 8 x MI300X log measures 315 GB/s busbw on 448 GB/s of xGMI: the fit lands at the
    preset's 0.70 (itself from STAS' 313 GB/s), with a smaller RMS log error over the rows than
    the preset's constants."""
    logs = cal.read_logs([FIXTURES / "mi300x-1node-all_reduce_perf.txt"])
    fit = cal.fit_collectives(_core.gpu_preset("mi300x"), logs)
    values = {v.name: v for v in fit.values}
    assert values["scaleup_bus_efficiency"].determined
    assert values["scaleup_bus_efficiency"].value == pytest.approx(0.71, abs=0.02)
    assert "nvls_efficiency" not in values  # xGMI has no switch
    def rms(ratios: list[float]) -> float:
        return math.sqrt(sum(math.log(r) ** 2 for r in ratios) / len(ratios))

    before = rms([r.preset_us / r.measured_us for r in fit.residuals])
    after = rms([r.fitted_us / r.measured_us for r in fit.residuals])
    assert after < before and after < 0.2


def test_mpi_prefixes_several_runs_and_legacy_columns() -> None:
    text = "\n".join([
        "[1,0]<stdout>:# Collective test starting: all_gather_perf_mpi",
        "[1,0]<stdout>:# nThread 1 nGpus 1 minBytes 1048576 maxBytes 2097152 step: 2(factor)",
        "[1,0]<stdout>:#  Rank  0 Group  0 Pid 11 on lab device  0 [0000:02:00] NVIDIA GeForce RTX 5090",
        "[1,0]<stdout>:#  Rank  1 Group  0 Pid 12 on lab device  1 [0000:03:00] NVIDIA GeForce RTX 5090",
        "[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
        "[1,0]<stdout>:     1048576        131072     float    none      -1    40.00   26.21   13.11      0    39.00   26.89   13.44      0",
        "[1,0]<stdout>:     2097152        262144     float    none      -1    70.00   29.96   14.98    N/A    69.00   30.39   15.20    N/A",
        "# Out of bounds values : 0 OK",
        # An older nccl-tests: no root column, an `error` column, another host layout.
        "# nThread 1 nGpus 1 minBytes 1310720000 maxBytes 1310720000 step: 1048576(bytes)",
        "#   Rank  0 Pid   1320 on ip-172-31-20-228 device  0 [0x00] Tesla V100-SXM2-16GB",
        "#   Rank  1 Pid   2066 on ip-172-31-22-230 device  0 [0x00] Tesla V100-SXM2-16GB",
        "#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error",
        "  1310720000     327680000     float     sum   1088441    1.20    1.20  0e+00  1088101    1.20    1.20  0e+00",
    ])
    runs = cal.parse_nccl_tests(text, "mixed.log", kind=None)
    assert [(r.kind, r.ranks, r.nodes, len(r.rows)) for r in runs] == [
        ("all_gather", 2, 1, 2), ("all_gather", 2, 2, 1),
    ]
    assert runs[0].rows[1].time_us == 70.0 and runs[0].rows[1].in_place_time_us == 69.0
    assert runs[1].rows[0].time_us == 1088441.0
    # The second run has no `Collective test starting` line of its own: --kind decides.
    assert cal.parse_nccl_tests(text, "x", kind="all_reduce")[1].kind == "all_reduce"


def test_bad_logs_are_one_line_errors_naming_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InvalidInputError, match="no result table"):
        cal.parse_nccl_tests("hello\n", "notes.txt")
    table = (FIXTURES / "mi300x-1node-all_reduce_perf.txt").read_text()
    with pytest.raises(InvalidInputError, match="which collective"):
        cal.parse_nccl_tests(table, "run.log")
    no_devices = "\n".join(line for line in table.splitlines() if "Rank" not in line)
    with pytest.raises(InvalidInputError, match="--ranks"):
        cal.parse_nccl_tests(no_devices, "all_reduce.log")
    runs = cal.parse_nccl_tests(no_devices, "all_reduce.log", ranks=8, nodes=1)
    assert runs[0].ranks == 8
    with pytest.raises(InvalidInputError, match="invalid ranks"):
        cal.parse_nccl_tests(table, "all_reduce.log", ranks=2**32)
    with pytest.raises(InvalidInputError, match="invalid kind"):
        cal.parse_nccl_tests(table, "x", kind="broadcast")
    with pytest.raises(InvalidInputError, match="existing file"):
        cal.read_logs([tmp_path / "absent"])
    logs = cal.parse_nccl_tests(table, "all_reduce.log")
    with pytest.raises(InvalidInputError, match="at most 10"):
        monkeypatch.setattr(cal, "MAX_ROWS", 10)
        cal.fit_collectives(_core.gpu_preset("mi300x"), logs)
    h100 = _core.gpu_preset("h100-sxm")
    for size in (0, 2**32, 2**64, -1):
        with pytest.raises(InvalidInputError,
                           match=r"^invalid collective.group_size: .* \(allowed: 1..=1048576\)$"):
            _core.collective_times(h100, [
                {"kind": "all_reduce", "bytes": 1.0, "group_size": size, "per_domain": 1}])
    with pytest.raises(InvalidInputError, match="invalid collective.per_domain: 9"):
        _core.collective_times(h100, [
            {"kind": "all_reduce", "bytes": 1.0, "group_size": 8, "per_domain": 9}])


# ---------------------------------------------------------------------------------------------
# Synthetic logs from known constants


def synthetic_log(gpu: dict[str, Any], kind: str, ranks: int, nodes: int, noise: float,
                  seed: int) -> str:
    """An nccl-tests log of ``kind`` whose times are meshplan's own model on ``gpu``, each
    scaled by a deterministic ``1 ± noise`` wobble."""
    sizes = [2**i for i in range(3, 34, 2)]
    priced = _core.collective_times(gpu, [
        {"kind": kind, "bytes": float(s), "group_size": ranks, "per_domain": ranks // nodes}
        for s in sizes])
    binary = {"all_to_all": "alltoall"}.get(kind, kind) + "_perf"
    lines = [
        f"# Collective test starting: {binary}",
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20",
        "#", "# Using devices",
    ]
    for r in range(ranks):
        lines.append(f"#  Rank {r:2d} Group  0 Pid {1000 + r} on node-{r // (ranks // nodes)} "
                     f"device {r % (ranks // nodes)} [0x1b] NVIDIA H100 80GB HBM3")
    lines += [
        "#                                                              out-of-place                       in-place",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
    ]
    for i, (size, p) in enumerate(zip(sizes, priced)):
        t = p["total_s"] * 1e6 * (1.0 + noise * math.sin(seed + 1.7 * i))
        algbw = size / t / 1e3
        lines.append(f"{size:12d} {size // 4:13d}     float     sum      -1 {t:8.2f} {algbw:7.2f} "
                     f"{algbw:7.2f}      0 {t:8.2f} {algbw:7.2f} {algbw:7.2f}      0")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.0", ""]
    return "\n".join(lines)


TRUTH = {
    "scaleup_bus_efficiency": 0.68,
    "scaleup_latency_us": 5.5,
    "nvls_efficiency": 0.78,
    "network_bus_efficiency": 0.62,
    "network_latency_us": 21.0,
}


def write_synthetic_logs(directory: Path, noise: float = 0.01) -> None:
    gpu = _core.gpu_preset("h100-sxm")
    gpu["calibration"] = {**gpu["calibration"], **TRUTH}
    for seed, kind in enumerate(("all_reduce", "all_gather", "reduce_scatter", "all_to_all")):
        for ranks, nodes in ((8, 1), (32, 4)):
            text = synthetic_log(gpu, kind, ranks, nodes, noise, seed)
            (directory / f"{kind}_{ranks}x{nodes}.txt").write_text(text)


def test_the_fit_recovers_the_constants_that_made_the_logs(tmp_path: Path) -> None:
    write_synthetic_logs(tmp_path)
    result = cal.run_calibration("h100-sxm", [tmp_path], microbenchmarks=False)
    assert len(result.logs) == 8
    got = {v.name: v for v in result.values}
    assert set(got) == set(TRUTH)
    for name, want in TRUTH.items():
        assert got[name].determined, name
        assert got[name].value == pytest.approx(want, rel=0.02), name
    s = result.summary()
    assert s["median_abs_error_fitted"] < 0.015 < s["median_abs_error_preset"]
    assert result.overrides()["h100-sxm"]["network_bus_efficiency"] == pytest.approx(0.62, rel=0.04)


def test_without_small_messages_the_latency_is_reported_not_determined(tmp_path: Path) -> None:
    gpu = _core.gpu_preset("a100-sxm-80g")
    text = synthetic_log(gpu, "all_gather", 8, 1, 0.0, 0)
    big = "\n".join(line for line in text.splitlines()
                    if line.startswith("#") or int(line.split()[0]) >= 2**27)
    logs = cal.parse_nccl_tests(big, "all_gather_perf.txt")
    fit = cal.fit_collectives(gpu, logs)
    values = {v.name: v for v in fit.values}
    assert values["scaleup_bus_efficiency"].determined
    assert values["scaleup_bus_efficiency"].value == pytest.approx(0.80, rel=0.01)
    assert not values["scaleup_latency_us"].determined
    result = cal.CalibrationResult("a100-sxm-80g", logs, fit.values, fit.residuals,
                                   cal.Microbenchmarks(skipped="not requested"))
    assert "scaleup_latency_us" not in result.overrides()["a100-sxm-80g"]
    assert "# scaleup_latency_us: not determined" in result.toml_text()


def test_cli_writes_the_file_search_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_synthetic_logs(tmp_path)
    out, report = tmp_path / "cluster.toml", tmp_path / "cluster.md"
    code, stdout, err = run(capsys, "calibrate", str(tmp_path), "--gpu", "h100-sxm",
                            "--out", str(out), "--report", str(report), "--no-microbenchmarks")
    assert code == 0, err
    assert "wrote" in err and stdout == ""
    text = out.read_text()
    assert text.startswith("# meshplan calibration") and "[h100-sxm]" in text
    md = report.read_text()
    assert "## Residuals" in md and "all_to_all" in md and "network_bus_efficiency" in md

    problem = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch",
               "256", "--seq-len", "8192", "--plan", "dp=64,tp=1,pp=1,zero=1"]
    code, preset_out, err = run(capsys, "evaluate", *problem, "--json")
    assert code == 0, err
    code, fitted_out, err = run(capsys, "evaluate", *problem, "--json", "--calibration", str(out))
    assert code == 0, err
    preset, fitted = json.loads(preset_out), json.loads(fitted_out)
    # The fitted network is slower (0.62 of the NIC rate against the preset's 0.80): the same
    # plan's data-parallel time grows.
    assert _dp_seconds(fitted) > _dp_seconds(preset)
    code, searched, err = run(capsys, "search", *problem[:-2], "--calibration", str(out),
                              "--top-k", "3", "--json")
    assert code == 0, err
    assert json.loads(searched)["plans"]

    cluster = mp.calibrated(mp.Cluster("h100-sxm", 64), str(out))
    assert isinstance(cluster.gpu, mp.Gpu)
    assert cluster.gpu.calibration["network_latency_us"] == pytest.approx(21.0, rel=0.04)


def _dp_seconds(evaluation: dict[str, Any]) -> float:
    return float(evaluation["time_s"]["dp"])


def test_cli_bad_input_is_exit_2_with_one_line(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "calibrate", str(tmp_path / "nope"), "--gpu", "h100-sxm")
    assert code == 2 and err.count("\n") == 1 and "nope" in err
    code, _, err = run(capsys, "calibrate", str(FIXTURES), "--gpu", "h999")
    assert code == 2 and err.count("\n") == 1 and "h999" in err
    code, _, err = run(capsys, "calibrate", "--gpu", "h100-sxm", "--no-microbenchmarks")
    assert code == 2 and "nothing to fit" in err


# ---------------------------------------------------------------------------------------------
# GPU microbenchmarks: skipped without PyTorch/CUDA, fitted on synthetic timings


def test_microbenchmarks_are_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_torch() -> Any:
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(cal, "_torch", no_torch)
    assert cal.torch_unavailable() == "PyTorch is not installed"
    bench = cal.run_microbenchmarks(None)
    assert bench.skipped == "PyTorch is not installed" and not bench.gemm

    cpu_only = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setattr(cal, "_torch", lambda: cpu_only)
    assert cal.torch_unavailable() == "PyTorch sees no CUDA/ROCm GPU"

    code, _, err = run(capsys, "calibrate", str(FIXTURES / "mi300x-1node-all_reduce_perf.txt"),
                       "--gpu", "mi300x", "--out", str(tmp_path / "c.toml"))
    assert code == 0
    assert "GPU microbenchmarks skipped: PyTorch sees no CUDA/ROCm GPU" in err
    assert "GPU microbenchmarks skipped: PyTorch sees no CUDA/ROCm GPU" in (tmp_path / "c.toml").read_text()


def test_compute_constants_are_recovered_from_synthetic_timings() -> None:
    gpu = _core.gpu_preset("h100-sxm")
    model = mp.Model.preset("mixtral-8x7b").to_dict()
    shapes = cal.model_gemm_shapes(model, 8192)
    truth = dict(gpu)
    truth["calibration"] = {**gpu["calibration"],
                            "gemm_efficiency": {**gpu["calibration"]["gemm_efficiency"], "bf16": 0.66}}
    times = _core.gemm_times(truth, "bf16", [list(s) for s in shapes])
    grouped = cal.model_grouped_shape(model, 8192)
    assert grouped is not None
    g, m, n, k = grouped
    peak = gpu["peak_tflops"]["bf16"] * 1e12
    attention = []
    # Synthetic kernels at the model's rate for their call length (0.42 at the reference length).
    factors = _core.attention_length_factors([2048.0, 8192.0])
    assert factors[0] < 1.0 < factors[1]
    for seq, f in zip((2048, 8192), factors):
        batch, heads, d = 8192 // seq, 32, 128
        flops = batch * seq * 2.0 * heads * 2 * d * seq / 2.0
        rate = 0.42 * f * peak
        attention.append({"batch": batch, "seq": seq, "heads": heads, "head_dim": d,
                          "forward_s": flops / rate, "backward_s": 2.5 * flops / rate})
    bw = gpu["memory_bandwidth_gbps"] * 1e9
    bench = cal.Microbenchmarks(
        device="synthetic", precision="bf16",
        gemm=[{"m": a, "n": b, "k": c, "seconds": t} for (a, b, c), t in zip(shapes, times)],
        grouped_gemm=[{"groups": g, "m": m, "n": n, "k": k,
                       "seconds": g * _core.gemm_times(truth, "bf16", [[m, n, k]])[0]}],
        attention=attention,
        elementwise=[{"bytes": 3 * 2**29, "seconds": 3 * 2**29 / (0.86 * bw)}],
    )
    values, lines = cal.fit_compute(gpu, bench)
    got = {v.name: v.value for v in values}
    assert got["gemm_efficiency.bf16"] == pytest.approx(0.66, rel=0.01)
    assert got["attention_efficiency"] == pytest.approx(0.42, rel=1e-9)
    assert got["memory_efficiency"] == pytest.approx(0.86, rel=1e-9)
    assert any(line.startswith("grouped GEMM") and "(+0.0%)" in line for line in lines)
    result = cal.CalibrationResult("h100-sxm", [], values, [], bench, lines)
    text = result.toml_text()
    assert "gemm_efficiency = { bf16 = 0.66" in text
    parsed = mp.calibrated(mp.Cluster("h100-sxm", 8), json.loads(json.dumps(result.overrides())))
    assert isinstance(parsed.gpu, mp.Gpu)
    assert parsed.gpu.calibration["attention_efficiency"] == pytest.approx(0.42)


class _FakeTensor:
    """Shape-only stand-in for a CUDA tensor: enough of its surface for the microbenchmarks."""

    def __init__(self, *shape: int) -> None:
        self.shape = shape

    def __matmul__(self, other: "_FakeTensor") -> "_FakeTensor":
        return _FakeTensor(*self.shape[:-1], other.shape[-1])

    def element_size(self) -> int:
        return 2

    def backward(self, grad: "_FakeTensor") -> None:
        assert grad.shape == self.shape


class _FakeEvent:
    clock_ms = 0.0

    def __init__(self, enable_timing: bool) -> None:
        assert enable_timing
        self.at = 0.0

    def record(self) -> None:
        _FakeEvent.clock_ms += 0.5
        self.at = _FakeEvent.clock_ms

    def elapsed_time(self, other: "_FakeEvent") -> float:
        return other.at - self.at


def _fake_torch() -> Any:
    """A PyTorch look-alike that "sees" one GPU: every kernel takes 0.5 ms."""
    def randn(*shape: int, **_: Any) -> _FakeTensor:
        return _FakeTensor(*shape)

    def sdpa(q: _FakeTensor, k: _FakeTensor, v: _FakeTensor, is_causal: bool) -> _FakeTensor:
        assert is_causal and q.shape == k.shape == v.shape
        return _FakeTensor(*q.shape)

    cuda = types.SimpleNamespace(
        is_available=lambda: True, get_device_name=lambda i: "Fake GPU", Event=_FakeEvent,
        synchronize=lambda: None, empty_cache=lambda: None,
    )
    return types.SimpleNamespace(
        cuda=cuda, bfloat16="bf16", float16="fp16", device=lambda name: name, randn=randn,
        randn_like=lambda t, **_: _FakeTensor(*t.shape), empty=lambda n, **_: _FakeTensor(n),
        bmm=lambda a, b: _FakeTensor(a.shape[0], a.shape[1], b.shape[2]),
        add=lambda x, y, out: out,
        nn=types.SimpleNamespace(functional=types.SimpleNamespace(scaled_dot_product_attention=sdpa)),
    )


def test_microbenchmarks_run_every_kernel_and_feed_the_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The microbenchmark code path end to end on a shape-only PyTorch stand-in (no GPU here):
    the model's four linear GEMMs, its experts' grouped GEMM, two attention shapes and the
    element-wise add are timed, and the fit turns them into the three constants."""
    monkeypatch.setattr(cal, "_torch", _fake_torch)
    model = mp.Model.preset("mixtral-8x7b").to_dict()
    bench = cal.run_microbenchmarks(model, precision="bf16", tokens=4096, repeats=3)
    assert bench.skipped is None and bench.device == "Fake GPU"
    assert [(g["m"], g["n"], g["k"]) for g in bench.gemm] == cal.model_gemm_shapes(model, 4096)
    assert all(g["seconds"] == pytest.approx(5e-4) for g in bench.gemm)
    assert len(bench.grouped_gemm) == 1 and bench.grouped_gemm[0]["groups"] == 8
    assert [a["seq"] for a in bench.attention] == [2048, 8192]
    assert bench.elementwise[0]["bytes"] == 3.0 * 2 * (1 << 28)
    values, lines = cal.fit_compute(_core.gpu_preset("h100-sxm"), bench)
    assert {v.name for v in values} == {"gemm_efficiency.bf16", "attention_efficiency",
                                         "memory_efficiency"}
    assert any(line.startswith("grouped GEMM 8 x") for line in lines)
    assert cal.run_microbenchmarks(model, precision="fp8").skipped.startswith("precision fp8")


def test_cli_json_lists_logs_values_and_the_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "calibrate", str(FIXTURES / "mi300x-1node-all_reduce_perf.txt"),
                         "--gpu", "mi300x", "--no-microbenchmarks", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["logs"][0]["ranks"] == 8 and doc["microbenchmarks"]["skipped"].startswith("not requested")
    fitted = {v["name"]: v for v in doc["values"]}
    assert doc["overrides"]["mi300x"]["scaleup_bus_efficiency"] == round(
        fitted["scaleup_bus_efficiency"]["value"], 4)
    assert doc["summary"]["rows"] == 31


def test_ranks_per_domain_follow_the_preset_or_the_flag() -> None:
    log = cal.NcclLog("x", "all_reduce", ranks=16, nodes=4, rows=())
    # HGX: the NVLink domain is the host (4 ranks of this log per host).
    assert cal.per_domain_of(log, _core.gpu_preset("h100-sxm"), None) == 4
    # NVL72: a rack of 72 holds every rank of a 4-host job.
    assert cal.per_domain_of(log, _core.gpu_preset("gb200-nvl72"), None) == 16
    assert cal.per_domain_of(log, _core.gpu_preset("gb200-nvl72"), 8) == 8
    with pytest.raises(InvalidInputError, match="invalid ranks_per_domain: 0"):
        cal.per_domain_of(log, _core.gpu_preset("h100-sxm"), 0)
