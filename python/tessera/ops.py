"""``tessera.ops``: MindSpore's primitives (``mindspore.ops``), first slice (issue 34).

A primitive applied in ``construct`` adds one node to the traced graph. Its node name is the
primitive's attribute path in the Cell tree (``self.matmul`` of the Cell ``fc1`` is
``fc1.matmul``); a primitive that is no attribute is named ``<cell path>.<op>`` (``_1``, ``_2``
… when repeated). ``.shard(in_strategy, out_strategy)`` stores a strategy (per operand a tuple
of split factors or a ``Layout``) that the engine applies to that node under semi-auto
parallel.

Supported: ``MatMul(transpose_a, transpose_b)``, ``BiasAdd``, ``Add``, ``Sub``, ``Mul``,
``RealDiv``, ``ReLU``, ``Tanh``, ``GeLU``, ``Softmax`` / ``LogSoftmax`` (last axis), ``Exp``,
``Reshape``, ``Flatten``, ``Transpose``, ``SparseSoftmaxCrossEntropyWithLogits``. Declared but not
supported yet (an error naming the Cell and the op): ``Sqrt``, ``ReduceMean``, ``ReduceSum``,
``Gather``, ``Concat``, ``Cast``, ``BatchMatMul``, ``OneHot``.
"""

from . import _trace
from ._trace import Tensor, UnsupportedOpError

__all__ = [
    "Add", "BiasAdd", "Exp", "Flatten", "GeLU", "LogSoftmax", "MatMul", "Mul", "RealDiv",
    "ReLU", "Reshape", "Softmax", "SparseSoftmaxCrossEntropyWithLogits", "Sub", "Tanh",
    "Tensor", "Transpose", "UnsupportedOpError",
    "BatchMatMul", "Cast", "Concat", "Gather", "OneHot", "ReduceMean", "ReduceSum", "Sqrt",
]


def _check_strategy(name, strategy, which="in_strategy"):
    """A strategy as given to ``shard``: per operand a tuple of positive split factors or a
    ``Layout`` with its tensor map (``layout("dp", "None")``)."""
    from .parallel._layout import Layout
    if strategy is None:
        return None
    if not isinstance(strategy, (tuple, list)) or not strategy:
        raise TypeError(f"{name}.shard: {which} is a tuple with one entry per operand (a tuple "
                        f"of positive ints or a Layout), got {strategy!r}")
    kinds = set()
    for s in strategy:
        if isinstance(s, Layout):
            if s._tensor_map is None:
                raise ValueError(f"{name}.shard: {which} holds a Layout without a tensor map; "
                                 "call it with one entry per dim (layout('dp', 'None'))")
            kinds.add("layout")
        elif isinstance(s, (tuple, list)) and all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in s):
            kinds.add("tuple")
        else:
            raise TypeError(f"{name}.shard: every entry of {which} is a tuple of positive ints "
                            f"or a Layout, got {s!r}")
    if len(kinds) > 1:
        raise TypeError(f"{name}.shard: {which} mixes tuples and Layouts; give all of one kind")
    return tuple(s if isinstance(s, Layout) else tuple(s) for s in strategy)


def _dims(s):
    """The number of tensor dims a strategy entry describes."""
    return len(s._tensor_map) if hasattr(s, "_tensor_map") else len(s)


class Primitive:
    """Base of the primitives: ``kind`` is the engine's op, ``default_name`` the node name when
    the primitive is no Cell attribute, ``arity`` its number of tensor inputs."""

    kind = None
    arity = 1
    default_name = None

    def __init__(self):
        self._name = None  # the attribute path, set when the owning Cell is traced
        self.in_strategy = None
        self.out_strategy = None

    def shard(self, in_strategy=None, out_strategy=None):
        """MindSpore's ``Primitive.shard``: the strategy of each input (``in_strategy``) and,
        optionally, of the output (``out_strategy``), each a tuple with one entry per operand:
        split factors or a ``Layout``. Returns the primitive."""
        cls = type(self).__name__
        if out_strategy is not None and in_strategy is None:
            raise ValueError(f"{cls}.shard: out_strategy needs an in_strategy")
        self.in_strategy = _check_strategy(cls, in_strategy)
        self.out_strategy = _check_strategy(cls, out_strategy, "out_strategy")
        return self

    def _attrs(self, inputs):
        return {}

    def __call__(self, *inputs):
        trace = _trace.current()
        if trace is None:
            raise RuntimeError(f"{type(self).__name__}: tessera.ops run inside construct, traced "
                               "by Model.train (there is no eager mode yet)")
        inputs = [_trace.operand(x) for x in inputs[:self.arity]] + list(inputs[self.arity:])
        attrs = self._attrs(inputs)
        tensors = inputs[:self.arity]
        base = self._name or (f"{trace.scope()}.{self.default_name}" if trace.scope()
                              else self.default_name)
        name = trace.unique(base)
        if self.in_strategy is not None:
            if len(self.in_strategy) != len(tensors):
                raise ValueError(
                    f"{name}: in_strategy has {len(self.in_strategy)} "
                    f"entr{'y' if len(self.in_strategy) == 1 else 'ies'} but "
                    f"{type(self).__name__} takes {len(tensors)} input(s)")
            for t, s in zip(tensors, self.in_strategy):
                if _dims(s) != len(t.shape):
                    raise ValueError(
                        f"{name}: strategy {s} has {_dims(s)} dim(s) but its input has shape "
                        f"{t.shape} (one split per dim)")
            trace.strategies[name] = (self.in_strategy, self.out_strategy)
        vid, shape = trace.builder.op(self.kind, name, [t.id for t in tensors], **attrs)
        return Tensor(vid, shape)


def _primitive(cls_name, kind, default_name, arity=1, doc=""):
    cls = type(cls_name, (Primitive,), {"kind": kind, "default_name": default_name,
                                        "arity": arity, "__doc__": doc})
    return cls


Add = _primitive("Add", "add", "add", 2, "``x + y`` (broadcasting).")
Sub = _primitive("Sub", "sub", "sub", 2, "``x - y`` (broadcasting).")
Mul = _primitive("Mul", "mul", "mul", 2, "``x * y`` elementwise (broadcasting).")
RealDiv = _primitive("RealDiv", "div", "div", 2, "``x / y`` elementwise (broadcasting).")
BiasAdd = _primitive("BiasAdd", "bias_add", "bias_add", 2, "``x + bias`` over the last dim.")
ReLU = _primitive("ReLU", "relu", "relu", 1, "``max(x, 0)``.")
Tanh = _primitive("Tanh", "tanh", "tanh", 1, "``tanh(x)``.")
Exp = _primitive("Exp", "exp", "exp", 1, "``e^x``.")
Flatten = _primitive("Flatten", "flatten", "flatten", 1, "``[n, ...]`` → ``[n, prod(...)]``.")


class GeLU(Primitive):
    """GeLU, the tanh approximation (MindSpore's ``ops.GeLU``)."""

    kind, default_name = "gelu", "gelu"


class Softmax(Primitive):
    """Softmax over ``axis`` (the last axis only in this slice)."""

    kind, default_name = "softmax", "softmax"

    def __init__(self, axis=-1):
        super().__init__()
        if axis not in (-1, (-1,)):
            raise ValueError(f"{type(self).__name__}: only axis=-1 is supported yet")


class LogSoftmax(Softmax):
    """Log-softmax over ``axis`` (the last axis only in this slice)."""

    kind, default_name = "log_softmax", "log_softmax"


class MatMul(Primitive):
    """``op(x)·op(y)`` of 2-D matrices, MindSpore's ``ops.MatMul(transpose_a=False,
    transpose_b=False)``."""

    kind, default_name, arity = "matmul", "matmul", 2

    def __init__(self, transpose_a=False, transpose_b=False):
        super().__init__()
        self.transpose_a, self.transpose_b = bool(transpose_a), bool(transpose_b)

    def _attrs(self, inputs):
        return {"transpose_a": self.transpose_a, "transpose_b": self.transpose_b}


class Reshape(Primitive):
    """``Reshape()(x, shape)``; one dim of ``shape`` may be -1."""

    kind, default_name = "reshape", "reshape"

    def _attrs(self, inputs):
        if len(inputs) != 2:
            raise TypeError("Reshape()(x, shape) takes a tensor and a shape")
        x, shape = inputs
        shape = list(shape)
        if shape.count(-1) == 1:
            known = 1
            for d in shape:
                known *= d if d != -1 else 1
            total = 1
            for d in x.shape:
                total *= d
            shape[shape.index(-1)] = total // known if known else 0
        return {"shape": shape}


class Transpose(Primitive):
    """``Transpose()(x, perm)``."""

    kind, default_name = "transpose", "transpose"

    def _attrs(self, inputs):
        if len(inputs) != 2:
            raise TypeError("Transpose()(x, perm) takes a tensor and a permutation")
        return {"perm": list(inputs[1])}


class SparseSoftmaxCrossEntropyWithLogits(Primitive):
    """Mean softmax cross entropy of ``logits [n, c]`` against int labels ``[n]``
    (``is_grad=False``)."""

    kind, default_name, arity = ("sparse_softmax_cross_entropy",
                                 "sparse_softmax_cross_entropy", 2)

    def __init__(self, is_grad=False):
        super().__init__()
        if is_grad:
            raise ValueError("SparseSoftmaxCrossEntropyWithLogits: is_grad=True is not supported")


class _Unsupported(Primitive):
    """A MindSpore primitive this slice declares but does not support yet."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def __call__(self, *inputs):
        trace = _trace.current()
        cell = trace.cell() if trace else "<not tracing>"
        raise UnsupportedOpError(cell, type(self).__name__,
                                 "not in this first slice of tessera.ops (issue 34); supported: "
                                 + ", ".join(n for n in __all__ if n not in _UNSUPPORTED
                                             and n not in ("Tensor", "UnsupportedOpError")))


_UNSUPPORTED = ("BatchMatMul", "Cast", "Concat", "Gather", "OneHot", "ReduceMean", "ReduceSum",
                "Sqrt")
for _n in _UNSUPPORTED:
    globals()[_n] = type(_n, (_Unsupported,), {"__doc__": f"MindSpore's ``ops.{_n}``: not "
                                               "supported yet (an error when traced)."})
del _n
