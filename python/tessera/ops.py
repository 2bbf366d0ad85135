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
``SparseSoftmaxCrossEntropyWithLogits``, ``ExpandDims()(x, axis)`` and ``Squeeze(axis=())``
(``Reshape`` nodes).

Composites (one primitive, several nodes of the engine's ops, each node named
``<name>.<part>`` but the result ``<name>``; ``.shard(in_strategy)`` applies to every node but
the constants): ``Square`` (``x * x``), ``Abs`` (``relu(x) + relu(-x)``), ``Rsqrt``
(``1 / √x``), ``Maximum``/``Minimum`` (broadcasting, a Python scalar allowed; two ``Select``
nodes, exact, the gradient split evenly at a tie as MindSpore's), ``Pow()(x, exponent)`` (a
Python-number exponent), ``Elu(alpha)``, ``Softplus`` (the stable form), ``Mish``, and the
Tessera addition ``LeakyReLU(alpha)`` (behind ``nn.LeakyReLU`` and ``ops.leaky_relu``;
MindSpore 2.10 has no ``ops.LeakyReLU``). Each has MindSpore's gradient, at the kinks too
(``abs`` 0 at 0, ``leaky_relu`` ``(1 + alpha)/2`` at 0, ``elu`` ``alpha`` at 0, ``softplus``
½ at 0); see each class for its nodes and docs/MINDSPORE_DIFFERENCES.md (difference 18) for
the rounding that differs.

Fused as MindSpore's graph compiler fuses them: ``Softmax`` of ``x * c`` (``c`` a positive Python
scalar) is one ``ScaledSoftmax`` node ``softmax(c·x)``, named after the ``Softmax``.

Functional forms: ``matmul``, ``bmm``, ``add``, ``sub``, ``mul``, ``div``, ``neg``, ``relu``,
``tanh``, ``sigmoid``, ``silu``, ``gelu``, ``exp``, ``log``, ``sqrt``, ``softmax``,
``log_softmax``, ``sum``, ``mean``, ``amax``, ``gather``, ``one_hot``, ``concat``/``cat``,
``split``, ``cast``, ``dropout``, ``masked_fill``, ``triu``, ``ones``, ``zeros``, ``reshape``,
``transpose``, ``stop_gradient``, ``square``, ``abs``, ``rsqrt``, ``maximum``, ``minimum``,
``pow``, ``leaky_relu``, ``elu``, ``softplus(input, beta=1, threshold=20)``, ``mish``,
``expand_dims``/``unsqueeze``, ``squeeze``.

Traced tensors take ``+ - * / @ **`` (a Python-number exponent), unary ``-``, ``abs()`` and the
methods ``reshape``, ``transpose``, ``expand_dims``, ``squeeze``, ``sum``, ``mean`` and the
attributes ``shape``, ``dtype``, ``ndim``.

``Print()(*args)`` prints its strings and tensors each time the step runs (one ``Print`` node per
tensor; see the class).
"""

import builtins
import math
import numbers

from . import _trace
from ._trace import Tensor, Unavailable, UnsupportedOpError
from .common import dtype as mstype

__all__ = [
    "Abs", "Add", "BatchMatMul", "BiasAdd", "Cast", "Concat", "Dropout", "Elu", "Exp",
    "ExpandDims", "Flatten", "Gather", "GeLU", "LayerNorm", "LeakyReLU", "Log", "LogSoftmax",
    "MaskedFill", "MatMul", "Maximum", "Minimum", "Mish", "Mul", "Neg", "OneHot", "Pow",
    "Primitive", "Print", "ReLU", "RealDiv", "ReduceMax", "ReduceMean", "ReduceSum", "Reshape",
    "Rsqrt", "SiLU", "Sigmoid", "Softmax", "Softplus", "SparseSoftmaxCrossEntropyWithLogits",
    "Split", "Sqrt", "Square", "Squeeze", "StopGradient", "Sub", "Tanh", "Tensor", "Transpose",
    "Triu", "UnsupportedOpError",
    "abs", "add", "amax", "bmm", "cast", "cat", "concat", "div", "dropout", "elu", "exp",
    "expand_dims", "gather", "gelu", "leaky_relu", "log", "log_softmax", "masked_fill",
    "matmul", "maximum", "mean", "minimum", "mish", "mul", "neg", "one_hot", "ones", "pow",
    "relu", "reshape", "rsqrt", "sigmoid", "silu", "softmax", "softplus", "split", "sqrt",
    "square", "squeeze", "stop_gradient", "sub", "sum", "tanh", "transpose", "triu",
    "unsqueeze", "zeros",
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


# Composite primitives: one MindSpore primitive as several nodes of the engine's ops, each exact
# or numerically safe, with MindSpore's gradient (also at ties and kinks: see each class).


def _broadcast_shape(prim, a, b):
    """NumPy's broadcast of shapes ``a`` and ``b`` (an error naming the op when they do not
    broadcast)."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        da = a[-i] if i <= len(a) else 1
        db = b[-i] if i <= len(b) else 1
        if da != db and 1 not in (da, db):
            prim._fail(f"the shapes {tuple(a)} and {tuple(b)} do not broadcast")
        out.append(db if da == 1 else da)
    return tuple(reversed(out))


class _Nodes:
    """Adds a composite's nodes: ``<name>.<part>`` (the last, the result, is ``<name>``). When
    the primitive has a strategy, every node gets one: an operand that is one of the primitive's
    inputs gets that input's entry, a scalar constant ``()``, any other value (of the output's
    shape) the output's entry ``out``."""

    def __init__(self, trace, name, inputs, strategy, out_entry):
        self.trace, self.name = trace, name
        self.ins, self.outs = strategy if strategy is not None else (None, None)
        self.entries = {} if self.ins is None else {t.id: s for t, s in zip(inputs, self.ins)}
        self.by_shape = {} if self.ins is None else {t.shape: s for t, s in zip(inputs, self.ins)}
        self.out_entry = out_entry

    def _entry(self, t):
        """An operand's strategy entry: its input's, ``()`` for a scalar, else the output's
        (or, for a value of an input's shape that is not the output's, that input's)."""
        if t.id in self.entries:
            return self.entries[t.id]
        if t.shape == ():
            return ()
        return self.out_entry if self.out_shape == t.shape else self.by_shape[t.shape]

    def add(self, kind, inputs, part=None, **attrs):
        """Adds node ``<name>.<part>`` (``<name>`` when ``part`` is None) of op ``kind``."""
        node = self.name if part is None else self.trace.unique(f"{self.name}.{part}")
        if self.ins is not None:
            strategy = tuple(self._entry(t) for t in inputs)
            self.trace.strategies[node] = (strategy, self.outs if part is None else None)
        return self.trace.add(kind, node, inputs, **attrs)[0]

    def const(self, value, part="value"):
        """A scalar constant node ``<name>.<part>``."""
        return self.trace.constant(self.trace.unique(f"{self.name}.{part}"), value)

    def relu_parts(self, x):
        """``(relu(x), relu(-x))``: nonzero exactly where ``x > 0`` and ``x < 0`` (``-x`` is
        kept as ``last_neg``)."""
        pos = self.add("relu", [x], "pos")
        self.last_neg = self.add("neg", [x], "neg")
        return pos, self.add("relu", [self.last_neg], "negpart")


class _Composite(Primitive):
    """A primitive emitted as several nodes (``_build`` adds them with a ``_Nodes``). A strategy
    ``.shard(in_strategy)`` applies to every node (see ``_Nodes``)."""

    def _out_entry(self, tensors):
        """The strategy entry of the output: the first input's (elementwise ops)."""
        return self.in_strategy[0] if self.in_strategy else None

    def _emit(self, trace, name, tensors, attrs):
        strategy = trace.strategies.pop(name, None)
        nodes = _Nodes(trace, name, tensors, strategy,
                       self._out_entry(tensors) if strategy is not None else None)
        nodes.out_shape = _broadcast_shape(self, *(t.shape for t in tensors)) \
            if len(tensors) == 2 else tensors[0].shape
        return [self._build(nodes, *tensors, **attrs)]


class Square(_Composite):
    """``x * x``: one ``Mul`` node ``<name>`` (gradient ``2·x·dy``)."""

    default_name = "square"

    def _build(self, n, x):
        return n.add("mul", [x, x])


class Abs(_Composite):
    """``|x|``, exact: ``x`` where ``x > 0``, ``-x`` where ``x < 0``, else ``x·0`` (0 at 0, NaN
    for NaN: ``relu(x) + relu(-x)`` would make NaN 0). Nodes ``<name>.pos``, ``<name>.neg``,
    ``<name>.negpart`` (the conditions), ``<name>.zero`` (with its constant), ``<name>.inner``
    and ``<name>`` (``Select`` nodes). Gradient ``sign(x)·dy``, 0 at ``x = 0`` (as MindSpore's
    ``AbsGrad``)."""

    default_name = "abs"

    def _build(self, n, x):
        pos, negpart = n.relu_parts(x)
        neg = n.last_neg
        zero = n.add("mul", [x, n.const(0.0, "zero_value")], "zero")
        return n.add("where", [pos, x, n.add("where", [negpart, neg, zero], "inner")])


class Rsqrt(_Composite):
    """``1 / √x``: nodes ``<name>.sqrt``, ``<name>.value`` (the constant 1) and the ``RealDiv``
    ``<name>`` (gradient ``-dy / (2·x·√x)``, as MindSpore's ``-dy·y³/2`` up to rounding)."""

    default_name = "rsqrt"

    def _build(self, n, x):
        return n.add("div", [n.const(1.0), n.add("sqrt", [x], "sqrt")])


class _MaxMin(_Composite):
    """``Maximum``/``Minimum`` (broadcasting; a Python scalar operand is a constant), exact, with
    MindSpore's gradient: all of ``dy`` to the operand chosen, half to each at a tie. Nodes:
    ``<name>.sub`` (``x - y``), ``<name>.pos``/``<name>.neg``/``<name>.negpart`` (``relu`` of
    ``±(x - y)``: where ``x > y`` and ``x < y``), ``<name>.half_x``, ``<name>.half_y`` and
    ``<name>.mid`` (``x/2 + y/2``, the value at ties, where it is exact), ``<name>.broadcast_x``/
    ``_y`` (a tensor operand of another shape than the output's times the constant of ones
    ``<name>.ones_x``/``_y``), ``<name>.inner`` and ``<name>`` (``Select`` nodes; with a scalar
    ``y`` the inner one is a ``MaskedFill``). A strategy gives one entry per tensor operand
    (``()`` for a scalar); it applies to every node but the constants (the output's split per
    dim is the operands' split of that dim)."""

    arity, scalars, larger = 2, True, True

    def __call__(self, x, y):
        if _is_scalar(x) and not _is_scalar(y):
            x, y = y, x  # symmetric (ties split evenly), the tensor first
        return super().__call__(x, y)

    def _out_entry(self, tensors):
        x, y = tensors
        shape = _broadcast_shape(self, x.shape, y.shape)
        sx, sy = self.in_strategy
        if hasattr(sx, "_tensor_map") or hasattr(sy, "_tensor_map"):
            if x.shape == shape:
                return sx
            if y.shape == shape:
                return sy
            self._fail("a Layout strategy needs an operand of the output's shape; give split "
                       "factors", UnsupportedOpError)
        out = []
        for i in range(1, len(shape) + 1):
            split = 1
            for t, s in ((x, sx), (y, sy)):
                if i <= len(t.shape) and t.shape[-i] == shape[-i]:
                    split = max(split, s[-i])
            out.append(split)
        return tuple(reversed(out))

    def _build(self, n, x, y):
        scalar = y.shape == () and self._scalar_y
        shape = _broadcast_shape(self, x.shape, y.shape)
        big, small = n.relu_parts(n.add("sub", [x, y], "sub"))
        if not self.larger:
            big, small = small, big
        # big: nonzero where x is chosen; small: where y is.
        half = n.const(0.5, "half")
        mid = n.add("add", [n.add("mul", [x, half], "half_x"), n.add("mul", [y, half], "half_y")],
                    "mid")
        if scalar:
            inner = n.add("masked_fill", [mid, small], "inner", value=self._scalar_y[0])
        else:
            inner = n.add("where", [small, self._full(n, y, shape, "broadcast_y"), mid], "inner")
        return n.add("where", [big, self._full(n, x, shape, "broadcast_x"), inner])

    @staticmethod
    def _full(n, t, shape, part):
        """``t`` broadcast to ``shape``: ``t`` times a constant of ones (exact; the engine
        places no forward ``BroadcastTo`` under a strategy)."""
        if t.shape == shape:
            return t
        ones = n.trace.add("fill", n.trace.unique(f"{n.name}.ones_{part[-1]}"), [],
                           shape=list(shape), value=1.0)[0]
        return n.add("mul", [t, ones], part)

    _scalar_y = None

    def _operands(self, name, inputs):
        x, y = inputs
        self._scalar_y = (float(y),) if _is_scalar(y) and not _is_scalar(x) else None
        return super()._operands(name, inputs)


class Maximum(_MaxMin):
    """``max(x, y)`` elementwise (see ``_MaxMin`` for the nodes and the gradient)."""

    default_name = "maximum"


class Minimum(_MaxMin):
    """``min(x, y)`` elementwise (see ``_MaxMin`` for the nodes and the gradient)."""

    default_name, larger = "minimum", False


def _real(prim, what, value):
    """``value``, a finite Python number, as a float (an error naming ``what`` otherwise)."""
    if not _is_scalar(value) or not math.isfinite(value):
        prim._fail(f"{what} must be a finite Python number, got {value!r}", TypeError)
    return float(value)


class LeakyReLU(_Composite):
    """Leaky ReLU (MindSpore's ``nn.LeakyReLU(alpha)``/``ops.leaky_relu``, a Tessera primitive):
    ``x`` where ``x > 0``, ``alpha·x`` where ``x < 0``, exact. Gradient 1 and ``alpha``, and
    ``(1 + alpha)/2`` at ``x = 0`` (MindSpore computes it as ``Maximum(alpha·x, x)``, or
    ``Minimum`` for ``alpha > 1``, whose tie at 0 splits the gradient). Nodes ``<name>.pos``,
    ``<name>.neg``, ``<name>.negpart``, ``<name>.scaled`` (``alpha·x``), ``<name>.mid`` (``x·(1 +
    alpha)/2``, the value 0 at 0) with their constants, ``<name>.inner`` and ``<name>`` (both
    ``Select``)."""

    default_name = "leaky_relu"

    def __init__(self, alpha=0.2):
        super().__init__()
        self.alpha = _real(self, "alpha", alpha)

    def _build(self, n, x):
        pos, neg = n.relu_parts(x)
        scaled = n.add("mul", [x, n.const(self.alpha, "alpha")], "scaled")
        mid = n.add("mul", [x, n.const((1 + self.alpha) / 2, "half")], "mid")
        return n.add("where", [pos, x, n.add("where", [neg, scaled, mid], "inner")])


class Elu(_Composite):
    """ELU (MindSpore's ``ops.Elu(alpha=1.0)``, ``nn.ELU``, ``ops.elu``): ``x`` where ``x > 0``,
    ``alpha·(e^x - 1)`` elsewhere, as ``relu(x) + alpha·(exp(min(x, 0)) - 1)`` (exact but for
    ``e^x - 1``, which loses the digits of ``x`` below about 1e-7 near 0: MindSpore's is
    ``expm1``). Gradient 1 where ``x > 0``, ``alpha·e^x`` elsewhere (``alpha`` at 0, as
    MindSpore's ``EluGrad``). Nodes ``<name>.pos``, ``<name>.min`` (``min(x, 0)``, a
    ``MaskedFill`` of ``x`` with 0 where ``x > 0``: exact, and ``+inf`` stays finite there),
    ``<name>.exp``, ``<name>.expm1`` (with the constant ``<name>.one``), ``<name>.scaled``
    (``alpha ≠ 1``, constant ``<name>.alpha``) and the ``Add`` ``<name>``."""

    default_name = "elu"

    def __init__(self, alpha=1.0):
        super().__init__()
        self.alpha = _real(self, "alpha", alpha)

    def _build(self, n, x):
        pos = n.add("relu", [x], "pos")
        low = n.add("masked_fill", [x, pos], "min", value=0.0)
        em1 = n.add("sub", [n.add("exp", [low], "exp"), n.const(1.0, "one")], "expm1")
        if self.alpha != 1.0:
            em1 = n.add("mul", [em1, n.const(self.alpha, "alpha")], "scaled")
        return n.add("add", [pos, em1])


def _softplus(n, x, beta=1.0, threshold=None):
    """Adds softplus ``log(1 + e^(beta·x)) / beta`` in the stable form ``(b + |b|)/2 + log(1 +
    e^-|b|)`` (``b = beta·x``; gradient ``sigmoid(b)``, ½ at 0 as MindSpore's), and ``x`` where
    ``b > threshold`` (unless ``threshold`` is None); the result is node ``<name>``."""
    b = x if beta == 1.0 else n.add("mul", [x, n.const(beta, "beta")], "scaled")
    pos, neg = n.relu_parts(b)
    mag = n.add("add", [pos, neg], "abs")
    half = n.const(0.5, "half")
    plus = n.add("add", [n.add("mul", [b, half], "half_x"), n.add("mul", [mag, half], "half_abs")],
                 "relu")
    tail = n.add("exp", [n.add("neg", [mag], "negabs")], "exp")
    tail = n.add("log", [n.add("add", [tail, n.const(1.0, "one")], "exp1")], "log")
    parts = [plus, tail]
    if beta != 1.0:
        parts = [n.add("add", parts, "sum"), n.const(beta, "beta_div")]
        if threshold is None:
            return n.add("div", parts)
        sp = n.add("div", parts, "div")
    elif threshold is None:
        return n.add("add", parts)
    else:
        sp = n.add("add", parts, "sum")
    above = n.add("relu", [n.add("sub", [b, n.const(threshold, "threshold")], "over")], "above")
    return n.add("where", [above, x, sp])


class Softplus(_Composite):
    """Softplus ``log(1 + e^x)`` (MindSpore's ``ops.Softplus()``) in the stable form ``(x +
    |x|)/2 + log(1 + e^-|x|)``: nodes ``<name>.pos``, ``<name>.neg``, ``<name>.negpart``,
    ``<name>.abs``, ``<name>.half_x``, ``<name>.half_abs``, ``<name>.relu``, ``<name>.negabs``,
    ``<name>.exp``, ``<name>.exp1``, ``<name>.log`` (with constants) and the ``Add`` ``<name>``.
    Gradient ``sigmoid(x)`` (½ at 0, as MindSpore's). ``ops.softplus(x, beta, threshold)`` adds
    the scaling and ``x`` above the threshold (``<name>.over``, ``<name>.above``, a ``Select``
    ``<name>``)."""

    default_name = "softplus"

    def __init__(self, *, beta=1.0, threshold=None):
        super().__init__()
        self.beta = _real(self, "beta", beta)
        if self.beta == 0:
            self._fail("beta must not be 0 (softplus divides by it)")
        self.threshold = None if threshold is None else _real(self, "threshold", threshold)

    def _build(self, n, x):
        return _softplus(n, x, self.beta, self.threshold)


class Mish(_Composite):
    """Mish ``x·tanh(softplus(x))`` (MindSpore's ``ops.Mish()``, ``nn.Mish``, ``ops.mish``):
    ``Softplus``'s nodes (the last named ``<name>.softplus``), ``<name>.tanh`` and the ``Mul``
    ``<name>``."""

    default_name = "mish"

    def _build(self, n, x):
        sp = _softplus(_Renamed(n, "softplus"), x)
        return n.add("mul", [x, n.add("tanh", [sp], "tanh")])


class _Renamed:
    """A ``_Nodes`` whose result node (``part=None``) is ``<name>.<last>`` instead."""

    def __init__(self, nodes, last):
        self.nodes, self.last = nodes, last

    def add(self, kind, inputs, part=None, **attrs):
        return self.nodes.add(kind, inputs, self.last if part is None else part, **attrs)

    def __getattr__(self, attr):
        return getattr(self.nodes, attr)


class Pow(_Composite):
    """``Pow()(x, exponent)`` with ``exponent`` a Python number (a tensor exponent is not
    supported). ``0``: ones (no gradient), a ``MaskedFill`` ``<name>``; ``1``: ``x``; ``0.5`` and
    ``-0.5``: ``Sqrt`` (and ``1 / ·``); another integer of at most 64 in magnitude: products of
    ``x`` by squaring (``<name>.sq1``, ``<name>.mul1`` …; for a negative one ``1 / ·``); any other
    exponent ``exp(exponent·log x)`` (``<name>.log``, ``<name>.scaled``, ``<name>.exp``), defined
    for ``x > 0`` (NaN for ``x < 0`` as MindSpore's, but its gradient at ``x = 0`` is NaN where
    MindSpore's is ``±inf`` or 0). A strategy: ``((s,),)`` or ``((s,), ())``."""

    default_name = "pow"

    def _attrs(self, tensors, args):
        if len(args) != 1:
            self._fail("takes (x, exponent)", TypeError)
        p = args[0]
        if isinstance(p, (Tensor, Unavailable)) or not _is_scalar(p):
            self._fail(f"the exponent must be a Python number (a tensor exponent is not "
                       f"supported), got {type(p).__name__}", UnsupportedOpError)
        if not math.isfinite(p):
            self._fail(f"the exponent must be finite, got {p!r}")
        return {"exponent": float(p)}

    def _record_strategy(self, trace, name, tensors):
        s = self.in_strategy
        if s is not None and len(s) == 2 and _dims(s[1]) == 0:
            self.in_strategy = s[:1]
            try:
                return super()._record_strategy(trace, name, tensors)
            finally:
                self.in_strategy = s
        return super()._record_strategy(trace, name, tensors)

    def _build(self, n, x, exponent):
        p = exponent
        if p == 0:
            return n.add("masked_fill", [x, n.const(1.0, "one")], value=1.0)
        if p == 1:
            return n.add("reshape", [x], shape=list(x.shape))
        if builtins.abs(p) == 0.5:
            root = n.add("sqrt", [x], "sqrt" if p < 0 else None)
            return root if p > 0 else n.add("div", [n.const(1.0, "one"), root])
        if p == int(p) and builtins.abs(p) <= 64:
            result = _power(n, x, int(builtins.abs(p)), p > 0)
            return result if p > 0 else n.add("div", [n.const(1.0, "one"), result])
        log = n.add("log", [x], "log")
        return n.add("exp", [n.add("mul", [log, n.const(p, "exponent")], "scaled")])


def _power(n, x, k, final):
    """``x^k`` (``k >= 2``) by squaring: nodes ``<name>.sq1``, ``<name>.mul2`` …; the last one is
    ``<name>`` when ``final``."""
    power, result, i = x, None, 0
    last_bit = k.bit_length() - 1
    for bit in range(last_bit + 1):
        i += 1
        if bit:
            done = final and bit == last_bit and result is None
            power = n.add("mul", [power, power], None if done else f"sq{i}")
        if k >> bit & 1:
            if result is None:
                result = power
            else:
                done = final and bit == last_bit
                result = n.add("mul", [result, power], None if done else f"mul{i}")
    return result


class ExpandDims(Primitive):
    """``ExpandDims()(x, axis)``: a dim of 1 inserted at ``axis`` (``-ndim-1 <= axis <= ndim``),
    a ``Reshape`` node."""

    kind, default_name = "reshape", "expand_dims"

    def _attrs(self, tensors, args):
        if len(args) != 1:
            self._fail("takes (x, axis)", TypeError)
        x, axis = tensors[0], args[0]
        if not isinstance(axis, int) or isinstance(axis, bool) or \
                not -x.ndim - 1 <= axis <= x.ndim:
            self._fail(f"axis {axis!r} is out of range for a {x.ndim}-D input (ints in "
                       f"[{-x.ndim - 1}, {x.ndim}])")
        shape = list(x.shape)
        shape.insert(axis % (x.ndim + 1), 1)
        return {"shape": shape}


class Squeeze(Primitive):
    """``Squeeze(axis=())(x)``: the dims of size 1 at ``axis`` (an int or a tuple; ``()`` every
    dim of size 1) removed, a ``Reshape`` node. A dim in ``axis`` that is not 1 is an error, as
    in MindSpore."""

    kind, default_name = "reshape", "squeeze"

    def __init__(self, axis=()):
        super().__init__()
        axes = axis if isinstance(axis, (tuple, list)) else (axis,)
        if any(not isinstance(a, int) or isinstance(a, bool) for a in axes):
            raise TypeError(f"Squeeze: axis must be an int or a tuple of ints, got {axis!r}")
        self.axis = tuple(axes)

    def _attrs(self, tensors, args):
        super()._attrs(tensors, args)
        x = tensors[0]
        dims = {_axis(self, a, x.ndim) for a in self.axis} if self.axis else {
            d for d, size in enumerate(x.shape) if size == 1}
        for d in sorted(dims):
            if x.shape[d] != 1:
                self._fail(f"dim {d} of the input {x.shape} is {x.shape[d]}, not 1: only dims of "
                           "size 1 are squeezed")
        return {"shape": [size for d, size in enumerate(x.shape) if d not in dims]}


def square(input):
    """``Square()(input)``: ``input * input``."""
    return Square()(input)


def abs(input):
    """``Abs()(input)``."""
    return Abs()(input)


def rsqrt(input):
    """``Rsqrt()(input)``: ``1 / √input``."""
    return Rsqrt()(input)


def maximum(input, other):
    """``Maximum()(input, other)``."""
    return Maximum()(input, other)


def minimum(input, other):
    """``Minimum()(input, other)``."""
    return Minimum()(input, other)


def pow(input, exponent):
    """``Pow()(input, exponent)`` (``exponent`` a Python number)."""
    return Pow()(input, exponent)


def leaky_relu(input, alpha=0.2):
    """``LeakyReLU(alpha)(input)``."""
    return LeakyReLU(alpha)(input)


def elu(input_x, alpha=1.0):
    """``Elu(alpha)(input_x)``."""
    return Elu(alpha)(input_x)


def softplus(input, beta=1, threshold=20):
    """``log(1 + e^(beta·input)) / beta``, and ``input`` where ``beta·input > threshold`` (see
    ``Softplus``)."""
    return Softplus(beta=beta, threshold=threshold)(input)


def mish(x):
    """``Mish()(x)``: ``x·tanh(softplus(x))``."""
    return Mish()(x)


def expand_dims(input_x, axis):
    """``ExpandDims()(input_x, axis)``."""
    return ExpandDims()(input_x, axis)


def unsqueeze(input, dim):
    """``ExpandDims()(input, dim)``."""
    return ExpandDims()(input, dim)


def squeeze(input, axis=None):
    """``Squeeze(axis)(input)`` (every dim of size 1 when ``axis`` is None)."""
    return Squeeze(() if axis is None else axis)(input)
