"""Argument checks raising MindSpore's exception types: TypeError for a wrong type, ValueError
for a wrong value."""

from __future__ import annotations

import os
from typing import Any, Optional


def path(value: Any, name: str) -> str:
    """A path argument: ``str`` or ``os.PathLike`` (TypeError otherwise)."""
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    raise TypeError(f"For '{name}', the type must be str, but got {type(value).__name__}.")


def optional_path(value: Any, name: str) -> Optional[str]:
    """A path argument that may be None."""
    return None if value is None else path(value, name)


def non_negative_int(value: Any, name: str) -> int:
    """A rank or count: an int (not bool) that is >= 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"For '{name}', the type must be int, but got {type(value).__name__}.")
    if value < 0:
        raise ValueError(f"For '{name}', the value must be a non-negative int, but got {value}.")
    return int(value)


def positive_int(value: Any, name: str) -> int:
    """An int (not bool) that is >= 1."""
    if non_negative_int(value, name) < 1:
        raise ValueError(f"For '{name}', the value must be a positive int, but got {value}.")
    return int(value)


def choice(value: Any, name: str, allowed: tuple) -> str:
    """One of ``allowed``."""
    if not isinstance(value, str):
        raise TypeError(f"For '{name}', the type must be str, but got {type(value).__name__}.")
    if value not in allowed:
        raise ValueError(f"For '{name}', the value must be one of {list(allowed)}, but got '{value}'.")
    return value



def flag(value: Any, name: str) -> bool:
    """A bool argument (TypeError otherwise, so ``fsync=0`` is not read as a choice)."""
    if not isinstance(value, bool):
        raise TypeError(f"For '{name}', the type must be bool, but got {type(value).__name__}.")
    return value
