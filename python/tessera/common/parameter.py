"""``tessera.Parameter``: a trainable weight of a Cell, named after its attribute path."""

import numbers

import numpy as np

from .initializer import InitSpec, Values


class Parameter:
    """MindSpore's ``Parameter(default_input, name=None, requires_grad=True,
    layerwise_parallel=False, parallel_optimizer=True, storage_format='', device=None)``.
    ``default_input`` is

    - ``initializer(...)``'s result: the engine draws the initial values when training starts
      (seeded by ``tessera.set_seed``); before training the Parameter has no value
      (``asnumpy()`` raises);
    - or the values themselves: a numpy array, a ``tessera.Tensor``, ``initializer(array)`` or
      a Python number (float32; the engine's ``Initializer::Values``: on N devices every rank
      starts from its slice of them). ``asnumpy()`` returns them before training.

    A Parameter that is a Cell attribute is named after its path (``fc1.weight``). After
    ``Model.train`` it holds its trained value (``asnumpy()``, ``data``), read back from the
    checkpoint the run saved, and a later ``Model.train`` of the same Model continues from it.
    ``requires_grad=False`` (set here or later) freezes it: the engine never updates it, it is
    left out of ``trainable_params()`` and of the run's checkpoints, and keeps its current value
    (given, loaded or trained); a Parameter without a value yet (drawn from an initializer,
    never trained) cannot be frozen: a ``ValueError`` when training starts."""

    def __init__(self, default_input, name=None, requires_grad=True, layerwise_parallel=False,
                 parallel_optimizer=True, storage_format="", device=None):
        if storage_format != "" or device is not None:
            raise ValueError(f"Parameter {name}: storage_format and device are not supported "
                             "(the engine places every parameter)")
        for what, value in (("layerwise_parallel", layerwise_parallel),
                            ("parallel_optimizer", parallel_optimizer)):
            if not isinstance(value, bool):
                raise TypeError(f"Parameter {name}: {what} must be a bool, but got "
                                f"{type(value).__name__}")
        if layerwise_parallel:
            # MindSpore then leaves the parameter's gradient out of the data-parallel reduction;
            # the engine reduces every gradient, so ignoring it would train something else.
            raise ValueError(f"Parameter {name}: layerwise_parallel=True is not supported (the "
                             "engine reduces every parameter's gradient over the data-parallel "
                             "replicas); shard the parameter's ops instead")
        if isinstance(default_input, Parameter):
            default_input = default_input.asnumpy()
        if isinstance(default_input, InitSpec):
            self.init, self.shape = default_input.init, default_input.shape
        elif isinstance(default_input, (np.ndarray, numbers.Real)) or \
                hasattr(default_input, "asnumpy"):
            if isinstance(default_input, numbers.Real):
                default_input = np.float32(default_input)
            self.init = Values(default_input,
                               "Parameter" if name is None else f"Parameter {name}")
            self.shape = self.init.values.shape
        else:
            raise TypeError(f"Parameter: default_input must be initializer(...), a numpy array, "
                            f"a tessera.Tensor or a number, got {type(default_input).__name__}")
        self.name = name
        self.requires_grad = requires_grad
        # False: MindSpore keeps this parameter out of the optimizer sharding (hsdp); the engine
        # shards every parameter alike, so Model.train warns, naming it, when hsdp is on.
        self._parallel_optimizer = parallel_optimizer
        self._value = self.init.values.copy() if isinstance(self.init, Values) else None
        from ..nn.utils import deferring
        self._deferred = deferring()  # created inside nn.utils.no_init_parameters

    def _add_to(self, builder):
        """Adds this Parameter to the traced graph ``builder``; returns ``(id, shape)``. A
        frozen one starts from its current value (given, loaded or trained)."""
        if self.requires_grad:
            return self.init._add_to(builder, self.name, list(self.shape))
        if self._value is None:
            raise ValueError(f"Parameter {self.name}: requires_grad=False needs a value to keep "
                             "(Parameter(array, requires_grad=False), load_param_into_net, or a "
                             f"Model.train before freezing it); {self.init} draws it only when "
                             "training starts, as a trainable parameter")
        return Values(self._value, f"Parameter {self.name}")._add_to(
            builder, self.name, list(self.shape), trainable=False)

    @classmethod
    def _holding(cls, value, name):
        """A Parameter holding ``value`` (any dtype; read from a checkpoint): a float one can
        start a network from it, as ``Parameter(value)``."""
        p = cls.__new__(cls)
        p.name, p.requires_grad, p.shape = name, True, tuple(value.shape)
        p.init = Values(value, f"Parameter {name}") if value.dtype.kind == "f" else None
        p._value = np.array(value)
        return p

    @property
    def dtype(self):
        """The element type: float32, but for a non-float value read from a checkpoint."""
        return np.float32 if self._value is None else self._value.dtype.type

    @property
    def data(self):
        """The value as a numpy array (MindSpore returns the Parameter itself; here numpy)."""
        return self.asnumpy()

    def asnumpy(self):
        """The value (a copy): the trained one once ``Model.train`` ran, else the given one."""
        if self._value is None:
            raise ValueError(f"Parameter {self.name}: no value yet; the engine draws it from "
                             f"{self.init} when Model.train starts")
        return self._value.copy()

    def __repr__(self):
        return f"Parameter(name={self.name}, shape={self.shape}, init={self.init})"

    def _traced(self, op):
        """This Parameter as the traced tensor of the ``construct`` being traced (added to the
        graph at first use), for the operator ``op``; outside ``construct`` the error that ops
        run only there."""
        from .. import _trace
        _trace.require(f"{op} of Parameter {self.name}")
        return _trace.operand(self)


def _operator(name, doc):
    def method(self, *args):
        return getattr(self._traced(doc), name)(*args)
    method.__name__ = name
    method.__doc__ = (f"``{doc}`` in ``construct``: the traced tensor's ``{name}`` (as "
                      "MindSpore's Parameter, a Tensor there).")
    return method


# In construct a Parameter is a tensor of the traced graph: `self.w * x`, `self.scale * 2.0`,
# `-self.w`, `self.w ** 2`, `self.w @ x` apply the ops the traced tensor's operators apply.
for _name, _doc in (("__add__", "+"), ("__radd__", "+"), ("__sub__", "-"), ("__rsub__", "-"),
                    ("__mul__", "*"), ("__rmul__", "*"), ("__truediv__", "/"),
                    ("__rtruediv__", "/"), ("__matmul__", "@"), ("__rmatmul__", "@"),
                    ("__pow__", "**"), ("__neg__", "unary -"), ("__abs__", "abs()")):
    setattr(Parameter, _name, _operator(_name, _doc))


def initial_values(params):
    """The value of each Parameter of ``params``: its own (given, loaded or trained) or, for one
    drawn from an initializer and not trained yet, the value training starts it from — the
    engine fills it from its initializer, its name and the seed of ``tessera.set_seed``, as the
    ranks fill their shards when ``Model.train`` starts (no step is run). A Parameter without a
    name, or frozen without a value, is a ``ValueError`` naming it (``asnumpy()``'s)."""
    from .. import _tessera
    from .._context import get_seed
    drawn = list({id(p): p for p in params if p._value is None}.values())
    for p in drawn:
        if p.name is None or not p.requires_grad or p.init is None:
            p.asnumpy()  # raises: nothing says what training would start it from
    values = {}
    if drawn:
        builder = _tessera.NetworkBuilder()
        ids = [p.init._add_to(builder, p.name, list(p.shape))[0] for p in drawn]
        values = {id(p): v for p, v in zip(drawn, _tessera.initial_values(builder, ids,
                                                                           get_seed()))}
    return [values[id(p)] if id(p) in values else p.asnumpy() for p in params]
