"""Tessera from Python.

- ``tessera.parallel``: ``mindspore.parallel``'s distributed-checkpoint and ``Layout`` tools
  under their MindSpore names and signatures (``from tessera import parallel as ms_parallel``),
  plus ``reshard_plan``, ``layout_slices`` and ``verify_checkpoint``.
- ``tessera.train(config, devices=...)`` trains as ``tessera train`` does and returns the
  metrics; ``tessera.plan(config, devices=...)`` returns the parallel plan as a dict.

Errors name their culprit: ``CheckpointError`` (a ``ValueError``), ``CheckpointIOError`` (an
``OSError``) and ``ConfigError`` (a ``ValueError``) carry ``file``, ``tensor`` and ``rule``.
"""

from importlib.metadata import PackageNotFoundError, version

from . import parallel
from ._tessera import CheckpointError, CheckpointIOError, ConfigError
from ._training import plan, train

try:
    __version__ = version("tessera-parallel")
except PackageNotFoundError:  # imported from a source tree without installing
    __version__ = "0+unknown"

__all__ = [
    "CheckpointError",
    "CheckpointIOError",
    "ConfigError",
    "parallel",
    "plan",
    "train",
]
