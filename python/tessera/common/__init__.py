"""``tessera.common``: ``Parameter``, ``Tensor`` (values) and ``initializer`` (MindSpore's
``mindspore.common``)."""

from . import initializer
from .parameter import Parameter
from .tensor import Tensor

__all__ = ["Parameter", "Tensor", "initializer"]
