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
cancelled           CancelledError
deadline_exceeded   DeadlineExceededError
(a Rust panic)      MeshplanError ("internal error: ...")
==================  =========================
"""

from __future__ import annotations

__all__ = [
    "MeshplanError",
    "InvalidInputError",
    "UnknownPresetError",
    "HfConfigError",
    "DataFileError",
    "InvalidCaseError",
    "SpaceTooLargeError",
    "CancelledError",
    "DeadlineExceededError",
]


class MeshplanError(Exception):
    """Base class of every meshplan error."""


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


class CancelledError(MeshplanError):
    """The search was cancelled through its :class:`~meshplan.CancelToken`."""


class DeadlineExceededError(MeshplanError):
    """The search did not finish within ``timeout_s``."""
