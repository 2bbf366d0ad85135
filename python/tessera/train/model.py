"""``Model``: traces a network once and trains or evaluates it with the engine."""

import contextlib
import json
import math
import os
import shutil
import tempfile
import types
import warnings
import weakref

import numpy as np

from .. import _checks, _context, _trace, nn
from .._tessera import (NetworkBuilder, anchored_strategies, forward_network, forward_outputs,
                        mpi_barrier,
                        mpi_broadcast_str, read_parameters, train_network)
from ..common.parameter import initial_values
from ..common.tensor import Tensor
from . import engine_config
from .callback import Callback, RunContext, _StopRequested
from .checkpoint import _io_error, _run_recipe


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


def _engine_arrays(dataset):
    """(inputs, labels) of a batched dataset for the engine: inputs int32 when the column holds
    signed integers (token ids), else float32; labels float32 when the column holds floats
    (regression targets), else int32 (class indices), any shape per sample (``[n, 1]`` is one
    per sample)."""
    columns = dataset._columns
    if len(columns) != 2:
        raise ValueError(f"Model.train needs two columns (data, label); this dataset has "
                         f"{dataset.column_names}")
    data, label = np.asarray(columns[0]), np.asarray(columns[1])
    if label.ndim == 2 and label.shape[1] == 1:
        label = label[:, 0]
    rule = "the network's input and label must be numbers"
    data = _engine_column(dataset.column_names[0], data, "i", rule)
    label = _engine_column(dataset.column_names[1], label, "biu", rule)
    return data, label


#: The most columns a dataset fed to a network may have (each is one input of the traced graph;
#: the engine's bound).
_MAX_COLUMNS = 1024


def _engine_columns(dataset):
    """Every column of a batched dataset as the engine takes it, for a loss cell of one's own
    (which MindSpore feeds them positionally): ``[(name, array)]``, a column of signed integers
    (token ids, class indices) as int32, any other (floats, unsigned integers, bools) as
    float32, each with its own shape per sample. A column that is not numbers, an integer
    beyond int32, or a float that is NaN or infinite as float32 is a ``ValueError`` naming the
    column (and the sample)."""
    names, columns = list(dataset.column_names), dataset._columns
    if len(columns) > _MAX_COLUMNS:
        raise ValueError(f"Model.train: the dataset has {len(columns)} columns; a network takes "
                         f"at most {_MAX_COLUMNS}")
    rule = "the network's inputs must be numbers"
    return [(name, _engine_column(name, column, "i", rule))
            for name, column in zip(names, columns)]


def _engine_column(name, column, int_kinds, numbers_rule):
    """Column ``name`` as the engine takes it: int32 when its dtype kind is one of
    ``int_kinds`` (a value beyond int32 refused), else float32 (NaN or infinity as float32
    refused); a column that is not numbers is a ``ValueError`` saying ``numbers_rule``."""
    column = np.asarray(column)
    if column.dtype.kind not in "biuf":
        raise ValueError(f"column {name} has dtype {column.dtype}; {numbers_rule}")
    to_int = column.dtype.kind in int_kinds
    if to_int:
        _check_int32(name, column)
    with np.errstate(over="ignore"):  # a float64 beyond float32 becomes inf, refused below
        column = np.ascontiguousarray(column, np.int32 if to_int else np.float32)
    _check_finite(name, column)
    return column


def _construct_arity(cell):
    """``(fewest, most, text)`` positional arguments of ``cell.construct`` (``most`` None for
    ``*args``) and its signature as text, for the error of a column count it does not take."""
    import inspect
    try:
        signature = inspect.signature(cell.construct)
    except (TypeError, ValueError):
        return 0, None, "construct(...)"
    fewest, most = 0, 0
    for param in signature.parameters.values():
        if param.kind == param.VAR_POSITIONAL:
            most = None
        elif param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            if most is not None:
                most += 1
            if param.default is param.empty:
                fewest += 1
    return fewest, most, f"{type(cell).__name__}.construct{signature}"


def _check_column_count(cell, names):
    """The dataset's columns ``names`` are fed positionally to ``cell.construct`` (MindSpore's
    rule for a network trained as it is): a count it does not take is a ``TypeError`` naming
    both."""
    fewest, most, text = _construct_arity(cell)
    if len(names) < fewest or (most is not None and len(names) > most):
        takes = (f"{fewest}" if fewest == most else
                 f"{fewest} or more" if most is None else f"{fewest} to {most}")
        raise TypeError(f"Model.train: the dataset's {len(names)} column(s) {list(names)} are "
                        f"fed positionally to {text}, which takes {takes} (a network trained "
                        "without loss_fn computes its loss from the columns; give loss_fn for "
                        "Model(net, loss_fn, optimizer) with (data, label) columns)")


def _check_loss_output(cell, out):
    """The output of a loss cell of one's own is its loss: a scalar float tensor; anything else
    is a ``TypeError`` naming what it returned."""
    if isinstance(out, _trace.Tensor):
        if out.shape == () and out.dtype.is_float:
            return
        what = f"a tensor of shape {tuple(out.shape)} and dtype {out.dtype}"
    else:
        what = f"a {type(out).__name__}"
    raise TypeError(f"Model.train: {type(cell).__name__}.construct returned {what}; a network "
                    "trained as it is (without loss_fn) must return its loss, a scalar float "
                    "tensor (give loss_fn, Model(net, loss_fn, optimizer), to train a network "
                    "that returns its logits)")


def _check_finite(name, column):
    """A float column (as the engine takes it, float32) holding NaN or infinity is a
    ``ValueError`` naming the column and the first such sample: one would make the weights NaN
    while the losses can look finite."""
    if column.dtype.kind != "f" or column.size == 0 or np.isfinite(column).all():
        return
    bad = ~np.isfinite(column.reshape(len(column), -1)).all(axis=1)
    sample = int(np.argmax(bad))
    raise ValueError(f"column {name}: sample {sample} holds NaN or infinity (as float32); the "
                     "network's input and label must be finite")


def _first_bad_sample(column, bad):
    """``(sample, value)`` of the first sample of ``column`` where the elementwise mask ``bad``
    holds."""
    rows = bad.reshape(len(column), -1)
    sample = int(np.argmax(rows.any(axis=1)))
    value = column.reshape(len(column), -1)[sample][rows[sample]][0]
    return sample, value.item()


def _check_int32(name, column):
    """An integer column the engine takes as int32 (token ids, class labels): a value beyond
    int32 is a ``ValueError`` naming the column and sample (the cast would wrap it)."""
    if column.size == 0:
        return
    info = np.iinfo(np.int32)
    if column.min() >= info.min and column.max() <= info.max:
        return
    sample, value = _first_bad_sample(column, (column < info.min) | (column > info.max))
    raise ValueError(f"column {name}: sample {sample} holds {value}, beyond int32 (the engine's "
                     "integer type)")


def _check_labels(what, name, labels, class_uses):
    """Integer labels that ``class_uses`` (``[(node or None, classes)]``) take as class
    indices lie in ``0..classes - 1``: the first one outside is a ``ValueError`` naming the
    label column, the sample and the node, found before any step runs (the engine would stop
    only at the batch holding it, naming its position in a shuffled batch)."""
    if labels.dtype.kind not in "iu" or labels.size == 0:
        return
    for node, classes, *_ in class_uses:
        bad = (labels < 0) | (labels >= classes)
        if bad.any():
            sample, value = _first_bad_sample(labels, bad)
            taker = f", taken by {node}" if node else ""
            raise ValueError(f"{what}: column {name}: sample {sample} has label {value}, but the "
                             f"network's output has {classes} classes (class indices "
                             f"0..{classes - 1}{taker})")


def _copy_strategy_file(source, target):
    """The run's ``strategy.ckpt`` copied to ``target`` (``save_param_strategy_file``): into a
    hidden file beside it, then renamed into place. An OS error removes the hidden file and is
    a ``CheckpointIOError`` naming the setting."""
    staging = os.path.join(os.path.dirname(target),
                           f".{os.path.basename(target)}.{os.getpid()}.tmp")
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source, staging)
        os.replace(staging, target)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(staging)
        raise _io_error(target, "AutoParallel.save_param_strategy_file: writing", e) from e


def _sink_mode(method, dataset_sink_mode):
    """``dataset_sink_mode``: a bool (``TypeError`` otherwise, so a string is not read as a
    choice). True has no effect here, as in MindSpore on CPU: every step takes its batch from
    the host, and callbacks see every step (a sinking MindSpore run calls them once per sink),
    so a ``UserWarning`` naming the argument says so."""
    if not isinstance(dataset_sink_mode, bool):
        raise TypeError(f"For '{method}', the type of 'dataset_sink_mode' must be bool, but got "
                        f"{type(dataset_sink_mode).__name__}.")
    if dataset_sink_mode:
        warnings.warn(f"{method}: dataset_sink_mode=True has no effect: Tessera runs on CPU, "
                      "which cannot sink the dataset (as MindSpore on CPU), so the steps run "
                      "without sinking and callbacks see every step", UserWarning, stacklevel=3)


def _warn_ignored_settings(parts, strategies, traced, devices):
    """A ``UserWarning`` for each setting that the run cannot apply, naming it: shard strategies
    under ``parallel_mode="data_parallel"`` (MindSpore applies them only in the semi-auto and
    auto modes; the engine runs every op data parallel), the context's ``gradients_mean`` under
    ``AutoParallel`` when it differs from the wrapper's, and ``Parameter(...,
    parallel_optimizer=False)`` under ``AutoParallel.hsdp()`` (the engine shards every
    parameter's optimizer state alike)."""
    if devices == 1:
        return  # one device: nothing is split, whatever the settings say
    auto = parts.auto_parallel
    if auto is None and _context._STATE["parallel_mode"] == "data_parallel" and strategies:
        warnings.warn(f"Model.train: the shard strategies of {sorted(strategies)} have no "
                      "effect under set_auto_parallel_context(parallel_mode='data_parallel'), "
                      "which runs every op data parallel; use 'semi_auto_parallel' (or "
                      "AutoParallel) to apply them", UserWarning, stacklevel=3)
    context_mean = _context._STATE.get("gradients_mean")
    if auto is not None and context_mean is not None \
            and context_mean != auto._keys["parallel"]["gradients_mean"]:
        warnings.warn(f"Model.train: set_auto_parallel_context(gradients_mean={context_mean}) has "
                      "no effect under AutoParallel, whose own switch decides (call "
                      "enable_gradients_mean() on it for the mean)", UserWarning, stacklevel=3)
    if auto is not None and (auto._pipeline or {}).get("output_broadcast"):
        warnings.warn("Model.train: AutoParallel.pipeline(output_broadcast=True) has no effect "
                      "on training: every rank already reports each step's loss (MindSpore "
                      "broadcasts the last stage's output for prediction, which Model.predict "
                      "runs on one device)", UserWarning, stacklevel=3)
    hsdp = auto._keys["parallel"].get("hsdp") if auto is not None else None
    if hsdp is not None:
        # MindSpore shards the optimizer state of a parameter of at least `threshold` KB only.
        need = hsdp["threshold"] * 1024
        trained = [p for p, _ in traced if p.requires_grad]
        if trained and need <= 2**63 and all(4 * math.prod(p.shape) < need for p in trained):
            warnings.warn(f"Model.train: AutoParallel.hsdp(threshold={hsdp['threshold']}) has no "
                          f"effect: no parameter has {hsdp['threshold']} KB or more (the largest: "
                          f"{max(4 * math.prod(p.shape) for p in trained)} bytes), so no "
                          "optimizer state is sharded", UserWarning, stacklevel=3)
    if auto is not None and "hsdp" in auto._keys["parallel"]:
        kept = sorted(p.name for p, _ in traced if not getattr(p, "_parallel_optimizer", True))
        if kept:
            warnings.warn(f"Model.train: Parameter(..., parallel_optimizer=False) of {kept} has "
                          "no effect: AutoParallel.hsdp() shards every parameter's optimizer "
                          "state alike in Tessera", UserWarning, stacklevel=3)


def _callback_list(callbacks):
    """``Model.train``'s ``callbacks`` (None, a ``Callback`` or a list or tuple of them) as a
    list; anything else is a ``TypeError`` naming the argument and the item."""
    if callbacks is None:
        return []
    items = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    for i, cb in enumerate(items):
        if not isinstance(cb, Callback):
            where = f"callbacks[{i}]" if isinstance(callbacks, (list, tuple)) else "callbacks"
            raise TypeError(f"For 'Model.train', '{where}' must be a Callback "
                            f"(tessera.train.Callback), but got {type(cb).__name__}.")
    return items


def _anchors(trace):
    """``[(value id, split)]`` fixed by ``shard`` while tracing: Cells' inputs and the
    parameters of their ``parameter_plan``."""
    from ..parallel._shard import _split
    anchors = [(vid, split) for vid, split, _ in trace.anchors]
    for p, strategy, what in trace.param_anchors:
        tensor = trace.params.get(id(p))
        if tensor is None:
            raise ValueError(f"{what}: the parameter is not used by the network")
        anchors.append((tensor.id, _split(what, strategy, tensor.ndim)))
    return anchors


def _with_anchored(builder, anchors, strategies, devices, per_stage):
    """``strategies`` with the engine's strategy for every op reading an anchored value that
    ``Primitive.shard`` left unset (on one device there is nothing to split)."""
    if not anchors or devices == 1:
        return strategies
    found = anchored_strategies(builder, anchors, per_stage)
    merged = {op: (tuple(tuple(s) for s in ins), None) for op, ins in found.items()}
    merged.update(strategies)
    return merged


class Model:
    """MindSpore's ``Model(network, loss_fn=None, optimizer=None, metrics=None, ...)``. To
    train and evaluate, the network must end in a loss (``Model(net)`` without one can only
    ``predict``, which runs the network without its loss): ``loss_fn`` is given (the network
    is wrapped in ``nn.WithLossCell``) or the network is a ``WithLossCell``, possibly inside
    ``parallel.nn.Pipeline`` (or ``GradAccumulation``, ``MicroBatchInterleaved``) inside
    ``AutoParallel``. ``metrics``: a set of names (``"Accuracy"``/``"accuracy"``/``"acc"``,
    ``"loss"``) or a dict ``{name: nn.Accuracy()}``, evaluated by ``eval``.

    Each ``train`` saves its final weights into a checkpoint set (a directory of this Model's,
    removed with it); the Parameters then hold the trained values, and the next ``train``
    resumes from that set (weights, optimizer state and step count).

    ``run_dir`` (a Tessera addition): the directory the runs' outputs go into, made if missing
    and never removed. Each ``train`` writes a new ``run_<n>/`` in it (never one already
    there), and removes this Model's previous run once the new one is committed. By default a
    temporary directory is made and removed with the Model, which a process killed by a signal
    cannot do: name one to keep long runs' outputs where you choose."""

    def __init__(self, network, loss_fn=None, optimizer=None, metrics=None, eval_network=None,
                 eval_indexes=None, amp_level="O0", boost_level="O0", **kwargs):
        # MindSpore's signature; `run_dir` comes as a keyword of its **kwargs.
        run_dir = kwargs.pop("run_dir", None)
        self._eval_network, self._eval_indexes = _eval_setting(eval_network, eval_indexes)
        if amp_level != "O0" or boost_level != "O0" or kwargs:
            raise ValueError("Model: amp_level, boost_level and other options are not supported yet")
        self._metrics = _metrics(metrics)
        self.network = network
        if isinstance(network, nn.TrainOneStepCell):
            # MindSpore trains a TrainOneStepCell as it is: its own network and optimizer.
            if loss_fn is not None or optimizer is not None:
                raise ValueError("Model: the network is a TrainOneStepCell, which holds its loss "
                                 "and optimizer; give loss_fn and optimizer only with the bare "
                                 "network (Model(net, loss_fn, optimizer)), not both")
            if type(network).construct is not nn.TrainOneStepCell.construct:
                # A custom step (clipping, loss scaling, ...) would be skipped without a word.
                raise ValueError(f"Model: {type(network).__name__} overrides "
                                 "TrainOneStepCell.construct, which Tessera does not run (the "
                                 "engine computes the gradients and applies the optimizer); "
                                 "use nn.TrainOneStepCell itself, or Model(net, loss_fn, "
                                 "optimizer), with the optimizer's max_grad_norm for clipping")
            network, optimizer = network.network, network.optimizer
        self._loss_fn_given = loss_fn is not None
        self._trained_network = network  # inside a TrainOneStepCell
        if loss_fn is None and _predict_only(network):
            # A network without its loss (`Model(net)`): MindSpore builds it, and it can
            # predict; `train` and `eval` refuse it (`_require_loss`).
            self._parts = None
        else:
            self._parts = engine_config.unwrap(network, loss_fn)
            network = self._parts.top
        if not isinstance(self.network, nn.TrainOneStepCell):
            self.network = network
        self.optimizer = optimizer if optimizer is not None else nn.Momentum(
            network.trainable_params(), 0.05, 0.9)
        if not isinstance(self.optimizer, nn.Optimizer):
            raise TypeError("Model: optimizer must be a tessera.nn optimizer")
        self.losses = []
        if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
            raise TypeError(f"Model: run_dir must be a path, got {type(run_dir).__name__}")
        self._run_dir_given = None if run_dir is None else os.fspath(run_dir)
        self._runs = None          # this Model's directory of run outputs
        self._checkpoint = None    # the checkpoint set of the last completed train
        self._steps_done = 0       # global steps trained so far (the engine's step counter)
        self._runs_count = 0

    def _trace(self, batch, columns, training=True):
        """The network traced on one micro-batch of ``batch`` samples of ``columns`` (``[(name,
        array)]``, as the engine takes them): ``(builder, inputs, logits, loss, strategies,
        params)``. A ``WithLossCell`` takes (data, label) and its backbone's output are the
        logits; a loss cell of one's own takes every column positionally, as MindSpore feeds
        them to ``construct``, and its output (which must be a scalar float tensor) is both the
        loss and what ``logits`` names."""
        builder = NetworkBuilder()
        top, net = self._parts.top, self._parts.loss_cell
        with_loss = self._parts.with_loss is not None
        top._name_tree("")
        with _trace.tracing(builder) as trace:
            trace.training = training
            inputs = []
            for j, (name, array) in enumerate(columns):
                # A column's own name could be a Parameter's or node's (`fc1.weight`): a
                # name with a space, which no attribute path has, names the column.
                graph_name = (("data", "label")[j] if with_loss else
                              f"column {j} {name}".replace(".", "_").replace(":", "_").strip())
                t = _trace.Tensor(*builder.input(graph_name, [batch, *array.shape[1:]],
                                                 array.dtype.name), dtype=array.dtype.name)
                if array.dtype.kind in "iu" and (j == 1 or not with_loss):
                    trace.label_ids[t.id] = j  # class indices, if a loss takes them so
                inputs.append(t)
            if with_loss:
                trace.cells.append(("", type(net).__name__))
                logits = net._backbone(inputs[0])
                loss = net._loss_fn(logits, inputs[1])
                trace.cells.pop()
            else:
                loss = logits = net(*inputs)
        if with_loss:
            for what, t in (("the backbone's output", logits), ("the loss", loss)):
                if not isinstance(t, _trace.Tensor):
                    raise TypeError(f"{what} is a {type(t).__name__}, not a traced tensor")
        else:
            _check_loss_output(net, loss)
        params = [(p, trace.params[id(p)]) for p in net.get_parameters() if id(p) in trace.params]
        self._anchors = _anchors(trace)
        self._class_uses = list(trace.class_uses)
        return builder, inputs, logits, loss, trace.strategies, params

    def _run_dir(self):
        """A fresh directory for the next run's outputs; under ``tessera launch`` rank 0 makes
        it and every rank uses its path (the ranks of one run write one checkpoint set)."""
        state = _context._STATE
        mpi = state["backend"] == "mpi"
        if self._runs is None and self._run_dir_given is not None:
            given = os.path.abspath(self._run_dir_given)
            if os.path.lexists(given) and not os.path.isdir(given):
                raise ValueError(f"Model: run_dir {given} exists and is not a directory; it "
                                 "must name a directory (made if missing)")
            if state["rank"] == 0:
                os.makedirs(given, exist_ok=True)
            self._runs = given
        elif self._runs is None:
            made = tempfile.mkdtemp(prefix="tessera-model-") if state["rank"] == 0 else ""
            self._runs = mpi_broadcast_str(made) if mpi else made
            if state["rank"] == 0:
                weakref.finalize(self, shutil.rmtree, self._runs, True)
        self._runs_count += 1
        if self._run_dir_given is not None and state["rank"] == 0:
            # A directory the user named may hold an earlier Model's runs: never write into
            # them (rank 0 decides, every rank takes its choice).
            while os.path.exists(os.path.join(self._runs, f"run_{self._runs_count}")):
                self._runs_count += 1
        if self._run_dir_given is not None and mpi:
            self._runs_count = int(mpi_broadcast_str(str(self._runs_count)))
        return os.path.join(self._runs, f"run_{self._runs_count}")

    def _require_loss(self, method):
        """The network taken apart for ``method`` (``train``, ``eval``): a network given
        without ``loss_fn`` that is no ``WithLossCell`` (``Model(net)``) is trained as it is,
        as MindSpore does — a loss cell of one's own, whose ``construct`` takes the dataset's
        columns and returns the loss; a ``TypeError`` naming the method if it cannot be."""
        if self._parts is None:
            try:
                self._parts = engine_config.unwrap(self._trained_network)
            except TypeError as e:
                raise TypeError(f"{method}: {str(e).removeprefix('Model: ')}") from None

    def _devices(self):
        state = _context._STATE
        if state["backend"] == "mpi":
            if state["device_num"] not in (1, state["group_size"]):
                raise ValueError(f"Model.train: device_num={state['device_num']} but the job "
                                 f"has {state['group_size']} ranks (tessera launch --nproc)")
            return state["group_size"]
        if state["parallel_mode"] == "stand_alone" and state["device_num"] > 1 \
                and self._parts.auto_parallel is None:
            raise ValueError(f"Model.train: device_num={state['device_num']} needs "
                             "set_auto_parallel_context(parallel_mode='data_parallel' or "
                             "'semi_auto_parallel'); 'stand_alone' is one device")
        return state["device_num"]

    def train(self, epoch, train_dataset, callbacks=None, dataset_sink_mode=False, sink_size=-1,
              initial_epoch=0):
        """Trains ``epoch`` passes over ``train_dataset`` (a batched dataset), from the weights
        of the previous ``train`` of this Model if any. Under ``tessera launch`` this process
        trains its rank; callbacks run on every rank."""
        self._require_loss("Model.train")
        if sink_size != -1 or initial_epoch != 0:
            raise ValueError("Model.train: sink_size and initial_epoch are not supported yet")
        _sink_mode("Model.train", dataset_sink_mode)
        epoch = _checks.positive_int_arg(epoch, "Model.train", "epoch")
        callbacks = _callback_list(callbacks)
        if train_dataset.batch_size is None:
            raise ValueError("Model.train: batch the dataset first (dataset.batch(n))")
        if self._parts.with_loss is not None:
            data, labels = _engine_arrays(train_dataset)
            columns = [(train_dataset.column_names[0], data),
                       (train_dataset.column_names[1], labels)]
        else:
            _check_column_count(self._parts.loss_cell, train_dataset.column_names)
            columns = _engine_columns(train_dataset)
        if self._parts.auto_parallel is not None:
            self._parts.auto_parallel._check_outputs()
        batch = train_dataset.batch_size
        state = _context._STATE
        devices = self._devices()
        step_batch, micro_batch = engine_config.batch_sizes(self._parts, batch, devices)
        builder, inputs, logits, loss, strategies, traced = self._trace(micro_batch, columns)
        for _, _, j in self._class_uses:
            name, column = columns[j]
            _check_labels("Model.train", name, column,
                          [use for use in self._class_uses if use[2] == j])
        strategies = _with_anchored(builder, self._anchors, strategies, devices,
                                    engine_config.devices_per_stage(self._parts, devices))
        _warn_ignored_settings(self._parts, strategies, traced, devices)
        batch_num = len(columns[0][1]) // batch
        # A continued run counts its steps on from the checkpoint's: the engine trains up to
        # `epochs` in all, so the epochs already done (a partial one counted whole) are added.
        done_epochs = -(-self._steps_done // batch_num) if self._checkpoint else 0
        step_offset = self._steps_done if self._checkpoint else 0
        out = self._run_dir()
        config = engine_config.engine_config(
            self._parts, self.optimizer, strategies, epochs=done_epochs + epoch,
            output_dir=out, resume_from=self._checkpoint, devices=devices,
            deferred_init=any(getattr(p, "_deferred", False) for p, _ in traced),
            node_names=builder.node_names())
        recipe = _run_recipe(self.optimizer, callbacks,
                             {id(p): p.name for p, _ in traced if p.requires_grad},
                             (done_epochs + epoch) * batch_num)
        for section, keys in recipe.items():
            config.setdefault(section, {}).update(keys)
        config = engine_config.check_values(config)
        params = types.SimpleNamespace(
            cur_epoch_num=0, cur_step_num=0, batch_num=batch_num, epoch_num=epoch,
            net_outputs=None, train_network=self.network, optimizer=self.optimizer,
            train_dataset=train_dataset, parallel_mode=state["parallel_mode"],
            device_number=devices, _output_dir=out)
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

        mpi = state["backend"] == "mpi"
        try:
            losses, saved, engine_warnings = train_network(
                builder, [t.id for t in inputs], logits.id, loss.id,
                [column for _, column in columns], json.dumps(config),
                names=[name for name, _ in columns],
                batch_size=step_batch, shuffle=train_dataset._shuffle, backend="mpi" if mpi else "local",
                callback=on_step if callbacks else None)
        except _StopRequested:
            # The engine stops without saving: the Parameters keep their earlier values.
            self.losses = list(seen)
            if state["rank"] == 0:
                shutil.rmtree(out, ignore_errors=True)
        else:
            # The engine's warnings (a setting that has no effect, such as pipeline keys with
            # one stage, or one the program caps), which `tessera train` prints: as warnings of
            # this call, on rank 0 only (once per job under tessera launch).
            if state["rank"] == 0:
                for text in engine_warnings:
                    warnings.warn(f"Model.train: {text}", UserWarning, stacklevel=2)
            self.losses = list(losses)
            if mpi:
                # Rank 0 committed the set (the others may return before it did).
                saved = mpi_broadcast_str(str(saved) if saved is not None else "") or None
            if saved is not None:
                self._take_values(saved, traced)
                old, self._checkpoint_run = getattr(self, "_checkpoint_run", None), out
                self._checkpoint = params._final_set = saved
                self._steps_done = step_offset + len(losses)
                if mpi:
                    mpi_barrier()  # every rank has read the set before rank 0 removes the old
                if old is not None and state["rank"] == 0:
                    shutil.rmtree(old, ignore_errors=True)
        for cb in callbacks:
            cb.on_train_end(context)

    def _take_values(self, saved, traced):
        """The trained values into the Parameters, and the strategy file where
        ``AutoParallel.save_param_strategy_file`` asked for it. The values are read and the
        files placed before any Parameter changes, so a failure leaves them as they were."""
        trained = [(p, t) for p, t in traced if p.requires_grad]  # frozen: not in the set
        values = read_parameters(saved, [(p.name, list(t.shape)) for p, t in trained])
        auto = self._parts.auto_parallel
        target = getattr(auto, "_param_strategy_file", None) if auto is not None else None
        if target is not None:
            _copy_strategy_file(os.path.join(saved, "strategy.ckpt"), target)
        self._place_group_info(auto)
        for (p, _), value in zip(trained, values):
            p._value = value

    @staticmethod
    def _place_group_info(auto):
        """Under ``tessera launch`` the path given to ``set_group_ckpt_save_file`` is this
        process's own (MindSpore's rule): the engine's per-rank file (``<stem>_<rank><ext>``,
        its name for a path without ``{rank}``) is moved there."""
        state = _context._STATE
        path = auto._keys["output"].get("group_info_file") if auto is not None else None
        if path is None or state["backend"] != "mpi" or "{rank}" in path:
            return
        stem, ext = os.path.splitext(path)
        written = f"{stem}_{state['rank']}{ext}"
        if os.path.exists(written):
            os.replace(written, path)

    def eval(self, valid_dataset, callbacks=None, dataset_sink_mode=False):
        """The ``metrics`` of the trained network on ``valid_dataset`` (batched), as
        ``{name: value}``: the engine runs the network forward only (one device, the trained
        Parameters' values; a Parameter not trained, given or loaded a value takes the one
        training would start it from), batch by batch. With ``Model(..., eval_network=...,
        eval_indexes=...)`` the metrics are computed from that network's outputs on the
        dataset's columns (MindSpore's rules; see ``_eval_with_network``), which a loss cell
        of one's own needs."""
        if callbacks is not None:
            raise ValueError("Model.eval: callbacks are not supported yet")
        _sink_mode("Model.eval", dataset_sink_mode)
        if not self._metrics:
            raise ValueError("Model.eval: the Model has no metrics (Model(..., metrics={'accuracy'}))")
        if valid_dataset.batch_size is None:
            raise ValueError("Model.eval: batch the dataset first (dataset.batch(n))")
        if self._eval_network is not None:
            return self._eval_with_network(valid_dataset)
        self._require_loss("Model.eval")
        if self._parts.with_loss is None:
            # MindSpore's rule: the metrics need the logits, which a loss cell of one's own
            # does not give out; they come from an eval_network.
            raise ValueError(
                f"Model.eval: the network ({type(self._parts.loss_cell).__name__}) computes its "
                "own loss (it is no WithLossCell and Model has no loss_fn), so the metrics need "
                "an eval_network: Model(network, optimizer=..., metrics=..., "
                "eval_network=EvalNet(net), eval_indexes=[loss, logits, label]) with "
                "EvalNet.construct(*columns) returning (loss, logits, label), or evaluate "
                "with Model(net, loss_fn, metrics=...) on the same backbone")
        loss_fn = self._parts.with_loss._loss_fn
        kinds = set(self._metrics.values())
        # Token ids stay int32, as in training (cast to float32 they reached the Embedding's
        # Gather, which refused them); labels are class indices unless only an MSELoss's loss
        # is asked for.
        if "loss" in kinds:
            _eval_loss_rule(loss_fn)
        data, labels = _engine_arrays(valid_dataset)
        if "accuracy" in kinds or not isinstance(loss_fn, nn.MSELoss):
            _, labels = valid_dataset._arrays()
        # NaN or infinity gave metrics silently (argmax of NaN scores is class 0), as training
        # refuses them.
        with np.errstate(over="ignore"):
            _check_finite(valid_dataset.column_names[0], data)
        batch = valid_dataset.batch_size
        if valid_dataset.drop_remainder:
            n = len(data) // batch * batch
            data, labels = data[:n], labels[:n]
        if len(data) == 0:
            raise ValueError(f"Model.eval: the dataset has {len(valid_dataset._columns[0])} "
                             f"sample(s), no batch of batch_size {batch}; the metrics need at "
                             "least one")
        names = valid_dataset.column_names
        builder, (x, _), logits, _, _, traced = self._trace(
            batch, [(names[0], data), (names[1], labels)], training=False)
        if len(logits.shape) != 2 and labels.dtype.kind != "f":
            raise ValueError(f"Model.eval: the network's output has shape {logits.shape[1:]} "
                             "per sample; class scores [classes] are needed")
        if labels.dtype.kind != "f":
            _check_labels("Model.eval", valid_dataset.column_names[1], labels,
                          [(None, logits.shape[1])])
        elif labels.size != len(labels) * math.prod(logits.shape[1:]):
            raise ValueError(f"Model.eval: the label column {valid_dataset.column_names[1]} has "
                             f"shape {labels.shape[1:]} per sample; the MSELoss compares it with "
                             f"the network's output, of shape {tuple(logits.shape[1:])}")
        out = forward_network(builder, x.id, logits.id, _current_values("Model.eval", traced),
                              data)
        result = {}
        for key, kind in self._metrics.items():
            if kind == "accuracy":
                result[key] = float(np.mean(np.argmax(out, axis=1) == labels))
            else:
                result[key] = _eval_loss(loss_fn, out, labels, batch)
        return result

    def _eval_with_network(self, dataset):
        """``eval`` with ``eval_network`` (MindSpore's rules): its ``construct`` takes the
        dataset's columns positionally and returns a tensor or a tuple of them. With
        ``eval_indexes = [loss, logits, label]`` the ``loss`` metric averages output ``loss``
        over the batches and ``accuracy`` compares the arg-max of output ``logits`` with output
        ``label`` (class indices, or one-hot scores); without, every output goes to each metric
        (``accuracy`` takes two, ``(logits, label)``, and ``loss`` one). The engine runs the
        network forward on one device with the Parameters' current values, batch by batch (a
        last, smaller batch traced at its own size, as MindSpore runs it)."""
        net = self._eval_network
        columns = _engine_columns(dataset)
        names = [name for name, _ in columns]
        try:
            _check_column_count(net, names)
        except TypeError as e:
            raise TypeError(str(e).replace("Model.train:", "Model.eval: eval_network:", 1)
                            .split(" (a network trained")[0]) from None
        batch = dataset.batch_size
        samples = len(columns[0][1]) if columns else 0
        full = samples // batch * batch
        rest = 0 if dataset.drop_remainder else samples - full
        if full + rest == 0:
            raise ValueError(f"Model.eval: the dataset has {samples} sample(s), no batch of "
                             f"batch_size {batch}; the metrics need at least one")
        kinds = set(self._metrics.values())
        parts = []  # per traced batch size: {"loss": per batch, "logits", "label": per sample}
        for start, stop, size in ((0, full, batch), (full, full + rest, rest)):
            if stop > start:
                parts.append(self._run_eval_network(
                    [(name, column[start:stop]) for name, column in columns], size, kinds))
        result = {}
        for key, kind in self._metrics.items():
            if kind == "loss":
                per_batch = [v for part in parts for v in part["loss"]]
                result[key] = float(np.mean(per_batch))
            else:
                logits = np.concatenate([part["logits"] for part in parts])
                labels = np.concatenate([part["label"] for part in parts])
                result[key] = _accuracy(logits, labels)
        return result

    def _metric_indexes(self, count, kinds):
        """``(loss, logits, label)`` positions among the eval_network's ``count`` outputs for
        the metrics ``kinds``: ``eval_indexes``, or MindSpore's rule without them (every output
        to every metric), a ``ValueError`` naming what does not fit."""
        if self._eval_indexes is not None:
            if count < 3:
                raise ValueError(f"Model.eval: the eval_network returns {count} output(s); with "
                                 "eval_indexes it must return at least 3 (MindSpore: 'The "
                                 "length of 'outputs' must be >= 3')")
            for position in self._eval_indexes:
                if not -count <= position < count:
                    raise ValueError(f"Model.eval: eval_indexes {self._eval_indexes} names "
                                     f"output {position}, but the eval_network returns {count}")
            return tuple(i % count for i in self._eval_indexes)
        if "loss" in kinds and "accuracy" in kinds:
            raise ValueError("Model.eval: without eval_indexes every output of the "
                             "eval_network goes to every metric, but 'loss' takes one output "
                             "and 'accuracy' two (logits, label); give eval_indexes=[loss, "
                             "logits, label]")
        want = 1 if "loss" in kinds else 2
        if count != want:
            metric = "'loss' takes one output (the loss)" if want == 1 else \
                "'accuracy' takes two outputs (logits, label)"
            raise ValueError(f"Model.eval: the eval_network returns {count} output(s), which "
                             f"go to every metric without eval_indexes; {metric}: return "
                             "those, or give eval_indexes=[loss, logits, label]")
        return (0, None, None) if want == 1 else (None, 0, 1)

    def _run_eval_network(self, columns, batch, kinds):
        """The eval_network traced at ``batch`` samples and run forward over ``columns``
        (``[(name, array)]``, a whole number of batches): ``{"count": outputs, "loss": one value
        per batch, "logits": rows, "label": rows}`` for the metrics ``kinds``. An output that
        is an input column is that column, unchanged (integer labels stay integers)."""
        net = self._eval_network
        builder = NetworkBuilder()
        net._name_tree("")
        try:
            with _trace.tracing(builder) as trace:
                trace.training = False
                inputs = []
                for j, (name, array) in enumerate(columns):
                    graph_name = f"column {j} {name}".replace(".", "_").replace(":", "_")
                    inputs.append(_trace.Tensor(*builder.input(
                        graph_name, [batch, *array.shape[1:]], array.dtype.name),
                        dtype=array.dtype.name))
                out = net(*inputs)
            traced = [(p, trace.params[id(p)]) for p in net.get_parameters()
                      if id(p) in trace.params]
        finally:
            # The Parameters the eval_network shares keep the trained network's names.
            (self._parts.top if self._parts is not None else self._trained_network)._name_tree("")
        outputs = list(out) if isinstance(out, (tuple, list)) else [out]
        for k, t in enumerate(outputs):
            if not isinstance(t, _trace.Tensor):
                raise TypeError(f"Model.eval: output {k} of the eval_network "
                                f"({type(net).__name__}) is a {type(t).__name__}, not a tensor")
        loss_at, logits_at, label_at = self._metric_indexes(len(outputs), kinds)
        wanted = {}
        if "loss" in kinds:
            wanted["loss"] = loss_at
        if "accuracy" in kinds:
            wanted.update(logits=logits_at, label=label_at)
        by_input = {t.id: array for t, (_, array) in zip(inputs, columns)}
        computed = sorted({outputs[i].id for i in wanted.values()} - set(by_input))
        for role, i in wanted.items():
            t = outputs[i]
            if t.id in computed and t.dtype.name != "float32":
                raise TypeError(f"Model.eval: output {i} of the eval_network (the {role}) is "
                                f"{t.dtype.name}; the engine's forward returns float32 outputs "
                                "(or give back an input column unchanged)")
        values = {}
        if computed:
            arrays = forward_outputs(builder, [t.id for t in inputs], computed,
                                     _current_values("Model.eval", traced),
                                     [array for _, array in columns])
            values = dict(zip(computed, arrays))
        runs = len(columns[0][1]) // batch
        result = {"count": len(outputs)}
        for role, i in wanted.items():
            t = outputs[i]
            if t.id in by_input:
                value = by_input[t.id]
            else:
                value = values[t.id]  # [runs, *shape]
                if role != "loss":
                    if not t.shape or t.shape[0] != batch:
                        raise ValueError(f"Model.eval: output {i} of the eval_network (the "
                                         f"{role}) has shape {tuple(t.shape)}; its first dim "
                                         f"must be the batch ({batch})")
                    value = value.reshape(runs * batch, *t.shape[1:])
            if role == "loss":
                if len(t.shape) > 1 or t.id in by_input:
                    raise ValueError(f"Model.eval: output {i} of the eval_network (the loss) "
                                     f"has shape {tuple(t.shape)}; MindSpore's Loss metric "
                                     "takes a scalar or one dim of values, computed by the "
                                     "network")
                value = value.reshape(runs, -1).astype(np.float64).mean(axis=1)
            result[role] = value
        return result

    def predict(self, *predict_data, backend=None, config=None):
        """MindSpore's ``Model.predict(*predict_data, backend=None, config=None)``: the
        network's output for ``predict_data`` as a ``tessera.Tensor`` (``asnumpy()`` gives the
        values), computed forward only by the engine on one device, from the Parameters'
        current values — trained by ``train``, loaded (``load_param_into_net``) or given when
        they were made — in eval mode (``nn.Dropout`` is the identity). The input is one
        ``tessera.Tensor`` or numpy array of samples ``[batch, ...]`` (MindSpore takes
        Tensors only), run as one batch as in MindSpore: signed integers (token ids) as int32,
        other numbers as float32, the engine's types; NaN and infinity are computed with.

        The network run is the one given to ``Model``, without the loss: ``net`` of
        ``Model(net)`` and of ``Model(net, loss_fn, optimizer)``; under
        ``Model(AutoParallel(net), ...)`` the network it wraps, run on this one device with
        the trained values (not split over devices: the same output, computed whole). A
        network ending in its loss (``WithLossCell``, inside ``Pipeline`` or ``AutoParallel``
        too) or a ``TrainOneStepCell``, which MindSpore's predict runs as it is (taking the
        label too, returning the loss; a ``TrainOneStepCell`` even takes a training step), is
        a ``TypeError``: give ``Model`` the network itself. A Parameter neither given, trained
        nor loaded a value (drawn from its initializer when ``train`` starts, or made under
        ``no_init_parameters``) takes the value training would start it from, as MindSpore
        initialises a network before predicting, and as in ``eval``. ``backend="lite"``
        falls back to the engine with a ``UserWarning`` (as MindSpore does without MindSpore
        Lite); ``config`` applies to Lite only, so giving it warns too."""
        if backend not in ("lite", None):
            raise ValueError(f"For Model.predict, `backend` should be 'lite' or None, but got "
                             f"{backend!r}")
        if backend == "lite" or config is not None:
            what = "backend='lite'" if backend == "lite" else "config"
            warnings.warn(f"Model.predict: {what} has no effect: Tessera has no MindSpore Lite "
                          "(MindSpore falls back to its own inference without it), so the "
                          "engine runs the network", UserWarning, stacklevel=2)
        net = self._predict_network()
        data = _predict_input(predict_data)
        builder = NetworkBuilder()
        (self._parts.top if self._parts is not None else self.network)._name_tree("")
        with _trace.tracing(builder) as trace:
            trace.training = False
            x = _trace.Tensor(*builder.input("data", list(data.shape), data.dtype.name),
                              dtype=data.dtype.name)
            try:
                out = net(x)
            except ValueError as e:
                raise ValueError(f"Model.predict: tracing the network on the input of shape "
                                 f"{tuple(data.shape)}, {data.dtype}: {e}") from None
        if not isinstance(out, _trace.Tensor):
            raise TypeError(f"Model.predict: the network returns a {type(out).__name__}, not one "
                            "tensor; the engine's forward computes one output")
        if out.dtype != "float32":
            raise TypeError(f"Model.predict: the network's output is {out.dtype.name}; the "
                            "engine's forward returns float32 outputs only (cast the output "
                            "to float32 in construct)")
        traced = [(p, trace.params[id(p)]) for p in net.get_parameters()
                  if id(p) in trace.params]
        values = _current_values("Model.predict", traced)
        try:
            result = forward_network(builder, x.id, out.id, values, data)
        except ValueError as e:
            raise ValueError(f"Model.predict: {e}") from None
        return Tensor(result)

    def _predict_network(self):
        """The Cell ``predict`` runs: the network given to ``Model`` without its loss and
        outside ``AutoParallel``; a ``TypeError`` for one that ends in its loss."""
        given = self.network
        if isinstance(given, nn.TrainOneStepCell):
            raise TypeError("Model.predict: the network is a TrainOneStepCell, which MindSpore's "
                            "predict runs as it is (one training step on (data, label), "
                            "returning the loss); Tessera predicts the network alone: give "
                            "it to Model (Model(net).predict(data))")
        parts = self._parts
        if parts is None:
            return _without_auto_parallel(given)
        if self._loss_fn_given:
            return parts.with_loss._backbone
        if parts.with_loss is None and parts.pipeline is None \
                and parts.grad_accumulation is None and parts.interleaved is None:
            # A Cell given alone (Model(net)), maybe trained as its own loss cell: MindSpore's
            # predict runs it as it is, on the inputs given.
            net = _without_auto_parallel(given)
            fewest, most, text = _construct_arity(net)
            if fewest > 1:
                raise TypeError(f"Model.predict: {text} takes {fewest} inputs (a loss cell of "
                                "one's own, fed the dataset's columns in training); the "
                                "engine's forward runs a network of one input: give "
                                "Model the network without its loss")
            return net
        raise TypeError(f"Model.predict: the network ends in its loss (a "
                        f"{type(parts.loss_cell).__name__}, given as "
                        f"{type(self._parts.top).__name__}), which MindSpore's predict runs "
                        "as it is, taking (data, label) and returning the loss; Tessera's "
                        "predict runs one input through the network without a loss: give "
                        "the network itself (Model(net) or Model(net, loss_fn, optimizer))")


def _eval_setting(eval_network, eval_indexes):
    """``Model``'s ``eval_network`` and ``eval_indexes`` checked (MindSpore's rules): a Cell,
    and ``None`` or a list of three ints (the positions of the loss, the logits and the label
    among its outputs); ``eval_indexes`` without ``eval_network`` would be ignored, so it is a
    ``ValueError``."""
    if eval_network is not None and not isinstance(eval_network, nn.Cell):
        raise TypeError(f"Model: eval_network must be a Cell, but got "
                        f"{type(eval_network).__name__}")
    if eval_indexes is None:
        return eval_network, None
    if not (isinstance(eval_indexes, list) and len(eval_indexes) == 3
            and all(isinstance(i, int) and not isinstance(i, bool) for i in eval_indexes)):
        raise ValueError("Model: the argument 'eval_indexes' must be a list or None. If "
                         "'eval_indexes' is a list, length of it must be three (ints: the "
                         f"positions of loss, logits and label). But got {eval_indexes!r}")
    if eval_network is None:
        raise ValueError("Model: eval_indexes is used only with an eval_network (it picks the "
                         "loss, logits and label among its outputs); give eval_network too")
    return eval_network, list(eval_indexes)


def _accuracy(logits, labels):
    """MindSpore's ``Accuracy``: the share of samples whose arg-max score is the label (class
    indices ``[n]``, or one-hot scores of the logits' shape, taken by their arg-max)."""
    if logits.ndim != 2:
        raise ValueError(f"Model.eval: the eval_network's logits have shape {logits.shape[1:]} "
                         "per sample; class scores [classes] are needed for 'accuracy'")
    if labels.ndim == logits.ndim:
        if labels.shape != logits.shape:
            raise ValueError(f"Model.eval: the label has shape {labels.shape[1:]} per sample; "
                             f"one-hot labels need the logits' {logits.shape[1:]}")
        labels = np.argmax(labels, axis=1)
    elif labels.ndim != 1 and labels.shape[1:] != (1,):
        raise ValueError(f"Model.eval: the label has shape {labels.shape[1:]} per sample; "
                         "class indices (one per sample) or one-hot scores are needed")
    labels = labels.reshape(len(labels))
    return float(np.mean(np.argmax(logits, axis=1) == labels))


def _eval_loss_rule(loss_fn):
    """The loss ``Model.eval``'s ``"loss"`` metric computes for ``loss_fn``: MindSpore's
    ``nn.Loss`` averages the values of the Model's own loss Cell; Tessera computes those of
    the loss Cells it knows, and refuses another (a loss Cell of your own) rather than report
    another loss than the one trained."""
    if isinstance(loss_fn, (nn.SoftmaxCrossEntropyWithLogits, nn.CrossEntropyLoss)):
        return "cross_entropy"
    if isinstance(loss_fn, nn.MSELoss) and loss_fn.reduction in ("mean", "sum"):
        return loss_fn.reduction
    what = (f"an MSELoss(reduction={loss_fn.reduction!r})" if isinstance(loss_fn, nn.MSELoss)
            else f"a {type(loss_fn).__name__}")
    raise ValueError(f"Model.eval: the 'loss' metric of {what} loss is not supported (it is "
                     "computed for SoftmaxCrossEntropyWithLogits, CrossEntropyLoss and MSELoss "
                     "with reduction 'mean' or 'sum'; MindSpore's needs a scalar loss)")


def _eval_loss(loss_fn, out, labels, batch):
    """MindSpore's ``nn.Loss`` metric: the mean over the batches of the loss Cell's value on
    each."""
    rule = _eval_loss_rule(loss_fn)
    values = []
    for start in range(0, len(out), batch):
        o = out[start:start + batch].astype(np.float64)
        y = labels[start:start + batch]
        if rule == "cross_entropy":
            shifted = o - o.max(axis=1, keepdims=True)
            logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
            values.append(-np.mean(logp[np.arange(len(y)), y]))
        else:
            squared = (o - y.reshape(o.shape)) ** 2
            values.append(squared.mean() if rule == "mean" else squared.sum())
    return float(np.mean(values))


def _current_values(method, traced):
    """``[(value id, float32 array)]`` of the traced Parameters ``[(Parameter, traced tensor)]``
    for a forward run: each one's own value (given, loaded or trained) or, for one not trained
    yet, the value ``Model.train`` would start it from (its initializer's draw, as MindSpore
    initialises a network's parameters before evaluating or predicting with it). A frozen
    Parameter without a value is a ``ValueError`` naming it."""
    try:
        values = initial_values([p for p, _ in traced])
    except ValueError as e:
        raise ValueError(f"{method}: {e}") from None
    return [(t.id, np.asarray(v, np.float32)) for (_, t), v in zip(traced, values)]


def _without_auto_parallel(network):
    """The network inside ``AutoParallel``, or ``network`` itself."""
    from ..parallel.auto_parallel import AutoParallel
    return network.network if isinstance(network, AutoParallel) else network


def _predict_only(network):
    """Whether ``Model(network)`` (no ``loss_fn``) can only predict: ``network`` (or the one
    inside ``AutoParallel``) is a Cell that is neither a loss cell nor a training wrapper
    (``WithLossCell``, ``TrainOneStepCell``, ``Pipeline``, ``GradAccumulation``,
    ``MicroBatchInterleaved``), whose own checks then apply."""
    from ..parallel.nn import GradAccumulation, MicroBatchInterleaved, Pipeline
    net = _without_auto_parallel(network)
    return isinstance(net, nn.Cell) and not isinstance(
        net, (nn.WithLossCell, nn.TrainOneStepCell, Pipeline, GradAccumulation,
              MicroBatchInterleaved))


def _predict_input(predict_data):
    """The one input of ``Model.predict`` as the engine takes it: a ``tessera.Tensor`` or numpy
    array of at least one dim and one element, signed integers as int32 (a value beyond it is
    a ``ValueError``), other numbers as float32 (a finite value beyond it, too); anything else
    is a ``TypeError`` or ``ValueError`` naming the rule."""
    if len(predict_data) != 1:
        raise ValueError(f"Model.predict: got {len(predict_data)} inputs; the engine's forward "
                         "runs a network of one input (one column of samples [batch, ...]), so "
                         "give exactly one Tensor or numpy array")
    item = predict_data[0]
    if isinstance(item, Tensor):
        data = item.asnumpy()
    elif isinstance(item, np.ndarray):
        data = item
    else:
        raise TypeError(f"Model.predict: the input must be a tessera.Tensor or a numpy array, "
                        f"but got {type(item).__name__}")
    if data.dtype.kind not in "biuf":
        raise TypeError(f"Model.predict: the input has dtype {data.dtype}; the network's input "
                        "must be numbers (signed integers are taken as int32, others as "
                        "float32)")
    if data.ndim == 0:
        raise ValueError("Model.predict: the input is a scalar; it must be a batch of samples "
                         "[batch, ...] (one dim at least)")
    if data.size == 0:
        raise ValueError(f"Model.predict: the input data can not be empty (shape "
                         f"{tuple(data.shape)})")
    if data.dtype.kind == "i":
        try:
            _check_int32("predict_data", data)
        except ValueError as e:
            raise ValueError(f"Model.predict: {e}") from None
        return np.ascontiguousarray(data, np.int32)
    with np.errstate(over="ignore"):
        cast = np.ascontiguousarray(data, np.float32)
    overflow = np.isinf(cast) & np.isfinite(data)
    if overflow.any():
        sample, value = _first_bad_sample(data, overflow)
        raise ValueError(f"Model.predict: sample {sample} of the input holds {value}, beyond "
                         "float32 (the engine's float type)")
    return cast
