"""Tessera from Python.

- ``tessera.parallel``: ``mindspore.parallel``'s distributed-checkpoint and ``Layout`` tools
  under their MindSpore names and signatures (``from tessera import parallel as ms_parallel``),
  plus ``reshard_plan``, ``layout_slices`` and ``verify_checkpoint``.
- ``tessera.train(config, devices=...)`` trains as ``tessera train`` does and returns the
  metrics; ``tessera.plan(config, devices=...)`` returns the parallel plan as a dict.
- Your own network with MindSpore's API (issue 34): ``tessera.nn`` (``Cell``
  with ``construct``, ``Dense``, ``ReLU``, ``Flatten``, ``SequentialCell``, ``WithLossCell``,
  ``SoftmaxCrossEntropyWithLogits``, optimizers ``SGD``, ``Momentum``, ``Adam``,
  ``AdamWeightDecay``, metrics ``Accuracy``, ``Loss``), ``tessera.ops`` (primitives with
  ``.shard``), ``tessera.dataset`` (``NumpySlicesDataset``, ``MnistDataset``, ``map`` with
  ``vision`` and ``transforms`` operations), ``tessera.train`` (``Model`` with ``train`` and
  ``eval``, ``Callback``, ``LossMonitor``, ``TimeMonitor``; the
  module is also the callable ``tessera.train(config)``), ``tessera.Parameter``,
  ``tessera.common.initializer``, the dtypes ``tessera.float32``, ``float16``, ``bfloat16``,
  ``float64``, ``int32``, ``int64``, ``set_context``, ``set_auto_parallel_context`` (the device
  count), ``get_auto_parallel_context`` and ``set_seed``; learning-rate schedules, parameter
  groups, ``tessera.mint.optim.AdamW``,
  ``GeneratorDataset``, ``ModelCheckpoint``, ``load_checkpoint``, ``load_param_into_net``,
  ``save_checkpoint`` and ``tessera.Tensor`` (values for ``Parameter``);
  ``tessera.communication`` (``init``, ``get_rank``, ``get_group_size``: one process per rank
  under ``tessera launch --nproc N -- python3 script.py``),
  ``tessera.parallel.auto_parallel.AutoParallel`` with its switches, ``tessera.parallel.nn``
  (``Pipeline``, ``PipelineGradReducer``, ``GradAccumulation``, ``MicroBatchInterleaved``),
  ``shard`` with ``Layout``s and ``out_strategy``, ``ops.Print``; MindSpore's top-level names
  (``tessera.Model``, ``tessera.load_distributed_checkpoint``, ``transform_checkpoints``, …),
  ``ParallelMode`` and the older ``tessera.context``. ``construct`` is traced once
  into Tessera's graph; the Rust engine runs every step. See docs/PYTHON.md, "Your own
  network" and "One process per rank".

Errors name their culprit: ``CheckpointError`` (a ``ValueError``), ``CheckpointIOError`` (an
``OSError``) and ``ConfigError`` (a ``ValueError``) carry ``file``, ``tensor`` and ``rule``;
``tessera.ops.UnsupportedOpError`` names the Cell, the op and the rule.
"""

from importlib.metadata import PackageNotFoundError, version

from . import parallel
from ._context import (GRAPH_MODE, PYNATIVE_MODE, ParallelMode, get_auto_parallel_context,
                       get_seed, reset_auto_parallel_context, set_auto_parallel_context,
                       set_context, set_seed)
from ._tessera import CheckpointError, CheckpointIOError, ConfigError
from ._training import plan
from . import common, communication, dataset, nn, ops
from . import mint
from . import train  # the module tessera.train, callable as tessera.train(config, ...)
from .common import Parameter, Tensor
from .parallel import shard
from .common.dtype import bfloat16, float16, float32, float64, int32, int64
from .train.checkpoint import load_checkpoint, load_param_into_net, save_checkpoint
from . import context
# MindSpore's top-level names for the same things (``mindspore.Model``,
# ``mindspore.load_distributed_checkpoint``, ...), and the 2.x names of the conversions:
# ``transform_checkpoints``, ``transform_checkpoint_by_rank`` and ``rank_list_for_transform``
# have ``convert_checkpoints``', ``convert_checkpoint_by_rank``'s and
# ``rank_list_for_convert``'s parameters and are those functions.
from .train.callback import Callback, LossMonitor, RunContext, TimeMonitor
from .train.checkpoint import CheckpointConfig, ModelCheckpoint
from .train.model import Model
from .parallel import (build_searched_strategy, load_distributed_checkpoint,
                       load_segmented_checkpoints, merge_pipeline_strategys,
                       merge_sliced_parameter, restore_group_info_list)
from .parallel import convert_checkpoint_by_rank as transform_checkpoint_by_rank
from .parallel import convert_checkpoints as transform_checkpoints
from .parallel import rank_list_for_convert as rank_list_for_transform

try:
    __version__ = version("tessera-parallel")
except PackageNotFoundError:  # imported from a source tree without installing
    __version__ = "0+unknown"

__all__ = [
    "Callback",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointIOError",
    "ConfigError",
    "GRAPH_MODE",
    "LossMonitor",
    "Model",
    "ModelCheckpoint",
    "PYNATIVE_MODE",
    "Parameter",
    "ParallelMode",
    "RunContext",
    "Tensor",
    "TimeMonitor",
    "bfloat16",
    "build_searched_strategy",
    "common",
    "communication",
    "context",
    "dataset",
    "float16",
    "float32",
    "float64",
    "get_auto_parallel_context",
    "get_seed",
    "int32",
    "int64",
    "load_checkpoint",
    "load_distributed_checkpoint",
    "load_param_into_net",
    "load_segmented_checkpoints",
    "merge_pipeline_strategys",
    "merge_sliced_parameter",
    "mint",
    "nn",
    "ops",
    "parallel",
    "plan",
    "rank_list_for_transform",
    "reset_auto_parallel_context",
    "restore_group_info_list",
    "save_checkpoint",
    "set_auto_parallel_context",
    "set_context",
    "set_seed",
    "shard",
    "train",
    "transform_checkpoint_by_rank",
    "transform_checkpoints",
]


def __getattr__(name):
    """MindSpore's Python training-step names (``value_and_grad``, ``grad``, ``jit``) and
    ``export``/``load`` are an ``AttributeError`` saying why and what to use; other absent
    names the usual one."""
    from ._missing import TOP, missing_name
    missing_name(__name__, name, TOP)
