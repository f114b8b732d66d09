"""Exceptions raised by meshplan.

Every failure of meshplan is a :class:`MeshplanError`. Errors caused by the caller's input are
also :class:`ValueError` (through :class:`InvalidInputError`), and their message names the bad
field, its value and what is allowed, e.g.
``invalid model.kv_heads: 7 (allowed: a divisor of heads (64))``.

The Rust core reports failures by kind; the binding maps each kind onto one class here:

==================  =========================
core kind           class
==================  =========================
invalid_field       InvalidInputError
unknown_preset      UnknownPresetError
hf_config           HfConfigError
data_file           DataFileError
invalid_case        InvalidCaseError
space_too_large     SpaceTooLargeError
too_many_plans      TooManyPlansError
cancelled           CancelledError
deadline_exceeded   DeadlineExceededError
(a Rust panic)      MeshplanError ("internal error: ...")
==================  =========================

The table is checked for completeness against the core's kinds by the binding's tests
(``rust/meshplan-py``).

Every error also carries its typed context as attributes, for field-violation details (the gRPC
server's ``google.rpc.BadRequest``): ``field`` (the field path, e.g. ``cluster.num_gpus``),
``value`` (the offending value as the message echoes it, bounded to 64 characters and ``…``) and
``allowed`` (what the field accepts, e.g. ``1..=1048576``); each is None where it does not
apply. Integer limits come from one table, ``meshplan._core.limits()`` (``docs/limits.md``).
"""

from __future__ import annotations

from typing import Optional

__all__ = [
    "MeshplanError",
    "InvalidInputError",
    "UnknownPresetError",
    "HfConfigError",
    "DataFileError",
    "InvalidCaseError",
    "SpaceTooLargeError",
    "TooManyPlansError",
    "CancelledError",
    "DeadlineExceededError",
]


class MeshplanError(Exception):
    """Base class of every meshplan error.

    ``field``, ``value`` and ``allowed`` name the offending input field, its value (bounded) and
    what it accepts, or are None where they do not apply.
    """

    field: Optional[str] = None
    value: Optional[str] = None
    allowed: Optional[str] = None

    def __init__(
        self,
        *args: object,
        field: Optional[str] = None,
        value: Optional[str] = None,
        allowed: Optional[str] = None,
    ) -> None:
        super().__init__(*args)
        self.field = field
        self.value = value
        self.allowed = allowed


class InvalidInputError(MeshplanError, ValueError):
    """An input value is outside its allowed range or set; the message names the field."""


class UnknownPresetError(InvalidInputError):
    """A model or GPU preset name that meshplan does not know; the message lists the known ones."""


class HfConfigError(InvalidInputError):
    """A Hugging Face ``config.json`` that cannot be read or mapped onto a meshplan model."""


class DataFileError(MeshplanError):
    """A built-in data file (presets, calibration) does not parse: a packaging bug."""


class InvalidCaseError(InvalidInputError):
    """A validation case (published run) that does not fit the case schema; the message names
    the case (index and id) and the field."""


class SpaceTooLargeError(MeshplanError):
    """The search space has more candidates than ``max_candidates`` allows."""


class TooManyPlansError(SpaceTooLargeError):
    """A whole-space query (``feasible_space``) found more feasible plans than ``max_plans``
    allows. A :class:`SpaceTooLargeError`, so existing handlers still catch it."""


class CancelledError(MeshplanError):
    """The call (a search, evaluation or explanation) was cancelled through its
    :class:`~meshplan.CancelToken`."""


class DeadlineExceededError(MeshplanError):
    """The call (a search, evaluation or explanation) did not finish within ``timeout_s``."""
