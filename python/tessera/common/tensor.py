"""``tessera.Tensor``: a tensor with values (MindSpore's ``Tensor(input_data, dtype)``), held in
numpy. It gives Parameters their initial values (``Parameter(Tensor(array))``); it is not the
symbolic tensor ``construct`` is traced on (``tessera._trace.Tensor``), and ops do not run on
it (there is no eager mode)."""

import numpy as np

__all__ = ["Tensor"]


def _np_dtype(dtype):
    """``dtype`` as a numpy dtype: ``tessera.float32`` and friends, a numpy dtype or its name,
    or any object whose ``str`` is a dtype name in any case (``Float32``)."""
    if hasattr(dtype, "to_numpy"):
        return np.dtype(dtype.to_numpy())
    try:
        return np.dtype(dtype)
    except TypeError:
        pass
    try:
        return np.dtype(str(dtype).lower())
    except TypeError as e:
        raise TypeError(f"Tensor: dtype {dtype!r} is not a dtype (float32, int32, …)") from e


class Tensor:
    """MindSpore's ``Tensor(input_data=None, dtype=None)``: ``input_data`` a numpy array, a
    Python number or (nested) list, or another Tensor; ``dtype`` (``tessera.float32``, …, or a
    numpy dtype) casts it (default: numpy's
    dtype of the data, with Python floats as float32 as MindSpore does). ``asnumpy()`` returns
    a copy; ``shape`` and ``dtype`` (a numpy dtype) describe it."""

    def __init__(self, input_data=None, dtype=None):
        if input_data is None:
            raise ValueError("Tensor: input_data is required (Tessera has no lazy "
                             "initialisation of a Tensor)")
        if isinstance(input_data, Tensor):
            input_data = input_data._data
        array = np.array(input_data, copy=True)
        if dtype is not None:
            array = array.astype(_np_dtype(dtype))
        elif array.dtype == np.float64 and not isinstance(input_data, np.ndarray):
            array = array.astype(np.float32)
        if array.dtype == object:
            raise TypeError(f"Tensor: input_data of type {type(input_data).__name__} is not "
                            "numeric")
        self._data = array

    @property
    def shape(self):
        """The shape, a tuple."""
        return tuple(self._data.shape)

    @property
    def dtype(self):
        """The element type (a numpy dtype)."""
        return self._data.dtype

    @property
    def ndim(self):
        """The number of dims."""
        return self._data.ndim

    @property
    def size(self):
        """The number of elements."""
        return int(self._data.size)

    def asnumpy(self):
        """The values, a numpy copy."""
        return self._data.copy()

    def __array__(self, dtype=None, copy=None):
        return self._data if dtype is None else self._data.astype(dtype)

    def __repr__(self):
        return f"Tensor(shape={list(self.shape)}, dtype={self.dtype}, value={self._data!r})"
