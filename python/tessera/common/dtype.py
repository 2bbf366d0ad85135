"""``tessera.common.dtype``: MindSpore's dtype objects (``mindspore.float32`` …), exported from
``tessera`` (``tessera.float32``). ``Cast()(x, tessera.float16)``, ``ops.ones(shape,
tessera.float32)`` and ``OneHot`` take them; the engine's graph computes in these types."""

import numpy as np


class Type:
    """A tensor element type: ``name`` is MindSpore's lowercase name (``"float32"``), the one
    traced tensors report as ``Tensor.dtype``."""

    __slots__ = ("name", "is_float", "_numpy")

    def __init__(self, name, is_float, numpy_type):
        self.name, self.is_float, self._numpy = name, is_float, numpy_type

    def __repr__(self):
        return self.name.capitalize().replace("Bfloat", "BFloat")

    def __eq__(self, other):
        if isinstance(other, Type):
            return self.name == other.name
        if isinstance(other, str):
            return self.name == other
        return NotImplemented

    def __hash__(self):
        return hash(self.name)

    def to_numpy(self):
        """The numpy dtype (bfloat16 has none: float32 stands in)."""
        return self._numpy


float32 = Type("float32", True, np.float32)
float16 = Type("float16", True, np.float16)
bfloat16 = Type("bfloat16", True, np.float32)
float64 = Type("float64", True, np.float64)
int32 = Type("int32", False, np.int32)
int64 = Type("int64", False, np.int64)

_ALL = {t.name: t for t in (float32, float16, bfloat16, float64, int32, int64)}


def of(dtype, what):
    """``dtype`` (a ``Type``, its name, or a numpy dtype) as a ``Type``; ``what`` names the caller
    in the error."""
    if isinstance(dtype, Type):
        return dtype
    name = dtype if isinstance(dtype, str) else getattr(np.dtype(dtype), "name", str(dtype))
    if name.lower() in _ALL:
        return _ALL[name.lower()]
    raise TypeError(f"{what}: dtype {dtype!r} is not supported (supported: {sorted(_ALL)})")


__all__ = ["Type", "bfloat16", "float16", "float32", "float64", "int32", "int64"]
