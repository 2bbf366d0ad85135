"""Argument checks raising MindSpore's exception types: TypeError for a wrong type, ValueError
for a wrong value."""

from __future__ import annotations

import numbers
import os
from typing import Any, Optional

import numpy as np


def path(value: Any, name: str) -> str:
    """A path argument: ``str`` or ``os.PathLike`` (TypeError otherwise)."""
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    raise TypeError(f"For '{name}', the type must be str, but got {type(value).__name__}.")


def optional_path(value: Any, name: str) -> Optional[str]:
    """A path argument that may be None."""
    return None if value is None else path(value, name)


def plain(value: Any) -> Any:
    """A numpy scalar setting as the Python value it holds: ``np.bool_`` as a ``bool``, a numpy
    integer as an ``int``, a numpy float as a ``float`` (each exactly; the range checks then
    apply to that value); anything else as it is. Settings reach the engine as JSON, which has
    no numpy types."""
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


#: The largest int the library takes (a rank, count or size: ``usize`` / ``i64`` in Rust).
MAX_INT = 2**63 - 1


def non_negative_int(value: Any, name: str) -> int:
    """A rank or count: an int (not bool; a numpy int is taken as its value) that is >= 0 and
    at most ``MAX_INT``."""
    value = plain(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"For '{name}', the type must be int, but got {type(value).__name__}.")
    if value < 0:
        raise ValueError(f"For '{name}', the value must be a non-negative int, but got {value}.")
    if value > MAX_INT:
        raise ValueError(f"For '{name}', the value must be at most 2**63 - 1, but got {value}.")
    return int(value)


def positive_int(value: Any, name: str) -> int:
    """An int (not bool; a numpy int is taken as its value) that is >= 1."""
    value = plain(value)
    if non_negative_int(value, name) < 1:
        raise ValueError(f"For '{name}', the value must be a positive int, but got {value}.")
    return int(value)


def positive_int_arg(value: Any, func: str, name: str) -> int:
    """Argument ``name`` of ``func`` (a Cell or method) as MindSpore's ``Validator`` checks a
    positive int: an int (not bool, not float; numpy ints included) that is >= 1."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"For '{func}', the type of '{name}' must be int, but got "
                        f"{type(value).__name__}.")
    if value < 1:
        raise ValueError(f"For '{func}', the '{name}' must be a positive int, but got {value}.")
    if value > MAX_INT:
        raise ValueError(f"For '{func}', the '{name}' must be at most 2**63 - 1, but got {value}.")
    return int(value)


def text(value: Any, name: str) -> str:
    """A ``str`` argument the library receives as UTF-8 (a name, a prefix): a lone surrogate
    (``'\\udcff'``, e.g. from ``os.fsdecode`` of non-UTF-8 bytes) cannot be sent and is a
    ``ValueError`` naming ``name`` (it was a ``UnicodeEncodeError`` naming nothing)."""
    if not isinstance(value, str):
        raise TypeError(f"For '{name}', the type must be str, but got {type(value).__name__}.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        shown = repr(value) if len(value) <= 80 else repr(value[:80]) + "…"
        raise ValueError(f"For '{name}', the value {shown} holds a lone surrogate "
                         f"({value[e.start]!r} at index {e.start}), which UTF-8 cannot "
                         "hold.") from None
    return value


def choice(value: Any, name: str, allowed: tuple) -> str:
    """One of ``allowed``."""
    if not isinstance(value, str):
        raise TypeError(f"For '{name}', the type must be str, but got {type(value).__name__}.")
    if value not in allowed:
        raise ValueError(f"For '{name}', the value must be one of {list(allowed)}, but got '{value}'.")
    return value



def flag(value: Any, name: str) -> bool:
    """A bool argument (TypeError otherwise, so ``fsync=0`` is not read as a choice); an
    ``np.bool_`` is taken as its value."""
    value = plain(value)
    if not isinstance(value, bool):
        raise TypeError(f"For '{name}', the type must be bool, but got {type(value).__name__}.")
    return value
