"""The ``meshplan`` command, in-process through ``main(argv)`` and once through its entry point."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HF_CONFIGS

import meshplan as mp
from meshplan.cli import main

PROBLEM = ["--model", "llama2-7b", "--gpu", "a100-sxm-40g", "--gpus", "8",
           "--global-batch", "64", "--seq-len", "4096"]
SMALL = ["--max-micro-batch", "2", "--recompute", "none,full", "--zero", "0,1,3",
         "--schedules", "1f1b"]
PLAN_KEYS = {"rank", "dp", "tp", "pp", "ep", "cp", "vpp", "micro_batch", "zero", "recompute",
             "sequence_parallel", "schedule", "step_time_s", "tokens_per_s_per_gpu", "mfu",
             "peak_memory_gib", "memory_gib", "time_s"}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_models_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "models")
    assert code == 0
    for name in ["llama3-70b", "deepseek-v3", "gpt3-175b"]:
        assert name in out
    code, out, _ = run(capsys, "models", "--json")
    assert code == 0
    assert [m["name"] for m in json.loads(out)] == mp.Model.presets()


def test_gpus_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "gpus")
    assert code == 0 and "h100-sxm" in out and "mi300x" in out
    header, _, *rows = out.splitlines()
    at = header.index("host GB/s")  # the host link per GPU: PCIe or NVLink-C2C
    host = {r.split()[0]: r[at:].split()[0] for r in rows}
    assert host["gb200-nvl72"] == "225" and host["h100-sxm"] == "64" and host["a100-sxm-80g"] == "32"
    code, out, _ = run(capsys, "gpus", "--json")
    gpus = json.loads(out)
    assert [g["name"] for g in gpus] == mp.Gpu.presets()
    assert all("calibration" in g for g in gpus)


def test_stacks_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "stacks")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[2:] if line.strip() and "source" not in line}
    assert set(rows) == {"megatron-core", "torchtitan", "deepspeed", "maxtext"}
    assert "0,2,3 / 1" in rows["torchtitan"]  # FSDP2 is ZeRO-1 under pipelining only
    code, out, _ = run(capsys, "stacks", "--json")
    stacks = {s["name"]: s for s in json.loads(out)}
    assert stacks["deepspeed"]["overlap_grad_reduce"] is False
    assert stacks["megatron-core"]["ddp_bucket_params_per_rank"] == 1e6


def test_search_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "search", *PROBLEM, *SMALL, "--top-k", "5")
    assert code == 0 and err == ""
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("rank"))
    for column in ["dp", "tp", "pp", "ep", "cp", "vpp", "mb", "zero", "recompute", "sp",
                   "schedule", "step s", "tok/s/GPU", "MFU %", "mem GiB"]:
        assert column in header
    first = lines.index(header) + 2  # header, rule, then the plans
    assert [line.split()[0] for line in lines[first:first + 5]] == ["1", "2", "3", "4", "5"]
    assert any(line.startswith("candidates") for line in lines)
    assert any(line.startswith("feasible") for line in lines)
    assert any(line.startswith("elapsed") for line in lines)
    # Distinct plans by default: the last column says how many plans each row stands for.
    assert header.split()[-1] == "plans"
    sizes = [int(line.split()[-1]) for line in lines[first:first + 5]]
    assert all(n >= 1 for n in sizes)
    code, out, _ = run(capsys, "search", *PROBLEM, *SMALL, "--top-k", "5", "--ungrouped")
    header = next(line for line in out.splitlines() if line.startswith("rank"))
    assert code == 0 and header.split()[-1] != "plans"
    # Pruning reasons are listed largest first.
    pruned = lines[lines.index("pruned") + 1:]
    counts = [int(line.split()[-1].replace(",", "")) for line in pruned if line.strip()]
    assert counts and counts == sorted(counts, reverse=True)


def test_search_json_shape_matches_the_api(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "search", *PROBLEM, *SMALL, "--tp", "2", "--json")
    assert code == 0
    doc = json.loads(out)
    # `notes`: a100-sxm-40g's GEMM efficiency is derived from a100-sxm-80g's fit (hardware.py).
    assert set(doc) == {"plans", "stats", "notes"}
    assert "a100-sxm-40g has no runs of its own" in doc["notes"][0]
    assert doc["plans"]
    for i, plan in enumerate(doc["plans"], start=1):
        assert PLAN_KEYS <= set(plan)
        assert plan["rank"] == i and plan["tp"] == 2
        assert isinstance(plan["memory_gib"], dict) and isinstance(plan["time_s"], dict)
    assert {"candidates", "feasible", "pruned", "elapsed_s"} <= set(doc["stats"])
    assert all(isinstance(v, int) for v in doc["stats"]["pruned"].values())
    api = mp.search("llama2-7b", mp.Cluster("a100-sxm-40g", 8), mp.Workload(64, 4096),
                    mp.SearchSpace(tp=2, max_micro_batch=2, recompute=["none", "full"],
                                   zero=[0, 1, 3], schedules=["1f1b"]))
    assert [p["tokens_per_s_per_gpu"] for p in doc["plans"]] == [
        p.tokens_per_s_per_gpu for p in api.plans
    ]


def test_search_csv(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "search", *PROBLEM, *SMALL, "--top-k", "4", "--csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 4
    assert [r["rank"] for r in rows] == ["1", "2", "3", "4"]
    assert {"dp", "tp", "pp", "step_time_s", "mfu", "memory_gib.weights", "time_s.compute"} <= set(
        rows[0]
    )


def test_search_flags_reach_the_space(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "search", *PROBLEM, "--max-micro-batch", "2", "--zero", "3",
                       "--recompute", "full", "--sequence-parallel", "off", "--dp", "8",
                       "--json")
    assert code == 0
    plans = json.loads(out)["plans"]
    assert plans
    assert all(p["dp"] == 8 and p["zero"] == 3 and p["recompute"] == "full" for p in plans)
    assert all(not p["sequence_parallel"] and p["micro_batch"] <= 2 for p in plans)


def test_workload_flags_reach_the_core(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["evaluate", *PROBLEM, "--plan", "dp=8,tp=1,pp=1,zero=3", "--json"]
    base = json.loads(run(capsys, *argv)[1])
    lora = json.loads(run(capsys, *argv, "--lora")[1])
    qlora = json.loads(run(capsys, *argv, "--lora", "--lora-rank", "8", "--lora-targets", "q,v",
                           "--lora-base", "nf4")[1])
    assert qlora["memory_gib"]["weights"] < lora["memory_gib"]["weights"]
    assert qlora["memory_gib"]["optimizer"] < lora["memory_gib"]["optimizer"]
    unfused = json.loads(run(capsys, *argv, "--no-flash-attention")[1])
    eager_loss = json.loads(run(capsys, *argv, "--unfused-cross-entropy")[1])
    assert lora["memory_gib"]["optimizer"] < base["memory_gib"]["optimizer"]
    assert unfused["memory_gib"]["activations"] > base["memory_gib"]["activations"]
    assert eager_loss["memory_gib"]["transient"] > base["memory_gib"]["transient"]
    assert eager_loss["memory_gib"]["activations"] == base["memory_gib"]["activations"]


def test_search_with_nothing_feasible(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "search", "--model", "llama3-70b", "--gpu", "a100-sxm-40g",
                       "--gpus", "2", "--global-batch", "8", "--seq-len", "4096")
    assert code == 0
    assert "no feasible plan" in out and "memory" in out


def test_evaluate_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "evaluate", *PROBLEM, "--plan",
                       "dp=8,tp=1,pp=1,ep=1,cp=1,micro_batch=1,zero=3,recompute=none,vpp=1,"
                       "sequence_parallel=false", "--json")
    assert code == 0
    doc = json.loads(out)
    assert PLAN_KEYS | {"feasible", "reasons"} <= set(doc)
    assert doc["feasible"] is True and doc["reasons"] == [] and doc["zero"] == 3


def test_evaluate_infeasible_plan_shows_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["evaluate", "--model", "llama3-70b", "--gpu", "a100-sxm-40g", "--gpus", "8",
            "--global-batch", "64", "--seq-len", "4096", "--plan", "dp=8,tp=1,pp=1"]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert "feasible    NO" in out and "memory" in out
    code, out, _ = run(capsys, *argv, "--json")
    doc = json.loads(out)
    assert doc["feasible"] is False
    assert any(r["rule"] == "memory" for r in doc["reasons"])


def test_model_from_config_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "evaluate", "--model", str(HF_CONFIGS / "Mixtral-8x7B-v0.1.json"),
                       "--model-name", "mixtral-from-hf", "--gpu", "h100-sxm", "--gpus", "8",
                       "--global-batch", "64", "--seq-len", "4096", "--plan", "dp=1,tp=1,pp=1,ep=8")
    assert code == 0 and "mixtral-from-hf on 8 x h100-sxm" in out


@pytest.mark.parametrize(
    "argv, names",
    [
        (["search", *PROBLEM[2:], "--model", "gpt-5"], ["gpt-5", "llama3-70b"]),
        (["search", *PROBLEM[:2], "--gpu", "tpu", *PROBLEM[4:]], ["tpu"]),
        (["search", *PROBLEM[:-1], "many"], ["--seq-len", "many"]),
        (["search", *PROBLEM[2:]], ["--model"]),
        (["search", *PROBLEM, "--precision", "fp8"], ["workload.precision", "fp8"]),
        (["search", *PROBLEM, "--precision", "fp5"], ["workload.precision", "fp5"]),
        (["search", *PROBLEM, "--zero", "0,x"], ["--zero"]),
        (["search", *PROBLEM, "--recompute", "most"], ["space.recompute", "most"]),
        (["search", *PROBLEM, "--max-pp", "0"], ["space.pp.max"]),
        (["search", *PROBLEM, "--sequence-parallel", "maybe"], ["--sequence-parallel"]),
        (["search", *PROBLEM, "--threads", "0"], ["threads"]),
        (["search", *PROBLEM, "--json", "--csv"], ["--csv"]),
        (["evaluate", *PROBLEM, "--plan", "dp=4,tp=1,pp=1"], ["plan", "8"]),
        (["evaluate", *PROBLEM, "--plan", "dp=8,tp=1"], ["plan.pp"]),
        (["evaluate", *PROBLEM, "--plan", "dp=8 tp=1 pp=1"], ["plan.dp"]),
        (["evaluate", *PROBLEM], ["--plan"]),
        (["search", "--model", "missing/config.json", *PROBLEM[2:]], ["missing/config.json"]),
        (["search", *PROBLEM, "--gpus", "0"], ["cluster.num_gpus"]),
        (["frobnicate"], ["frobnicate"]),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], names: list[str]
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.startswith("meshplan: error: ") and err.count("\n") == 1, err
    for name in names:
        assert name in err, (name, err)


def test_bad_json_config_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{oops")
    code, _, err = run(capsys, "search", "--model", str(bad), *PROBLEM[2:])
    assert code == 2 and "JSON" in err and err.count("\n") == 1


def test_other_failures_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "search", *PROBLEM, "--max-candidates", "10")
    assert code == 1
    assert err.startswith("meshplan: error: search space too large") and err.count("\n") == 1


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0 and mp.__version__ in out
    code, out, _ = run(capsys, "search", "--help")
    assert code == 0 and "--max-candidates" in out


def _entry_point() -> str:
    here = Path(sys.executable).parent / "meshplan"
    found = str(here) if here.exists() else shutil.which("meshplan")
    assert found, "the `meshplan` entry point is not installed (pip install .)"
    return found


def test_entry_point_search_json_and_bad_input() -> None:
    exe = _entry_point()
    done = subprocess.run([exe, "search", *PROBLEM, *SMALL, "--top-k", "3", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert len(doc["plans"]) == 3 and doc["stats"]["candidates"] > 0
    bad = subprocess.run([exe, "evaluate", *PROBLEM, "--plan", "dp=3,tp=1,pp=1"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("meshplan: error: invalid plan") and bad.stderr.count("\n") == 1
    assert "Traceback" not in bad.stderr


# --- issue 9: the edges a new user finds ------------------------------------------------------

GPUS = str(mp._core.limits()["cluster.num_gpus"][1])
"""The largest GPU count (the core's limit), as the messages spell it."""


@pytest.mark.parametrize(
    "argv, message",
    [
        (["search", *PROBLEM[:4], "--gpus", "-8", *PROBLEM[6:]],
         f"invalid cluster.num_gpus: -8 (allowed: 1..={GPUS})"),
        (["search", *PROBLEM[:-1], "-5"], "invalid workload.seq_len: -5 (allowed: 1..="),
        (["evaluate", *PROBLEM, "--plan", "dp=-64,tp=1,pp=1"],
         f"invalid plan.dp: -64 (allowed: 1..={GPUS})"),
        (["search", *PROBLEM[:4], "--gpus", "4294967296", *PROBLEM[6:]],
         f"invalid cluster.num_gpus: 4294967296 (allowed: 1..={GPUS})"),
        (["search", *PROBLEM[:4], "--gpus", "4294967295", *PROBLEM[6:]],
         f"invalid cluster.num_gpus: 4294967295 (allowed: 1..={GPUS})"),
        (["search", *PROBLEM, "--tp", "18446744073709551615"],
         "invalid space.tp.fixed: 18446744073709551615 (allowed: 1..="),
        (["search", *PROBLEM, "--top-k", "-1"], "invalid space.top_k: -1 (allowed: 1..="),
        (["explain", *PROBLEM, "--plan", "dp=8,tp=1,pp=1,vpp=2147483648"],
         "invalid plan.vpp: 2147483648 (allowed: 1..="),
    ],
)
def test_out_of_range_numbers_get_the_limit_not_python_internals(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    began = time.monotonic()
    code, out, err = run(capsys, *argv)
    assert time.monotonic() - began < 1.0
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith(f"meshplan: error: {message}"), err
    for internal in ("OverflowError", "TypeError", "ValueError", "Traceback", "conversion"):
        assert internal not in err


def test_a_sweep_point_out_of_range_is_an_error_row(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "sweep", "--model", "llama2-7b", "--gpu", "a100-sxm-40g",
                       "--gpus", "8,-8", "--global-batch", "64", "--seq-len", "4096", "--json")
    assert code == 0
    ok, bad = json.loads(out)
    assert ok["status"] == "ok"
    assert bad["status"] == "error"
    assert bad["error"] == f"invalid cluster.num_gpus: -8 (allowed: 1..={GPUS})"


def test_no_arguments_print_usage_and_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys)
    assert code == 2 and out == ""
    assert err.startswith("usage: meshplan")
    for command in ("search", "evaluate", "explain", "export", "serve", "sweep", "validate",
                    "models", "gpus", "plot"):
        assert f"\n    {command} " in err, command


@pytest.mark.parametrize("argv, command", [
    (["serve", "--port", "0"], "serve"),
    (["search", *PROBLEM, "--server", "127.0.0.1:1"], "search --server"),
])
def test_a_missing_grpc_extra_names_the_pip_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str],
    command: str
) -> None:
    # As if grpcio were not installed: importing it fails (and the modules that need it are
    # imported afresh).
    monkeypatch.setitem(sys.modules, "grpc", None)
    for name in ("meshplan.server", "meshplan.client"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err == (f"meshplan: error: {command} needs the grpc extra (missing module grpc): "
                   "pip install 'meshplan[grpc]'\n")


def test_an_empty_search_names_the_constraint(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["search", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "512",
            "--global-batch", "1024", "--seq-len", "8192"]
    code, out, _ = run(capsys, *argv, "--tp", "3")
    assert code == 0
    assert ("no plan to consider: tp=3 does not divide the 512 GPUs "
            "(dp·tp·pp·ep·cp must equal the GPU count)") in out
    for extra, reason in [
        (["--ep", "2"], "ep=2 needs an MoE model (a dense model has ep = 1)"),
        (["--min-pp", "1000"], "no divisor of the 512 GPUs satisfies pp >= 1000"),
        (["--dp", "16", "--tp", "8", "--pp", "8"],
         "no dp·tp·pp·ep·cp = 512 satisfies dp=16, tp=8, pp=8 together"),
        (["--micro-batch", "2048"],
         "no micro-batch size satisfies micro_batch=2048 and is at most the global batch"),
        (["--pp", "1", "--schedules", "zb-h1"], "no schedule of zb-h1 applies"),
    ]:
        code, out, _ = run(capsys, *argv, *extra)
        assert code == 0 and f"no plan to consider: {reason}" in out, (extra, out)
        assert "candidates  0" in out


@pytest.mark.parametrize("name", ["config.json", "my-model.json"])
def test_a_config_that_is_not_json_is_reported_under_its_own_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    bad = tmp_path / name
    bad.write_text("not json")
    code, _, err = run(capsys, "search", "--model", str(bad), *PROBLEM[2:])
    assert code == 2
    assert err.startswith(f"meshplan: error: cannot import Hugging Face config {bad}: "
                          "not valid JSON"), err
    # A snapshot directory names the config.json inside it.
    (tmp_path / "snapshot").mkdir()
    (tmp_path / "snapshot" / "config.json").write_text("{")
    code, _, err = run(capsys, "search", "--model", str(tmp_path / "snapshot"), *PROBLEM[2:])
    assert code == 2 and f"{tmp_path / 'snapshot' / 'config.json'}: not valid JSON" in err


@pytest.mark.parametrize("timeout_s", [1.0, 2.0])
def test_timeout_s_returns_within_ten_percent(capsys: pytest.CaptureFixture[str],
                                              timeout_s: float) -> None:
    # A search of many seconds (DeepSeek-V3 on 2^20 GPUs, every knob open at the largest bounds:
    # about 20 s on an idle core with LTO; Llama 3.1 405B on as many takes under 2 s, which a
    # fast machine finishes inside the 2 s timeout); the clock starts with the command, so
    # parsing and building the inputs count too.
    argv = ["search", "--model", "deepseek-v3", "--gpu", "h100-sxm", "--gpus", "1048576",
            "--global-batch", "65536", "--seq-len", "4096", "--max-vpp", "4096",
            "--max-micro-batch", "4096", "--allow-tp-cross-domain", "--all-orders"]
    for extra in ([], ["--all", "--csv"]):
        began = time.monotonic()
        code, _, err = run(capsys, *argv, *extra, "--timeout-s", str(timeout_s))
        elapsed = time.monotonic() - began
        assert code == 1 and "deadline exceeded" in err, err
        assert elapsed < 1.1 * timeout_s, (extra, elapsed)
