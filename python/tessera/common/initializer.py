"""``tessera.common.initializer``: MindSpore's initializers, as specifications the engine draws
from (seeded by ``tessera.set_seed``). This slice: ``Normal``, ``Uniform``, ``HeUniform``,
``Zero``, ``One``, ``TruncatedNormal``, ``XavierUniform`` and ``initializer(init, shape, dtype)``
(the last two drawn in numpy when ``initializer`` is called, see ``_Drawn``); the values are drawn by the engine when
training starts, not in Python. ``initializer(array)`` (a numpy array or ``tessera.Tensor``)
gives the values themselves (the engine's ``Initializer::Values``: every rank starts from its
slice of them)."""

import math
import numbers
from statistics import NormalDist, StatisticsError

import numpy as np

from .dtype import float32

#: Rounds of redrawing the values of ``TruncatedNormal`` outside [a, b] before the rest come
#: from the inverse CDF (an unbounded loop hung on an interval far in a tail).
_REDRAWS = 100


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
    exactly them (float32). ``owner`` names them in errors (``Parameter fc1.bias``)."""

    kind = "values"

    def __init__(self, values, owner="initializer"):
        super().__init__(0.0)
        self.values = _float32_values(owner, values)

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
    """All zeros (MindSpore's ``Zero(**kwargs)``; no keyword is used)."""

    kind = "zeros"

    def __init__(self, **kwargs):
        super().__init__(0.0)


class One(Initializer):
    """All ones (MindSpore's ``One(**kwargs)``; no keyword is used)."""

    kind = "ones"

    def __init__(self, **kwargs):
        super().__init__(0.0)


class _Drawn(Initializer):
    """An initializer the engine has no rule for: ``initializer(init, shape)`` draws its values
    in numpy, seeded by ``tessera.set_seed`` and the number of values drawn so far in this
    process (so a script draws the same values on every rank), and the parameter starts from
    exactly them (``Values``)."""

    def draw(self, shape, rng):
        """The values for ``shape``."""
        raise NotImplementedError


_DRAWN = [0]


def _fans(shape):
    """MindSpore's fan-in and fan-out: ``shape[1]``, ``shape[0]`` times the receptive field."""
    if len(shape) < 2:
        raise ValueError(f"initializer: fan in and fan out need a shape of 2 dims or more, got "
                         f"{list(shape)}")
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


class TruncatedNormal(_Drawn):
    """MindSpore's ``TruncatedNormal(sigma=0.01, mean=0.0, a=-2.0, b=2.0)``: ``N(mean, sigma)``
    restricted to ``[a, b]`` (redrawn until inside)."""

    def __init__(self, sigma=0.01, mean=0.0, a=-2.0, b=2.0):
        super().__init__(sigma)
        if not a < b:
            raise ValueError(f"TruncatedNormal: a ({a}) must be below b ({b})")
        if not (math.isfinite(sigma) and sigma >= 0 and math.isfinite(mean)):
            raise ValueError(f"TruncatedNormal: sigma ({sigma}) must be finite and >= 0, and "
                             f"mean ({mean}) finite")
        self.sigma, self.mean, self.a, self.b = float(sigma), float(mean), float(a), float(b)

    def draw(self, shape, rng):
        out = rng.normal(self.mean, self.sigma, size=shape)
        bad = (out < self.a) | (out > self.b)
        # Redrawn while outside [a, b], a bounded number of times: when [a, b] holds little of
        # N(mean, sigma) (far in a tail, or sigma huge) the rest come from its inverse CDF.
        for _ in range(_REDRAWS):
            if not bad.any():
                return out
            out[bad] = rng.normal(self.mean, self.sigma, size=int(bad.sum()))
            bad = (out < self.a) | (out > self.b)
        if bad.any():
            out[bad] = self._inverse_cdf(rng, int(bad.sum()))
        return out

    def _inverse_cdf(self, rng, n):
        """``n`` draws of N(mean, sigma) restricted to [a, b] by its inverse CDF."""
        rule = (f"TruncatedNormal: [a, b] = [{self.a}, {self.b}] holds too little of "
                f"N({self.mean}, {self.sigma}) to draw from")
        if self.sigma == 0:
            raise ValueError(f"{rule} (sigma is 0 and mean lies outside)")
        dist = NormalDist(self.mean, self.sigma)
        lo, hi = dist.cdf(self.a), dist.cdf(self.b)
        if lo == hi and 0.0 < lo < 1.0:
            # [a, b] so narrow against sigma that the CDF rounds to one value: the density is
            # flat across it.
            return rng.uniform(self.a, self.b, size=n)
        if not 0.0 < hi - lo:
            raise ValueError(rule)  # far in a tail, where the CDF saturates at 0 or 1
        try:
            values = [dist.inv_cdf(u) for u in rng.uniform(lo, hi, size=n)]
        except StatisticsError:  # u rounded to 0 or 1: far in a tail
            raise ValueError(rule) from None
        return np.clip(values, self.a, self.b)


class XavierUniform(_Drawn):
    """MindSpore's ``XavierUniform(gain=1)``: ``U(-bound, bound)``, ``bound = gain·√(6 /
    (fan_in + fan_out))``."""

    def __init__(self, gain=1):
        super().__init__(0.0)
        self.gain = float(gain)

    def draw(self, shape, rng):
        fan_in, fan_out = _fans(shape)
        bound = self.gain * np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-bound, bound, size=shape)


_BY_NAME = {"normal": Normal, "uniform": Uniform, "he_uniform": HeUniform, "zeros": Zero,
            "ones": One, "truncatednormal": TruncatedNormal, "xavier_uniform": XavierUniform}


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
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or any(
            isinstance(d, bool) or not isinstance(d, numbers.Integral) for d in shape):
        raise TypeError(f"initializer: shape must be an int or a tuple of ints, got {shape!r}")
    if any(not 0 <= d <= 2**63 - 1 for d in shape):
        raise ValueError(f"initializer: shape {tuple(shape)} has a dim outside 0 .. 2**63 - 1")
    shape = tuple(int(d) for d in shape)
    if isinstance(init, _Drawn):
        from .._context import get_seed
        rng = np.random.default_rng([get_seed(), _DRAWN[0]])
        _DRAWN[0] += 1
        values = Values(init.draw(tuple(shape), rng).astype(np.float32))
        return InitSpec(values, values.values.shape, dtype)
    return InitSpec(init, shape, dtype)
