"""``tessera.ops``: MindSpore's primitives (``mindspore.ops``) and their functional forms
(issue 34).

A primitive applied in ``construct`` adds one node to the traced graph (a few add two or three,
listed below). Its node name is the primitive's attribute path in the Cell tree (``self.matmul``
of the Cell ``fc1`` is ``fc1.matmul``); a primitive that is no attribute, a functional form
(``ops.softmax(x)``) and an operator (``x + y``) are named ``<cell path>.<op>`` (``_1``, ``_2``
… when repeated). ``.shard(in_strategy, out_strategy)`` stores a strategy (per operand a tuple
of split factors or a ``Layout``; ``()`` for a scalar operand) that the engine applies to that
node under semi-auto parallel.

Primitives: ``MatMul(transpose_a, transpose_b)`` (a ``[..., k]`` input with a 2-D weight is a
``BatchMatMul`` node, as ``nn.Dense`` on 3-D inputs), ``BatchMatMul(transpose_a, transpose_b)``,
``BiasAdd``, ``Add``, ``Sub``, ``Mul``, ``RealDiv`` (a Python scalar operand is a constant node
``<name>.value``), ``Neg``, ``ReLU``, ``Tanh``, ``Sigmoid``, ``SiLU`` (a Tessera addition, the
shardable primitive behind ``nn.SiLU`` and ``ops.silu``: MindSpore 2.10 has no public
``ops.SiLU``; ``x * sigmoid(x)`` as nodes ``<name>.sigmoid`` and the ``Mul`` ``<name>``, both
given the strategy), ``GeLU``, ``Exp``, ``Log``, ``Sqrt``,
``Softmax(axis)``/``LogSoftmax(axis)`` (the last axis), ``ReduceSum``/``ReduceMean``/``ReduceMax``
``(keep_dims)(x, axis)`` (``ReduceMean`` adds ``<name>.count`` and ``<name>.div``; ``ReduceMax`` has
no gradient: use it under ``stop_gradient``), ``Gather()(table, indices, 0)`` (an embedding lookup),
``OneHot(axis=-1)(indices, depth, on_value=1, off_value=0)``, ``Concat(axis)((x, y, ...))``,
``Split(axis, output_num)``, ``Cast()(x, tessera.float16)``, ``LayerNorm(begin_norm_axis,
begin_params_axis, epsilon)(x, gamma, beta)`` (the last axis; returns ``(y, mean, variance)`` of
which only ``y`` may be used), ``Dropout(keep_prob, Seed0, Seed1)`` (returns ``(y, mask)``, only
``y`` usable; the seed is the site's number in tracing order unless ``Seed0``/``Seed1`` are set),
``MaskedFill()(x, mask, value)``, ``Triu(diagonal)`` (of ``ops.ones(shape)``: a constant mask),
``StopGradient``, ``Reshape``, ``Flatten``, ``Transpose``,
``SparseSoftmaxCrossEntropyWithLogits``.

Fused as MindSpore's graph compiler fuses them: ``Softmax`` of ``x * c`` (``c`` a positive Python
scalar) is one ``ScaledSoftmax`` node ``softmax(c·x)``, named after the ``Softmax``.

Functional forms: ``matmul``, ``bmm``, ``add``, ``sub``, ``mul``, ``div``, ``neg``, ``relu``,
``tanh``, ``sigmoid``, ``silu``, ``gelu``, ``exp``, ``log``, ``sqrt``, ``softmax``,
``log_softmax``, ``sum``, ``mean``, ``amax``, ``gather``, ``one_hot``, ``concat``/``cat``,
``split``, ``cast``, ``dropout``, ``masked_fill``, ``triu``, ``ones``, ``zeros``, ``reshape``,
``transpose``, ``stop_gradient``.

``Print()(*args)`` prints its strings and tensors each time the step runs (one ``Print`` node per
tensor; see the class).
"""

import math
import numbers

from . import _trace
from ._trace import Tensor, Unavailable, UnsupportedOpError
from .common import dtype as mstype

__all__ = [
    "Add", "BatchMatMul", "BiasAdd", "Cast", "Concat", "Dropout", "Exp", "Flatten", "Gather",
    "GeLU", "LayerNorm", "Log", "LogSoftmax", "MaskedFill", "MatMul", "Mul", "Neg", "OneHot",
    "Primitive", "Print", "RealDiv", "ReduceMax", "ReduceMean", "ReduceSum", "ReLU", "Reshape",
    "SiLU", "Sigmoid", "Softmax", "SparseSoftmaxCrossEntropyWithLogits", "Split", "Sqrt",
    "StopGradient", "Sub",
    "Tanh", "Tensor", "Transpose", "Triu", "UnsupportedOpError",
    "add", "amax", "bmm", "cast", "cat", "concat", "div", "dropout", "exp", "gather", "gelu",
    "log", "log_softmax", "masked_fill", "matmul", "mean", "mul", "neg", "one_hot", "ones",
    "relu", "reshape", "sigmoid", "silu", "softmax", "split", "sqrt", "stop_gradient", "sub",
    "sum", "tanh",
    "transpose", "triu", "zeros",
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


def _split_of(entry, dim):
    """How many ways a strategy entry (split factors or a ``Layout``) splits tensor dim
    ``dim``."""
    if not hasattr(entry, "_tensor_map"):
        return entry[dim]
    mapped = entry._tensor_map[dim]
    ways = 1
    for alias in ([mapped] if isinstance(mapped, str) else mapped):
        if alias != "None":
            ways *= entry._device_shape[entry._alias_name.index(alias)]
    return ways


def _is_scalar(x):
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


class Primitive:
    """Base of the primitives: ``kind`` is the engine's op, ``default_name`` the node name when
    the primitive is no Cell attribute, ``arity`` its number of tensor inputs (the rest of the
    call's arguments are attributes, ``Reshape()(x, shape)``). ``scalars``: Python scalars are
    tensor operands (constants)."""

    kind = None
    arity = 1
    default_name = None
    scalars = False

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

    def _attrs(self, tensors, args):
        """The node's attributes from the tensor inputs and the other arguments."""
        if args:
            self._fail(f"takes {self.arity} tensor input(s), got {self.arity + len(args)} "
                       "arguments")
        return {}

    def _fail(self, rule, error=ValueError):
        """Raises ``error`` naming the Cell, this op and ``rule``."""
        trace = _trace.current()
        cell = trace.cell() if trace else "<not tracing>"
        if error is UnsupportedOpError:
            raise UnsupportedOpError(cell, type(self).__name__, rule)
        raise error(f"Cell {cell}: op {type(self).__name__}: {rule}")

    def _operands(self, name, inputs):
        like = next((x for x in inputs if isinstance(x, Tensor)), None)
        return [_trace.operand(x, name if self.scalars else None, like) for x in inputs]

    def _record_strategy(self, trace, name, tensors):
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

    def _emit(self, trace, name, tensors, attrs):
        """Adds the node(s); returns the outputs."""
        return trace.add(self.kind, name, tensors, **attrs)

    def _identity(self, trace, name, x):
        """``x`` for a call that computes nothing (``Concat`` of one tensor, ``ReduceSum`` with
        ``skip_mode`` and no axis). Unsharded it adds no node; with a strategy (recorded under
        ``name``) it adds an identity node ``name`` (a ``Reshape`` to the same shape, as
        ``reshard``) that carries it, so the strategy is applied and checked by the engine
        rather than refused as naming no op of the graph."""
        if self.in_strategy is None:
            return [x]
        return trace.add("reshape", name, [x], shape=list(x.shape))

    def __call__(self, *inputs):
        trace = _trace.require(type(self).__name__)
        if len(inputs) < self.arity:
            self._fail(f"takes {self.arity} tensor input(s), got {len(inputs)}", TypeError)
        name = trace.node_name(self._name, self.default_name)
        tensors = self._operands(name, inputs[:self.arity])
        attrs = self._attrs(tensors, inputs[self.arity:])
        self._record_strategy(trace, name, tensors)
        outs = self._emit(trace, name, tensors, attrs)
        return outs[0] if len(outs) == 1 else tuple(outs)


def _primitive(cls_name, kind, arity, doc, scalars=False):
    return type(cls_name, (Primitive,), {"kind": kind, "default_name": kind, "arity": arity,
                                         "scalars": scalars, "__doc__": doc})


Add = _primitive("Add", "add", 2, "``x + y`` (broadcasting; a Python scalar is a constant).", True)
Sub = _primitive("Sub", "sub", 2, "``x - y`` (broadcasting; a Python scalar is a constant).", True)
RealDiv = _primitive("RealDiv", "div", 2, "``x / y`` elementwise (broadcasting; a Python scalar "
                     "is a constant).", True)
ReLU = _primitive("ReLU", "relu", 1, "``max(x, 0)``.")
Tanh = _primitive("Tanh", "tanh", 1, "``tanh(x)``.")
Sigmoid = _primitive("Sigmoid", "sigmoid", 1, "``1 / (1 + e^-x)`` (gradient ``dy·y·(1 − y)``).")
Exp = _primitive("Exp", "exp", 1, "``e^x``.")
Log = _primitive("Log", "log", 1, "``ln x``.")
Sqrt = _primitive("Sqrt", "sqrt", 1, "``√x`` (gradient ``dy / 2√x``).")
Neg = _primitive("Neg", "neg", 1, "``-x``.")
StopGradient = _primitive("StopGradient", "stop_gradient", 1,
                          "``x``, through which no gradient flows.")
Flatten = _primitive("Flatten", "flatten", 1, "``[n, ...]`` → ``[n, prod(...)]``.")


class Mul(Primitive):
    """``x * y`` elementwise (broadcasting; a Python scalar is a constant). ``x * c`` with ``c``
    a positive Python scalar is added when used, so that ``Softmax`` may fuse it."""

    kind, default_name, arity, scalars = "mul", "mul", 2, True

    def __call__(self, x, y):
        trace = _trace.require("Mul")
        t, c = (x, y) if _is_scalar(y) else (y, x)
        if (self.in_strategy is None and isinstance(t, Tensor) and _is_scalar(c)
                and t.dtype.is_float and c > 0 and math.isfinite(c)):
            name = trace.node_name(self._name, self.default_name)

            def make():
                const = trace.constant(trace.unique(f"{name}.value"), c)
                a, b = (t, const) if t is x else (const, t)
                return trace.add("mul", name, [a, b])[0].id

            out = Tensor.deferred(t.shape, t.dtype, make)
            out.scaled = (t, float(c))
            return out
        return super().__call__(x, y)


class SiLU(Primitive):
    """SiLU (a Tessera addition: MindSpore 2.10's ``nn.SiLU`` and ``ops.silu`` use a primitive
    it does not export): ``x * sigmoid(x)``, as two nodes: ``<name>.sigmoid`` (a ``Sigmoid``)
    and ``<name>`` (the ``Mul`` of ``x`` and it). A strategy ``((s,),)`` applies to both: the
    ``Sigmoid`` gets ``(s,)``, the ``Mul`` ``(s, s)`` (and the ``out_strategy``, if any)."""

    kind, default_name = "sigmoid", "silu"

    def _emit(self, trace, name, tensors, attrs):
        x = tensors[0]
        sigmoid_name = trace.unique(f"{name}.sigmoid")
        if name in trace.strategies:
            (s,), out = trace.strategies[name]
            trace.strategies[sigmoid_name] = ((s,), None)
            trace.strategies[name] = ((s, s), out)
        y = trace.add("sigmoid", sigmoid_name, [x])[0]
        return trace.add("mul", name, [x, y])


class BiasAdd(Primitive):
    """MindSpore's ``BiasAdd(data_format="NCHW")``: ``x + bias`` over the channel dim — dim 1
    (``"NCHW"``, ``"NCDHW"``) or the last (``"NHWC"``); the same dim for a 2-D input. The engine
    adds over the last dim, so a channel-first input of more than 2 dims is an error."""

    kind, default_name, arity = "bias_add", "bias_add", 2

    def __init__(self, data_format="NCHW"):
        super().__init__()
        if data_format not in ("NCHW", "NHWC", "NCDHW"):
            raise ValueError(f"BiasAdd: data_format must be 'NCHW', 'NHWC' or 'NCDHW', got "
                             f"{data_format!r}")
        self.data_format = data_format

    def _attrs(self, tensors, args):
        super()._attrs(tensors, args)
        if tensors[0].ndim > 2 and self.data_format != "NHWC":
            self._fail(f"data_format {self.data_format!r} adds the bias over dim 1 of a "
                       f"{tensors[0].ndim}-D input; the engine adds it over the last dim "
                       "(use data_format='NHWC' with the channels last)", UnsupportedOpError)
        return {}


class GeLU(Primitive):
    """GeLU, the tanh approximation (MindSpore's ``ops.GeLU``); ``approximate=False`` is the
    exact erf form (``nn.GELU(approximate=False)``)."""

    kind, default_name = "gelu", "gelu"

    def __init__(self, *, approximate=True):
        super().__init__()
        self.approximate = bool(approximate)

    def _attrs(self, tensors, args):
        super()._attrs(tensors, args)
        return {"approximate": self.approximate}


def _axis(prim, axis, ndim):
    """``axis`` (an int, negative from the end) as a dim of an ``ndim``-D input."""
    if not isinstance(axis, int) or isinstance(axis, bool) or not -ndim <= axis < ndim:
        prim._fail(f"axis {axis!r} is out of range for a {ndim}-D input "
                   f"(ints in [{-ndim}, {ndim}))")
    return axis % ndim


class Softmax(Primitive):
    """Softmax over ``axis``, which must be the last. Of ``x * c`` (``c`` a positive Python
    scalar): one ``ScaledSoftmax`` node."""

    kind, default_name = "softmax", "softmax"

    def __init__(self, axis=-1):
        super().__init__()
        self.axis = axis[0] if isinstance(axis, (tuple, list)) and len(axis) == 1 else axis

    def _attrs(self, tensors, args):
        super()._attrs(tensors, args)
        x = tensors[0]
        if _axis(self, self.axis, x.ndim) != x.ndim - 1:
            self._fail(f"axis {self.axis} is not the last axis of the {x.ndim}-D input: only the "
                       "last axis is supported", UnsupportedOpError)
        return {}

    def _emit(self, trace, name, tensors, attrs):
        x = tensors[0]
        if self.kind == "softmax" and x.scaled is not None and x._id is None:
            base, scale = x.scaled
            return trace.add("scaled_softmax", name, [base], scale=scale)
        return trace.add(self.kind, name, tensors)


class LogSoftmax(Softmax):
    """Log-softmax over ``axis``, which must be the last."""

    kind, default_name = "log_softmax", "log_softmax"


class MatMul(Primitive):
    """``op(x)·op(y)``, MindSpore's ``ops.MatMul(transpose_a=False, transpose_b=False)``; an
    ``x`` of more than 2 dims with a 2-D ``y`` is one ``BatchMatMul`` node (as ``nn.Dense``)."""

    kind, default_name, arity = "matmul", "matmul", 2

    def __init__(self, transpose_a=False, transpose_b=False):
        super().__init__()
        self.transpose_a, self.transpose_b = bool(transpose_a), bool(transpose_b)

    def _attrs(self, tensors, args):
        super()._attrs(tensors, args)
        return {"transpose_a": self.transpose_a, "transpose_b": self.transpose_b}

    def _emit(self, trace, name, tensors, attrs):
        kind = "batch_matmul" if tensors[0].ndim > 2 else self.kind
        return trace.add(kind, name, tensors, **attrs)


class BatchMatMul(MatMul):
    """``op(x)·op(y)`` over the last two dims, broadcasting the leading (batch) dims."""

    kind, default_name = "batch_matmul", "batch_matmul"


class _Reduce(Primitive):
    """``op(x, axis=())``: a reduction over ``axis`` (an int or tuple; ``()`` every axis)."""

    default_name = None

    def __init__(self, keep_dims=False):
        super().__init__()
        self.keep_dims = bool(keep_dims)

    def _attrs(self, tensors, args):
        if len(args) > 1:
            self._fail(f"takes (x, axis), got {1 + len(args)} arguments", TypeError)
        axis = args[0] if args else ()
        axes = axis if isinstance(axis, (tuple, list)) else (axis,)
        ndim = tensors[0].ndim
        dims = sorted({_axis(self, a, ndim) for a in axes})
        if len(dims) != len(axes):
            self._fail(f"axis {axis!r} repeats a dim")
        return {"axes": dims, "keep_dims": self.keep_dims}


class ReduceSum(_Reduce):
    """MindSpore's ``ReduceSum(keep_dims=False, skip_mode=False)(x, axis=())``; with
    ``skip_mode`` an empty ``axis`` reduces nothing (``x`` itself) rather than every dim."""

    kind = default_name = "reduce_sum"

    def __init__(self, keep_dims=False, skip_mode=False):
        super().__init__(keep_dims)
        self.skip_mode = bool(skip_mode)

    def _emit(self, trace, name, tensors, attrs):
        if self.skip_mode and not attrs["axes"]:
            return self._identity(trace, name, tensors[0])
        return super()._emit(trace, name, tensors, attrs)


class ReduceMax(_Reduce):
    """MindSpore's ``ReduceMax(keep_dims=False)(x, axis=())``. The engine's ReduceMax has no
    gradient: apply it under ``ops.stop_gradient`` (a log-sum-exp shift)."""

    kind = default_name = "reduce_max"


class ReduceMean(_Reduce):
    """MindSpore's ``ReduceMean(keep_dims=False)(x, axis=())``: nodes ``<name>`` (the sum, where
    the strategy applies), ``<name>.count`` (the element count) and ``<name>.div``."""

    kind, default_name = "reduce_sum", "reduce_mean"

    def _emit(self, trace, name, tensors, attrs):
        total = trace.add("reduce_sum", name, tensors, **attrs)[0]
        count = 1
        for d in attrs["axes"] or range(tensors[0].ndim):
            count *= tensors[0].shape[d]
        n = trace.constant(trace.unique(f"{name}.count"), count)
        return trace.add("div", trace.unique(f"{name}.div"), [total, n])


class Gather(Primitive):
    """``Gather()(table, indices, axis)``: an embedding lookup, rows of a 2-D ``table`` at
    integer ``indices`` (axis 0 only; ``batch_dims=0``)."""

    kind, default_name, arity = "embedding", "gather", 2

    def __init__(self, batch_dims=0):
        super().__init__()
        if batch_dims != 0:
            self._fail("batch_dims other than 0 is not supported", UnsupportedOpError)

    def _attrs(self, tensors, args):
        axis = args[0] if args else 0
        table, ids = tensors
        if len(args) > 1 or _axis(self, axis, table.ndim) != 0 or table.ndim != 2:
            self._fail(f"only an embedding lookup is supported: a 2-D table (got {table.shape}) "
                       f"on axis 0 (got {axis!r})", UnsupportedOpError)
        if ids.dtype.is_float:
            self._fail(f"the indices must be int32 or int64, got {ids.dtype.name}")
        return {}


class OneHot(Primitive):
    """``OneHot(axis=-1)(indices, depth, on_value=1, off_value=0)``: rows of ``depth`` of
    float32; ``on_value``/``off_value`` must be the Python numbers 1 and 0."""

    kind, default_name = "one_hot", "one_hot"

    def __init__(self, axis=-1):
        super().__init__()
        self.axis = axis

    def _attrs(self, tensors, args):
        if self.axis != -1:
            self._fail(f"axis={self.axis} is not supported (the last axis only, -1)",
                       UnsupportedOpError)
        if not args or not isinstance(args[0], int) or args[0] < 1:
            self._fail("needs a positive int depth: OneHot()(indices, depth, 1.0, 0.0)", TypeError)
        on, off = (list(args[1:3]) + [1.0, 0.0][len(args) - 1:])[:2]
        if not (_is_scalar(on) and _is_scalar(off) and on == 1 and off == 0):
            self._fail(f"on_value and off_value must be the Python numbers 1 and 0 (got {on!r}, "
                       f"{off!r})", UnsupportedOpError)
        return {"depth": args[0], "dtype": "float32"}

    def _record_strategy(self, trace, name, tensors):
        """MindSpore's OneHot strategy: one tuple of the OUTPUT's dims (the indices' and the
        depth's), optionally followed by ``()`` for ``on_value`` and ``off_value``."""
        s = self.in_strategy
        if s is None:
            return
        ndim = tensors[0].ndim + 1
        if not (len(s) in (1, 3) and _dims(s[0]) == ndim and all(_dims(t) == 0 for t in s[1:])):
            raise ValueError(f"{name}: OneHot's strategy is one tuple of its output's {ndim} dims "
                             f"(the indices' and the depth's), then optionally (), (); got {s}")
        trace.strategies[name] = ((s[0],), self.out_strategy)


class Concat(Primitive):
    """``Concat(axis=0)((x, y, ...))``: 2 to 8 tensors joined along ``axis``."""

    kind, default_name, arity = "concat", "concat", 0

    def __init__(self, axis=0):
        super().__init__()
        self.axis = axis

    def __call__(self, *inputs):
        if len(inputs) != 1 or not isinstance(inputs[0], (tuple, list)):
            self._fail("takes one tuple of tensors: Concat(axis)((x, y))", TypeError)
        return self._joined(tuple(inputs[0]))

    def _joined(self, xs):
        trace = _trace.require("Concat")
        name = trace.node_name(self._name, self.default_name)
        tensors = [_trace.operand(x) for x in xs]
        if not tensors:
            self._fail("takes at least one tensor", TypeError)
        axis = _axis(self, self.axis, tensors[0].ndim)
        self._record_strategy(trace, name, tensors)
        if len(tensors) == 1:
            if self.in_strategy is not None and _split_of(self.in_strategy[0], axis) > 1:
                raise ValueError(f"{name}: strategy {self.in_strategy}: dim {axis} of input 0 is "
                                 "the concat axis and cannot be split")
            return self._identity(trace, name, tensors[0])[0]
        return trace.add("concat", name, tensors, axis=axis)[0]


class Split(Primitive):
    """``Split(axis=0, output_num=1)(x)``: ``output_num`` equal pieces along ``axis`` (a
    tuple)."""

    kind, default_name = "split", "split"

    def __init__(self, axis=0, output_num=1):
        super().__init__()
        self.axis, self.output_num = axis, output_num

    def _attrs(self, tensors, args):
        super()._attrs(tensors, args)
        x = tensors[0]
        axis = _axis(self, self.axis, x.ndim)
        n = self.output_num
        if not isinstance(n, int) or n < 1 or x.shape[axis] % n:
            self._fail(f"output_num={n!r} does not divide dim {axis} ({x.shape[axis]}) of the "
                       f"input {x.shape}")
        return {"axis": axis, "sizes": [x.shape[axis] // n] * n}

    def __call__(self, x):
        out = super().__call__(x)
        return out if isinstance(out, tuple) else (out,)


class Cast(Primitive):
    """``Cast()(x, dtype)``: to ``tessera.float32``, ``float16``, ``bfloat16`` or ``float64``."""

    kind, default_name = "cast", "cast"

    def _attrs(self, tensors, args):
        if len(args) != 1:
            self._fail("takes (x, dtype)", TypeError)
        to = mstype.of(args[0], "Cast")
        if not to.is_float:
            self._fail(f"casts to float types only, not {to.name}", UnsupportedOpError)
        return {"dtype": to.name}


class LayerNorm(Primitive):
    """MindSpore's ``LayerNorm(begin_norm_axis=1, begin_params_axis=1, epsilon=1e-7)(x, gamma,
    beta)`` over the last axis (both axes must name it). Returns ``(y, mean, variance)``; only
    ``y`` may be used (the engine keeps the reciprocal standard deviation, not the variance)."""

    kind, default_name, arity = "layer_norm", "layer_norm", 3

    def __init__(self, begin_norm_axis=1, begin_params_axis=1, epsilon=1e-7):
        super().__init__()
        self.begin_norm_axis, self.begin_params_axis = begin_norm_axis, begin_params_axis
        self.epsilon = float(epsilon)

    def _attrs(self, tensors, args):
        super()._attrs(tensors, args)
        ndim = tensors[0].ndim
        for key in ("begin_norm_axis", "begin_params_axis"):
            axis = getattr(self, key)
            if _axis(self, axis, ndim) != ndim - 1:
                self._fail(f"{key}={axis} is not the last axis of the {ndim}-D input: only the "
                           "last axis is normalised", UnsupportedOpError)
        return {"epsilon": self.epsilon}

    def _emit(self, trace, name, tensors, attrs):
        y = trace.add(self.kind, name, tensors, **attrs)[0]
        cell = trace.cell()
        return (y, *(Unavailable(cell, f"LayerNorm's {what}", "only y is computed for use: the "
                                 "engine's LayerNorm keeps the mean and the reciprocal standard "
                                 "deviation for its gradient only") for what in ("mean",
                                                                               "variance")))


class Dropout(Primitive):
    """``Dropout(keep_prob=0.5, Seed0=0, Seed1=0)(x)`` → ``(y, mask)``; only ``y`` may be used.
    Inverted dropout whose mask is a function of the seed, the step and the element's global
    index. The seed is the site's number in tracing order (1, 2, …) unless ``Seed0`` or
    ``Seed1`` is set (then ``Seed0·2³² + Seed1``)."""

    kind, default_name = "dropout", "dropout"

    def __init__(self, keep_prob=0.5, Seed0=0, Seed1=0):
        super().__init__()
        if not 0 < keep_prob <= 1:
            self._fail(f"keep_prob={keep_prob} is out of range (0, 1]")
        self.keep_prob, self.seeds = float(keep_prob), (int(Seed0), int(Seed1))

    def _attrs(self, tensors, args):
        super()._attrs(tensors, args)
        site = _next_dropout_seed()
        seed = site if self.seeds == (0, 0) else (self.seeds[0] << 32) + self.seeds[1]
        return {"keep_prob": self.keep_prob, "seed": seed}

    def _emit(self, trace, name, tensors, attrs):
        y = trace.add(self.kind, name, tensors, **attrs)[0]
        return (y, Unavailable(trace.cell(), "Dropout's mask", "the engine's Dropout recomputes "
                               "its mask from the seed; it has no mask output"))


def _next_dropout_seed():
    """Counts a Dropout site (one with ``keep_prob=1`` included) and returns its number."""
    trace = _trace.require("Dropout")
    trace.dropouts += 1
    return trace.dropouts


class MaskedFill(Primitive):
    """``MaskedFill()(x, mask, value)``: ``value`` (a Python number, ``-inf`` allowed) where
    ``mask`` (broadcast to ``x``) is nonzero, ``x`` elsewhere."""

    kind, default_name, arity = "masked_fill", "masked_fill", 2

    def _attrs(self, tensors, args):
        if len(args) != 1 or not _is_scalar(args[0]):
            self._fail("takes (x, mask, value) with value a Python number", TypeError)
        return {"value": float(args[0])}


class Triu(Primitive):
    """``Triu(diagonal=0)(x)`` of ``ops.ones(shape)``: the constant upper-triangular mask, 1 where
    ``col - row >= diagonal`` (``Triu(1)`` marks the future positions of causal attention). Of
    any other tensor: not supported (the engine's Triu is a constant)."""

    kind, default_name = "triu", "triu"

    def __init__(self, diagonal=0):
        super().__init__()
        self.diagonal = int(diagonal)

    def _operands(self, name, inputs):
        x = inputs[0]
        if not (isinstance(x, Tensor) and x.ones and x._id is None):
            self._fail("the engine's Triu is a constant: apply it to ops.ones(shape) (not yet "
                       "used by another op)", UnsupportedOpError)
        return [x]

    def _record_strategy(self, trace, name, tensors):
        if self.in_strategy is not None:
            self._fail("a constant Triu takes no strategy: the engine computes each rank's block "
                       "from global positions", UnsupportedOpError)

    def _emit(self, trace, name, tensors, attrs):
        x = tensors[0]
        return trace.add("triu", name, [], shape=list(x.shape), diagonal=self.diagonal)


def _int_dims(shape):
    """``shape`` (an int, or a sequence of ints: a tuple, a list, a 1-d numpy array) as a list
    of Python ints; ``None`` when it is not one."""
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        return [int(shape)]
    if isinstance(shape, (str, bytes)):
        return None
    try:
        dims = list(shape)
    except TypeError:
        return None
    if any(isinstance(d, bool) or not isinstance(d, numbers.Integral) for d in dims):
        return None
    return [int(d) for d in dims]


class Reshape(Primitive):
    """``Reshape()(x, shape)``; one dim of ``shape`` may be -1."""

    kind, default_name = "reshape", "reshape"

    def _attrs(self, tensors, args):
        if len(args) != 1:
            self._fail("Reshape()(x, shape) takes a tensor and a shape", TypeError)
        x, dims = tensors[0], _int_dims(args[0])
        if dims is None:
            self._fail(f"shape must be a tuple of ints, got {args[0]!r}", TypeError)
        shape = dims
        if shape.count(-1) > 1 or any(d < -1 for d in shape):
            self._fail(f"shape {tuple(shape)}: every dim is an int >= 0, except at most one -1 "
                       "(inferred)")
        if shape.count(-1) == 1:
            known = 1
            for d in shape:
                known *= d if d != -1 else 1
            total = 1
            for d in x.shape:
                total *= d
            if known and total % known:
                self._fail(f"shape {tuple(shape)}: the other dims ({known} elements) do not "
                           f"divide the {total} elements of the input {tuple(x.shape)}")
            shape[shape.index(-1)] = total // known if known else 0
        return {"shape": shape}


class Transpose(Primitive):
    """``Transpose()(x, perm)``."""

    kind, default_name = "transpose", "transpose"

    def _attrs(self, tensors, args):
        if len(args) != 1:
            self._fail("Transpose()(x, perm) takes a tensor and a permutation", TypeError)
        return {"perm": [_axis(self, p, tensors[0].ndim) for p in args[0]]}


class SparseSoftmaxCrossEntropyWithLogits(Primitive):
    """Mean softmax cross entropy of ``logits [n, c]`` against int labels ``[n]``
    (``is_grad=False``)."""

    kind, default_name, arity = ("sparse_softmax_cross_entropy",
                                 "sparse_softmax_cross_entropy", 2)

    def __init__(self, is_grad=False):
        super().__init__()
        if is_grad:
            raise ValueError("SparseSoftmaxCrossEntropyWithLogits: is_grad=True is not supported")


class Print(Primitive):
    """MindSpore's ``Print()(*args)``: strings and tensors, printed each time the step runs (on
    each rank its shard of each tensor), as GRAPH_MODE prints them: the strings before a tensor,
    then ``Tensor(shape=[..], dtype=Float32, value=`` and the values in numpy's layout
    (summarised beyond 1000 elements). Each tensor is one ``Print`` node of the graph (the
    identity, no gradient), named after the primitive (``layer1.print``, ``layer1.print_1``, …);
    the strings after the last tensor are printed with it. It returns nothing, as MindSpore's
    does. At least one tensor is needed (a Print of strings alone has no step to run in)."""

    kind, default_name, arity = "print", "print", 0

    def __call__(self, *args):
        from .common.parameter import Parameter
        trace = _trace.require(type(self).__name__)
        texts, groups = [], []
        for arg in args:
            if isinstance(arg, str):
                texts.append(arg)
            elif isinstance(arg, (Tensor, Parameter)):
                groups.append((" ".join(texts), arg))
                texts = []
            else:
                self._fail(f"prints strings and tensors, got a {type(arg).__name__}", TypeError)
        if not groups:
            self._fail("prints at least one tensor (strings alone have no step to run in)",
                       UnsupportedOpError)
        if texts:
            label, last = groups[-1]
            groups[-1] = (label + "\n" + " ".join(texts) if label else " ".join(texts), last)
        for label, value in groups:
            name = trace.node_name(self._name, self.default_name)
            tensor = _trace.operand(value, None, None)
            trace.add(self.kind, name, [tensor], label=label)



# Functional forms (MindSpore 2.x's mindspore.ops functions); each applies a new primitive.

def matmul(input, other):
    """``input @ other``: ``MatMul`` of 2-D operands, else ``BatchMatMul``."""
    return input @ other


def bmm(input, mat2):
    """``BatchMatMul()(input, mat2)``."""
    return BatchMatMul()(input, mat2)


def add(input, other):
    """``Add()(input, other)``."""
    return Add()(input, other)


def sub(input, other):
    """``Sub()(input, other)``."""
    return Sub()(input, other)


def mul(input, other):
    """``Mul()(input, other)``."""
    return Mul()(input, other)


def div(input, other):
    """``RealDiv()(input, other)``."""
    return RealDiv()(input, other)


def neg(input):
    """``Neg()(input)``."""
    return Neg()(input)


def relu(input):
    """``ReLU()(input)``."""
    return ReLU()(input)


def tanh(input):
    """``Tanh()(input)``."""
    return Tanh()(input)


def sigmoid(input):
    """``Sigmoid()(input)``."""
    return Sigmoid()(input)


def silu(input):
    """``SiLU()(input)``: ``input * sigmoid(input)``."""
    return SiLU()(input)


def gelu(input, approximate="none"):
    """GeLU: ``approximate="none"`` the erf form, ``"tanh"`` the tanh approximation."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return GeLU(approximate=approximate == "tanh")(input)


def exp(input):
    """``Exp()(input)``."""
    return Exp()(input)


def log(input):
    """``Log()(input)``."""
    return Log()(input)


def sqrt(x):
    """``Sqrt()(x)``."""
    return Sqrt()(x)


def softmax(input, axis=-1):
    """``Softmax(axis)(input)``."""
    return Softmax(axis)(input)


def log_softmax(logits, axis=-1):
    """``LogSoftmax(axis)(logits)``."""
    return LogSoftmax(axis)(logits)


def _axes(axis):
    return () if axis is None else axis


def sum(input, dim=None, keepdim=False):
    """``ReduceSum(keepdim)(input, dim)`` (every axis when ``dim`` is None)."""
    return ReduceSum(keepdim)(input, _axes(dim))


def mean(input, axis=None, keep_dims=False):
    """``ReduceMean(keep_dims)(input, axis)`` (every axis when ``axis`` is None)."""
    return ReduceMean(keep_dims)(input, _axes(axis))


def amax(input, axis=None, keepdims=False):
    """``ReduceMax(keepdims)(input, axis)`` (every axis when ``axis`` is None)."""
    return ReduceMax(keepdims)(input, _axes(axis))


def gather(input_params, input_indices, axis, batch_dims=0):
    """``Gather(batch_dims)(input_params, input_indices, axis)``."""
    return Gather(batch_dims)(input_params, input_indices, axis)


def one_hot(indices, depth, on_value=1, off_value=0, axis=-1):
    """``OneHot(axis)(indices, depth, on_value, off_value)``."""
    return OneHot(axis)(indices, depth, on_value, off_value)


def concat(tensors, axis=0):
    """``Concat(axis)(tensors)``."""
    return Concat(axis)(tensors)


cat = concat


def split(tensor, split_size_or_sections, axis=0):
    """Pieces of ``split_size_or_sections`` elements each along ``axis`` (an int that divides
    the dim; uneven sections are not supported)."""
    dim = tensor.shape[axis]
    size = split_size_or_sections
    if not isinstance(size, int) or size < 1 or dim % size:
        raise ValueError(f"split: split_size_or_sections={size!r} must be an int dividing dim "
                         f"{axis} ({dim})")
    return Split(axis, dim // size)(tensor)


def cast(input, dtype):
    """``Cast()(input, dtype)``."""
    return Cast()(input, dtype)


def dropout(input, p=0.5, training=True, seed=None):
    """Dropout dropping with probability ``p`` when ``training`` (else ``input``)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise ValueError(f"dropout: p={p!r} is out of range [0, 1) (the probability of "
                         "dropping an element)")
    if not training or p == 0:
        _next_dropout_seed()
        return input
    s = (0, 0) if seed is None else (0, int(seed))
    return Dropout(1 - p, *s)(input)[0]


def masked_fill(input_x, mask, value):
    """``MaskedFill()(input_x, mask, value)``."""
    return MaskedFill()(input_x, mask, value)


def triu(input, diagonal=0):
    """``Triu(diagonal)(input)`` (``input`` from ``ops.ones``)."""
    return Triu(diagonal)(input)


def _fill(shape, dtype, value, ones):
    trace = _trace.require("ones" if ones else "zeros")
    kind = "ones" if ones else "zeros"
    dims = _int_dims(shape)
    if dims is None:
        raise TypeError(f"{kind}: shape must be an int or a tuple of ints, got {shape!r}")
    if any(d < 0 for d in dims):
        raise ValueError(f"{kind}: shape {tuple(dims)} has a negative dim")
    shape = tuple(dims)
    to = mstype.of(dtype or mstype.float32, kind)
    if to != mstype.float32:
        raise UnsupportedOpError(trace.cell(), kind, f"float32 constants only, not {to.name}")
    name = trace.node_name(None, kind)

    def make():
        return trace.add("fill", name, [], shape=list(shape), value=value)[0].id

    out = Tensor.deferred(shape, to, make)
    out.ones = ones
    return out


def ones(shape, dtype=None):
    """A constant of ones (float32); ``Triu`` of it is the engine's constant mask."""
    return _fill(shape, dtype, 1.0, True)


def zeros(shape, dtype=None):
    """A constant of zeros (float32)."""
    return _fill(shape, dtype, 0.0, False)


def reshape(input, shape):
    """``Reshape()(input, shape)``."""
    return Reshape()(input, shape)


def transpose(input, input_perm):
    """``Transpose()(input, input_perm)``."""
    return Transpose()(input, input_perm)


def stop_gradient(value):
    """``StopGradient()(value)``."""
    return StopGradient()(value)
