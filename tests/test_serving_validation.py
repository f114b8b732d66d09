"""``validation/serving.json`` and ``meshplan validate`` on it: every case carries its source
and locator and evaluates; the report gives throughput (and TTFT/TPOT where measured) error by
GPU and model kind."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from meshplan import _core
from meshplan.cli import main
from meshplan.hardware import Cluster
from meshplan.model import Model
from meshplan.serving import serving_problem
from meshplan.errors import InvalidCaseError
from meshplan.serving_validation import METRICS, is_serving_file, validate_serving

SERVING = Path(__file__).parent.parent / "validation" / "serving.json"


def test_every_case_is_sourced_and_exact() -> None:
    data = json.loads(SERVING.read_text())
    assert data["kind"] == "serving" and data["cases"]
    ids = [c["id"] for c in data["cases"]]
    assert len(ids) == len(set(ids))
    for c in data["cases"]:
        # a repository path at a pinned commit or tag, or a page's URL and section
        assert c["source"] and c["locator"] and ("@" in c["locator"] or c["locator"].startswith("https://")), c["id"]
        assert any(c["measured"].get(m) for m in METRICS), c["id"]
        assert set(c["measured"]) <= set(METRICS), c["id"]
        t = c["traffic"]
        assert t["input_len"] >= 1 and t["output_len"] >= 1, c["id"]
        if c["measured"].get("tpot_s") or c["measured"].get("e2e_s"):
            # a latency is only comparable at a stated load: a closed loop's concurrency or an
            # open loop's request rate
            assert t.get("concurrency") or t.get("request_rate"), c["id"]
            assert t.get("arrival") in (None, "spread", "waves", "poisson"), c["id"]
        def gpus(w: dict) -> int:
            return int(w["tp"]) * w.get("pp", 1) * w.get("attention_dp", 1)

        used = gpus(c["plan"]) * c["plan"].get("replicas", 1)
        if "prefill" in c["plan"]:  # a disaggregated deployment: its prefill pool too
            used += gpus(c["plan"]["prefill"]) * c["plan"].get("prefill_replicas", 1)
        assert used == c["num_gpus"], c["id"]
    for engine in data["engines"].values():
        assert engine["source"]


def test_the_report_summarises_by_gpu_and_kind() -> None:
    text = SERVING.read_text()
    assert is_serving_file(text) and not is_serving_file("[]")
    report = validate_serving(text)
    assert len(report.rows) == len(json.loads(text)["cases"])
    s = report.summary
    for metric in METRICS:
        measured = [r for r in report.rows if r["measured"][metric] is not None]
        assert s["all"][metric]["n"] == len(measured), metric
        assert sum(g[metric]["n"] for g in s["by_gpu"].values()) == len(measured), metric
        assert sum(a[metric]["n"] for a in s["by_arch"].values()) == len(measured), metric
        assert sum(e[metric]["n"] for e in s["by_engine"].values()) == len(measured), metric
    # the set holds every metric, dense and MoE cases
    assert all(s["all"][metric]["n"] > 0 for metric in METRICS)
    assert set(s["by_gpu"]) == {r["gpu"] for r in report.rows}
    assert {"dense", "moe"} <= set(s["by_arch"])
    for r in report.rows:
        assert r["batch"] >= 1 and r["predicted"]["output_tokens_per_s"] > 0
        for metric in METRICS:
            m, p = r["measured"][metric], r["predicted"][metric]
            if m is None:
                assert r["ape"][metric] is None
            else:
                assert p > 0 and r["ape"][metric] == pytest.approx(abs(p - m) / m)


SERVING_TOML = Path(__file__).parent.parent / "rust" / "meshplan-core" / "data" / "serving.toml"


def test_the_cases_a_constant_was_fitted_on_are_kept_out_of_the_quoted_figure() -> None:
    # Every serving constant fitted on validation cases (its data-file comment says FITTED) names
    # them, and only those; the summary's out_of_sample block leaves them out.
    raw = SERVING_TOML.read_text()
    constants = tomllib.loads(raw)
    fitted_in_toml = {line.split("=")[0].strip() for line in raw.splitlines()
                      if "=" in line and "FITTED" in line.split("#", 1)[-1]}
    assert fitted_in_toml == {"moe_block_fp8_gemm_efficiency"}
    text = SERVING.read_text()
    cases = json.loads(text)["cases"]
    named = {c["id"]: c["in_sample_for"] for c in cases if c.get("in_sample_for")}
    assert {n for names in named.values() for n in names} == fitted_in_toml
    assert all(n in constants for names in named.values() for n in names)
    # the four vLLM 0.7.4 rows the constant's comment says it was fitted on
    assert sorted(named) == sorted(f"dstack-deepseek-r1-vllm-h200-sxm-tp8-fp8-c{k}-3200-800" for k in (4, 8, 16, 32))
    report = validate_serving(text)
    held = report.summary["out_of_sample"]
    assert held["cases"] == len(cases) - len(named)
    for metric in METRICS:
        outside = [r for r in report.rows if r["id"] not in named and r["ape"][metric] is not None]
        assert held["all"][metric]["n"] == len(outside)
        assert held["all"][metric]["median_ape"] == _core.percentile([r["ape"][metric] for r in outside], 0.5)
    assert held["by_gpu"]["h200-sxm"]["ttft_s"]["n"] == report.summary["by_gpu"]["h200-sxm"]["ttft_s"]["n"] - 4
    bad = json.loads(text)
    bad["cases"][0]["in_sample_for"] = "moe_block_fp8_gemm_efficiency"
    with pytest.raises(InvalidCaseError, match=r"in_sample_for = 'moe_block_fp8_gemm_efficiency'; expected a list"):
        validate_serving(json.dumps(bad))


def test_meshplan_validate_reads_the_serving_file() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["validate", str(SERVING), "--worst", "3"])
    assert code == 0
    text = out.getvalue()
    assert "serving cases" in text and "gpu h100-sxm" in text and "largest throughput errors" in text
    assert "largest TTFT errors" in text and "largest TPOT errors" in text and "arch moe" in text
    assert "out of sample: the 211 cases no constant was fitted on" in text


def test_a_malformed_serving_file_is_an_invalid_case() -> None:
    with pytest.raises(InvalidCaseError):
        validate_serving('{"kind": "serving", "cases": [{"id": "x"}]}')
    with pytest.raises(InvalidCaseError):
        validate_serving('{"kind": "serving"}')


def test_a_case_may_give_a_length_distribution_and_its_field_errors_name_it() -> None:
    case = {"id": "mix", "model": "llama3-8b", "gpu": "h100-sxm", "num_gpus": 1, "plan": {"tp": 1},
            "traffic": {"lengths": [{"input_len": 128, "output_len": 64, "weight": 3},
                                    {"input_len": 2048, "output_len": 512}], "concurrency": 8},
            "measured": {"tpot_s": 0.01}}
    row = validate_serving(json.dumps({"kind": "serving", "cases": [case]})).rows[0]
    problem = serving_problem(Model.preset("llama3-8b"), Cluster("h100-sxm", 1), concurrency=8,
                              lengths=[(128, 64, 3), (2048, 512)])
    worker = {"tp": 1, "pp": 1, "attention_dp": 1, "ep": 1, "expert_tp": 1, "max_sequences": row["batch"]}
    ev = _core.evaluate_serving(problem, {"worker": worker, "replicas": 1})
    assert row["predicted"]["tpot_s"] == pytest.approx(ev["time"]["tpot_s"])
    case["traffic"]["input_len"] = 128
    with pytest.raises(InvalidCaseError, match=r"^serving case 0 \(mix\): invalid traffic\.input_len: 128 "):
        validate_serving(json.dumps({"kind": "serving", "cases": [case]}))


@pytest.mark.parametrize("bad", ["\"fast\"", "-0.5", "0", "true", "[1]"])
def test_a_measurement_that_is_not_a_positive_number_is_named(bad: str) -> None:
    case = {"id": "x", "model": "llama3-8b", "gpu": "h100-sxm", "num_gpus": 1, "plan": {"tp": 1},
            "traffic": {"input_len": 128, "output_len": 128, "concurrency": 8}, "measured": {"tpot_s": None}}
    text = json.dumps({"kind": "serving", "cases": [case]}).replace('"tpot_s": null', f'"tpot_s": {bad}')
    with pytest.raises(InvalidCaseError, match=r"measured\.tpot_s"):
        validate_serving(text)


def test_fewer_requests_than_attention_dp_ranks_count_only_the_requests() -> None:
    def case(concurrency: int) -> dict:
        return {"id": f"c{concurrency}", "model": "deepseek-v3", "gpu": "h200-sxm", "num_gpus": 8,
                "weight_precision": "fp8", "kv_precision": "fp8", "plan": {"tp": 1, "attention_dp": 8},
                "traffic": {"input_len": 1024, "output_len": 256, "concurrency": concurrency},
                "measured": {"tpot_s": 0.05}}

    rows = validate_serving(json.dumps({"kind": "serving", "cases": [case(4), case(8)]})).rows
    assert rows[0]["batch"] == rows[1]["batch"] == 8
    # the same deployment of 8 slots, evaluated directly: the core runs the 4 requests there are
    # (its share of the concurrency), and the prediction is that evaluation's, not scaled again
    problem = serving_problem(Model.preset("deepseek-v3"), Cluster("h200-sxm", 8), input_len=1024, output_len=256,
                              weight_precision="fp8", kv_precision="fp8", concurrency=4)
    worker = {"tp": 1, "pp": 1, "attention_dp": 8, "ep": 1, "expert_tp": 8, "max_sequences": 8}
    ev = _core.evaluate_serving(problem, {"worker": worker, "replicas": 1})
    assert ev["sequences_per_worker"] == 4
    assert rows[0]["predicted"]["tpot_s"] == pytest.approx(ev["time"]["tpot_s"])
    assert rows[0]["predicted"]["output_tokens_per_s"] == pytest.approx(ev["output_tokens_per_s"])
    # with as many requests as ranks, all of them count
    assert rows[1]["predicted"]["output_tokens_per_s"] * rows[1]["predicted"]["tpot_s"] > \
        rows[0]["predicted"]["output_tokens_per_s"] * rows[0]["predicted"]["tpot_s"]


def test_the_summaries_use_the_cores_percentile() -> None:
    from meshplan import _core
    from meshplan.errors import InvalidInputError

    assert _core.percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert _core.percentile([1.0, 2.0, 3.0, 4.0], 0.9) == pytest.approx(3.7)
    assert _core.percentile([], 0.5) is None
    with pytest.raises(InvalidInputError, match="q"):
        _core.percentile([1.0], 2.0)


def _derivation(name: str) -> Any:
    """The module of ``benchmarks/<name>.py``, a constant's derivation from its source run."""
    path = Path(__file__).parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def test_the_triton_mla_rate_is_what_its_source_run_gives() -> None:
    # data/serving.toml's triton_mla_attention_efficiency comes from sglang PR 3550's saturated
    # run (benchmarks/serving_triton_mla_rate.py): the constant must stay what that run gives
    # under this model's other terms, and re-time the run to its measured duration.
    module = _derivation("serving_triton_mla_rate")
    d = module.derive()
    assert len(d.chunks) == 146 and d.measured_s == pytest.approx(349.7, abs=0.05)
    data = Path(__file__).parent.parent / "rust" / "meshplan-core" / "data" / "serving.toml"
    shipped = tomllib.loads(data.read_text())["triton_mla_attention_efficiency"]
    low, high = d.efficiency(module.DECODE_TAIL_S[0]), d.efficiency(module.DECODE_TAIL_S[1])
    assert low < high and low - 0.001 <= shipped <= high + 0.001, (low, shipped, high)
    # The compiled model at that constant re-times the run (prefill chunks at the Triton rate).
    assert d.modelled_s == pytest.approx(d.measured_s, rel=0.01)


def test_the_mxfp4_hopper_rate_is_what_its_source_run_gives() -> None:
    # data/serving.toml's mxfp4_upcast_moe_bandwidth_fraction comes from the LMSYS gpt-oss blog's
    # H100 batch-32 decode rate (benchmarks/serving_mxfp4_hopper_rate.py): the constant must stay
    # what that run gives under this model's other terms, and the published runs it was not
    # derived from must stay within their stated distance of the model.
    module = _derivation("serving_mxfp4_hopper_rate")
    d = module.derive()
    assert module.bar_tok_s(1024) == pytest.approx(4791, abs=1)
    assert d.fraction == pytest.approx(module.shipped(), abs=0.005), (d.fraction, module.shipped())
    assert d.modelled_step_s == pytest.approx(d.measured_step_s, rel=0.01)
    # Its GEMM rate in prefill: both H100 prefill bars at the shipped constant and the fixed time
    # they imply together.
    p = module.derive_prefill()
    assert p.efficiency == pytest.approx(module.shipped("mxfp4_upcast_moe_gemm_efficiency"), abs=0.01)
    assert 0.0 < p.fixed_s < 0.2, p.fixed_s
    for n, measured in p.measured_s.items():
        assert p.modelled_s[n] == pytest.approx(measured, rel=0.02), n
    # The checks quoted beside the constant: the 8k bar, vLLM's bench latency and issue 30326.
    for name, (modelled, measured) in {**d.checks, **d.others}.items():
        bound = 0.2 if "batch 1" in name or "concurrency 8 " in name else 0.05
        assert abs(modelled / measured - 1) < bound, (name, modelled, measured)


def test_a_disaggregated_case_is_scored_with_its_prefill_pool() -> None:
    data = json.loads(SERVING.read_text())
    pd = [c for c in data["cases"] if "prefill" in c["plan"]]
    assert pd and all(c["engine"] == "sglang" and c.get("expert_weights") == "mxfp4" for c in pd)
    case = dict(pd[0])
    one = {"kind": "serving", "engines": data["engines"], "cases": [case]}
    row = validate_serving(json.dumps(one)).rows[0]
    # The same case aggregated on its decode workers alone is another deployment: a
    # different first token.
    plain = dict(case, plan={k: v for k, v in case["plan"].items() if k not in ("prefill", "prefill_replicas")},
                 num_gpus=case["num_gpus"] - 2 * case["plan"]["prefill_replicas"])
    other = validate_serving(json.dumps(dict(one, cases=[plain]))).rows[0]
    assert row["predicted"]["ttft_s"] != other["predicted"]["ttft_s"]
    bad = dict(case, plan=dict(case["plan"], prefill={"tp": 2}))
    with pytest.raises(InvalidCaseError, match=r"plan.prefill: missing or bad 'max_sequences'"):
        validate_serving(json.dumps(dict(one, cases=[bad])))


def test_the_decode_gemm_constants_are_what_the_measured_kernel_tables_give() -> None:
    # data/serving.toml's gemm_fixed_us, gemm_bandwidth_fraction and their quantized twins come
    # from NVIDIA's measured GEMM tables in aiconfigurator (benchmarks/serving_decode_gemm_rate.py):
    # the medians of the committed per-GPU, per-engine fits, re-fitted from the tables where
    # aiconfigurator is installed.
    module = _derivation("serving_decode_gemm_rate")
    derived = module.derive()
    for fmt, prefix in (("bfloat16", ""), ("fp8", "quantized_")):
        t0, share = derived[fmt]
        assert module.shipped(f"{prefix}gemm_fixed_us") == pytest.approx(t0, abs=0.05), fmt
        assert module.shipped(f"{prefix}gemm_bandwidth_fraction") == pytest.approx(share, abs=0.005), fmt
    assert derived["fp8"][0] > 2.0 * derived["bfloat16"][0]
    assert len(module.CELLS) == 26
    fresh = module.refit()
    if fresh is None:
        return
    for key, (t0, bandwidth) in module.CELLS.items():
        assert fresh[key][0] == pytest.approx(t0, abs=0.1), key
        assert fresh[key][1] == pytest.approx(bandwidth, abs=0.01), key
