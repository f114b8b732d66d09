"""Model fields the cost model reads independently: the activation (gating) and dropout."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan.errors import InvalidInputError


def _model(**kw: object) -> mp.Model:
    base: dict[str, object] = dict(name="m", layers=4, hidden=1024, heads=8, kv_heads=8,
                                   ffn_hidden=4096, vocab=32000)
    base.update(kw)
    return mp.Model(**base)  # type: ignore[arg-type]


def _memory(model: mp.Model, plan: str = "dp=1,tp=1,pp=1,micro_batch=1") -> float:
    e = mp.evaluate(model, mp.Cluster("h100-sxm", 1), mp.Workload(1, 2048), plan)
    return float(e.memory_gib["activations"])


@pytest.mark.parametrize("gated,plain", [("swiglu", "silu"), ("geglu", "gelu"), ("reglu", "relu2")])
def test_gated_activations_have_three_ffn_matrices_and_plain_ones_two(gated: str, plain: str) -> None:
    g = mp.evaluate(_model(activation=gated), mp.Cluster("h100-sxm", 1), mp.Workload(1, 2048),
                    "dp=1,tp=1,pp=1,micro_batch=1")
    p = mp.evaluate(_model(activation=plain), mp.Cluster("h100-sxm", 1), mp.Workload(1, 2048),
                    "dp=1,tp=1,pp=1,micro_batch=1")
    # One h×f matrix per layer fewer: 4 layers · 1024 · 4096 parameters, 2 bytes each.
    weights = g.memory_gib["weights"] - p.memory_gib["weights"]
    assert weights == pytest.approx(4 * 1024 * 4096 * 2 / 2**30, rel=1e-6)
    assert g.step_time_s > p.step_time_s


def test_activation_is_independent_of_norm_and_tying() -> None:
    a = mp.evaluate(_model(activation="gelu"), mp.Cluster("h100-sxm", 1), mp.Workload(1, 2048),
                    "dp=1,tp=1,pp=1,micro_batch=1")
    b = mp.evaluate(_model(activation="gelu", norm="layernorm", tied_embeddings=True),
                    mp.Cluster("h100-sxm", 1), mp.Workload(1, 2048), "dp=1,tp=1,pp=1,micro_batch=1")
    # Same FFN; LayerNorm adds a bias per norm and tying drops the LM head: different weights.
    assert a.memory_gib["weights"] != b.memory_gib["weights"]
    assert a.memory_gib["activations"] == pytest.approx(b.memory_gib["activations"])


def test_an_unknown_activation_is_a_one_line_error() -> None:
    with pytest.raises(InvalidInputError) as e:
        mp.evaluate(_model(activation="tanhshrink"), mp.Cluster("h100-sxm", 1), mp.Workload(1, 2048),
                    "dp=1,tp=1,pp=1")
    text = str(e.value)
    assert "activation" in text and "\n" not in text


def test_dropout_masks_add_two_bytes_per_hidden_element_without_sp() -> None:
    on, off = _memory(_model(dropout=True)), _memory(_model(dropout=False))
    # 4 layers · 2048 tokens · 2 masks · 1024 · 1 byte.
    assert on - off == pytest.approx(4 * 2048 * 2 * 1024 / 2**30, rel=1e-6)
    assert mp.Model.from_dict(_model(dropout=True).to_dict()).dropout is True


def test_aliases_resolve_to_presets_of_the_same_dimensions() -> None:
    aliases = {a["name"]: a for a in mp.Model.aliases()}
    assert aliases["llama3.1-8b"]["preset"] == "llama3-8b"
    for name, a in aliases.items():
        m = mp.Model.preset(name)
        p = mp.Model.preset(a["preset"])
        assert m.name == name and a["why"]
        assert {**m.to_dict(), "name": ""} == {**p.to_dict(), "name": ""}
        assert name not in mp.Model.presets()


def test_cli_models_lists_the_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    from meshplan.cli import main
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "aliases" in out and "llama3.1-70b" in out and "llama3-70b" in out
