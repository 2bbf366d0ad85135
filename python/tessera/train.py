"""``tessera.train``: MindSpore's ``mindspore.train``, first slice (issue 34): ``Model(network,
loss_fn=None, optimizer=None)`` with ``train(epoch, train_dataset, callbacks=None)``,
``Callback`` (``on_train_step_end(run_context)`` and friends), ``RunContext`` and
``LossMonitor(per_print_times)``.

``Model.train`` traces ``construct`` once into Tessera's graph and trains it with the Rust
engine (``runtime::Trainer``) on ``set_auto_parallel_context(device_num=N)`` ranks, threads of
this process, with the GIL released; Python runs only at step ends, for the callbacks. An
exception in a callback stops training and reaches the caller. The per-step losses are kept
in ``Model.losses`` (a Tessera addition).

The module is also callable: ``tessera.train(config, devices=...)`` trains a TOML configuration
as ``tessera train`` does (see ``tessera._training.train``).
"""

import inspect
import shutil
import sys
import tempfile
import types

import numpy as np

from . import _context, _trace, _training, nn
from ._tessera import NetworkBuilder, train_network

__all__ = ["Callback", "LossMonitor", "Model", "RunContext"]


class RunContext:
    """What a callback gets: ``original_args()`` (the run's parameters, ``cb_params``) and
    ``request_stop()``."""

    def __init__(self, cb_params):
        self._cb_params = cb_params
        self._stop = False

    def original_args(self):
        """The run's parameters: ``cur_epoch_num``, ``cur_step_num`` (over the run, from 1),
        ``batch_num`` (steps per epoch), ``epoch_num``, ``net_outputs`` (the step's loss),
        ``train_network``, ``optimizer``."""
        return self._cb_params

    def request_stop(self):
        """Stops training after this step."""
        self._stop = True

    def get_stop_requested(self):
        """Whether a callback asked to stop."""
        return self._stop


class Callback:
    """MindSpore's ``Callback``: override what you need. This slice calls ``on_train_begin``,
    ``on_train_step_end`` (and the older ``step_end``), ``on_train_epoch_end`` (and
    ``epoch_end``) and ``on_train_end``."""

    def on_train_begin(self, run_context):
        """Before the first step."""

    def on_train_epoch_begin(self, run_context):
        """Not called yet in this slice."""

    def on_train_step_begin(self, run_context):
        """Not called yet in this slice (the engine runs the step)."""

    def on_train_step_end(self, run_context):
        """After every step's update; ``net_outputs`` is the step's loss."""
        self.step_end(run_context)

    def on_train_epoch_end(self, run_context):
        """After the last step of an epoch."""
        self.epoch_end(run_context)

    def on_train_end(self, run_context):
        """After the last step."""
        self.end(run_context)

    def step_end(self, run_context):
        """MindSpore's older name of ``on_train_step_end``."""

    def epoch_end(self, run_context):
        """MindSpore's older name of ``on_train_epoch_end``."""

    def end(self, run_context):
        """MindSpore's older name of ``on_train_end``."""


class LossMonitor(Callback):
    """Prints ``epoch: 1 step: 10, loss is 2.2871413`` every ``per_print_times`` steps."""

    def __init__(self, per_print_times=1):
        if not isinstance(per_print_times, int) or per_print_times < 0:
            raise ValueError("LossMonitor: per_print_times must be a non-negative int")
        self._per_print_times = per_print_times

    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        step = (p.cur_step_num - 1) % p.batch_num + 1
        if self._per_print_times and p.cur_step_num % self._per_print_times == 0:
            print(f"epoch: {p.cur_epoch_num} step: {step}, loss is {p.net_outputs}", flush=True)


class _StopRequested(Exception):
    pass


class Model:
    """MindSpore's ``Model(network, loss_fn=None, optimizer=None, metrics=None, ...)``. The
    network must end in a loss: ``loss_fn`` is given (the network is wrapped in
    ``nn.WithLossCell``) or the network is a ``WithLossCell``. ``metrics`` and ``eval`` are not
    supported yet."""

    def __init__(self, network, loss_fn=None, optimizer=None, metrics=None, eval_network=None,
                 eval_indexes=None, amp_level="O0", boost_level="O0", **kwargs):
        if metrics is not None or eval_network is not None or eval_indexes is not None:
            raise ValueError("Model: metrics and evaluation are not supported yet")
        if amp_level != "O0" or boost_level != "O0" or kwargs:
            raise ValueError("Model: amp_level, boost_level and other options are not supported yet")
        if loss_fn is not None:
            network = nn.WithLossCell(network, loss_fn)
        if not isinstance(network, nn.WithLossCell):
            raise TypeError("Model: give loss_fn, or a network wrapped in nn.WithLossCell (the "
                            "engine needs the logits and the loss)")
        self.network = network
        self.optimizer = optimizer if optimizer is not None else nn.Momentum(
            network.trainable_params(), 0.05, 0.9)
        if not isinstance(self.optimizer, nn.Optimizer):
            raise TypeError("Model: optimizer must be a tessera.nn optimizer")
        self.losses = []

    def _trace(self, batch, sample_shape):
        builder = NetworkBuilder()
        net = self.network
        net._name_tree("")
        with _trace.tracing(builder) as trace:
            x = _trace.Tensor(*builder.input("data", [batch, *sample_shape], "float32"))
            y = _trace.Tensor(*builder.input("label", [batch], "int32"), dtype="int32")
            trace.cells.append(("", type(net).__name__))
            logits = net._backbone(x)
            loss = net._loss_fn(logits, y)
            trace.cells.pop()
        for what, t in (("the backbone's output", logits), ("the loss", loss)):
            if not isinstance(t, _trace.Tensor):
                raise TypeError(f"{what} is a {type(t).__name__}, not a traced tensor")
        return builder, x, y, logits, loss, trace.strategies

    def train(self, epoch, train_dataset, callbacks=None, dataset_sink_mode=False, sink_size=-1,
              initial_epoch=0):
        """Trains ``epoch`` passes over ``train_dataset`` (a batched ``NumpySlicesDataset``)."""
        if sink_size != -1 or initial_epoch != 0:
            raise ValueError("Model.train: sink_size and initial_epoch are not supported yet")
        if train_dataset.batch_size is None:
            raise ValueError("Model.train: batch the dataset first (dataset.batch(n))")
        data, labels = train_dataset._arrays()
        batch = train_dataset.batch_size
        builder, x, y, logits, loss, strategies = self._trace(batch, data.shape[1:])
        state = _context._STATE
        if state["parallel_mode"] == "stand_alone" and state["device_num"] > 1:
            raise ValueError(f"Model.train: device_num={state['device_num']} needs "
                             "set_auto_parallel_context(parallel_mode='data_parallel' or "
                             "'semi_auto_parallel'); 'stand_alone' is one device")
        if state["parallel_mode"] != "semi_auto_parallel":
            strategies = {}
        callbacks = [] if callbacks is None else (
            list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks])
        batch_num = len(data) // batch
        params = types.SimpleNamespace(
            cur_epoch_num=0, cur_step_num=0, batch_num=batch_num, epoch_num=epoch,
            net_outputs=None, train_network=self.network, optimizer=self.optimizer,
            train_dataset=train_dataset, parallel_mode=state["parallel_mode"],
            device_number=state["device_num"])
        context = RunContext(params)
        for cb in callbacks:
            cb.on_train_begin(context)

        seen = []

        def on_step(ep, step_in_epoch, global_step, step_loss):
            seen.append(step_loss)
            params.cur_epoch_num, params.cur_step_num = ep, global_step
            params.net_outputs = np.float32(step_loss)
            for cb in callbacks:
                cb.on_train_step_end(context)
            if step_in_epoch == batch_num:
                for cb in callbacks:
                    cb.on_train_epoch_end(context)
            if context._stop:
                raise _StopRequested

        out = tempfile.mkdtemp(prefix="tessera-model-")
        losses = []
        try:
            losses = train_network(
                builder, x.id, y.id, logits.id, loss.id, data, labels,
                devices=state["device_num"], strategies=list(strategies.items()),
                epochs=epoch, seed=state["seed"], deterministic=state["deterministic"],
                shuffle=train_dataset.shuffle, callback=on_step if callbacks else None,
                output_dir=out, **self.optimizer._engine_args())
        except _StopRequested:
            losses = seen
        finally:
            shutil.rmtree(out, ignore_errors=True)
        self.losses = list(losses)
        for cb in callbacks:
            cb.on_train_end(context)


class _CallableModule(types.ModuleType):
    """``tessera.train`` is this module and ``tessera.train(config, ...)`` at once."""

    def __call__(self, *args, **kwargs):
        return _training.train(*args, **kwargs)


_self = sys.modules[__name__]
_self.__class__ = _CallableModule
_self.__signature__ = inspect.signature(_training.train)
