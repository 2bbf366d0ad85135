"""A loss Cell of one's own (MindSpore's ``class NetWithLoss(nn.Cell): construct(x, y) ->
loss`` given to ``Model(net_with_loss, optimizer=opt)`` or ``TrainOneStepCell``) and datasets of
several columns fed positionally to ``construct(c1, ..., ck)``: trained by the engine exactly as
the equivalent ``Model(net, loss_fn)``, on one device and sharded."""

import numpy as np
import pytest

import tessera
from tessera import dataset as ds
from tessera import nn, ops
from tessera.parallel.auto_parallel import AutoParallel
from tessera.parallel.nn import GradAccumulation, MicroBatchInterleaved, Pipeline
from tessera.train import Callback, Model

from nets import fresh_context  # noqa: F401 (the fixture is used by name)

pytestmark = pytest.mark.usefixtures("fresh_context")

N, BATCH, FEATURES, HIDDEN, CLASSES = 64, 16, 8, 16, 4


def _ce():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


class Net(nn.Cell):
    """Dense+ReLU → Dense; with ``shard`` its ops split over ``shard`` devices (batch × out)."""

    def __init__(self, shard=None):
        super().__init__()
        self.fc1 = nn.Dense(FEATURES, HIDDEN, activation="relu")
        self.fc2 = nn.Dense(HIDDEN, CLASSES)
        if shard:
            dp, mp = (2, shard // 2) if shard > 2 else (1, 2)
            self.fc1.matmul.shard(((dp, 1), (mp, 1)))
            self.fc1.bias_add.shard(((dp, mp), (mp,)))
            self.fc1.activation.relu.shard(((dp, mp),))

    def construct(self, x):
        return self.fc2(self.fc1(x))


class NetWithLoss(nn.Cell):
    """MindSpore's pattern: the loss computed by a Cell of one's own."""

    def __init__(self, net):
        super().__init__()
        self.net = net
        self.loss = _ce()

    def construct(self, x, y):
        return self.loss(self.net(x), y)


class Masked(nn.Cell):
    """Three columns: ``construct(x, mask, y)``, the mask multiplying fc1's activation."""

    def __init__(self, shard=None):
        super().__init__()
        self.fc1 = nn.Dense(FEATURES, HIDDEN, activation="relu")
        self.fc2 = nn.Dense(HIDDEN, CLASSES)
        self.mul = ops.Mul()
        self.loss = _ce()
        if shard:
            self.fc1.matmul.shard(((shard, 1), (1, 1)))
            self.mul.shard(((shard, 1), (shard, 1)))

    def construct(self, x, mask, y):
        return self.loss(self.fc2(self.mul(self.fc1(x), mask)), y)


def _columns(n=N, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, FEATURES)).astype(np.float32)
    mask = (rng.random((n, HIDDEN)) < 0.7).astype(np.float32)
    y = rng.integers(0, CLASSES, n).astype(np.int32)
    return x, mask, y


def _values(seed=1):
    """Fixed starting weights by attribute path below the backbone (a loss cell of one's own
    names its parameters under its own attribute, ``net.fc1.weight``)."""
    rng = np.random.default_rng(seed)
    return {"fc1.weight": rng.normal(0, 0.5, (HIDDEN, FEATURES)).astype(np.float32),
            "fc1.bias": rng.normal(0, 0.5, HIDDEN).astype(np.float32),
            "fc2.weight": rng.normal(0, 0.5, (CLASSES, HIDDEN)).astype(np.float32),
            "fc2.bias": rng.normal(0, 0.5, CLASSES).astype(np.float32)}


def _set(cell):
    """``cell``'s four parameters given the values of ``_values``, whatever their prefix."""
    values = _values()
    given = {name: values[".".join(name.split(".")[-2:])]
             for name, _ in cell.parameters_and_names()}
    not_loaded, _ = tessera.load_param_into_net(cell, given)
    assert not not_loaded and len(given) == 4
    return cell


def _weights(cell):
    return [np.array(p.asnumpy()) for p in cell.trainable_params()]


def _context(devices, mode="semi_auto_parallel", gradients_mean=None):
    tessera.set_context(deterministic="ON")
    kwargs = {} if gradients_mean is None else {"gradients_mean": gradients_mean}
    tessera.set_auto_parallel_context(device_num=devices, parallel_mode=mode, **kwargs)


class Outputs(Callback):
    """Every step's ``net_outputs`` (the loss a callback sees)."""

    def __init__(self):
        self.seen = []

    def on_train_step_end(self, run_context):
        self.seen.append(float(run_context.original_args().net_outputs))


def _dataset(*columns, names=("x", "y")):
    return ds.NumpySlicesDataset(dict(zip(names, columns)), shuffle=True).batch(BATCH)


def _with_loss_fn(devices, shard, wrap=None, **context):
    _context(devices, **context)
    net = _set(Net(shard))
    x, _, y = _columns()
    opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    if wrap is None:
        model = Model(net, _ce(), opt)
    else:
        model = Model(wrap(nn.WithLossCell(net, _ce())), optimizer=opt)
    model.train(2, _dataset(x, y))
    return model.losses, _weights(net)


def _own_loss(devices, shard, wrap=None, step=False, make=None, **context):
    _context(devices, **context)
    cell = make() if make is not None else NetWithLoss(Net(shard))
    _set(cell)
    x, _, y = _columns()
    opt = nn.Momentum(cell.trainable_params(), 0.05, 0.9)
    seen = Outputs()
    if step:
        model = Model(nn.TrainOneStepCell(cell, opt))
    elif wrap is None:
        model = Model(cell, optimizer=opt)
    else:
        model = Model(wrap(cell), optimizer=opt)
    model.train(2, _dataset(x, y), callbacks=[seen])
    assert seen.seen == pytest.approx(model.losses, abs=0), "callbacks see the trained loss"
    return model.losses, _weights(cell)


def _same(a, b):
    (la, wa), (lb, wb) = a, b
    assert len(la) == 2 * N // BATCH
    assert la == lb, "the same losses, bitwise"
    for x, y in zip(wa, wb):
        assert np.array_equal(x, y), "the same trained weights, bitwise"


@pytest.mark.parametrize("devices, shard", [(1, None), (2, 2), (4, 4)])
def test_a_loss_cell_of_ones_own_trains_as_model_with_loss_fn(devices, shard):
    _same(_own_loss(devices, shard), _with_loss_fn(devices, shard))


def test_train_one_step_cell_of_a_loss_cell_of_ones_own():
    _same(_own_loss(2, 2, step=True), _with_loss_fn(2, 2))


def test_under_auto_parallel_and_grad_accumulation():
    auto = lambda cell: AutoParallel(cell, parallel_mode="semi_auto")  # noqa: E731
    _same(_own_loss(2, 2, wrap=auto), _with_loss_fn(2, 2, wrap=auto))
    accumulate = lambda cell: GradAccumulation(cell, 2)  # noqa: E731
    _same(_own_loss(1, None, wrap=accumulate), _with_loss_fn(1, None, wrap=accumulate))
    both = lambda cell: AutoParallel(GradAccumulation(cell, 2))  # noqa: E731
    _same(_own_loss(4, 4, wrap=both), _with_loss_fn(4, 4, wrap=both))


class Inline(nn.Cell):
    """The loss computed inline, the layers direct children of the loss cell."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(FEATURES, HIDDEN, activation="relu")
        self.fc2 = nn.Dense(HIDDEN, CLASSES)
        self.loss = _ce()

    def construct(self, x, y):
        return self.loss(self.fc2(self.fc1(x)), y)


def test_pipeline_stages_and_interleaved_parts_of_an_own_loss_cell():
    def staged(prefix):
        def wrap(cell):
            stages = {f"{prefix}fc1": 0, f"{prefix}fc2": 1}
            auto = AutoParallel(Pipeline(cell, 2, stage_config=stages))
            auto.pipeline(stages=2, scheduler="gpipe")
            return auto
        return wrap
    _same(_own_loss(2, None, wrap=staged(""), make=Inline),
          _with_loss_fn(2, None, wrap=staged("_backbone.")))
    interleaved = lambda cell: MicroBatchInterleaved(cell, 2)  # noqa: E731
    _same(_own_loss(2, None, wrap=interleaved), _with_loss_fn(2, None, wrap=interleaved))


def test_summed_gradients_read_the_own_loss_graph():
    # gradients_mean=False scales the gradients by how the loss's graph divides the batch
    # (parallel/lower.rs loss_batch_shards), which must not depend on a WithLossCell.
    for mean in (False, True):
        _same(_own_loss(4, None, mode="data_parallel", gradients_mean=mean),
              _with_loss_fn(4, None, mode="data_parallel", gradients_mean=mean))
    summed = _own_loss(4, None, mode="data_parallel", gradients_mean=False)
    averaged = _own_loss(4, None, mode="data_parallel", gradients_mean=True)
    assert summed[0][1:] != averaged[0][1:], "the switch changes the run"


def _numpy_masked(x, mask, y, epochs, lr):
    """SGD on Masked in float64, batches in order: the reference of the 3-column network."""
    w = {k: v.astype(np.float64) for k, v in _values().items()}
    losses = []
    for _ in range(epochs):
        for s in range(0, len(x), BATCH):
            xb, mb, yb = x[s:s + BATCH], mask[s:s + BATCH], y[s:s + BATCH]
            pre = xb @ w["fc1.weight"].T + w["fc1.bias"]
            h = np.maximum(pre, 0) * mb
            logits = h @ w["fc2.weight"].T + w["fc2.bias"]
            shifted = logits - logits.max(axis=1, keepdims=True)
            p = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
            losses.append(-np.mean(np.log(p[np.arange(len(yb)), yb])))
            d = p.copy()
            d[np.arange(len(yb)), yb] -= 1
            d /= len(yb)
            grads = {"fc2.weight": d.T @ h, "fc2.bias": d.sum(0)}
            dpre = (d @ w["fc2.weight"]) * mb * (pre > 0)
            grads.update({"fc1.weight": dpre.T @ xb, "fc1.bias": dpre.sum(0)})
            for k in w:
                w[k] -= lr * grads[k]
    return losses, w


def _train_masked(devices, shard, mode="semi_auto_parallel", epochs=2):
    _context(devices, mode)
    cell = _set(Masked(shard))
    x, mask, y = _columns()
    data = ds.NumpySlicesDataset({"x": x, "mask": mask, "y": y}, shuffle=False).batch(BATCH)
    model = Model(cell, optimizer=nn.SGD(cell.trainable_params(), 0.1))
    model.train(epochs, data)
    return model.losses, _weights(cell)


def test_three_columns_train_as_the_numpy_reference_and_sharded_as_one_device():
    x, mask, y = _columns()
    expected, w = _numpy_masked(x, mask, y, 2, 0.1)
    one = _train_masked(1, None)
    np.testing.assert_allclose(one[0], expected, rtol=1e-5, atol=1e-6)
    names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    for got, name in zip(one[1], names):
        np.testing.assert_allclose(got, w[name], rtol=1e-4, atol=1e-5, err_msg=name)
    # Without the mask the run differs: the mask column reached its input, not x.
    assert not np.allclose(one[0], _numpy_masked(x, np.ones_like(mask), y, 2, 0.1)[0],
                           rtol=1e-3)
    _same(_train_masked(2, 2), one)
    _same(_train_masked(4, None, mode="data_parallel"), one)


def test_a_column_count_construct_does_not_take_is_named():
    x, mask, y = _columns()
    three = ds.NumpySlicesDataset({"x": x, "mask": mask, "y": y}, shuffle=False).batch(BATCH)
    cell = NetWithLoss(Net())
    with pytest.raises(TypeError, match=r"the dataset's 3 column\(s\) \['x', 'mask', 'y'\] are "
                                        r"fed positionally to NetWithLoss.construct\(x, y\), "
                                        r"which takes 2"):
        Model(cell, optimizer=nn.SGD(cell.trainable_params(), 0.1)).train(1, three)
    masked = Masked()
    with pytest.raises(TypeError, match=r"2 column\(s\) \['x', 'y'\] .*Masked.construct"
                                        r"\(x, mask, y\), which takes 3"):
        Model(masked, optimizer=nn.SGD(masked.trainable_params(), 0.1)).train(
            1, _dataset(x, y))
    net = Net()
    with pytest.raises(ValueError, match=r"Model.train needs two columns \(data, label\)"):
        Model(net, _ce(), nn.SGD(net.trainable_params(), 0.1)).train(1, three)


class ReturnsLogits(nn.Cell):
    def __init__(self):
        super().__init__()
        self.net = Net()

    def construct(self, x, y):
        return self.net(x)


class ReturnsPair(NetWithLoss):
    def construct(self, x, y):
        return self.loss(self.net(x), y), self.net(x)


@pytest.mark.parametrize("cell, what", [
    (ReturnsLogits, r"returned a tensor of shape \(16, 4\) and dtype"),
    (ReturnsPair, r"returned a tuple"),
])
def test_a_construct_returning_no_scalar_loss_is_refused_naming_it(cell, what):
    x, _, y = _columns()
    net = cell() if cell is ReturnsLogits else cell(Net())
    with pytest.raises(TypeError, match=rf"Model.train: {cell.__name__}.construct {what}.*must "
                                        r"return its loss, a scalar float tensor"):
        Model(net, optimizer=nn.SGD(net.trainable_params(), 0.1)).train(1, _dataset(x, y))


def test_labels_of_an_own_loss_are_checked_as_class_indices_and_eval_needs_eval_network():
    x, _, y = _columns()
    y = y.copy()
    y[5] = CLASSES
    cell = NetWithLoss(Net())
    model = Model(cell, optimizer=nn.SGD(cell.trainable_params(), 0.1), metrics={"accuracy"})
    with pytest.raises(ValueError, match=r"column y: sample 5 has label 4, but the network's "
                                         r"output has 4 classes"):
        model.train(1, _dataset(x, y))
    with pytest.raises(ValueError, match=r"Model.eval: the network \(NetWithLoss\) computes its "
                                         r"own loss.*eval_network"):
        model.eval(_dataset(x, y))


def test_a_wrapper_inside_an_own_loss_cell_is_refused_naming_it():
    x, _, y = _columns()
    cell = NetWithLoss(AutoParallel(Net()))
    with pytest.raises(TypeError, match=r"Model.train: the cell 'net' of the loss cell is a "
                                        r"AutoParallel, whose settings apply only around the "
                                        r"loss: give "
                                        r"AutoParallel\(NetWithLoss\(...\)\) to Model"):
        Model(cell, optimizer=nn.SGD(cell.trainable_params(), 0.1)).train(1, _dataset(x, y))


def test_columns_named_as_parameters_or_nodes_train():
    # A column's name was the graph input's: `fc1.weight` collided with the Parameter's.
    x, _, y = _columns()
    losses = []
    for names in (("x", "y"), ("fc1.weight", "loss")):
        _context(1)
        cell = _set(Inline())
        model = Model(cell, optimizer=nn.SGD(cell.trainable_params(), 0.1))
        model.train(1, _dataset(x, y, names=names))
        losses.append(model.losses)
    assert losses[0] == losses[1]


def test_predict_of_an_own_loss_cell_taking_several_columns_is_refused_naming_it():
    x, _, y = _columns()
    cell = _set(NetWithLoss(Net()))
    model = Model(cell, optimizer=nn.SGD(cell.trainable_params(), 0.1))
    model.train(1, _dataset(x, y))
    with pytest.raises(TypeError, match=r"Model.predict: NetWithLoss.construct\(x, y\) takes 2 "
                                        r"inputs"):
        model.predict(x[:4])
    # The network inside predicts with the trained values.
    out = Model(cell.net).predict(x[:4]).asnumpy()
    assert out.shape == (4, CLASSES) and np.isfinite(out).all()


def test_checkpoints_of_an_own_loss_cell_hold_its_parameter_names(tmp_path):
    from tessera.train import CheckpointConfig, ModelCheckpoint, load_checkpoint
    x, _, y = _columns()
    cell = _set(NetWithLoss(Net()))
    model = Model(cell, optimizer=nn.Momentum(cell.trainable_params(), 0.05, 0.9))
    saver = ModelCheckpoint("own", str(tmp_path), CheckpointConfig(save_checkpoint_steps=4))
    model.train(1, _dataset(x, y), callbacks=[saver])
    final = load_checkpoint(str(tmp_path / "own-1_4"))
    for name, p in cell.parameters_and_names():
        assert name.startswith("net.")
        assert np.array_equal(final[name].asnumpy(), p.asnumpy()), name
    assert "moments.net.fc1.weight" in final
    # The next train resumes from the saved set: its first loss continues the run.
    first = list(model.losses)
    model.train(1, _dataset(x, y))
    assert len(model.losses) == len(first) and model.losses != first


def _staged(stage_config, stages=2, strategy=None):
    """``AutoParallel(Pipeline(cell, 2, stage_config))`` over ``stages`` stages (GPipe)."""
    def wrap(cell):
        auto = AutoParallel(Pipeline(cell, 2, stage_config=stage_config))
        auto.pipeline(stages=stages, scheduler="gpipe")
        if strategy is not None:
            auto.save_param_strategy_file(str(strategy))
        return auto
    return wrap


def test_stage_config_keys_inside_an_own_loss_cells_network(tmp_path):
    # `self.net`'s cells are named below the loss cell's `net`: the engine cut the layer `net`
    # at the keys (it refused "net.fc1 matches no layer"), as MindSpore stages cells at any depth.
    strategy = tmp_path / "strategy.ckpt"
    staged = _own_loss(2, None, wrap=_staged({"net.fc1": 0, "net.fc2": 1}, strategy=strategy))
    # Bitwise one device's run, and the same network's WithLossCell pipeline.
    _same(staged, _own_loss(1, None))
    _same(staged, _with_loss_fn(2, None, wrap=_staged({"_backbone.fc1": 0, "_backbone.fc2": 1})))
    # Each cell's parameters on its stage (the strategy file's "<stage>-<name>").
    saved = strategy.read_bytes()
    for name in (b"0-net.fc1.weight", b"0-net.fc1.bias", b"1-net.fc2.weight", b"1-net.fc2.bias"):
        assert name in saved, name


class Act(nn.Cell):
    """An activation cell of two ops."""

    def __init__(self):
        super().__init__()
        self.relu = ops.ReLU()
        self.neg = ops.Neg()

    def construct(self, x):
        return self.neg(self.relu(x))


class SharedAct(nn.Cell):
    """One activation cell called after fc1 and after fc2."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(FEATURES, HIDDEN)
        self.act = Act()
        self.fc2 = nn.Dense(HIDDEN, CLASSES)

    def construct(self, x):
        return self.act(self.fc2(self.act(self.fc1(x))))


def test_hostile_stage_config_keys_inside_an_own_loss_cell_are_refused_naming_them():
    def train(stage_config, make=lambda: NetWithLoss(Net())):
        _own_loss(2, None, wrap=_staged(stage_config), make=make)

    with pytest.raises(ValueError, match=r"stage_config names the cell 'net.fc3', which the "
                                         r"network does not have \(its cells: .*net.fc1"):
        train({"net.fc1": 0, "net.fc3": 1})
    with pytest.raises(ValueError, match=r"'net.fc1.matmul'.*does not have"):
        train({"net.fc1": 0, "net.fc1.matmul": 1})
    with pytest.raises(tessera.ConfigError, match=r"cell \"net.fc2\" is assigned to stage 0, "
                                                  r"but it comes after \"net.fc1\" on stage 1"):
        train({"net.fc1": 1, "net.fc2": 0})
    # A key giving the shared cell stage 0: its second call reads fc2's output on stage 1.
    with pytest.raises(tessera.ConfigError, match=r"op \"net.act.relu_1\" of cell \"net.act\" "
                                                  r"is given stage 0, but it reads the output of "
                                                  r"op \"net.fc2.bias_add\" on stage 1"):
        train({"net.fc1": 0, "net.act": 0, "net.fc2": 1}, make=lambda: NetWithLoss(SharedAct()))


def test_a_shared_cell_called_after_a_later_stages_cell_runs_on_that_stage():
    # Its second call ran on the first stage, reading fc2's output from the second in the same
    # forward pass: 1F1B deadlocked (every Model.train with a cell used before and after a cut).
    import threading

    make = lambda: NetWithLoss(SharedAct())  # noqa: E731
    result = {}
    for scheduler in ("1f1b", "gpipe"):
        def run(scheduler=scheduler):
            def wrap(cell):
                auto = AutoParallel(Pipeline(cell, 2, stage_config={"net.fc1": 0,
                                                                      "net.fc2": 1}))
                auto.pipeline(stages=2, scheduler=scheduler)
                return auto
            result[scheduler] = _own_loss(2, None, wrap=wrap, make=make)
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(timeout=120)
        assert not worker.is_alive(), f"{scheduler}: the pipeline deadlocked"
        _same(result[scheduler], _own_loss(1, None, make=make))


def test_the_pipeline_stage_attribute_stages_cells_inside_an_own_loss_cell(tmp_path):
    strategy = tmp_path / "strategy.ckpt"

    def make():
        cell = NetWithLoss(Net())
        cell.net.fc1.pipeline_stage = 0
        cell.net.fc2.pipeline_stage = 1
        return cell

    staged = _own_loss(2, None, wrap=_staged(None, strategy=strategy), make=make)
    _same(staged, _own_loss(1, None))
    assert b"1-net.fc2.weight" in strategy.read_bytes()
    # Given twice with different stages, or without the Pipeline that reads it: refused.
    with pytest.raises(ValueError, match=r"the cell 'net.fc2' has pipeline_stage = 1 but "
                                         r"stage_config\['net.fc2'\] = 0"):
        _own_loss(2, None, wrap=_staged({"net.fc2": 0}), make=make)

    def staged_without_pipeline(cell):
        auto = AutoParallel(cell)
        auto.pipeline(stages=2)
        return auto

    with pytest.raises(ValueError, match=r"the cell 'net.fc1' has a pipeline_stage, which "
                                         r"Tessera reads from a Pipeline"):
        _own_loss(2, None, wrap=staged_without_pipeline, make=make)
    with pytest.raises(TypeError, match=r"'pipeline_stage' must be int type"):
        Net().pipeline_stage = "1"
    with pytest.raises(ValueError, match=r"'pipeline_stage' can not be less than 0"):
        Net().pipeline_stage = -1
    assert Net().pipeline_stage == -1
