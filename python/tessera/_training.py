"""Training and planning from Python: ``tessera train`` and ``tessera train --explain`` as
functions returning data."""

from __future__ import annotations

import numbers
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from . import _checks, _tessera

Config = Union[str, "os.PathLike[str]", Mapping[str, Any]]


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n",
                 "\f": "\\f", "\r": "\\r"}


def _toml_string(text: str, key: str) -> str:
    """``text`` as a TOML basic string: quotes, backslashes and control characters escaped,
    every other character as it is (TOML text is UTF-8, so emoji and other characters beyond
    U+FFFF are written whole; a lone surrogate, which UTF-8 cannot hold, is a ``ValueError``
    naming ``key``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"config key {key!r}: the string holds a lone surrogate "
                         f"({text[e.start]!r} at index {e.start}), which TOML (UTF-8) "
                         "cannot hold") from None
    out = []
    for c in text:
        if c in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[c])
        elif c < " " or c == "\x7f":
            out.append(f"\\u{ord(c):04X}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _toml_value(value: Any, key: str) -> str:
    """``value`` (a bool, number, string or list of them) as a TOML value; ``key`` names it
    in errors."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value, key)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, key) for v in value) + "]"
    raise TypeError(f"config key {key!r}: a {type(value).__name__} cannot be written as TOML")


def _toml(config: Mapping[str, Any]) -> str:
    """A config dict (sections of keys; nested dicts are sub-tables) as TOML text."""
    lines: List[str] = []

    def table(header: str, dotted: str, items: Mapping[str, Any]) -> None:
        """The keys of ``items`` under table ``header`` (TOML, quoted) named ``dotted``."""
        scalars = [(k, v) for k, v in items.items() if not isinstance(v, Mapping)]
        tables = [(k, v) for k, v in items.items() if isinstance(v, Mapping)]
        if header and scalars:
            lines.append(f"[{header}]")
        for k, v in scalars:
            key = f"{dotted}.{k}" if dotted else str(k)
            lines.append(f"{_toml_string(str(k), key)} = {_toml_value(v, key)}")
        for k, v in tables:
            key = f"{dotted}.{k}" if dotted else str(k)
            name = _toml_string(str(k), key)
            table(f"{header}.{name}" if header else name, key, v)

    table("", "", config)
    return "\n".join(lines) + "\n"


def _source(config: Config) -> Tuple[Optional[str], Optional[str]]:
    if isinstance(config, Mapping):
        return None, _toml(config)
    return _checks.path(config, "config"), None


def _overrides(overrides: Optional[Mapping[str, Any]]) -> List[str]:
    if overrides is None:
        return []
    if not isinstance(overrides, Mapping):
        raise TypeError(f"overrides must be a dict of 'section.key': value, not {type(overrides).__name__}")
    return [f"{k}={_toml_value(v, k)}" for k, v in overrides.items()]


def _devices(devices: Optional[int]) -> Optional[int]:
    return None if devices is None else _checks.positive_int(devices, "devices")


def train(config: Config, devices: Optional[int] = None, *,
          overrides: Optional[Mapping[str, Any]] = None, log_json: Optional[str] = None,
          print_loss: bool = False, timeout: float = 300.0) -> Dict[str, Any]:
    """Trains as ``tessera train CONFIG [--devices N]`` does (ranks as threads of this
    process) and returns the metrics: ``losses`` (per step), ``accuracies`` /
    ``eval_losses`` (per epoch), ``step_ms``, ``steps``, ``devices``, ``pipeline_bubble``,
    ``output_dir``, ``checkpoint_saved``, ``metrics_log`` and ``warnings`` (the configuration's,
    then what the compiled program caps or skips beyond them, as ``tessera train`` prints).

    ``config`` is a TOML file (docs/CONFIG.md) or a dict of sections (``{"model": {...},
    "data": {...}, ...}``; relative paths against the current directory). ``overrides``
    maps ``"section.key"`` to a value, as ``--set`` does. A bad configuration raises
    ``ConfigError`` naming the key.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"For 'timeout', the type must be a number of seconds, but got "
                        f"{type(timeout).__name__}.")
    path, text = _source(config)
    return _tessera.train(path=path, text=text, devices=_devices(devices),
                          overrides=_overrides(overrides),
                          log_json=_checks.optional_path(log_json, "log_json"),
                          print_loss=bool(print_loss), timeout=float(timeout))


def plan(config: Config, devices: Optional[int] = None, *,
         overrides: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The parallel plan ``tessera train --explain`` prints, as a dict: ``mode``,
    ``devices``, ``bytes_per_step``, ``reshards``, ``params`` (name, shape, layout, mesh,
    slice_shape, replicas, …), ``steps`` (kernels, and reshards with their communication,
    bytes per step and reason), ``pipelined`` and the ``explain`` text. Nothing is trained."""
    path, text = _source(config)
    return _tessera.plan(path=path, text=text, devices=_devices(devices), overrides=_overrides(overrides))
