"""``Model``: traces a network once and trains or evaluates it with the engine."""

import os
import shutil
import tempfile
import types
import weakref

import numpy as np

from .. import _context, _trace, nn
from .._tessera import NetworkBuilder, forward_network, read_parameters, train_network
from .callback import RunContext, _StopRequested
from .checkpoint import _run_recipe


_METRIC_NAMES = {"accuracy": "accuracy", "acc": "accuracy", "loss": "loss"}


def _metrics(metrics):
    """``{key: kind}`` of ``Model``'s ``metrics``: a set of names or a dict of metric objects."""
    if metrics is None:
        return {}
    if isinstance(metrics, (set, list, tuple)):
        out = {}
        for name in metrics:
            kind = _METRIC_NAMES.get(str(name).lower())
            if kind is None:
                raise ValueError(f"Model: metric {name!r} is not supported (supported: "
                                 f"{sorted(_METRIC_NAMES)})")
            out[name] = kind
        return out
    if isinstance(metrics, dict):
        out = {}
        for key, metric in metrics.items():
            if not isinstance(metric, nn.Metric):
                raise TypeError(f"Model: metric {key!r} is a {type(metric).__name__}, not a "
                                "tessera.nn metric (nn.Accuracy, nn.Loss)")
            out[key] = metric._kind
        return out
    raise TypeError("Model: metrics is a set of names or a dict of name: nn.Metric")


class Model:
    """MindSpore's ``Model(network, loss_fn=None, optimizer=None, metrics=None, ...)``. The
    network must end in a loss: ``loss_fn`` is given (the network is wrapped in
    ``nn.WithLossCell``) or the network is a ``WithLossCell``. ``metrics``: a set of names
    (``"Accuracy"``/``"accuracy"``/``"acc"``, ``"loss"``) or a dict ``{name: nn.Accuracy()}``,
    evaluated by ``eval``.

    Each ``train`` saves its final weights into a checkpoint set (a directory of this Model's,
    removed with it); the Parameters then hold the trained values, and the next ``train``
    resumes from that set (weights, optimizer state and step count)."""

    def __init__(self, network, loss_fn=None, optimizer=None, metrics=None, eval_network=None,
                 eval_indexes=None, amp_level="O0", boost_level="O0", **kwargs):
        if eval_network is not None or eval_indexes is not None:
            raise ValueError("Model: eval_network and eval_indexes are not supported yet")
        if amp_level != "O0" or boost_level != "O0" or kwargs:
            raise ValueError("Model: amp_level, boost_level and other options are not supported yet")
        self._metrics = _metrics(metrics)
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
        self._runs = None          # this Model's directory of run outputs
        self._checkpoint = None    # the checkpoint set of the last completed train
        self._steps_done = 0       # global steps trained so far (the engine's step counter)
        self._runs_count = 0

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
        params = [(p, trace.params[id(p)]) for p in net.get_parameters() if id(p) in trace.params]
        return builder, x, y, logits, loss, trace.strategies, params

    def _run_dir(self):
        if self._runs is None:
            self._runs = tempfile.mkdtemp(prefix="tessera-model-")
            weakref.finalize(self, shutil.rmtree, self._runs, True)
        self._runs_count += 1
        return os.path.join(self._runs, f"run_{self._runs_count}")

    def train(self, epoch, train_dataset, callbacks=None, dataset_sink_mode=False, sink_size=-1,
              initial_epoch=0):
        """Trains ``epoch`` passes over ``train_dataset`` (a batched dataset), from the weights
        of the previous ``train`` of this Model if any."""
        if sink_size != -1 or initial_epoch != 0:
            raise ValueError("Model.train: sink_size and initial_epoch are not supported yet")
        if train_dataset.batch_size is None:
            raise ValueError("Model.train: batch the dataset first (dataset.batch(n))")
        data, labels = train_dataset._arrays()
        batch = train_dataset.batch_size
        builder, x, y, logits, loss, strategies, traced = self._trace(batch, data.shape[1:])
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
        # A continued run counts its steps on from the checkpoint's: the engine trains up to
        # `epochs` in all, so the epochs already done (a partial one counted whole) are added.
        done_epochs = -(-self._steps_done // batch_num) if self._checkpoint else 0
        step_offset = self._steps_done if self._checkpoint else 0
        params = types.SimpleNamespace(
            cur_epoch_num=0, cur_step_num=0, batch_num=batch_num, epoch_num=epoch,
            net_outputs=None, train_network=self.network, optimizer=self.optimizer,
            train_dataset=train_dataset, parallel_mode=state["parallel_mode"],
            device_number=state["device_num"])
        context = RunContext(params)
        for cb in callbacks:
            cb.on_train_begin(context)

        seen = []

        def on_step(ep, step_in_epoch, global_step, step_loss, lr):
            seen.append(step_loss)
            params.cur_epoch_num = ep - done_epochs
            params.cur_step_num = global_step - step_offset
            params.net_outputs = np.float32(step_loss)
            params.cur_lr, params._global_step = lr, global_step
            for cb in callbacks:
                cb.on_train_step_end(context)
            if step_in_epoch == batch_num:
                for cb in callbacks:
                    cb.on_train_epoch_end(context)
            if context._stop:
                raise _StopRequested

        out = self._run_dir()
        params._output_dir = out
        recipe = _run_recipe(self.optimizer, callbacks,
                             {id(p): p.name for p, _ in traced if p.requires_grad},
                             (done_epochs + epoch) * batch_num)
        try:
            losses, saved = train_network(
                builder, x.id, y.id, logits.id, loss.id, data, labels,
                devices=state["device_num"], strategies=list(strategies.items()),
                epochs=done_epochs + epoch, seed=state["seed"],
                deterministic=state["deterministic"], shuffle=train_dataset._shuffle,
                callback=on_step if callbacks else None, output_dir=out,
                resume_from=self._checkpoint, recipe=recipe, **self.optimizer._engine_args())
        except _StopRequested:
            # The engine stops without saving: the Parameters keep their earlier values.
            self.losses = list(seen)
            shutil.rmtree(out, ignore_errors=True)
        else:
            self.losses = list(losses)
            if saved is not None:
                trained = [(p, t) for p, t in traced if p.requires_grad]  # frozen: unsaved
                values = read_parameters(saved, [(p.name, list(t.shape)) for p, t in trained])
                for (p, _), value in zip(trained, values):
                    p._value = value
                old, self._checkpoint_run = getattr(self, "_checkpoint_run", None), out
                self._checkpoint = params._final_set = saved
                self._steps_done = step_offset + len(losses)
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True)
        for cb in callbacks:
            cb.on_train_end(context)

    def eval(self, valid_dataset, callbacks=None, dataset_sink_mode=False):
        """The ``metrics`` of the trained network on ``valid_dataset`` (batched), as
        ``{name: value}``: the engine runs the network forward only (one device, the trained
        Parameters' values), batch by batch."""
        if callbacks is not None:
            raise ValueError("Model.eval: callbacks are not supported yet")
        if not self._metrics:
            raise ValueError("Model.eval: the Model has no metrics (Model(..., metrics={'accuracy'}))")
        if valid_dataset.batch_size is None:
            raise ValueError("Model.eval: batch the dataset first (dataset.batch(n))")
        data, labels = valid_dataset._arrays()
        if valid_dataset.drop_remainder:
            n = len(data) // valid_dataset.batch_size * valid_dataset.batch_size
            data, labels = data[:n], labels[:n]
        builder, x, _, logits, _, _, traced = self._trace(valid_dataset.batch_size, data.shape[1:])
        missing = [p.name for p, _ in traced if p._value is None]
        if missing:
            raise ValueError(f"Model.eval: parameters {missing} have no values; train first")
        out = forward_network(builder, x.id, logits.id,
                              [(t.id, p._value) for p, t in traced], data)
        if out.ndim != 2:
            raise ValueError(f"Model.eval: the network's output has shape {out.shape[1:]} per "
                             "sample; class scores [classes] are needed")
        result = {}
        for key, kind in self._metrics.items():
            if kind == "accuracy":
                result[key] = float(np.mean(np.argmax(out, axis=1) == labels))
            else:
                shifted = out - out.max(axis=1, keepdims=True)
                logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
                result[key] = float(-np.mean(logp[np.arange(len(labels)), labels]))
        return result
