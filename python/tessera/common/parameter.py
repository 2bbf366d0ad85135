"""``tessera.Parameter``: a trainable weight of a Cell, named after its attribute path."""

from .initializer import InitSpec


class Parameter:
    """MindSpore's ``Parameter(default_input, name=None, requires_grad=True, layerwise_parallel=False,
    parallel_optimizer=True)``. ``default_input`` is ``initializer(...)``'s result (the engine draws
    the values; numpy values are not supported yet). A Parameter that is a Cell attribute is
    named after its path (``fc1.weight``)."""

    def __init__(self, default_input, name=None, requires_grad=True, layerwise_parallel=False,
                 parallel_optimizer=True):
        if not isinstance(default_input, InitSpec):
            raise TypeError("Parameter: default_input must be initializer(init, shape, dtype) "
                            "in this slice (tensor and numpy values are not supported yet)")
        if not requires_grad:
            raise ValueError("Parameter: requires_grad=False is not supported yet")
        self.init = default_input.init
        self.shape = default_input.shape
        self.name = name
        self.requires_grad = requires_grad

    def __repr__(self):
        return f"Parameter(name={self.name}, shape={self.shape}, init={self.init})"
