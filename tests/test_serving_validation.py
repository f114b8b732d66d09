"""``validation/serving.json`` and ``meshplan validate`` on it: every case carries its source
and locator and evaluates; the report gives throughput (and TTFT/TPOT where measured) error by
GPU and model kind."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from meshplan.cli import main
from meshplan.errors import InvalidCaseError
from meshplan.serving_validation import METRICS, is_serving_file, validate_serving

SERVING = Path(__file__).parent.parent / "validation" / "serving.json"


def test_every_case_is_sourced_and_exact() -> None:
    data = json.loads(SERVING.read_text())
    assert data["kind"] == "serving" and data["cases"]
    ids = [c["id"] for c in data["cases"]]
    assert len(ids) == len(set(ids))
    for c in data["cases"]:
        assert c["source"] and c["locator"] and "@" in c["locator"], c["id"]
        assert any(c["measured"].get(m) for m in METRICS), c["id"]
        assert c["plan"]["tp"] * c["plan"].get("pp", 1) * c["plan"].get("attention_dp", 1) \
            * c["plan"].get("replicas", 1) == c["num_gpus"], c["id"]
    for engine in data["engines"].values():
        assert engine["source"]


def test_the_report_summarises_by_gpu_and_kind() -> None:
    text = SERVING.read_text()
    assert is_serving_file(text) and not is_serving_file("[]")
    report = validate_serving(text)
    assert len(report.rows) == len(json.loads(text)["cases"])
    s = report.summary
    assert s["all"]["output_tokens_per_s"]["n"] == len(report.rows)
    assert set(s["by_gpu"]) == {r["gpu"] for r in report.rows}
    assert "dense" in s["by_arch"]
    for r in report.rows:
        assert r["batch"] >= 1 and r["predicted"]["output_tokens_per_s"] > 0
        m, p = r["measured"]["output_tokens_per_s"], r["predicted"]["output_tokens_per_s"]
        assert r["ape"]["output_tokens_per_s"] == pytest.approx(abs(p - m) / m)


def test_meshplan_validate_reads_the_serving_file() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["validate", str(SERVING), "--worst", "3"])
    assert code == 0
    text = out.getvalue()
    assert "serving cases" in text and "gpu h100-sxm" in text and "largest throughput errors" in text


def test_a_malformed_serving_file_is_an_invalid_case() -> None:
    with pytest.raises(InvalidCaseError):
        validate_serving('{"kind": "serving", "cases": [{"id": "x"}]}')
    with pytest.raises(InvalidCaseError):
        validate_serving('{"kind": "serving"}')
