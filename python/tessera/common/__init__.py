"""``tessera.common``: ``Parameter`` and ``initializer`` (MindSpore's ``mindspore.common``)."""

from . import initializer
from .parameter import Parameter

__all__ = ["Parameter", "initializer"]
