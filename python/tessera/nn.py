"""``tessera.nn``: MindSpore's ``mindspore.nn`` Cells, optimizers and metrics (issue 34).

A network is a ``Cell`` subclass whose ``construct`` applies ``tessera.ops`` primitives and
other Cells. ``construct`` is not run per step: ``tessera.train.Model.train`` traces it once
on symbolic tensors into Tessera's graph, and the Rust engine runs every step (GRAPH_MODE).
Parameters and ops are named after their attribute path (``fc1.weight``, ``fc1.matmul``), so
strategies set with ``.shard`` attach to the right node.

Cells: ``Cell``, ``Dense(in_channels, out_channels, weight_init=None, bias_init=None,
has_bias=True, activation=None)``, ``ReLU``, ``Tanh``, ``GELU``, ``Flatten``,
``SequentialCell``, ``WithLossCell``, ``SoftmaxCrossEntropyWithLogits(sparse=True,
reduction="mean")``. Optimizers (hyperparameters for the engine's own, applied to every
parameter): ``SGD``, ``Momentum``, ``Adam``, ``AdamWeightDecay``. Metrics for
``Model(metrics=...)``: ``Accuracy``, ``Loss``.
"""

import math

from . import _trace, ops
from .common.initializer import HeUniform, Uniform, initializer
from .common.parameter import Parameter

__all__ = [
    "Accuracy", "Loss", "Metric", "Adam", "AdamWeightDecay", "Cell", "Dense", "Flatten", "GELU", "Momentum", "Optimizer",
    "ReLU", "SGD", "SequentialCell", "SoftmaxCrossEntropyWithLogits", "Tanh", "WithLossCell",
]


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


class Cell:
    """MindSpore's ``nn.Cell``: subclass it, set sub-Cells, Parameters and primitives as
    attributes in ``__init__`` and apply them in ``construct``."""

    _single_op = None  # the attribute of a Cell that is one primitive, named by the Cell's path

    def __init__(self, auto_prefix=True, flags=None):
        object.__setattr__(self, "_cells", {})
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_prims", {})
        object.__setattr__(self, "_auto_prefix", auto_prefix)
        object.__setattr__(self, "_path", "")

    def __setattr__(self, name, value):
        if "_cells" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}: call super().__init__() before setting "
                                 "attributes")
        for table in (self._cells, self._params, self._prims):
            table.pop(name, None)
        if isinstance(value, Cell):
            self._cells[name] = value
        elif isinstance(value, Parameter):
            self._params[name] = value
        elif isinstance(value, ops.Primitive):
            self._prims[name] = value
        object.__setattr__(self, name, value)

    def construct(self, *inputs):
        """The forward computation; subclasses define it."""
        raise NotImplementedError(f"{type(self).__name__} defines no construct")

    def _name_tree(self, prefix=""):
        """Names every Parameter and primitive below this Cell after its attribute path."""
        object.__setattr__(self, "_path", prefix)
        for attr, p in self._params.items():
            if p.name is None or getattr(p, "_auto_named", False):
                p.name = _join(prefix, attr)
                p._auto_named = True
        for attr, prim in self._prims.items():
            prim._name = prefix if (attr == self._single_op and prefix) else _join(prefix, attr)
        for attr, cell in self._cells.items():
            cell._name_tree(_join(prefix, attr) if self._auto_prefix else prefix)

    def cells_and_names(self, cells=None, name_prefix=""):
        """This Cell and every Cell below it with its attribute path."""
        yield name_prefix, self
        for attr, cell in self._cells.items():
            yield from cell.cells_and_names(name_prefix=_join(name_prefix, attr))

    def name_cells(self):
        """The direct sub-Cells by attribute name."""
        return dict(self._cells)

    def parameters_and_names(self, name_prefix="", expand=True):
        """Every Parameter below this Cell with its name."""
        self._name_tree(name_prefix)
        seen = set()
        for _, cell in self.cells_and_names():
            for p in cell._params.values():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p.name, p

    def get_parameters(self, expand=True):
        """Every Parameter below this Cell."""
        return [p for _, p in self.parameters_and_names()]

    def trainable_params(self, recurse=True):
        """The trainable Parameters (every Parameter in this slice)."""
        return [p for p in self.get_parameters() if p.requires_grad]

    def __call__(self, *inputs):
        trace = _trace.current()
        if trace is None:
            raise RuntimeError(f"{type(self).__name__}: Cells run inside Model.train, which traces "
                               "construct once (there is no eager mode yet)")
        trace.cells.append((self._path, type(self).__name__))
        try:
            return self.construct(*inputs)
        finally:
            trace.cells.pop()


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


class SoftmaxCrossEntropyWithLogits(Cell):
    """MindSpore's loss Cell; this slice supports ``sparse=True, reduction="mean"`` (int labels,
    the batch mean), one node ``<path>.sparse_softmax_cross_entropy``."""

    def __init__(self, sparse=False, reduction="none"):
        super().__init__()
        if not sparse or reduction != "mean":
            raise ValueError("SoftmaxCrossEntropyWithLogits: only sparse=True, reduction='mean' "
                             "are supported yet")
        self.sparse_softmax_cross_entropy = ops.SparseSoftmaxCrossEntropyWithLogits()

    def construct(self, logits, labels):
        return self.sparse_softmax_cross_entropy(logits, labels)


class WithLossCell(Cell):
    """``loss_fn(backbone(data), label)``. Its own name adds no prefix (MindSpore's
    ``auto_prefix=False``): the backbone's parameters keep their names (``fc1.weight``)."""

    def __init__(self, backbone, loss_fn):
        super().__init__(auto_prefix=False)
        self._backbone = backbone
        self._loss_fn = loss_fn

    def construct(self, data, label):
        return self._loss_fn(self._backbone(data), label)

    @property
    def backbone_network(self):
        """The backbone."""
        return self._backbone


class Optimizer:
    """Base of the optimizers: the engine's optimizer by MindSpore's class name and its
    hyperparameters. Every parameter is updated by the same rule (parameter groups and
    learning-rate schedules are not supported yet: ``learning_rate`` is a number)."""

    def __init__(self, learning_rate, parameters, weight_decay=0.0, loss_scale=1.0):
        if isinstance(parameters, (list, tuple)) and parameters and isinstance(parameters[0], dict):
            raise ValueError(f"{type(self).__name__}: parameter groups are not supported yet")
        if not isinstance(learning_rate, (int, float)):
            raise ValueError(f"{type(self).__name__}: learning_rate must be a number in this "
                             "slice (schedules are not supported yet)")
        if loss_scale != 1.0:
            raise ValueError(f"{type(self).__name__}: loss_scale is not supported yet")
        self.parameters = list(parameters)
        self.learning_rate = float(learning_rate)
        self.weight_decay = float(weight_decay)

    def _engine_args(self):
        return {"optimizer": type(self).__name__, "learning_rate": self.learning_rate,
                "weight_decay": self.weight_decay}


class SGD(Optimizer):
    """MindSpore's ``nn.SGD``; with ``momentum > 0`` it is the engine's Momentum rule
    (``dampening=0`` only)."""

    def __init__(self, params, learning_rate=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, loss_scale=1.0):
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        if dampening != 0.0:
            raise ValueError("SGD: dampening is not supported yet")
        self.momentum, self.nesterov = float(momentum), bool(nesterov)

    def _engine_args(self):
        args = super()._engine_args()
        if self.momentum > 0 or self.nesterov:
            args.update(optimizer="Momentum", momentum=self.momentum, use_nesterov=self.nesterov)
        return args


class Momentum(Optimizer):
    """MindSpore's ``nn.Momentum``."""

    def __init__(self, params, learning_rate, momentum, weight_decay=0.0, loss_scale=1.0,
                 use_nesterov=False):
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        self.momentum, self.use_nesterov = float(momentum), bool(use_nesterov)

    def _engine_args(self):
        args = super()._engine_args()
        args.update(momentum=self.momentum, use_nesterov=self.use_nesterov)
        return args


class Adam(Optimizer):
    """MindSpore's ``nn.Adam`` (bias-corrected)."""

    def __init__(self, params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                 use_locking=False, use_nesterov=False, weight_decay=0.0, loss_scale=1.0,
                 use_amsgrad=False):
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        if use_nesterov or use_amsgrad:
            raise ValueError("Adam: use_nesterov and use_amsgrad are not supported yet")
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)

    def _engine_args(self):
        args = super()._engine_args()
        args.update(beta1=self.beta1, beta2=self.beta2, eps=self.eps)
        return args


class AdamWeightDecay(Adam):
    """MindSpore's ``nn.AdamWeightDecay`` (decoupled weight decay, no bias correction)."""

    def __init__(self, params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-6,
                 weight_decay=0.0):
        super().__init__(params, learning_rate, beta1, beta2, eps, weight_decay=weight_decay)



class Metric:
    """Base of the metrics ``Model(..., metrics={name: metric})`` evaluates in ``Model.eval``
    (computed there from the network's outputs; ``update``/``eval`` are not supported yet)."""

    _kind = None


class Accuracy(Metric):
    """MindSpore's ``nn.Accuracy(eval_type='classification')``: the fraction of samples whose
    highest class score is the label's."""

    _kind = "accuracy"

    def __init__(self, eval_type="classification"):
        if eval_type != "classification":
            raise ValueError("Accuracy: only eval_type='classification' is supported yet")
        self.eval_type = eval_type


class Loss(Metric):
    """MindSpore's ``nn.Loss()``: here the mean softmax cross entropy of the outputs and the
    labels (the loss of ``SoftmaxCrossEntropyWithLogits(sparse=True, reduction='mean')``)."""

    _kind = "loss"
