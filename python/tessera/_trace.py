"""Tracing: ``construct`` runs once on symbolic tensors that record ops into the native graph
builder (``tessera._tessera.NetworkBuilder``). Internal; the public names are in ``tessera.ops``,
``tessera.nn`` and ``tessera.common.initializer``.

Two kinds of traced tensors are *deferred*: their node is added only when an op uses them, so
that the op may fold them in instead (as MindSpore's graph compiler fuses them):

- ``x * c`` with ``c`` a positive Python scalar: ``Softmax`` of it is one ``ScaledSoftmax`` node
  (``softmax(c·x)``), any other use adds the ``Mul`` (and its constant);
- ``ops.ones(shape)``: ``Triu`` of it is one constant ``Triu`` node, any other use adds a
  ``Fill``.
"""

import contextlib
import numbers

from .common import dtype as mstype


class UnsupportedOpError(NotImplementedError):
    """An op that this slice of the Python front end does not support, used in ``construct``.
    Attributes: ``cell`` (the Cell's attribute path and class), ``op`` and ``rule``."""

    def __init__(self, cell, op, rule):
        super().__init__(f"Cell {cell}: op {op} is not supported: {rule}")
        self.cell, self.op, self.rule = cell, op, rule


class _Trace:
    def __init__(self, builder):
        self.builder = builder
        self.cells = []          # (path, class name) of the Cells being traced, innermost last
        self.used = set()        # node names taken
        self.params = {}         # id(Parameter) -> Tensor
        self.strategies = {}     # node name -> (in_strategy, out_strategy)
        self.anchors = []        # (value id, split per dim, what) fixed by shard
        self.param_anchors = []  # (Parameter, strategy, what) from shard's parameter_plan
        self.dropouts = 0        # Dropout sites traced so far (the default seed of the next)
        self.training = True     # False when Model.eval traces: nn.Dropout is the identity
        self.label_ids = {}      # value id -> integer column it is, as given or reshaped
        self.class_uses = []     # (node, classes, column): nodes taking one as class indices

    def cell(self):
        if not self.cells:
            return "<top level> (no Cell)"
        path, cls = self.cells[-1]
        return f"{path or '<root>'} ({cls})"

    def scope(self):
        return self.cells[-1][0] if self.cells else ""

    def unique(self, name):
        base, k = name, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def node_name(self, given, default):
        """``given`` (a primitive's attribute path) or ``<cell path>.<default>``, made unique."""
        scope = self.scope()
        return self.unique(given or (f"{scope}.{default}" if scope else default))

    def add(self, kind, name, inputs, **attrs):
        """Adds node ``name``; returns its outputs as Tensors."""
        ids = [t.id for t in inputs]
        outs = self.builder.op(kind, name, ids, **attrs)
        if ids and self.label_ids:
            if kind == "sparse_softmax_cross_entropy" and len(ids) == 2 \
                    and ids[1] in self.label_ids and inputs[0].shape:
                self.class_uses.append((name, inputs[0].shape[-1], self.label_ids[ids[1]]))
            elif kind == "reshape" and ids[0] in self.label_ids:
                self.label_ids.update((vid, self.label_ids[ids[0]]) for vid, _, _ in outs)
        return [Tensor(vid, shape, dtype) for vid, shape, dtype in outs]

    def constant(self, name, value, like=None):
        """A scalar constant node (``Fill``, shape ``()``) of the network's float type."""
        if like is not None and not mstype.of(like.dtype, name).is_float:
            raise UnsupportedOpError(self.cell(), name, f"a Python scalar ({value!r}) combines "
                                     f"with float tensors only; this one is {like.dtype}")
        return self.add("fill", name, [], shape=[], value=float(value))[0]


_CURRENT = None


def current():
    return _CURRENT


def require(what):
    """The current trace, or the error that ``what`` runs only inside ``construct``."""
    if _CURRENT is None:
        raise RuntimeError(f"{what}: tessera.ops run inside construct, traced by Model.train "
                           "(there is no eager mode yet)")
    return _CURRENT


@contextlib.contextmanager
def tracing(builder):
    global _CURRENT
    outer, _CURRENT = _CURRENT, _Trace(builder)
    try:
        yield _CURRENT
    finally:
        _CURRENT = outer


def _binary(kind, prim, swap=False):
    def method(self, other):
        from . import ops
        from .common.parameter import Parameter
        if not isinstance(other, (Tensor, Parameter, numbers.Real)) or isinstance(other, bool):
            return NotImplemented
        a, b = (other, self) if swap else (self, other)
        return getattr(ops, prim)()(a, b)
    method.__name__ = f"__{'r' if swap else ''}{kind}__"
    method.__doc__ = f"``ops.{prim}`` of the operands (a Python scalar is a constant)."
    return method


class Tensor:
    """A symbolic tensor while ``construct`` is traced: a value of the graph (``id``) with its
    ``shape`` and ``dtype`` (``tessera.float32`` …). ``tessera.ops`` primitives, Cells and the
    operators ``+ - * / @`` and unary ``-`` apply to it; a Python scalar operand is a constant
    (``x * 0.5``)."""

    __slots__ = ("_id", "shape", "dtype", "_make", "scaled", "ones")

    def __init__(self, id, shape, dtype="float32"):
        self._id, self.shape = id, tuple(shape)
        self.dtype = mstype.of(dtype, "Tensor")
        self._make = None    # adds the deferred node, returning its id
        self.scaled = None   # (x, c) when this is the deferred x * c
        self.ones = False    # whether this is the deferred ops.ones(shape)

    @classmethod
    def deferred(cls, shape, dtype, make):
        """A tensor whose node ``make()`` adds when first used (see the module doc)."""
        t = cls(None, shape, dtype)
        t._make = make
        return t

    @property
    def id(self):
        """The graph value's id (adding a deferred tensor's node now)."""
        if self._id is None:
            make, self._make = self._make, None
            self._id = make()
        return self._id

    @property
    def ndim(self):
        """The number of dims."""
        return len(self.shape)

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype!r}, traced)"

    __add__, __radd__ = _binary("add", "Add"), _binary("add", "Add", swap=True)
    __sub__, __rsub__ = _binary("sub", "Sub"), _binary("sub", "Sub", swap=True)
    __mul__, __rmul__ = _binary("mul", "Mul"), _binary("mul", "Mul", swap=True)
    __truediv__ = _binary("truediv", "RealDiv")
    __rtruediv__ = _binary("truediv", "RealDiv", swap=True)

    def __matmul__(self, other):
        """``MatMul`` of 2-D operands, else ``BatchMatMul``."""
        from . import ops
        from .common.parameter import Parameter
        if not isinstance(other, (Tensor, Parameter)):
            return NotImplemented
        return (ops.MatMul() if self.ndim == 2 and len(other.shape) == 2 else ops.BatchMatMul())(
            self, other)

    def __rmatmul__(self, other):
        """``other @ self`` (``other`` a Parameter): ``MatMul`` of 2-D operands, else
        ``BatchMatMul``."""
        from . import ops
        from .common.parameter import Parameter
        if not isinstance(other, Parameter):
            return NotImplemented
        return (ops.MatMul() if self.ndim == 2 and len(other.shape) == 2 else ops.BatchMatMul())(
            other, self)

    def __neg__(self):
        """``ops.Neg``."""
        from . import ops
        return ops.Neg()(self)

    def _unsupported(self, op, rule):
        trace = current()
        cell = trace.cell() if trace else "<not tracing>"
        raise UnsupportedOpError(cell, op, rule)

    def __array__(self, *args, **kwargs):
        self._unsupported("a numpy conversion", "a traced tensor has no value")

    def __bool__(self):
        self._unsupported("control flow on a tensor (bool of a traced tensor)",
                          "construct is traced once; a traced tensor has no value")

    # MindSpore's Tensor methods used in construct (each applies a tessera.ops primitive).

    def reshape(self, *shape):
        """``ops.reshape``: ``x.reshape(2, 3)`` or ``x.reshape((2, 3))``."""
        from . import ops
        return ops.reshape(self, shape[0] if len(shape) == 1 else shape)

    def transpose(self, *axes):
        """``ops.transpose``: ``x.transpose(1, 0)`` or ``x.transpose((1, 0))``; no axes reverses
        the dims."""
        from . import ops
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return ops.transpose(self, axes or tuple(reversed(range(self.ndim))))

    def expand_dims(self, axis):
        """``ops.expand_dims``."""
        from . import ops
        return ops.expand_dims(self, axis)

    def squeeze(self, axis=None):
        """``ops.squeeze``."""
        from . import ops
        return ops.squeeze(self, axis)

    def sum(self, axis=None, dtype=None, keepdims=False, initial=None):
        """``ops.ReduceSum(keepdims)`` over ``axis`` (every axis when None); ``dtype`` and
        ``initial`` other than None are not supported."""
        from . import ops
        if dtype is not None or initial is not None:
            self._unsupported("Tensor.sum", "dtype and initial are not supported (None only)")
        return ops.sum(self, axis, keepdims)

    def mean(self, axis=None, keep_dims=False):
        """``ops.ReduceMean(keep_dims)`` over ``axis`` (every axis when None)."""
        from . import ops
        return ops.mean(self, axis, keep_dims)

    def __pow__(self, exponent):
        """``ops.Pow`` with a Python-number exponent."""
        from . import ops
        return ops.pow(self, exponent)

    def __abs__(self):
        """``ops.Abs``."""
        from . import ops
        return ops.abs(self)


class Unavailable:
    """An output MindSpore's primitive has but the engine's op does not compute (``LayerNorm``'s
    mean and variance, ``Dropout``'s mask): any use is an ``UnsupportedOpError`` naming the Cell,
    the op and the rule."""

    def __init__(self, cell, op, rule):
        self.cell, self.op, self.rule = cell, op, rule

    def error(self):
        """The error a use raises."""
        return UnsupportedOpError(self.cell, self.op, self.rule)

    def _raise(self, *args, **kwargs):
        raise self.error()

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _raise
    __matmul__ = __neg__ = __array__ = __bool__ = _raise

    @property
    def shape(self):
        """Raises: there is no such value."""
        raise self.error()

    dtype = ndim = shape


def operand(x, name=None, like=None):
    """``x`` as a traced tensor: a Tensor, a Parameter (added to the graph at first use) or a
    Python scalar (a constant node ``<name>.value``, when ``name`` is given)."""
    from .common.parameter import Parameter
    trace = current()
    if isinstance(x, Tensor):
        return x
    if isinstance(x, Parameter):
        if id(x) not in trace.params:
            if x.name is None:
                raise ValueError(f"Cell {trace.cell()}: a Parameter that is not a Cell attribute "
                                 "has no name; give it one (Parameter(..., name=...))")
            vid, shape = x._add_to(trace.builder)
            trace.params[id(x)] = Tensor(vid, shape)
        return trace.params[id(x)]
    if isinstance(x, Unavailable):
        raise x.error()
    if name is not None and isinstance(x, numbers.Real) and not isinstance(x, bool):
        return trace.constant(trace.unique(f"{name}.value"), x, like)
    raise UnsupportedOpError(trace.cell(), f"an input of type {type(x).__name__}",
                             "ops take traced tensors, Parameters or (binary arithmetic) "
                             "Python scalars")
