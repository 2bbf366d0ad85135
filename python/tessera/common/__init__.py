"""``tessera.common``: ``Parameter``, ``Tensor`` (values), ``initializer`` and ``dtype``
(MindSpore's
``mindspore.common``)."""

from . import dtype, initializer
from .parameter import Parameter
from .tensor import Tensor

__all__ = ["Parameter", "Tensor", "dtype", "initializer"]
