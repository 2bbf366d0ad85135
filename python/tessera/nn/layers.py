"""Layers: activations (``ReLU``, ``Tanh``, ``Sigmoid``, ``SiLU``, ``GELU``, ``LeakyReLU``,
``ELU``, ``Mish``), ``Identity``, ``Softmax``,
``Flatten``, ``Dense``, ``Dropout``, ``LayerNorm``, ``Embedding``, and the containers
``SequentialCell`` and ``CellList``."""

import math

from .. import _checks, _trace, ops
from ..common import dtype as mstype
from ..common.initializer import HeUniform, Normal, Uniform, initializer
from ..common.parameter import Parameter
from .cell import Cell


def _float32_only(cell, dtype):
    """Parameters are float32 in this slice: another ``dtype`` is an error naming the Cell."""
    if dtype != mstype.float32:
        raise ValueError(f"{cell}: dtype {dtype!r} is not supported (parameters are float32)")


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


class Sigmoid(Cell):
    """``1 / (1 + e^-x)``; its node is named after the Cell."""

    _single_op = "sigmoid"

    def __init__(self):
        super().__init__()
        self.sigmoid = ops.Sigmoid()

    def construct(self, x):
        return self.sigmoid(x)


class SiLU(Cell):
    """``x * sigmoid(x)`` (MindSpore's ``nn.SiLU``): nodes ``<cell>.sigmoid`` and the ``Mul``
    ``<cell>`` (see ``ops.SiLU``; shard them with ``silu.silu.shard(...)``)."""

    _single_op = "silu"

    def __init__(self):
        super().__init__()
        self.silu = ops.SiLU()

    def construct(self, x):
        return self.silu(x)


class GELU(Cell):
    """GeLU: the tanh approximation (``approximate=True``, MindSpore's default) or the exact erf
    form (``approximate=False``); its node is named after the Cell."""

    _single_op = "gelu"

    def __init__(self, approximate=True):
        super().__init__()
        self.gelu = ops.GeLU(approximate=approximate)

    def construct(self, x):
        return self.gelu(x)


class Softmax(Cell):
    """MindSpore's ``nn.Softmax(axis=-1)`` (the last axis); its node is named after the Cell."""

    _single_op = "softmax"

    def __init__(self, axis=-1):
        super().__init__()
        self.softmax = ops.Softmax(axis)

    def construct(self, x):
        return self.softmax(x)


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


class LeakyReLU(Cell):
    """MindSpore's ``nn.LeakyReLU(alpha=0.2)``: ``x`` where ``x > 0``, ``alpha·x`` elsewhere
    (gradient ``(1 + alpha)/2`` at 0, as MindSpore's); see ``ops.LeakyReLU`` for its nodes,
    named after the Cell (shard them with ``cell.leaky_relu.shard(...)``)."""

    _single_op = "leaky_relu"

    def __init__(self, alpha=0.2):
        super().__init__()
        self.alpha = alpha
        self.leaky_relu = ops.LeakyReLU(alpha)

    def construct(self, x):
        return self.leaky_relu(x)


class ELU(Cell):
    """MindSpore's ``nn.ELU(alpha=1.0)``: ``x`` where ``x > 0``, ``alpha·(e^x - 1)`` elsewhere;
    see ``ops.Elu`` for its nodes, named after the Cell (shard them with
    ``cell.elu.shard(...)``)."""

    _single_op = "elu"

    def __init__(self, alpha=1.0):
        super().__init__()
        self.elu = ops.Elu(alpha)

    def construct(self, x):
        return self.elu(x)


class Mish(Cell):
    """MindSpore's ``nn.Mish()``: ``x·tanh(softplus(x))``; see ``ops.Mish`` for its nodes,
    named after the Cell (shard them with ``cell.mish.shard(...)``)."""

    _single_op = "mish"

    def __init__(self):
        super().__init__()
        self.mish = ops.Mish()

    def construct(self, x):
        return self.mish(x)


class Identity(Cell):
    """MindSpore's ``nn.Identity()``: its input itself (no node)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def construct(self, x):
        return x


_ACTIVATIONS = {"relu": ReLU, "tanh": Tanh, "gelu": GELU, "sigmoid": Sigmoid, "silu": SiLU,
                "leakyrelu": LeakyReLU, "elu": ELU, "mish": Mish}


class Dense(Cell):
    """MindSpore's ``nn.Dense``: ``activation(x·weightᵀ + bias)``, ``weight [out, in]``,
    ``bias [out]``. Nodes: ``matmul`` (``MatMul(transpose_b=True)``, shard it with
    ``dense.matmul.shard(...)``), ``bias_add``, and the activation Cell ``activation``.
    Defaults: weight ``HeUniform(negative_slope=√5)``, bias ``Uniform(1/√in)``."""

    def __init__(self, in_channels, out_channels, weight_init=None, bias_init=None,
                 has_bias=True, activation=None, dtype=mstype.float32):
        super().__init__()
        _float32_only("Dense", dtype)
        in_channels = _checks.positive_int_arg(in_channels, "Dense", "in_channels")
        out_channels = _checks.positive_int_arg(out_channels, "Dense", "out_channels")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.has_bias = bool(has_bias)
        if weight_init is None:
            weight_init = HeUniform(negative_slope=math.sqrt(5))
        self.weight = Parameter(initializer(weight_init, (out_channels, in_channels)))
        self.matmul = ops.MatMul(transpose_b=True)
        if has_bias:
            if bias_init is None:
                bias_init = Uniform(1 / math.sqrt(max(in_channels, 1)))
            self.bias = Parameter(initializer(bias_init, (out_channels,)))
            self.bias_add = ops.BiasAdd(data_format="NHWC")  # the last dim, as Dense's 2-D bias
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


class CellList(Cell):
    """MindSpore's ``nn.CellList(args=None)``: a list of Cells named ``0``, ``1``, … (applied by
    the owner's ``construct``, which iterates over it)."""

    def __init__(self, args=None, **kwargs):
        super().__init__()
        for cell in args or ():
            self.append(cell)

    def append(self, cell):
        """Adds ``cell`` at the end."""
        if not isinstance(cell, Cell):
            raise TypeError(f"CellList: item {len(self)} is a {type(cell).__name__}, not a Cell")
        setattr(self, str(len(self)), cell)

    def extend(self, cells):
        """Adds every Cell of ``cells`` at the end."""
        for cell in cells:
            self.append(cell)
        return self

    def __len__(self):
        return len(self._cells)

    def __getitem__(self, i):
        return list(self._cells.values())[i]

    def __iter__(self):
        return iter(list(self._cells.values()))

    def construct(self, *inputs):
        """A CellList is not called: its owner applies its Cells."""
        raise TypeError("CellList: a CellList has no construct; iterate over it in the owner's "
                        "construct")


class Dropout(Cell):
    """MindSpore's ``nn.Dropout(keep_prob=None, p=None)``: drops with probability ``p`` (default
    0.5; or ``1 - keep_prob``) and scales the kept elements by ``1/(1 - p)``. With ``p = 0``, and
    in ``Model.eval``, it is the identity (no node). Its node is named after the Cell; its seed is
    its site's number in tracing order (see ``ops.Dropout``)."""

    _single_op = "dropout"

    def __init__(self, keep_prob=0.5, p=None, dtype=mstype.float32):
        super().__init__()
        _float32_only("Dropout", dtype)
        if p is None:
            p = 1 - keep_prob
        if not 0 <= p < 1:
            raise ValueError(f"Dropout: p={p} is out of range [0, 1)")
        self.p = float(p)
        self.dropout = ops.Dropout(1 - self.p) if self.p > 0 else None

    def construct(self, x):
        trace = _trace.require("Dropout")
        if self.dropout is None or not trace.training:
            ops._next_dropout_seed()
            return x
        return self.dropout(x)[0]


def _last_axis(cell, what, axis, ndim):
    """Checks that ``axis`` names the last of ``ndim`` dims (an error naming the Cell)."""
    if not isinstance(axis, int) or not -ndim <= axis < ndim or axis % ndim != ndim - 1:
        raise _trace.UnsupportedOpError(_trace.require(cell).cell(), cell,
                                        f"{what}={axis} is not the last axis of the {ndim}-D "
                                        "input: only the last axis is normalised")


class LayerNorm(Cell):
    """MindSpore's ``nn.LayerNorm(normalized_shape, begin_norm_axis=-1, begin_params_axis=-1,
    gamma_init='ones', beta_init='zeros', epsilon=1e-7)`` over the last axis (``normalized_shape``
    one dim). Parameters ``gamma`` and ``beta``, node ``layer_norm``."""

    def __init__(self, normalized_shape, begin_norm_axis=-1, begin_params_axis=-1,
                 gamma_init="ones", beta_init="zeros", epsilon=1e-7, dtype=mstype.float32):
        super().__init__()
        _float32_only("LayerNorm", dtype)
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(
            normalized_shape)
        if len(shape) != 1:
            raise ValueError(f"LayerNorm: normalized_shape {normalized_shape} must be one dim "
                             "(only the last axis is normalised)")
        self.normalized_shape = shape
        self.begin_norm_axis, self.begin_params_axis = begin_norm_axis, begin_params_axis
        self.gamma = Parameter(initializer(gamma_init, shape))
        self.beta = Parameter(initializer(beta_init, shape))
        self.layer_norm = ops.LayerNorm(-1, -1, epsilon)

    def construct(self, x):
        for what in ("begin_norm_axis", "begin_params_axis"):
            _last_axis("LayerNorm", what, getattr(self, what), x.ndim)
        return self.layer_norm(x, self.gamma, self.beta)[0]


class Embedding(Cell):
    """MindSpore's ``nn.Embedding(vocab_size, embedding_size, use_one_hot=False,
    embedding_table='normal', dtype=int32, padding_idx=None)``: rows of ``embedding_table
    [vocab_size, embedding_size]`` (``'normal'``: ``Normal(0.01)``) at integer ids. Node
    ``gather`` (a lookup), or with ``use_one_hot`` ``one_hot`` and ``matmul``."""

    def __init__(self, vocab_size, embedding_size, use_one_hot=False, embedding_table="normal",
                 dtype=mstype.float32, padding_idx=None):
        super().__init__()
        _float32_only("Embedding", dtype)
        if padding_idx is not None:
            raise ValueError("Embedding: padding_idx is not supported yet")
        if isinstance(embedding_table, str) and embedding_table.lower() == "normal":
            embedding_table = Normal(0.01)
        self.vocab_size = _checks.positive_int_arg(vocab_size, "Embedding", "vocab_size")
        self.embedding_size = _checks.positive_int_arg(embedding_size, "Embedding",
                                                       "embedding_size")
        self.use_one_hot = bool(use_one_hot)
        self.embedding_table = Parameter(initializer(embedding_table,
                                                     (self.vocab_size, self.embedding_size)))
        if self.use_one_hot:
            self.one_hot = ops.OneHot()
            self.matmul = ops.MatMul()
        else:
            self.gather = ops.Gather()

    def construct(self, ids):
        if self.use_one_hot:
            return self.matmul(self.one_hot(ids, self.vocab_size, 1.0, 0.0),
                               self.embedding_table)
        return self.gather(self.embedding_table, ids, 0)
