"""Shared plumbing of the typed objects: strict ``from_dict`` and plain ``to_dict``.

The core validates values and names the bad field; this module only checks the *shape* of a dict
(unknown or missing keys), so that a typo in a key never passes silently.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, TypeVar

from .errors import InvalidInputError

T = TypeVar("T")


@functools.lru_cache(maxsize=None)
def field_names(cls: type) -> tuple[str, ...]:
    """Fields of the dataclass ``cls``, in order (cached: ``from_dict`` runs per result)."""
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.lru_cache(maxsize=None)
def required_keys(cls: type) -> tuple[str, ...]:
    """Fields of the dataclass ``cls`` that have no default."""
    return tuple(
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )


def checked(
    cls: type,
    data: object,
    where: str,
    *,
    allow_extra: bool = False,
) -> dict[str, Any]:
    """A copy of ``data`` after checking that it is a mapping with the fields of ``cls``.

    Unknown keys raise :class:`InvalidInputError` naming ``where.key`` unless ``allow_extra``
    (then they are left in the copy for the caller to collect); missing required keys raise
    naming the missing field.
    """
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"invalid {where}: expected a mapping, got {type(data).__name__}")
    names = field_names(cls)
    out = dict(data)
    for key in out:
        if not isinstance(key, str):
            raise InvalidInputError(f"invalid {where}: keys must be strings, got {key!r}")
        if key not in names and not allow_extra:
            allowed = ", ".join(names)
            raise InvalidInputError(f"invalid {where}.{key}: unknown field (allowed: {allowed})")
    for key in required_keys(cls):
        if key not in out:
            raise InvalidInputError(f"missing {where}.{key} (a required field)")
    return out


def as_type(cls: type[T], value: object, where: str) -> T:
    """``value`` if it is a ``cls``, ``cls.from_dict(value)`` if it is a mapping, else an error."""
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        result: T = getattr(cls, "from_dict")(value)
        return result
    raise InvalidInputError(
        f"invalid {where}: expected a {cls.__name__} or a dict, got {type(value).__name__}"
    )
