"""``tessera.common``: ``Parameter``, ``initializer`` and ``dtype`` (MindSpore's
``mindspore.common``)."""

from . import dtype, initializer
from .parameter import Parameter

__all__ = ["Parameter", "dtype", "initializer"]
