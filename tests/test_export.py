"""Exporters: every exported value checked against the plan, and clear errors for plans a
framework cannot run. torch is not needed: the device-mesh snippet is read with ``ast``."""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

import meshplan as mp
from meshplan.cli import main
from meshplan.errors import InvalidInputError
from meshplan.export import FORMATS

LLAMA70 = mp.Model.preset("llama3-70b")  # 80 layers
WORKLOAD = mp.Workload(global_batch=128, seq_len=8192)

PLANS = [
    "dp=2,tp=4,pp=4,cp=2,vpp=5,zero=1,sp=on",
    "dp=4,tp=8,pp=2,zero=0,recompute=full,micro_batch=2",
    "dp=8,tp=8,pp=1,zero=3,recompute=selective",
    "dp=2,tp=2,pp=2,ep=4,cp=2,zero=2,sp=on",
    "dp=16,tp=4,pp=1,zero=1,order=tp-cp-ep-pp-dp",
]


def megatron_flags(text: str) -> dict[str, Optional[str]]:
    flags: dict[str, Optional[str]] = {}
    for line in text.splitlines():
        line = line.rstrip(" \\")
        if line.startswith("--"):
            flag, _, value = line.partition(" ")
            assert flag not in flags, f"{flag} given twice"
            flags[flag] = value or None
    return flags


@pytest.mark.parametrize("text", PLANS)
def test_megatron_arguments_match_the_plan(text: str) -> None:
    plan = mp.Plan.parse(text)
    out = mp.export(plan, "megatron", model=LLAMA70, workload=WORKLOAD)
    flags = megatron_flags(out)
    assert flags["--tensor-model-parallel-size"] == str(plan.tp)
    assert flags["--pipeline-model-parallel-size"] == str(plan.pp)
    assert flags["--context-parallel-size"] == str(plan.cp)
    assert flags["--expert-model-parallel-size"] == str(plan.ep)
    assert ("--expert-tensor-parallel-size" in flags) == (plan.ep > 1)
    if plan.vpp > 1:
        assert flags["--num-layers-per-virtual-pipeline-stage"] == str(80 // (plan.pp * plan.vpp))
    else:
        assert not any("virtual" in f for f in flags)
    assert ("--sequence-parallel" in flags) == plan.sequence_parallel
    assert ("--use-distributed-optimizer" in flags) == (plan.zero >= 1)
    sharding = {2: "optim_grads", 3: "optim_grads_params"}.get(plan.zero)
    assert flags.get("--data-parallel-sharding-strategy") == sharding
    assert flags.get("--recompute-granularity") == (None if plan.recompute == "none" else plan.recompute)
    if plan.recompute == "full":
        assert flags["--recompute-method"] == "uniform" and flags["--recompute-num-layers"] == "1"
    assert flags["--micro-batch-size"] == str(plan.micro_batch)
    assert flags["--global-batch-size"] == "128" and flags["--seq-length"] == "8192"
    assert "--bf16" in flags
    assert ("--use-tp-pp-dp-mapping" in flags) == (plan.order == "tp-cp-ep-pp-dp")
    # Megatron's data-parallel size is dp·ep, implied by the world size: said in a comment.
    assert f"dp·ep = {plan.dp}·{plan.ep} = {plan.dp * plan.ep}" in out
    assert "--data-parallel-size" not in flags
    # One argument per line, continued: a shell can take the block as it is.
    arg_lines = [line for line in out.splitlines() if line.startswith("--")]
    assert all(line.endswith(" \\") for line in arg_lines[:-1]) and not arg_lines[-1].endswith("\\")


def test_megatron_without_the_model_gives_the_chunk_count() -> None:
    flags = megatron_flags(mp.export("dp=2,tp=4,pp=4,cp=2,vpp=5", "megatron"))
    assert flags["--virtual-pipeline-model-parallel-size"] == "5"
    assert "--global-batch-size" not in flags


@pytest.mark.parametrize("text, message", [
    ("dp=4,tp=4,pp=4,schedule=zb-h1", "zb-h1"),
    ("dp=16,tp=4,pp=1,order=dp-tp-cp-ep-pp", "rank order"),
    ("dp=16,tp=4,pp=1,recompute=selective-op", "op-level"),
])
def test_megatron_refuses_what_it_cannot_run(text: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        mp.export(text, "megatron", workload=WORKLOAD)


def torchtitan_config(text: str) -> tuple[dict[str, Any], str]:
    """(ParallelismConfig keyword arguments, LEGACY_TOML) of the torchtitan snippet."""
    tree = ast.parse(text)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "ParallelismConfig"]
    assert len(calls) == 1
    kwargs = {k.arg: ast.literal_eval(k.value) for k in calls[0].keywords if k.arg}
    toml = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                and isinstance(n.targets[0], ast.Name) and n.targets[0].id == "LEGACY_TOML")
    imports = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert imports[0].module == "torchtitan.config.parallelism"
    return kwargs, toml


@pytest.mark.parametrize("text", PLANS[:4])
def test_torchtitan_config_matches_the_plan(text: str) -> None:
    # torchtitan's selective checkpointing is the op-level policy, not Megatron's; under
    # pipelining its FSDP2 is ZeRO-1 (gradients synced on the last micro-batch only).
    plan = mp.Plan.parse(text.replace("recompute=selective", "recompute=selective-op"))
    if plan.pp > 1:
        plan = dataclasses.replace(plan, zero=1)
    kwargs, toml = torchtitan_config(mp.export(plan, "torchtitan", model=LLAMA70, workload=WORKLOAD))
    dp = plan.dp * plan.ep
    if plan.zero == 0:
        assert (kwargs["data_parallel_replicate_degree"], kwargs["data_parallel_shard_degree"]) == (dp, 1)
    else:
        assert (kwargs["data_parallel_replicate_degree"], kwargs["data_parallel_shard_degree"]) == (1, dp)
        assert kwargs["fsdp_reshard_after_forward"] == {1: "default", 2: "never", 3: "always"}[plan.zero]
    assert kwargs["tensor_parallel_degree"] == plan.tp
    assert kwargs.get("enable_sequence_parallel", False) == plan.sequence_parallel
    assert kwargs["pipeline_parallel_degree"] == plan.pp
    if plan.pp > 1:
        assert kwargs["pipeline_parallel_schedule"] == ("Interleaved1F1B" if plan.vpp > 1 else "1F1B")
        assert kwargs["num_pp_microbatches"] == 128 // (plan.micro_batch * dp)
    if plan.vpp > 1:
        assert kwargs["pipeline_parallel_layers_per_stage"] == 80 // (plan.pp * plan.vpp)
    assert kwargs["context_parallel_degree"] == plan.cp
    assert kwargs["expert_parallel_degree"] == plan.ep
    # The product of the degrees is the world size (EP is carved out of the shard dimension).
    world = (kwargs["data_parallel_replicate_degree"] * kwargs["data_parallel_shard_degree"]
             * plan.tp * plan.pp * plan.cp)
    assert world == plan.num_gpus

    if sys.version_info >= (3, 11):
        import tomllib

        doc = tomllib.loads(toml)
        par = doc["parallelism"]
        for key in ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "tensor_parallel_degree", "pipeline_parallel_degree",
                    "context_parallel_degree", "expert_parallel_degree"):
            assert par[key] == kwargs[key], key
        if plan.pp > 1:
            assert par["pipeline_parallel_microbatch_size"] == plan.micro_batch
        if plan.ep > 1:
            assert par["expert_tensor_parallel_degree"] == plan.tp
        ac = doc["activation_checkpoint"]
        if plan.recompute == "selective-op":
            assert (ac["mode"], ac["selective_ac_option"]) == ("selective", "op")
        else:
            assert ac["mode"] == plan.recompute and "selective_ac_option" not in ac
        assert doc["training"]["global_batch_size"] == 128
        # With a pipeline the local batch is the data rank's whole batch; without, it is one
        # micro-batch and torchtitan accumulates gradients up to the global batch.
        assert doc["training"]["local_batch_size"] == (128 // dp if plan.pp > 1 else plan.micro_batch)
        assert doc["training"]["seq_len"] == 8192
    assert mp.export(plan, "torchtitan-toml", model=LLAMA70, workload=WORKLOAD) == toml


@pytest.mark.parametrize("text, message", [
    ("dp=4,tp=4,pp=4,zero=1,schedule=zb-h1", "ZBVZeroBubble"),
    ("dp=2,tp=2,pp=2,ep=4,cp=2,zero=0", "zero >= 1"),
    ("dp=16,tp=4,pp=1,order=tp-cp-ep-pp-dp", "rank order"),
    ("dp=16,tp=4,pp=1,recompute=selective", "core-attention"),
    ("dp=16,tp=4,pp=2,zero=3", "use zero 1"),
    ("dp=16,tp=4,pp=1,zero=1", "no ZeRO-1"),
    ("dp=16,tp=4,pp=1,zero=0", "DDP"),
])
def test_torchtitan_refuses_what_it_cannot_run(text: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        mp.export(text, "torchtitan", workload=WORKLOAD)


@pytest.mark.parametrize("text", [
    "dp=8,tp=1,pp=1,zero=3,micro_batch=2",
    "dp=64,tp=1,pp=1,zero=2",
    "dp=16,tp=1,pp=4,zero=1,recompute=full",
    "dp=32,tp=1,pp=2,zero=0,micro_batch=4",
])
def test_deepspeed_config_matches_the_plan(text: str) -> None:
    plan = mp.Plan.parse(text)
    config = json.loads(mp.export(plan, "deepspeed", workload=WORKLOAD))
    assert config["zero_optimization"]["stage"] == plan.zero
    assert config["train_micro_batch_size_per_gpu"] == plan.micro_batch
    assert config["train_batch_size"] == 128
    # DeepSpeed's identity: train batch = micro-batch · accumulation · data-parallel world.
    assert config["gradient_accumulation_steps"] * plan.micro_batch * plan.dp == 128
    assert config["bf16"] == {"enabled": True}
    assert config["communication_data_type"] == "fp32"  # 4-byte gradient reduction
    assert ("activation_checkpointing" in config) == (plan.recompute == "full")


@pytest.mark.parametrize("text, message", [
    ("dp=8,tp=8,pp=1", "tp = 8"),
    ("dp=16,tp=1,pp=1,ep=4", "ep = 4"),
    ("dp=32,tp=1,pp=1,cp=2", "cp = 2"),
    ("dp=16,tp=1,pp=4,zero=2", "pp = 4 with ZeRO-2"),
    ("dp=16,tp=1,pp=4,vpp=2", "vpp = 2"),
    ("dp=64,tp=1,pp=1,recompute=selective-op", "selective-op"),
])
def test_deepspeed_refuses_what_it_cannot_run(text: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=f"cannot export to deepspeed: .*{message}"):
        mp.export(text, "deepspeed", workload=WORKLOAD)


def test_deepspeed_needs_the_workload_and_16_bit_training() -> None:
    with pytest.raises(InvalidInputError, match="workload"):
        mp.export("dp=64,tp=1,pp=1", "deepspeed")
    with pytest.raises(InvalidInputError, match="fp8"):
        mp.export("dp=64,tp=1,pp=1", "deepspeed", workload=mp.Workload(128, 8192, "fp8"))


def mesh_call(text: str) -> tuple[tuple[int, ...], tuple[str, ...], str]:
    tree = ast.parse(text)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "init_device_mesh"]
    assert len(calls) == 1
    call = calls[0]
    device = ast.literal_eval(call.args[0])
    sizes = ast.literal_eval(call.args[1])
    names = next(ast.literal_eval(k.value) for k in call.keywords if k.arg == "mesh_dim_names")
    imports = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert [(i.module, [a.name for a in i.names]) for i in imports] == [
        ("torch.distributed.device_mesh", ["init_device_mesh"])
    ]
    return sizes, names, device


@pytest.mark.parametrize("text", PLANS + ["dp=8,tp=2,pp=1,order=dp-tp-cp-ep-pp"])
def test_device_mesh_snippet_names_the_right_dims(text: str) -> None:
    plan = mp.Plan.parse(text)
    snippet = mp.export(plan, "device-mesh")
    sizes, names, device = mesh_call(snippet)
    assert device == "cuda"
    # Outermost first: the reverse of the rank order.
    assert names == tuple(reversed(plan.order.split("-")))
    assert sizes == tuple(getattr(plan, n) for n in names)
    prod = 1
    for s in sizes:
        prod *= s
    assert prod == plan.num_gpus
    # Every slice names dims of the mesh, in mesh order.
    tree = ast.parse(snippet)
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "mesh":
            key = ast.literal_eval(node.slice)
            dims = (key,) if isinstance(key, str) else key
            assert all(d in names for d in dims)
            assert list(dims) == sorted(dims, key=names.index)


def test_unknown_format_and_bad_plans() -> None:
    with pytest.raises(InvalidInputError, match="format"):
        mp.export("dp=8,tp=1,pp=1", "nemo")
    with pytest.raises(InvalidInputError, match="plan.order"):
        mp.export("dp=8,tp=1,pp=1,order=tp-dp", "device-mesh")
    with pytest.raises(InvalidInputError, match="vpp"):
        mp.export("dp=8,tp=1,pp=2,vpp=2,schedule=1f1b", "megatron")
    assert set(FORMATS) == {"megatron", "torchtitan", "torchtitan-toml", "deepspeed", "maxtext",
                            "device-mesh"}


PROBLEM = ["--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64",
           "--global-batch", "128", "--seq-len", "8192"]


def test_cli_export_to_stdout_and_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plan = "dp=2,tp=8,pp=4,vpp=5,zero=1"
    assert main(["export", *PROBLEM, "--plan", plan, "--format", "megatron"]) == 0
    out = capsys.readouterr().out
    assert megatron_flags(out)["--num-layers-per-virtual-pipeline-stage"] == "4"
    target = tmp_path / "mesh.py"
    code = main(["export", *PROBLEM, "--plan", plan, "--format", "device-mesh", "--out", str(target)])
    assert code == 0
    sizes, names, _ = mesh_call(target.read_text())
    assert (sizes, names) == ((4, 2, 1, 1, 8), ("pp", "dp", "ep", "cp", "tp"))


def test_cli_export_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", *PROBLEM, "--plan", "dp=8,tp=8,pp=1", "--format", "deepspeed"]) == 2
    assert "cannot export to deepspeed" in capsys.readouterr().err
    assert main(["export", *PROBLEM, "--plan", "dp=8,tp=8,pp=1", "--format", "nemo"]) == 2
    assert main(["export", *PROBLEM, "--plan", "dp=4,tp=8,pp=1", "--format", "megatron"]) == 2
    assert "64 GPUs" in capsys.readouterr().err


def test_cli_export_warns_about_plans_that_do_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", *PROBLEM, "--plan", "dp=64,tp=1,pp=1", "--format", "megatron"]) == 0
    captured = capsys.readouterr()
    assert "warning: the plan does not fit" in captured.err
    assert "--tensor-model-parallel-size 1" in captured.out


def test_torchtitan_export_names_the_cp_exchange_the_estimate_assumed() -> None:
    workload = mp.Workload(16, 32768, stack="torchtitan")
    from meshplan.export import export, stack_profile

    text = export("dp=2,tp=1,pp=1,cp=4,zero=2", "torchtitan-toml", model="llama3-8b",
                  workload=workload)
    profile = stack_profile("torchtitan")
    assert f'context_parallel_rotate_method = "{profile["default_cp_exchange"]}"' in text
    no_cp = export("dp=8,tp=1,pp=1,zero=2", "torchtitan-toml", model="llama3-8b",
                   workload=workload)
    assert "context_parallel_rotate_method" not in no_cp
