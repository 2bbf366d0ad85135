"""Layers: activations, ``Flatten``, ``Dense``, ``SequentialCell``."""

import math

from .. import ops
from ..common.initializer import HeUniform, Uniform, initializer
from ..common.parameter import Parameter
from .cell import Cell


class ReLU(Cell):
    """``max(x, 0)``; its node is named after the Cell (``fc1.activation``)."""

    _single_op = "relu"

    def __init__(self):
        super().__init__()
        self.relu = ops.ReLU()

    def construct(self, x):
        return self.relu(x)


class Tanh(Cell):
    """``tanh(x)``; its node is named after the Cell."""

    _single_op = "tanh"

    def __init__(self):
        super().__init__()
        self.tanh = ops.Tanh()

    def construct(self, x):
        return self.tanh(x)


class GELU(Cell):
    """GeLU, the tanh approximation (``approximate=True``, MindSpore's default)."""

    _single_op = "gelu"

    def __init__(self, approximate=True):
        super().__init__()
        if not approximate:
            raise ValueError("GELU: approximate=False is not supported yet")
        self.gelu = ops.GeLU()

    def construct(self, x):
        return self.gelu(x)


class Flatten(Cell):
    """``[n, ...]`` → ``[n, prod(...)]`` (``start_dim=1, end_dim=-1`` only)."""

    _single_op = "flatten"

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        if (start_dim, end_dim) != (1, -1):
            raise ValueError("Flatten: only start_dim=1, end_dim=-1 are supported yet")
        self.flatten = ops.Flatten()

    def construct(self, x):
        return self.flatten(x)


_ACTIVATIONS = {"relu": ReLU, "tanh": Tanh, "gelu": GELU}


class Dense(Cell):
    """MindSpore's ``nn.Dense``: ``activation(x·weightᵀ + bias)``, ``weight [out, in]``,
    ``bias [out]``. Nodes: ``matmul`` (``MatMul(transpose_b=True)``, shard it with
    ``dense.matmul.shard(...)``), ``bias_add``, and the activation Cell ``activation``.
    Defaults: weight ``HeUniform(negative_slope=√5)``, bias ``Uniform(1/√in)``."""

    def __init__(self, in_channels, out_channels, weight_init=None, bias_init=None,
                 has_bias=True, activation=None, dtype=None):
        super().__init__()
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.has_bias = bool(has_bias)
        if weight_init is None:
            weight_init = HeUniform(negative_slope=math.sqrt(5))
        self.weight = Parameter(initializer(weight_init, (out_channels, in_channels)))
        self.matmul = ops.MatMul(transpose_b=True)
        if has_bias:
            if bias_init is None:
                bias_init = Uniform(1 / math.sqrt(max(in_channels, 1)))
            self.bias = Parameter(initializer(bias_init, (out_channels,)))
            self.bias_add = ops.BiasAdd()
        if isinstance(activation, str):
            if activation.lower() not in _ACTIVATIONS:
                raise ValueError(f"Dense: activation {activation!r} is not supported "
                                 f"(supported: {sorted(_ACTIVATIONS)})")
            activation = _ACTIVATIONS[activation.lower()]()
        if activation is not None and not isinstance(activation, Cell):
            raise TypeError("Dense: activation must be a Cell, its name or None")
        self.activation = activation

    def construct(self, x):
        y = self.matmul(x, self.weight)
        if self.has_bias:
            y = self.bias_add(y, self.bias)
        if self.activation is not None:
            y = self.activation(y)
        return y


class SequentialCell(Cell):
    """Cells applied in order; they are named ``0``, ``1``, … (MindSpore's names)."""

    def __init__(self, *args):
        super().__init__()
        cells = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
        for i, cell in enumerate(cells):
            if not isinstance(cell, Cell):
                raise TypeError(f"SequentialCell: item {i} is a {type(cell).__name__}, not a Cell")
            setattr(self, str(i), cell)

    def __len__(self):
        return len(self._cells)

    def __getitem__(self, i):
        return list(self._cells.values())[i]

    def construct(self, x):
        for cell in self._cells.values():
            x = cell(x)
        return x
