"""Progress of long conversions: a callable, a tqdm bar, or nothing."""

from __future__ import annotations

import sys
from typing import Callable, Optional, Union

#: ``callback(event, label, value)``: ``("start", label, total_bytes)``,
#: ``("advance", label, bytes)``, ``("file", path, 0)``, ``("finish", label, 0)``.
ProgressCallback = Callable[[str, str, int], None]
Progress = Union[None, bool, ProgressCallback]


class _TqdmProgress:
    """Draws the events as a tqdm bar in bytes."""

    def __init__(self, tqdm_class) -> None:
        self._tqdm = tqdm_class
        self._bar = None

    def __call__(self, event: str, label: str, value: int) -> None:
        if event == "start":
            self._close()
            self._bar = self._tqdm(total=value, desc=label, unit="B", unit_scale=True)
        elif event == "advance" and self._bar is not None:
            self._bar.update(value)
        elif event == "finish":
            self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _tqdm_class():
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def resolve(progress: Progress) -> Optional[ProgressCallback]:
    """The callback for a ``progress`` argument.

    ``None`` (the default): a tqdm bar when tqdm is installed and stderr is a terminal, else
    nothing. ``True``: a tqdm bar (tqdm must be installed). ``False``: nothing. A callable:
    called with each event. The first exception it raises (``KeyboardInterrupt`` included)
    stops the operation and is raised to the caller as it is; raised before the output is
    committed (any event but ``"finish"``, and but the ``"file"`` of a single-file conversion,
    which come after), it leaves nothing written.
    """
    if progress is False:
        return None
    if progress is None or progress is True:
        # No terminal, no bar: decided before importing tqdm, which takes a while.
        if progress is None and not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
            return None
        tqdm = _tqdm_class()
        if tqdm is None:
            if progress is True:
                raise ImportError("progress=True draws a tqdm bar, but tqdm is not installed (pip install tqdm)")
            return None
        return _TqdmProgress(tqdm)
    if callable(progress):
        return progress
    raise TypeError(f"progress must be None, a bool or a callable, but got {type(progress).__name__}")
