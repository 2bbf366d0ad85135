"""``tessera.train``: MindSpore's ``mindspore.train`` (issue 34): ``Model(network,
loss_fn=None, optimizer=None, metrics=None)`` with ``train(epoch, train_dataset,
callbacks=None)`` and ``eval(valid_dataset)``, ``Callback`` (``on_train_step_end(run_context)``
and friends), ``RunContext``, ``LossMonitor(per_print_times)``, ``TimeMonitor(data_size)``,
``ModelCheckpoint(prefix, directory, config)`` with ``CheckpointConfig`` (checkpoint sets
while training), ``load_checkpoint(path)``, ``load_param_into_net`` and ``save_checkpoint``
(see ``tessera.train.checkpoint``).
After ``train`` the Parameters hold the trained values; the next ``train`` continues from them.

``Model.train`` traces ``construct`` once into Tessera's graph and trains it with the Rust
engine (``runtime::Trainer``) on ``set_auto_parallel_context(device_num=N)`` ranks, threads of
this process, with the GIL released; Python runs only at step ends, for the callbacks. An
exception in a callback stops training and reaches the caller. The per-step losses are kept
in ``Model.losses`` (a Tessera addition).

The module is also callable: ``tessera.train(config, devices=...)`` trains a TOML configuration
as ``tessera train`` does (see ``tessera._training.train``).
"""

import inspect
import sys
import types

from .. import _training
from .callback import Callback, LossMonitor, RunContext, TimeMonitor
from .checkpoint import (CheckpointConfig, ModelCheckpoint, load_checkpoint,
                         load_param_into_net, save_checkpoint)
from .model import Model

__all__ = ["Callback", "LossMonitor", "Model", "RunContext", "TimeMonitor",
           "CheckpointConfig", "ModelCheckpoint", "load_checkpoint", "load_param_into_net",
           "save_checkpoint"]


class _CallableModule(types.ModuleType):
    """``tessera.train`` is this module and ``tessera.train(config, ...)`` at once."""

    def __call__(self, *args, **kwargs):
        return _training.train(*args, **kwargs)


_self = sys.modules[__name__]
_self.__class__ = _CallableModule
_self.__signature__ = inspect.signature(_training.train)
