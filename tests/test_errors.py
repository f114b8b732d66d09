"""Every error path: the right meshplan.errors class, and a message that names the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
from conftest import llama2_7b
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshplan as mp
from meshplan import _core
from meshplan.errors import (
    CancelledError,
    DeadlineExceededError,
    HfConfigError,
    InvalidInputError,
    MeshplanError,
    SpaceTooLargeError,
    UnknownPresetError,
)

CLUSTER = mp.Cluster("a100-sxm-80g", 8)
WORKLOAD = mp.Workload(64, 4096)
PLAN = {"dp": 8, "tp": 1, "pp": 1}


def problem(**parts: dict[str, Any]) -> dict[str, Any]:
    """The llama2-7b problem dict with some fields of ``model``/``cluster``/``workload`` replaced."""
    base = {"model": llama2_7b().to_dict(), "cluster": CLUSTER.to_dict(),
            "workload": WORKLOAD.to_dict()}
    for part, fields in parts.items():
        base[part] = {**base[part], **fields}
    return base


def raises(cls: type[Exception], *names: str) -> Callable[[Callable[[], object]], str]:
    """Runs a call that must raise ``cls`` with a one-line message containing ``names``."""

    def check(call: Callable[[], object]) -> str:
        with pytest.raises(cls) as info:
            call()
        message = str(info.value)
        assert "\n" not in message
        for name in names:
            assert name in message, (name, message)
        return message

    return check


def test_hierarchy() -> None:
    assert issubclass(InvalidInputError, ValueError)
    assert issubclass(UnknownPresetError, InvalidInputError)
    assert issubclass(HfConfigError, InvalidInputError)
    for cls in (mp.errors.DataFileError, SpaceTooLargeError, CancelledError,
                DeadlineExceededError, InvalidInputError):
        assert issubclass(cls, MeshplanError)
    assert not issubclass(SpaceTooLargeError, ValueError)


def test_unknown_presets_list_the_known_ones() -> None:
    msg = raises(UnknownPresetError, "nope", "llama3-70b")(lambda: mp.Model.preset("nope"))
    assert "model" in msg
    raises(UnknownPresetError, "h100-sxm")(lambda: mp.Gpu.preset("h1000"))
    raises(UnknownPresetError, "h1000")(lambda: mp.Cluster("h1000", 8).to_dict())


@pytest.mark.parametrize(
    "part, fields, names",
    [
        ("model", {"layers": 0}, ["model.layers", "0"]),
        ("model", {"kv_heads": 7}, ["model.kv_heads", "7"]),
        ("model", {"layers": -1}, ["model.layers"]),
        ("model", {"hidden": 1.5}, ["model.hidden"]),
        ("model", {"vocab": "lots"}, ["model.vocab"]),
        ("model", {"activation": "relu"}, ["model.activation", "relu"]),
        ("model", {"colour": "red"}, ["model.colour"]),
        ("model", {"moe": {"num_experts": 8, "top_k": 9, "expert_ffn_hidden": 512}},
         ["model.moe.top_k", "9"]),
        ("model", {"moe": {"num_experts": 8}}, ["model.moe.top_k"]),
        ("cluster", {"num_gpus": 0}, ["cluster.num_gpus"]),
        ("cluster", {"nvlink_domain": 0}, ["cluster.nvlink_domain"]),
        ("workload", {"global_batch": 0}, ["workload.global_batch"]),
        ("workload", {"seq_len": None}, ["workload.seq_len"]),
        ("workload", {"precision": "fp4"}, ["workload.precision", "fp4"]),
        ("workload", {"grad_bytes": 3}, ["workload.grad_bytes", "3"]),
        ("workload", {"optimizer": "lion"}, ["workload.optimizer", "lion"]),
    ],
)
def test_bad_field_values_name_the_field(part: str, fields: dict[str, Any], names: list[str]) -> None:
    raises(InvalidInputError, *names)(lambda: _core.evaluate(problem(**{part: fields}), PLAN))


def test_bad_gpu_field_names_the_field() -> None:
    gpu = {**_core.gpu_preset("a100-sxm-80g"), "memory_gib": -1.0}
    bad = problem(cluster={"gpu": gpu})
    raises(InvalidInputError, "gpu.memory_gib")(lambda: _core.evaluate(bad, PLAN))


def test_missing_field_is_named() -> None:
    p = problem()
    del p["model"]["layers"]
    raises(InvalidInputError, "model.layers")(lambda: _core.evaluate(p, PLAN))
    whole = problem()
    raises(InvalidInputError, "workload")(
        lambda: _core.evaluate({"model": whole["model"], "cluster": whole["cluster"]}, PLAN)
    )


def test_python_side_shape_errors_name_the_field() -> None:
    raises(InvalidInputError, "model.colour")(
        lambda: mp.Model.from_dict({**llama2_7b().to_dict(), "colour": 1})
    )
    raises(InvalidInputError, "model.hidden")(
        lambda: mp.Model.from_dict({"name": "x", "layers": 1})
    )
    raises(InvalidInputError, "space.colour")(lambda: mp.SearchSpace.from_dict({"colour": 1}))
    raises(InvalidInputError, "cluster")(
        lambda: mp.evaluate(llama2_7b(), 8, WORKLOAD, "dp=8,tp=1,pp=1")  # type: ignore[arg-type]
    )


def test_fp8_on_a100_names_precision_and_gpu() -> None:
    raises(InvalidInputError, "workload.precision", "fp8", "a100")(
        lambda: mp.evaluate(llama2_7b(), CLUSTER, mp.Workload(64, 4096, "fp8"), "dp=8,tp=1,pp=1")
    )


def test_wrong_plan_product() -> None:
    raises(InvalidInputError, "plan", "8")(
        lambda: mp.evaluate(llama2_7b(), CLUSTER, WORKLOAD, "dp=4,tp=1,pp=1")
    )


@pytest.mark.parametrize(
    "text, names",
    [
        ("dp=8,tp=1", ["plan.pp"]),
        ("dp=8;tp=1;pp=1", ["plan.dp", "8;tp=1;pp=1"]),
        ("dp=8,tp=1,=1", ["plan", "key=value"]),
        ("dp=8,tp,pp=1", ["plan", "'tp'"]),
        ("dp=eight,tp=1,pp=1", ["plan.dp", "eight"]),
        ("dp=8,tp=1,pp=1,colour=red", ["plan.colour"]),
        ("dp=8,tp=1,pp=1,dp=8", ["plan.dp", "twice"]),
        ("dp=8,tp=1,pp=1,sp=maybe", ["plan.sequence_parallel", "maybe"]),
        ("dp=8,tp=1,pp=1,zero=9", ["plan.zero", "9"]),
        ("dp=8,tp=1,pp=1,recompute=some", ["plan.recompute", "some"]),
        ("dp=8,tp=1,pp=1,schedule=gpipe", ["plan.schedule", "gpipe"]),
        ("dp=8,tp=1,pp=1,vpp=2,schedule=1f1b", ["plan.schedule"]),
        ("dp=8,tp=1,pp=1,schedule=interleaved-1f1b", ["plan.vpp"]),
        ("dp=8,tp=1,pp=1,dp=0", ["plan.dp"]),
        ("dp=-8,tp=-1,pp=1", ["plan.dp"]),
    ],
)
def test_bad_plan_text(text: str, names: list[str]) -> None:
    raises(InvalidInputError, *names)(lambda: mp.evaluate(llama2_7b(), CLUSTER, WORKLOAD, text))


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "config.json"
    raises(InvalidInputError, str(missing), "No such file")(lambda: mp.Model.from_hf_config(missing))
    raises(InvalidInputError, "config.json")(
        lambda: mp.evaluate(str(missing), CLUSTER, WORKLOAD, "dp=8,tp=1,pp=1")
    )
    # A directory stands for its config.json; a string with a separator is never a preset name.
    raises(InvalidInputError, "config.json")(lambda: mp.evaluate(tmp_path, CLUSTER, WORKLOAD, "dp=8,tp=1,pp=1"))
    raises(InvalidInputError, "models/llama")(
        lambda: mp.evaluate("models/llama", CLUSTER, WORKLOAD, "dp=8,tp=1,pp=1")
    )


def test_bad_json(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": ')
    raises(HfConfigError, "JSON")(lambda: mp.Model.from_hf_config(bad))
    raises(HfConfigError, "JSON")(lambda: mp.Model.from_hf_config("{not json"))


def test_hf_config_missing_field_and_unsupported_type() -> None:
    raises(HfConfigError, "num_hidden_layers")(
        lambda: mp.Model.from_hf_config({"model_type": "llama"})
    )
    raises(HfConfigError, "model_type", "bert")(
        lambda: mp.Model.from_hf_config({"model_type": "bert"})
    )


def test_bad_space_values_name_the_field() -> None:
    p = problem()
    raises(InvalidInputError, "space.zero", "5")(lambda: _core.search(p, {"zero": [5]}))
    raises(InvalidInputError, "space.zero")(lambda: _core.search(p, {"zero": []}))
    raises(InvalidInputError, "space.recompute[0]", "bogus")(
        lambda: _core.search(p, {"recompute": ["bogus"]})
    )
    raises(InvalidInputError, "space.tp.fixed")(lambda: _core.search(p, {"tp": {"fixed": 0}}))
    raises(InvalidInputError, "space.pp.min")(
        lambda: mp.search(llama2_7b(), CLUSTER, WORKLOAD, mp.SearchSpace(min_pp=4, max_pp=2))
    )
    raises(InvalidInputError, "space.top_k")(
        lambda: mp.search(llama2_7b(), CLUSTER, WORKLOAD, mp.SearchSpace(top_k=0))
    )
    raises(InvalidInputError, "space.memory_headroom_gib")(
        lambda: mp.search(llama2_7b(), CLUSTER, WORKLOAD,
                          mp.SearchSpace(memory_headroom_gib=float("nan")))
    )


def test_bad_search_controls() -> None:
    p = problem()
    raises(InvalidInputError, "threads")(lambda: _core.search(p, None, 0))
    raises(InvalidInputError, "threads")(lambda: _core.search(p, None, -2))
    raises(InvalidInputError, "timeout_s")(lambda: _core.search(p, None, None, -1.0))
    raises(InvalidInputError, "timeout_s")(lambda: _core.search(p, None, None, float("inf")))
    raises(InvalidInputError, "cancel")(lambda: _core.search(p, None, None, None, "stop"))


def test_space_too_large() -> None:
    raises(SpaceTooLargeError, "10")(
        lambda: mp.search(llama2_7b(), CLUSTER, WORKLOAD, mp.SearchSpace(max_candidates=10))
    )


def test_cancelled_search() -> None:
    token = mp.CancelToken()
    token.cancel()
    raises(CancelledError, "cancel")(
        lambda: mp.search(llama2_7b(), CLUSTER, WORKLOAD, cancel=token)
    )


def test_deadline_exceeded() -> None:
    raises(DeadlineExceededError, "deadline")(
        lambda: mp.search("llama3.1-405b", mp.Cluster("h100-sxm", 16384), mp.Workload(2048, 8192),
                          timeout_s=0.0)
    )


# --- generated bad inputs ------------------------------------------------------------------

ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=70_000),
    st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**32, 2**64, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.lists(st.integers(-1, 5), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(-1, 5), max_size=2),
)


def _check_only_meshplan_errors(call: Callable[[], object]) -> None:
    try:
        call()
    except MeshplanError as e:
        message = str(e)
        assert message and "\n" not in message
        assert not message.startswith("internal error"), message  # a panic in the core
    # Anything else propagates and fails the test.


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    part=st.sampled_from(["model", "cluster", "workload"]),
    key=st.sampled_from([
        "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab", "activation",
        "moe", "mla", "num_gpus", "gpus_per_node", "nvlink_domain", "global_batch", "seq_len",
        "precision", "grad_bytes", "optimizer", "extra",
    ]),
    value=ANY_VALUE,
)
def test_generated_bad_problem_fields(part: str, key: str, value: Any) -> None:
    _check_only_meshplan_errors(
        lambda: _core.evaluate(problem(**{part: {key: value}}), PLAN)
    )


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(
    st.sampled_from(["dp", "tp", "pp", "ep", "cp", "vpp", "micro_batch", "zero", "recompute",
                     "sequence_parallel", "schedule", "other"]),
    ANY_VALUE, max_size=6,
))
def test_generated_bad_plans(overrides: dict[str, Any]) -> None:
    _check_only_meshplan_errors(lambda: _core.evaluate(problem(), {**PLAN, **overrides}))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="dptepcvmbzro=,0123456789-_ ", max_size=40))
def test_generated_plan_text(text: str) -> None:
    _check_only_meshplan_errors(lambda: mp.evaluate(llama2_7b(), CLUSTER, WORKLOAD, text))


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=30), st.dictionaries(st.text(max_size=8), ANY_VALUE, max_size=5)))
def test_generated_hf_configs(config: Any) -> None:
    text = config if isinstance(config, str) else json.dumps(config)
    _check_only_meshplan_errors(lambda: _core.model_from_hf_config(text))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(
    st.sampled_from(["tp", "pp", "zero", "recompute", "top_k", "max_candidates",
                     "memory_headroom_gib", "sequence_parallel", "schedules", "other"]),
    ANY_VALUE, max_size=3,
))
def test_generated_bad_spaces(space: dict[str, Any]) -> None:
    # A tiny cluster keeps every generated search fast.
    p = problem(cluster={"num_gpus": 2})
    _check_only_meshplan_errors(lambda: _core.search(p, {**space, "max_candidates": 5000}))


def test_degrees_whose_product_overflows_are_rejected() -> None:
    # 24 · 2863311531 · (2^32 - 1)^2 is exactly 8 modulo 2^64: a wrapping product would take
    # this for an 8-GPU plan (and an unchecked one panics in debug builds).
    plan = {"dp": 24, "tp": 2**32 - 1, "pp": 2**32 - 1, "ep": 2863311531, "cp": 1}
    raises(InvalidInputError, "plan")(lambda: _core.evaluate(problem(), plan))


def test_a_value_with_a_newline_still_gives_a_one_line_message() -> None:
    # Found by the generated test above: serde quotes the bad value verbatim.
    with pytest.raises(InvalidInputError) as info:
        mp.evaluate("llama3-8b", mp.Cluster("h100-sxm", 8), mp.Workload(8, 4096, "\n"),
                    "dp=8,tp=1,pp=1")
    assert "\n" not in str(info.value) and "workload.precision" in str(info.value)
    assert "`\\n`" in str(info.value)
