"""``tessera.common.initializer``: MindSpore's initializers, as specifications the engine draws
from (seeded by ``tessera.set_seed``). This slice: ``Normal``, ``Uniform``, ``HeUniform``,
``Zero``, ``One`` and ``initializer(init, shape, dtype)``; the values are drawn by the engine when
training starts, not in Python. ``initializer(array)`` (a numpy array or ``tessera.Tensor``)
gives the values themselves (the engine's ``Initializer::Values``: every rank starts from its
slice of them)."""

import numpy as np

from .dtype import float32


class Initializer:
    """Base of the initializers: ``kind`` (the engine's name) and ``scale``."""

    kind = None

    def __init__(self, scale=0.0):
        self.scale = float(scale)

    def __repr__(self):
        return f"{type(self).__name__}({self.scale})"

    def _add_to(self, builder, name, shape):
        """Adds trainable parameter ``name`` of ``shape`` initialised by this to the traced
        graph ``builder``; returns ``(id, shape)``."""
        return builder.parameter(name, shape, self.kind, self.scale)


def _float32_values(owner, data):
    """``data`` (a numpy array, a ``tessera.Tensor`` or numbers) as a float32 array; a
    non-float dtype or non-finite value is a ``ValueError`` naming ``owner``."""
    array = np.asarray(data.asnumpy() if hasattr(data, "asnumpy") else data)
    if array.dtype.kind != "f":
        raise ValueError(f"{owner}: values of dtype {array.dtype} are not supported (parameters "
                         "are float32 in this slice; cast them first)")
    array = np.array(array, dtype=np.float32)
    if not np.isfinite(array).all():
        raise ValueError(f"{owner}: the values hold NaN or infinity")
    return array


class Values(Initializer):
    """Given values (``initializer(array)``, ``Parameter(array)``): the parameter starts from
    exactly them (float32)."""

    kind = "values"

    def __init__(self, values):
        super().__init__(0.0)
        self.values = _float32_values("initializer", values)

    def __repr__(self):
        return f"Values(shape={list(self.values.shape)})"

    def _add_to(self, builder, name, shape, trainable=True):
        """As ``Initializer._add_to``; ``trainable=False`` adds a frozen parameter."""
        from .. import _tessera
        if tuple(shape) != self.values.shape:
            raise ValueError(f"Parameter {name}: shape {tuple(shape)}, but its values have shape "
                             f"{self.values.shape}")
        return _tessera.parameter_values(builder, name, self.values, trainable)


class Normal(Initializer):
    """``N(mean, sigma)``; this slice supports ``mean=0.0`` only."""

    kind = "normal"

    def __init__(self, sigma=0.01, mean=0.0):
        if mean != 0.0:
            raise ValueError("Normal: mean other than 0.0 is not supported yet")
        super().__init__(sigma)


class Uniform(Initializer):
    """``U(-scale, scale)``."""

    kind = "uniform"

    def __init__(self, scale=0.07):
        super().__init__(scale)


class HeUniform(Initializer):
    """MindSpore's ``HeUniform(negative_slope=0, mode='fan_in', nonlinearity='leaky_relu')``;
    this slice supports the defaults and ``negative_slope=math.sqrt(5)`` (``nn.Dense``'s)."""

    kind = "he_uniform"

    def __init__(self, negative_slope=0, mode="fan_in", nonlinearity="leaky_relu"):
        super().__init__(0.0)
        if mode != "fan_in" or nonlinearity != "leaky_relu":
            raise ValueError("HeUniform: only mode='fan_in', nonlinearity='leaky_relu' are supported yet")
        if abs(negative_slope - 5 ** 0.5) < 1e-12:
            self.kind = "dense_weight"
        elif negative_slope != 0:
            raise ValueError("HeUniform: negative_slope must be 0 or sqrt(5) in this slice")


class Zero(Initializer):
    """All zeros."""

    kind = "zeros"


class One(Initializer):
    """All ones."""

    kind = "ones"


_BY_NAME = {"normal": Normal, "uniform": Uniform, "he_uniform": HeUniform, "zeros": Zero,
            "ones": One}


class InitSpec:
    """What ``initializer(init, shape, dtype)`` returns: an initializer with its shape."""

    def __init__(self, init, shape, dtype):
        self.init, self.shape, self.dtype = init, tuple(shape), dtype


def initializer(init, shape=None, dtype=float32):
    """MindSpore's ``initializer(init, shape, dtype)``: ``init`` an Initializer or its name
    (``"normal"``, ``"uniform"``, ``"he_uniform"``, ``"zeros"``, ``"ones"``), or the values
    themselves (a numpy array or ``tessera.Tensor``; ``shape``, if given, must be theirs)."""
    if isinstance(init, np.ndarray) or hasattr(init, "asnumpy"):
        values = Values(init)
        if shape is not None and tuple([shape] if isinstance(shape, int) else shape) != \
                values.values.shape:
            raise ValueError(f"initializer: shape {shape} differs from the values' shape "
                             f"{values.values.shape}")
        return InitSpec(values, values.values.shape, dtype)
    if isinstance(init, str):
        if init.lower() not in _BY_NAME:
            raise ValueError(f"initializer {init!r} is not supported (supported: {sorted(_BY_NAME)})")
        init = _BY_NAME[init.lower()]()
    if not isinstance(init, Initializer):
        raise TypeError(f"initializer: init must be an Initializer or its name, got {type(init).__name__}")
    if shape is None:
        raise ValueError("initializer: shape is required")
    if isinstance(shape, int):
        shape = (shape,)
    return InitSpec(init, shape, dtype)
