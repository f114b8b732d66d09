"""What-if hardware: a GPU preset with some of its fields changed, labelled as hypothetical.

Co-design studies ask what a GPU that does not exist would do: an H100 with 141 GiB of HBM, a
72-GPU NVLink domain, twice the network bandwidth. :func:`with_overrides` (also
:meth:`meshplan.Gpu.with_overrides`) takes a GPU and a few field values and returns a new
:class:`~meshplan.Gpu`:

* field names are checked here (an unknown one is a one-line error listing the allowed fields),
  values are checked by the core exactly as a preset's are (``invalid gpu.memory_gib: -1
  (allowed: a finite number > 0)``);
* the result is **named** ``what-if:<base>{field=value,...}`` (see :func:`label`), so every
  output that names the GPU (table titles, JSON, CSV, sweep rows, the HTML report, the gRPC
  wire) says it is hypothetical; :func:`is_hypothetical` recognises such a GPU.

On the command line: ``--gpu h100-sxm --gpu-set memory_gib=141,scaleup_domain=72`` or
``--gpu-file hw.toml``; a hardware file holds ``preset = "h100-sxm"`` and the overridden fields
(``memory_gib = 141``, ``[peak_tflops] bf16 = 1500``), or every field of a GPU (no ``preset``).

Core note: the core has no notion of a hypothetical GPU; the label lives in the name. A later
core change could carry ``hypothetical: bool`` and ``overrides`` on ``Gpu`` itself.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Union

from . import _core
from ._fields import shown
from .errors import InvalidInputError

PREFIX = "what-if:"
"""How the name of a hypothetical GPU starts."""

OPTIONAL_CALIBRATION = ("tp_overlap", "dp_overlap")
"""Calibration constants a GPU may leave unset: overrides of the training stack's overlap shares
(the core's ``Stack``), which presets do not set."""

NUMBER_FIELDS = (
    "memory_gib",
    "memory_bandwidth_gbps",
    "sm_count",
    "scaleup_bandwidth_gbps",
    "scaleup_domain",
    "gpus_per_node",
    "network_bandwidth_gbps",
    "host_bandwidth_gbps",
)
"""The top-level GPU fields a what-if may change (besides ``peak_tflops.<precision>``,
``calibration.<constant>`` and ``scaleup_topology``)."""

INT_FIELDS = ("sm_count", "scaleup_domain", "gpus_per_node")

PRECISIONS = ("bf16", "fp16", "fp8", "mxfp8", "nvfp4")


def allowed_fields() -> list[str]:
    """Every field name :func:`with_overrides` accepts."""
    return [*NUMBER_FIELDS, "scaleup_topology", *(f"peak_tflops.{p}" for p in PRECISIONS),
            "calibration.<constant>"]


def _unknown(name: str) -> InvalidInputError:
    return InvalidInputError(
        f"invalid gpu override {shown(name)}: unknown field (allowed: {', '.join(allowed_fields())})"
    )


def _number(name: str, value: Any) -> Union[int, float]:
    """``value`` (a number or its text) as the field's type; text that is no number is bad input."""
    if isinstance(value, bool):
        raise InvalidInputError(f"invalid gpu.{name}: {shown(value)} (allowed: a number)")
    if isinstance(value, str):
        try:
            value = int(value) if name in INT_FIELDS else float(value)
        except ValueError:
            kind = "an integer" if name in INT_FIELDS else "a number"
            raise InvalidInputError(f"invalid gpu.{name}: {shown(value)} (allowed: {kind})") from None
    if name in INT_FIELDS and isinstance(value, float) and value.is_integer():
        value = int(value)
    if name in INT_FIELDS and not isinstance(value, int):
        raise InvalidInputError(f"invalid gpu.{name}: {shown(value)} (allowed: an integer)")
    if not isinstance(value, (int, float)):
        raise InvalidInputError(f"invalid gpu.{name}: {shown(value)} (allowed: a number)")
    return value


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def label(base: str, overrides: Mapping[str, Any]) -> str:
    """The name of a hypothetical GPU: ``what-if:h100-sxm{memory_gib=141,scaleup_domain=72}``."""
    inner = ",".join(f"{k}={_fmt(v)}" for k, v in overrides.items())
    return f"{PREFIX}{base}{{{inner}}}"


def is_hypothetical(gpu: Any) -> bool:
    """Whether ``gpu`` (a :class:`~meshplan.Gpu`, a dict or a name) is a what-if GPU."""
    name = gpu if isinstance(gpu, str) else (
        gpu.get("name") if isinstance(gpu, Mapping) else getattr(gpu, "name", None))
    return isinstance(name, str) and name.startswith(PREFIX)


def base_name(name: str) -> str:
    """The preset a what-if name was made from (``h100-sxm``); a plain name unchanged."""
    if not name.startswith(PREFIX):
        return name
    return name[len(PREFIX):].split("{", 1)[0]


def apply(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The GPU dict ``data`` with ``overrides`` applied and labelled; validated by the core."""
    out = dict(data)
    out["peak_tflops"] = dict(out.get("peak_tflops") or {})
    out["calibration"] = dict(out.get("calibration") or {})
    clean: dict[str, Any] = {}
    for key, value in overrides.items():
        if not isinstance(key, str):
            raise _unknown(repr(key))
        if key in NUMBER_FIELDS:
            out[key] = clean[key] = _number(key, value)
        elif key == "scaleup_topology":
            out[key] = clean[key] = str(value)
        elif key.startswith("peak_tflops."):
            precision = key.split(".", 1)[1]
            if precision not in PRECISIONS:
                raise _unknown(key)
            out["peak_tflops"][precision] = clean[key] = _number(key, value)
        elif key.startswith("calibration."):
            constant = key.split(".", 1)[1]
            known = [*out["calibration"]] + [
                k for k in OPTIONAL_CALIBRATION if k not in out["calibration"]]
            tables = ("gemm_efficiency", "matmul_efficiency")  # per precision, not one number
            if constant not in known or constant in tables:
                allowed = ", ".join(k for k in known if k not in tables)
                raise InvalidInputError(
                    f"invalid gpu override {shown(key)}: unknown calibration constant "
                    f"(allowed: {allowed})"
                )
            out["calibration"][constant] = clean[key] = _number(key, value)
        else:
            raise _unknown(key)
    if not clean:
        raise InvalidInputError("invalid gpu overrides: {} (allowed: one or more field=value)")
    name = str(data.get("name", "gpu"))
    out["name"] = label(base_name(name), clean)
    if is_hypothetical(name) and name.endswith("}") and "{" in name:
        # Overrides of a what-if GPU keep the earlier ones in the label.
        earlier = name[:-1].split("{", 1)[1]
        out["name"] = out["name"].replace("{", "{" + earlier + ",", 1) if earlier else out["name"]
    out["description"] = f"hypothetical: {data.get('name', 'gpu')} with " + ", ".join(
        f"{k}={_fmt(v)}" for k, v in clean.items())
    # The core checks every value as it checks a preset's (raises naming the field and range).
    return _core.apply_calibration(out, "{}")


def parse_assignments(text: str) -> dict[str, str]:
    """``memory_gib=141,scaleup_domain=72`` as a dict of field → text (for ``--gpu-set``)."""
    out: dict[str, str] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InvalidInputError(
                f"invalid --gpu-set: {shown(item)} (allowed: field=value, e.g. memory_gib=141)")
        out[key.strip()] = value.strip()
    if not out:
        raise InvalidInputError("invalid --gpu-set: '' (allowed: field=value[,field=value...])")
    return out


def parse_sweep(text: str) -> tuple[str, list[Any]]:
    """``memory_gib=80,141,192`` as ``("memory_gib", [80.0, 141.0, 192.0])`` (``--gpu-sweep``;
    numbers for the numeric fields)."""
    key, sep, values = text.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not key.strip() or not items:
        raise InvalidInputError(
            f"invalid --gpu-sweep: {shown(text)} (allowed: field=v1,v2,..., e.g. memory_gib=80,141)")
    key = key.strip()
    if key not in NUMBER_FIELDS and key != "scaleup_topology" and not key.startswith(
            ("peak_tflops.", "calibration.")):
        raise _unknown(key)
    if key == "scaleup_topology":
        return key, items
    return key, [_number(key, v) for v in items]


def read_file(path: Union[str, os.PathLike[str]]) -> dict[str, Any]:
    """A hardware file (TOML, or JSON by the ``.json`` suffix) as a GPU dict, validated.

    With ``preset = "NAME"`` the other keys override that preset (and the GPU is labelled
    hypothetical); without it the file must hold every field of a GPU (its ``name`` is kept,
    prefixed ``what-if:`` unless it is a preset's exact values).
    """
    import json

    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise InvalidInputError(f"invalid gpu file {shown(path)}: {e.strerror}") from None
    try:
        if path.endswith(".json"):
            data = json.loads(raw.decode("utf-8"))
        else:
            try:
                import tomllib
            except ImportError:  # pragma: no cover - Python < 3.11
                import tomli as tomllib  # type: ignore[no-redef,import-not-found,unused-ignore]
            data = tomllib.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        message = " ".join(str(e).split())
        raise InvalidInputError(f"invalid gpu file {shown(path)}: {message}") from None
    if not isinstance(data, dict):
        raise InvalidInputError(f"invalid gpu file {shown(path)}: expected a table of fields")
    preset = data.pop("preset", None)
    if preset is None:
        name = str(data.get("name", ""))
        if name and not name.startswith(PREFIX):
            data["name"] = PREFIX + name
        return _core.apply_calibration(data, "{}")
    if not isinstance(preset, str):
        raise InvalidInputError(f"invalid gpu file preset: {shown(preset)} (allowed: a GPU preset name)")
    overrides: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("peak_tflops", "calibration") and isinstance(value, dict):
            overrides.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            overrides[key] = value
    return apply(_core.gpu_preset(preset), overrides)


__all__ = [
    "PREFIX", "NUMBER_FIELDS", "allowed_fields", "apply", "label", "is_hypothetical",
    "base_name", "parse_assignments", "parse_sweep", "read_file",
]
