"""Hardware: a GPU type and a cluster of them.

Mirrors the core's ``Gpu`` and ``Cluster`` (``rust/meshplan-core/src/hardware.rs``). GPU values
(peak FLOP/s per precision, HBM, fabrics, calibration constants) come from the core's data files
through :meth:`Gpu.preset`; change any of them with :func:`dataclasses.replace`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

from . import _core
from ._fields import check_fields, checked, invalid, shown
from .errors import InvalidInputError


@dataclass
class Gpu:
    """A GPU type. Units are in the names: GiB (binary), GB/s (decimal), TFLOP/s (dense)."""

    name: str
    peak_tflops: dict[str, float]
    """Dense tensor-core peak per precision (``bf16``, ``fp16``, ``fp8``, ``mxfp8``, ``nvfp4``);
    a precision the chip lacks is absent."""
    memory_gib: float
    """Usable HBM per GPU."""
    memory_bandwidth_gbps: float
    sm_count: int
    scaleup_bandwidth_gbps: float
    """NVLink/xGMI bandwidth per GPU, per direction."""
    scaleup_domain: int
    """GPUs in one scale-up (NVLink) domain by default."""
    gpus_per_node: int
    network_bandwidth_gbps: float
    """Scale-out NIC bandwidth per GPU, per direction."""
    calibration: dict[str, Any] = field(default_factory=dict)
    """Calibration constants of the cost model (see the core's GPU data file for sources)."""
    description: str = ""
    scaleup_topology: str = "switch"
    """``"switch"`` (NVSwitch) or ``"mesh"`` (AMD xGMI)."""
    host_bandwidth_gbps: Optional[float] = None
    """Link to host memory per GPU, per direction (PCIe x16 or NVLink-C2C): what activation
    offloading (``Plan.offload_layers``) copies over. None: unknown (such a plan is refused)."""
    architecture: Optional[str] = None
    """The die's GPU architecture (``"ampere"``, ``"hopper"``, ``"blackwell"``, ``"cdna3"``,
    ``"cdna4"``): which class of the core's ``matmul_realisation`` turns a measured
    ``calibration["matmul_efficiency"]`` into a GEMM efficiency. None: the default class."""

    def __post_init__(self) -> None:
        check_fields(self, "gpu", _GPU_KINDS)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "peak_tflops": dict(self.peak_tflops),
            "memory_gib": self.memory_gib,
            "memory_bandwidth_gbps": self.memory_bandwidth_gbps,
            "sm_count": self.sm_count,
            "scaleup_bandwidth_gbps": self.scaleup_bandwidth_gbps,
            "scaleup_domain": self.scaleup_domain,
            "scaleup_topology": self.scaleup_topology,
            "gpus_per_node": self.gpus_per_node,
            "network_bandwidth_gbps": self.network_bandwidth_gbps,
            "calibration": dict(self.calibration),
            # Only where known, as the core writes a GPU.
            **({} if self.host_bandwidth_gbps is None
               else {"host_bandwidth_gbps": self.host_bandwidth_gbps}),
            **({} if self.architecture is None else {"architecture": self.architecture}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Gpu:
        fields = checked(cls, data, "gpu")
        peak = fields["peak_tflops"]
        if isinstance(peak, Mapping):
            # The core lists every precision, None where the chip has none: keep the real ones.
            fields["peak_tflops"] = {k: v for k, v in peak.items() if v is not None}
        return cls(**fields)

    @staticmethod
    def presets() -> list[str]:
        """Names of the built-in GPU presets."""
        return _core.gpu_presets()

    @classmethod
    def preset(cls, name: str) -> Gpu:
        """The built-in GPU ``name`` (see :meth:`presets`); ``UnknownPresetError`` otherwise."""
        return cls.from_dict(_core.gpu_preset(name))

    def with_overrides(self, overrides: Optional[Mapping[str, Any]] = None, **fields: Any) -> Gpu:
        """A hypothetical GPU: this one with some fields changed (``memory_gib=141``,
        ``scaleup_domain=72``, ``network_bandwidth_gbps=100``; dotted names such as
        ``peak_tflops.bf16`` go in ``overrides``). Field names are checked here, values by the
        core as a preset's are; the result is named ``what-if:<name>{field=value,...}``
        (see :mod:`meshplan.whatif`)."""
        from . import whatif

        changes = {**(overrides or {}), **fields}
        return Gpu.from_dict(whatif.apply(self.to_dict(), changes))

    @classmethod
    def from_file(cls, path: Union[str, "os.PathLike[str]"]) -> Gpu:
        """A GPU from a hardware file (TOML or JSON; see :func:`meshplan.whatif.read_file`)."""
        from . import whatif

        return cls.from_dict(whatif.read_file(path))

    @property
    def hypothetical(self) -> bool:
        """Whether this is a what-if GPU (made by :meth:`with_overrides` or a hardware file)."""
        from . import whatif

        return whatif.is_hypothetical(self.name)


@dataclass
class Cluster:
    """GPUs of one type: how many, how many per node and per NVLink domain.

    ``gpu`` is a :class:`Gpu` or a preset name; ``gpus_per_node`` and ``nvlink_domain`` default
    (None) to the GPU's own values.
    """

    gpu: Union[str, Gpu]
    num_gpus: int
    gpus_per_node: Optional[int] = None
    nvlink_domain: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.gpu, (str, Gpu)):
            raise invalid("cluster.gpu", shown(self.gpu), "a GPU preset name or a Gpu")
        check_fields(self, "cluster", _CLUSTER_KINDS)

    @classmethod
    def preset(
        cls,
        gpu_name: str,
        num_gpus: int,
        gpus_per_node: Optional[int] = None,
        nvlink_domain: Optional[int] = None,
    ) -> Cluster:
        """``num_gpus`` of the GPU preset ``gpu_name``."""
        return cls(Gpu.preset(gpu_name), num_gpus, gpus_per_node, nvlink_domain)

    def resolved_gpu(self) -> Gpu:
        """The GPU, looked up in the presets when given by name."""
        if isinstance(self.gpu, Gpu):
            return self.gpu
        if isinstance(self.gpu, str):
            return Gpu.preset(self.gpu)
        raise InvalidInputError(
            f"invalid cluster.gpu: expected a Gpu or a preset name, got {type(self.gpu).__name__}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.resolved_gpu().to_dict(),
            "num_gpus": self.num_gpus,
            "gpus_per_node": self.gpus_per_node,
            "nvlink_domain": self.nvlink_domain,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Cluster:
        fields = checked(cls, data, "cluster")
        gpu = fields["gpu"]
        if isinstance(gpu, Mapping):
            fields["gpu"] = Gpu.from_dict(gpu)
        return cls(**fields)


def provenance(gpu: Union[str, Gpu]) -> dict[str, Any]:
    """Where each calibration constant of the GPU preset ``gpu`` (a name or a preset's
    :class:`Gpu`) comes from: ``{"summary": kind, "constants": {constant: {"kind", "note"}}}``
    with kind ``fitted`` (on its own published runs), ``measured`` (a published
    microbenchmark), ``derived`` (a stated rule), ``shared`` (one value for every GPU) or
    ``assumed`` (a starting value). ``UnknownPresetError`` for a GPU that is not a preset."""
    return _core.gpu_provenance(gpu if isinstance(gpu, str) else gpu.name)


_TRUSTED = ("fitted", "measured")


def calibration_notes(gpu: Union[str, Gpu], precision: str) -> list[str]:
    """One-line notes for a search or evaluation on ``gpu`` at ``precision`` when the GEMM
    efficiency it runs at was not fitted or measured on that GPU (a preset whose constant is
    derived, shared or assumed, and not overridden by a calibration file); empty otherwise, and
    for what-if or custom GPUs (which carry their own values)."""
    resolved = Gpu.preset(gpu) if isinstance(gpu, str) else gpu
    if resolved.hypothetical or resolved.name not in _core.gpu_presets():
        return []
    prov = _core.gpu_provenance(resolved.name)
    preset = _core.gpu_preset(resolved.name)["calibration"].get("gemm_efficiency") or {}
    key = precision if preset.get(precision) is not None else "bf16"
    origin = prov["constants"].get(f"gemm_efficiency.{key}")
    own = (resolved.calibration.get("gemm_efficiency") or {}).get(key)
    if origin is None or origin["kind"] in _TRUSTED or own != preset.get(key):
        return []
    what = (f"{resolved.name} has no runs of its own: its calibration is {prov['summary']}"
            if prov["summary"] not in _TRUSTED else
            f"{resolved.name}'s {key} GEMM efficiency is {origin['kind']}, not fitted on its runs")
    return [f"{what} ({key} GEMM efficiency {own}: {origin['note']}); `meshplan calibrate` "
            "fits it to your own cluster"]


_GPU_KINDS = {
    "name": "str", "peak_tflops": "mapping", "memory_gib": "number",
    "memory_bandwidth_gbps": "number", "sm_count": "int", "scaleup_bandwidth_gbps": "number",
    "scaleup_domain": "int", "gpus_per_node": "int", "network_bandwidth_gbps": "number",
    "calibration": "mapping", "description": "str", "scaleup_topology": "str",
    "host_bandwidth_gbps": "number?", "architecture": "str?",
}
_CLUSTER_KINDS = {"num_gpus": "int", "gpus_per_node": "int?", "nvlink_domain": "int?"}
