"""Shared plumbing of the typed objects: strict ``from_dict``, plain ``to_dict``, and the checks
every constructor runs on its arguments.

A constructor checks each argument's *type* and, for integers, its *range* from the core's table
of limits (``meshplan._core.limits()``), at once and with the core's own message
(``invalid cluster.num_gpus: -8 (allowed: 1..=1048576)``). What depends on several fields (the
degrees multiply to the GPU count, ``kv_heads`` divides ``heads``) stays with the core, which
knows them all. :func:`checked` checks the *shape* of a dict (unknown or missing keys), so that a
typo in a key never passes silently.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Sequence
from typing import Any, Mapping, SupportsIndex, TypeVar, cast

from .errors import InvalidInputError

T = TypeVar("T")

SHOWN_CHARS = 64
"""The most characters of a value an error message echoes (the rest is counted, not shown), so
that a 20,000-character preset name makes a short message, not a 20 KB one."""


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters: a longer one keeps its
    start and says how long it was (``'aaaa…' (20,000 characters)``)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, (str, bytes)) else len(text)
    return f"{text[:limit]}… ({size:,} characters)"


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


# --- argument checks of the constructors -------------------------------------------------------


@functools.lru_cache(maxsize=1)
def limits() -> dict[str, tuple[int, int]]:
    """The core's inclusive bounds of every integer input, by field path."""
    from . import _core

    return {path: (int(lo), int(hi)) for path, (lo, hi) in _core.limits().items()}


def invalid(field: str, value: str, allowed: str) -> InvalidInputError:
    """``invalid {field}: {value} (allowed: {allowed})``, the core's one-line message, with
    the three parts as the error's ``field``, ``value`` and ``allowed`` (as the core's own
    errors carry them: the gRPC server sends ``field`` as a ``BadRequest`` violation)."""
    return InvalidInputError(f"invalid {field}: {value} (allowed: {allowed})", field=field,
                             value=value, allowed=allowed)


def _bad(where: str, value: object, allowed: str) -> InvalidInputError:
    return invalid(where, shown(value), allowed)


def _range(limit: str) -> str:
    """What an integer field allows: its bounds as the core says them, else any integer."""
    bounds = limits().get(limit)
    return "an integer" if bounds is None else f"{bounds[0]}..={bounds[1]}"


def check_int(where: str, value: object, limit: str = "") -> int:
    """``value`` as an ``int`` (anything with ``__index__`` but a bool: NumPy integers too),
    inside the bounds of ``limit`` (default: ``where``) in :func:`limits`. Refused as the core
    refuses it: ``invalid {where}: {value} (allowed: {lo}..={hi})``, the value an integer in
    decimal, anything else its ``repr()``."""
    limit = limit or where
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise _bad(where, value, _range(limit))
    number = operator.index(cast(SupportsIndex, value))
    bounds = limits().get(limit)
    if bounds is not None and not bounds[0] <= number <= bounds[1]:
        raise invalid(where, str(number), _range(limit))
    return int(number)


def check_number(where: str, value: object) -> None:
    """``value`` is a real number (an int, a float or a NumPy scalar, not a bool or a string);
    the core checks its range."""
    if isinstance(value, (bool, str, bytes)) or not hasattr(type(value), "__float__"):
        raise _bad(where, value, "a number")


def check_str(where: str, value: object, allowed: str = "a string") -> str:
    if not isinstance(value, str):
        raise _bad(where, value, allowed)
    return value


def check_bool(where: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _bad(where, value, "true or false")
    return value


_LIST_OF = {"int": "a list of integers", "str": "a list of strings", "bool": "a list of booleans"}


def check_list(where: str, value: object, item: str) -> list[Any]:
    """A list or tuple (not a string) whose items are ``item``: ``int`` (in the bounds of
    ``where``), ``str`` or ``bool``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise _bad(where, value, _LIST_OF[item])
    if item == "int":
        return [check_int(where, v) for v in value]
    if item == "str":
        return [check_str(where, v, _LIST_OF["str"]) for v in value]
    return [check_bool(where, v) for v in value]


def check_fields(obj: Any, where: str, kinds: Mapping[str, str]) -> None:
    """Checks (and normalises in place) the fields of the dataclass ``obj``: ``kinds`` maps a
    field to ``int``, ``number``, ``str``, ``bool`` or ``mapping``, with a ``?`` when None is
    allowed too. Integers are bounded by the limit at ``where.field``."""
    for name, kind in kinds.items():
        value = getattr(obj, name)
        path = f"{where}.{name}"
        if kind.endswith("?"):
            if value is None:
                continue
            kind = kind[:-1]
        if kind == "int":
            value = check_int(path, value)
        elif kind == "number":
            check_number(path, value)
        elif kind == "str":
            check_str(path, value)
        elif kind == "bool":
            check_bool(path, value)
        elif kind == "mapping":
            if not isinstance(value, Mapping):
                raise _bad(path, value, "a mapping")
        else:
            raise AssertionError(f"unknown kind {kind!r} of {path}")
        setattr(obj, name, value)
