"""``tessera.dataset.transforms``: MindSpore's ``mindspore.dataset.transforms``, this slice:
``TypeCast(data_type)``. Operations apply in numpy when the pipeline is built (``map``), once,
not per training step."""

import numpy as np

__all__ = ["TypeCast"]

_DTYPES = {"bool": np.bool_, "int8": np.int8, "int16": np.int16, "int32": np.int32,
           "int64": np.int64, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32,
           "uint64": np.uint64, "float16": np.float16, "float32": np.float32,
           "float64": np.float64}


def _dtype(data_type):
    if hasattr(data_type, "to_numpy"):  # tessera.int32 and the other dtype objects
        return np.dtype(data_type.to_numpy())
    if isinstance(data_type, str):
        if data_type not in _DTYPES:
            raise ValueError(f"TypeCast: data_type {data_type!r} is not supported "
                             f"(supported: {sorted(_DTYPES)})")
        return np.dtype(_DTYPES[data_type])
    try:
        return np.dtype(data_type)
    except TypeError:
        raise TypeError(f"TypeCast: data_type must be a tessera dtype (tessera.int32), a numpy "
                        f"dtype or its name, got "
                        f"{data_type!r}") from None


class TensorOperation:
    """Base of the operations: ``op(array)`` applies it to one sample; ``map`` applies it to a
    whole column at once (``_apply_column``, the samples stacked along the first dim)."""

    def __call__(self, sample):
        return self._apply_column(np.asarray(sample)[None])[0]

    def _apply_column(self, column):
        raise NotImplementedError


class TypeCast(TensorOperation):
    """Casts to ``data_type`` (a numpy dtype or its name: ``np.int32``, ``"int32"``)."""

    def __init__(self, data_type):
        self.data_type = _dtype(data_type)

    def _apply_column(self, column):
        return np.asarray(column).astype(self.data_type)
