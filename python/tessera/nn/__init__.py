"""``tessera.nn``: MindSpore's ``mindspore.nn`` Cells, optimizers and metrics (issue 34).

A network is a ``Cell`` subclass whose ``construct`` applies ``tessera.ops`` primitives and
other Cells. ``construct`` is not run per step: ``tessera.train.Model.train`` traces it once
on symbolic tensors into Tessera's graph, and the Rust engine runs every step (GRAPH_MODE).
Parameters and ops are named after their attribute path (``fc1.weight``, ``fc1.matmul``), so
strategies set with ``.shard`` attach to the right node.

Cells: ``Cell``, ``Dense(in_channels, out_channels, weight_init=None, bias_init=None,
has_bias=True, activation=None)``, ``ReLU``, ``Tanh``, ``Sigmoid``, ``SiLU`` (``x * sigmoid(x)``),
``GELU(approximate=True)``, ``LeakyReLU(alpha=0.2)``, ``ELU(alpha=1.0)``, ``Mish``, ``Identity``,
``Softmax(axis=-1)``, ``Flatten``, ``Dropout(keep_prob=None, p=None)``,
``LayerNorm(normalized_shape, begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-7)``,
``Embedding(vocab_size, embedding_size, use_one_hot=False, embedding_table='normal')``,
``SequentialCell``, ``CellList``, ``WithLossCell``, ``TrainOneStepCell`` (for ``Model``).
Losses:
``SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")``,
``CrossEntropyLoss(reduction="mean")`` (int class labels), ``MSELoss(reduction="mean")``.
Optimizers (hyperparameters for the engine's own, applied to every parameter, or parameter
groups differing in weight decay only): ``SGD``, ``Momentum``, ``Adam`` (with
``use_nesterov`` or ``use_amsgrad``), ``AdamWeightDecay``, ``Lamb``;
learning rates: a number, a list of per-step rates (``warmup_lr``, ``cosine_decay_lr``,
``polynomial_decay_lr``, ``exponential_decay_lr``, ``piecewise_constant_lr``) or a schedule
(``WarmUpLR``, ``CosineDecayLR``, ``PolynomialDecayLR``, ``ExponentialDecayLR``). Metrics for
``Model(metrics=...)``: ``Accuracy``, ``Loss``.
"""

from .cell import Cell
from .layers import (GELU, CellList, Dense, Dropout, Embedding, Flatten, LayerNorm, ReLU,
                     SequentialCell, Sigmoid, SiLU, Softmax, Tanh)
from .layers import ELU, Identity, LeakyReLU, Mish
from .loss import CrossEntropyLoss, MSELoss, SoftmaxCrossEntropyWithLogits
from .metrics import Accuracy, Loss, Metric
from .optim import SGD, Adam, AdamWeightDecay, Lamb, Momentum, Optimizer
from .dynamic_lr import (cosine_decay_lr, exponential_decay_lr, piecewise_constant_lr,
                         polynomial_decay_lr, warmup_lr)
from .learning_rate_schedule import (CosineDecayLR, ExponentialDecayLR, LearningRateSchedule,
                                     PolynomialDecayLR, WarmUpLR)
from .wrap import TrainOneStepCell, WithLossCell
from . import utils
from ..parallel.nn import GradAccumulation, MicroBatchInterleaved, Pipeline, PipelineGradReducer


__all__ = [
    "Accuracy", "Loss", "Metric", "Adam", "AdamWeightDecay", "Cell", "Dense", "Flatten", "GELU", "Momentum", "Optimizer",
    "Lamb",
    "ELU", "Identity", "LeakyReLU", "Mish",
    "ReLU", "SGD", "SequentialCell", "Sigmoid", "SiLU", "SoftmaxCrossEntropyWithLogits", "Tanh",
    "TrainOneStepCell",
    "WithLossCell",
    "CellList", "CrossEntropyLoss", "Dropout", "Embedding", "LayerNorm", "MSELoss", "Softmax",
    "GradAccumulation", "MicroBatchInterleaved", "Pipeline", "PipelineGradReducer", "utils",
    "CosineDecayLR", "ExponentialDecayLR", "LearningRateSchedule", "PolynomialDecayLR", "WarmUpLR",
    "cosine_decay_lr", "exponential_decay_lr", "piecewise_constant_lr", "polynomial_decay_lr",
    "warmup_lr",
]


def __getattr__(name):
    """MindSpore's cells the engine cannot run (``Conv2d``, ``LSTM``, …) are an
    ``AttributeError`` saying why; other absent names the usual one."""
    from .._missing import NN, missing_name
    missing_name(__name__, name, NN, __all__)
