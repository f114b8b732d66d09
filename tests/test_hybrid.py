"""Hybrid layer stacks from Python and the CLI: the descriptor's new fields (bad values as
one-line errors), a Nemotron-H config.json searched and explained, the gRPC shape."""

from __future__ import annotations

import json

import pytest
from conftest import HF_CONFIGS

import meshplan as mp
from meshplan.cli import main
from meshplan.errors import InvalidInputError

NEMOTRON_H = HF_CONFIGS / "Nemotron-H-56B-Base-8K.json"
PROBLEM = ["--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "768", "--seq-len", "8192"]


def _hybrid(**kw: object) -> dict[str, object]:
    d = mp.Model.preset("nemotron-h-8b").to_dict()
    d.update(kw)
    return d


@pytest.mark.parametrize("part, field", [
    ("mamba", "heads"), ("mamba", "head_dim"), ("mamba", "state"), ("mamba", "groups"),
    ("mamba", "conv_kernel"), ("mamba", "chunk"),
])
@pytest.mark.parametrize("value", [0, 2**31, 2**32, 2**64 - 1, -1])
def test_every_mamba_field_is_range_checked(part: str, field: str, value: int) -> None:
    d = _hybrid()
    sub = dict(d[part])  # type: ignore[call-overload]
    sub[field] = value
    d[part] = sub
    with pytest.raises(InvalidInputError) as e:
        mp.evaluate(mp.Model.from_dict(d), mp.Cluster("h100-sxm", 8), mp.Workload(8, 4096),
                    "dp=8,tp=1,pp=1")
    text = str(e.value)
    assert f"model.{part}.{field}" in text and str(value) in text and "\n" not in text
    assert "allowed" in text


@pytest.mark.parametrize("field", ["key_heads", "key_head_dim", "value_heads",
                                   "value_head_dim", "conv_kernel", "chunk"])
@pytest.mark.parametrize("value", [0, 2**31, 2**32, 2**64 - 1])
def test_every_linear_attention_field_is_range_checked(field: str, value: int) -> None:
    d = mp.Model.preset("qwen3-next-80b-a3b").to_dict()
    d["linear_attention"] = {**d["linear_attention"], field: value}
    with pytest.raises(InvalidInputError) as e:
        mp.evaluate(mp.Model.from_dict(d), mp.Cluster("h100-sxm", 64), mp.Workload(64, 4096),
                    "dp=8,tp=1,pp=1,ep=8")
    text = str(e.value)
    assert f"model.linear_attention.{field}" in text and str(value) in text
    assert "\n" not in text


@pytest.mark.parametrize("value", [0, 2**31, 2**32, 2**64 - 1])
def test_sliding_window_is_range_checked(value: int) -> None:
    d = mp.Model.preset("gpt-oss-120b").to_dict()
    d["sliding_window"] = value
    with pytest.raises(InvalidInputError) as e:
        mp.evaluate(mp.Model.from_dict(d), mp.Cluster("h100-sxm", 64), mp.Workload(64, 4096),
                    "dp=8,tp=1,pp=1,ep=8")
    assert "model.sliding_window" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("pattern, words", [
    ("M-M-X" + "M-" * 23 + "M*", ["model.layer_pattern", "'X'"]),
    ("M-M*", ["model.layer_pattern", "52 characters"]),
    ("", ["model.layer_pattern", "52 characters"]),
    ("M" * 52 + "-" * 10**6, ["model.layer_pattern", "52 characters"]),
])
def test_a_bad_pattern_is_a_one_line_error(pattern: str, words: list[str]) -> None:
    with pytest.raises(InvalidInputError) as e:
        mp.evaluate(mp.Model.from_dict(_hybrid(layer_pattern=pattern)), mp.Cluster("h100-sxm", 8),
                    mp.Workload(8, 4096), "dp=8,tp=1,pp=1")
    text = str(e.value)
    assert all(w in text for w in words), text
    assert "\n" not in text and len(text) < 400


def test_a_pattern_needs_its_parts() -> None:
    with pytest.raises(InvalidInputError, match="model.mamba"):
        mp.evaluate(mp.Model.from_dict(_hybrid(mamba=None)), mp.Cluster("h100-sxm", 8),
                    mp.Workload(8, 4096), "dp=8,tp=1,pp=1")
    with pytest.raises(InvalidInputError, match="model.layer_pattern"):
        mp.Model.from_dict(_hybrid(layer_pattern=52))


def test_uniform_models_keep_their_json_shape() -> None:
    d = mp.Model.preset("llama3-70b").to_dict()
    for key in ("layer_pattern", "mamba", "linear_attention", "sliding_window"):
        assert key not in d


def test_the_hybrid_descriptor_round_trips_over_the_wire() -> None:
    from meshplan.wire import _model_from_dims, dims_message

    for name in ("nemotron-h-56b", "nemotron-3-nano-30b-a3b", "qwen3-next-80b-a3b",
                 "gpt-oss-120b"):
        m = mp.Model.preset(name)
        assert _model_from_dims(dims_message(m)) == m


def test_cli_searches_a_nemotron_h_config_and_explains_the_split(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["search", "--model", str(NEMOTRON_H), *PROBLEM, "--top-k", "3", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    plans = json.loads(out)["plans"]
    assert plans and all(p["mfu"] > 0.1 for p in plans)
    best = plans[0]
    plan = ",".join(f"{k}={best[k]}" for k in ("dp", "tp", "pp", "ep", "cp", "vpp",
                                                "micro_batch", "zero", "recompute"))
    plan += f",sequence_parallel={str(best['sequence_parallel']).lower()}"
    code = main(["explain", "--model", str(NEMOTRON_H), *PROBLEM, "--plan", plan])
    text = capsys.readouterr().out
    assert code == 0
    assert "Mamba-2 layer splits its 256 SSM heads" in text
    if best["pp"] > 1:
        assert "layers split by cost" in text and "Mamba-2" in text


def test_gated_deltanet_refuses_context_parallelism() -> None:
    e = mp.evaluate("qwen3-next-80b-a3b", mp.Cluster("h100-sxm", 64), mp.Workload(64, 4096),
                    "dp=4,tp=1,pp=1,ep=8,cp=2")
    assert not e.feasible
    assert any(r.rule == "cp_mixer" and "DeltaNet" in r.message for r in e.reasons)


def test_serving_rejects_a_layer_pattern_in_one_line() -> None:
    with pytest.raises(InvalidInputError) as e:
        mp.search_serving("nemotron-h-8b", mp.Cluster("h100-sxm", 8), input_len=1024,
                          output_len=128)
    assert "model.layer_pattern" in str(e.value) and "\n" not in str(e.value)


def test_serving_takes_a_sliding_window_pattern() -> None:
    r = mp.search_serving("gpt-oss-120b", mp.Cluster("h100-sxm", 8), input_len=1024,
                          output_len=128)
    assert r.plans
