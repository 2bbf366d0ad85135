"""Tracing: ``construct`` runs once on symbolic tensors that record ops into the native graph
builder (``tessera._tessera.NetworkBuilder``). Internal; the public names are in ``tessera.ops``,
``tessera.nn`` and ``tessera.common.initializer``."""

import contextlib


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
        self.strategies = {}     # node name -> in_strategy

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


_CURRENT = None


def current():
    return _CURRENT


@contextlib.contextmanager
def tracing(builder):
    global _CURRENT
    outer, _CURRENT = _CURRENT, _Trace(builder)
    try:
        yield _CURRENT
    finally:
        _CURRENT = outer


class Tensor:
    """A symbolic tensor while ``construct`` is traced: a value of the graph (``id``) with its
    ``shape`` and ``dtype``. Only ``tessera.ops`` primitives and Cells apply to it."""

    __slots__ = ("id", "shape", "dtype")

    def __init__(self, id, shape, dtype="float32"):
        self.id, self.shape, self.dtype = id, tuple(shape), dtype

    @property
    def ndim(self):
        return len(self.shape)

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, traced)"

    def _unsupported(self, op):
        trace = current()
        cell = trace.cell() if trace else "<not tracing>"
        raise UnsupportedOpError(
            cell, op, "this first slice of tessera.ops supports MatMul, BiasAdd, Add, Sub, Mul, "
            "RealDiv, ReLU, Tanh, GeLU, Softmax, LogSoftmax, Exp, Reshape, Flatten, Transpose "
            "and SparseSoftmaxCrossEntropyWithLogits on traced tensors (issue 34)")

    def __add__(self, other):
        from . import ops
        if isinstance(other, Tensor):
            return ops.Add()(self, other)
        self._unsupported("Add with a Python scalar")

    def __mul__(self, other):
        self._unsupported("Mul (the * operator)")

    def __matmul__(self, other):
        self._unsupported("MatMul (the @ operator; use ops.MatMul)")

    def __sub__(self, other):
        self._unsupported("Sub (the - operator; use ops.Sub)")

    def __truediv__(self, other):
        self._unsupported("RealDiv (the / operator; use ops.RealDiv)")

    def __array__(self, *args, **kwargs):
        self._unsupported("a numpy conversion (a traced tensor has no value)")

    def __bool__(self):
        self._unsupported("control flow on a tensor (bool of a traced tensor)")

    __radd__ = __add__
    __rmul__ = __mul__


def operand(x):
    """``x`` as a traced tensor: a Tensor, or a Parameter (added to the graph at first use)."""
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
    raise UnsupportedOpError(trace.cell(), f"an input of type {type(x).__name__}",
                             "ops take traced tensors or Parameters; constants are not "
                             "supported in this slice")
