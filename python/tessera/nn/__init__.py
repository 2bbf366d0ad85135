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
parameter, or parameter groups differing in weight decay only): ``SGD``, ``Momentum``, ``Adam``,
``AdamWeightDecay``; learning rates: a number, a list of per-step rates (``warmup_lr``,
``cosine_decay_lr``, ``polynomial_decay_lr``, ``exponential_decay_lr``,
``piecewise_constant_lr``) or a schedule (``WarmUpLR``, ``CosineDecayLR``,
``PolynomialDecayLR``, ``ExponentialDecayLR``). Metrics for
``Model(metrics=...)``: ``Accuracy``, ``Loss``.
"""

from .cell import Cell
from .layers import GELU, Dense, Flatten, ReLU, SequentialCell, Tanh
from .loss import SoftmaxCrossEntropyWithLogits
from .metrics import Accuracy, Loss, Metric
from .optim import SGD, Adam, AdamWeightDecay, Momentum, Optimizer
from .dynamic_lr import (cosine_decay_lr, exponential_decay_lr, piecewise_constant_lr,
                         polynomial_decay_lr, warmup_lr)
from .learning_rate_schedule import (CosineDecayLR, ExponentialDecayLR, LearningRateSchedule,
                                     PolynomialDecayLR, WarmUpLR)
from .wrap import WithLossCell


__all__ = [
    "Accuracy", "Loss", "Metric", "Adam", "AdamWeightDecay", "Cell", "Dense", "Flatten", "GELU", "Momentum", "Optimizer",
    "ReLU", "SGD", "SequentialCell", "SoftmaxCrossEntropyWithLogits", "Tanh", "WithLossCell",
    # learning rates (optim.py's owner)
    "CosineDecayLR", "ExponentialDecayLR", "LearningRateSchedule", "PolynomialDecayLR", "WarmUpLR",
    "cosine_decay_lr", "exponential_decay_lr", "piecewise_constant_lr", "polynomial_decay_lr",
    "warmup_lr",
]
