"""``tessera.Parameter``: a trainable weight of a Cell, named after its attribute path."""

import numpy as np

from .initializer import InitSpec


class Parameter:
    """MindSpore's ``Parameter(default_input, name=None, requires_grad=True, layerwise_parallel=False,
    parallel_optimizer=True)``. ``default_input`` is ``initializer(...)``'s result: the engine
    draws the initial values when training starts (numpy or tensor initial values are not
    supported: the engine's graph takes initializers only). A Parameter that is a Cell attribute
    is named after its path (``fc1.weight``).

    After ``Model.train`` it holds its trained value (``asnumpy()``, ``data``), read back from
    the checkpoint the run saved, and a later ``Model.train`` of the same Model continues from
    it. Before training it has no value (``asnumpy()`` raises)."""

    def __init__(self, default_input, name=None, requires_grad=True, layerwise_parallel=False,
                 parallel_optimizer=True):
        if not isinstance(default_input, InitSpec):
            raise TypeError("Parameter: default_input must be initializer(init, shape, dtype) "
                            "(numpy and tensor initial values are not supported: the engine's "
                            "graph takes initializers only)")
        if not requires_grad:
            raise ValueError("Parameter: requires_grad=False is not supported yet")
        self.init = default_input.init
        self.shape = default_input.shape
        self.name = name
        self.requires_grad = requires_grad
        self._value = None
        from ..nn.utils import deferring
        self._deferred = deferring()  # created inside nn.utils.no_init_parameters

    @property
    def dtype(self):
        """float32 (every parameter of this slice)."""
        return np.float32

    @property
    def data(self):
        """The value as a numpy array (MindSpore returns the Parameter itself; here numpy)."""
        return self.asnumpy()

    def asnumpy(self):
        """The trained value (a copy), once ``Model.train`` ran."""
        if self._value is None:
            raise ValueError(f"Parameter {self.name}: no value yet; the engine draws it from "
                             f"{self.init} when Model.train starts")
        return self._value.copy()

    def __repr__(self):
        return f"Parameter(name={self.name}, shape={self.shape}, init={self.init})"
