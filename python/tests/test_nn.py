"""Your own network in Python with MindSpore's API (first slice of issue 34): a Cell traced once
into Tessera's graph and trained by the Rust engine, on one device and on eight with `shard`
strategies; errors naming the op, the Cell and the rule; callbacks."""

import struct

import numpy as np
import pytest

import tessera
from tessera import dataset as ds
from tessera import nn, ops
from tessera.common.initializer import Normal, Zero, initializer
from tessera.train import Callback, LossMonitor, Model

from conftest import REPO
from nets import MLP, fresh_context  # noqa: F401 (the fixture is used by name)

DIGITS = REPO / "data" / "digits"


def _idx(path):
    """An IDX file (big-endian header, u8 data) as a numpy array; independent of the engine."""
    data = path.read_bytes()
    dims = data[3]
    shape = struct.unpack(f">{dims}I", data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def _digits(n=256):
    images = _idx(DIGITS / "train-images-idx3-ubyte")[:n].astype(np.float32)
    labels = _idx(DIGITS / "train-labels-idx1-ubyte")[:n].astype(np.int32)
    images = (images - images.mean()) / images.std()
    return images, labels


pytestmark = pytest.mark.usefixtures("fresh_context")


class OwnOps(nn.Cell):
    """A network written with primitives and Parameters, as MindSpore's examples do."""

    def __init__(self, shard=False):
        super().__init__()
        self.w1 = tessera.Parameter(initializer(Normal(0.1), (64, 32)))
        self.b1 = tessera.Parameter(initializer(Zero(), (32,)))
        self.w2 = tessera.Parameter(initializer(Normal(0.1), (32, 10)))
        self.reshape = ops.Reshape()
        self.matmul1 = ops.MatMul()
        self.add = ops.Add()
        self.relu = ops.ReLU()
        self.matmul2 = ops.MatMul()
        if shard:
            self.matmul1.shard(((2, 1), (1, 4)))
            self.add.shard(((2, 4), (4,)))
            self.relu.shard(((2, 4),))

    def construct(self, x):
        x = self.reshape(x, (-1, 64))
        h = self.relu(self.add(self.matmul1(x, self.w1), self.b1))
        return self.matmul2(h, self.w2)


def _train(net, devices=1, epochs=2, callbacks=None, optimizer=None, deterministic=False,
           n=256):
    tessera.set_context(deterministic="ON" if deterministic else "OFF")
    tessera.set_auto_parallel_context(device_num=devices, parallel_mode="semi_auto_parallel")
    images, labels = _digits(n)
    data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=True)
    data = data.batch(32, drop_remainder=True)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = optimizer or nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    model = Model(net, loss_fn=loss, optimizer=opt)
    model.train(epochs, data, callbacks=callbacks)
    return np.array(model.losses)


def test_mlp_trains_and_its_losses_decrease(capsys):
    losses = _train(MLP(64), epochs=3, callbacks=[LossMonitor(8)])
    assert len(losses) == 3 * 256 // 32
    assert np.isfinite(losses).all()
    assert losses[-4:].mean() < 0.6 * losses[:4].mean()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("epoch: 1 step: 8, loss is ")
    assert len(out) == 3


def test_parameter_and_op_names_follow_the_attribute_path():
    net = MLP(64)
    names = [p.name for p in net.trainable_params()]
    assert names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert net.fc1.matmul._name == "fc1.matmul"
    assert net.fc1.activation.relu._name == "fc1.activation"


@pytest.mark.parametrize("make", [lambda s: MLP(64, s), OwnOps], ids=["Dense", "primitives"])
def test_eight_devices_with_strategies_give_one_devices_losses(make):
    one = _train(make(False), devices=1)
    eight = _train(make(True), devices=8)
    np.testing.assert_allclose(eight, one, atol=1e-5, rtol=0)
    one = _train(make(False), devices=1, deterministic=True)
    eight = _train(make(True), devices=8, deterministic=True)
    assert (eight == one).all(), "deterministic mode is bitwise one device's"


@pytest.mark.parametrize("opt", [
    lambda p: nn.SGD(p, learning_rate=0.1),
    lambda p: nn.SGD(p, learning_rate=0.05, momentum=0.9),
    lambda p: nn.Adam(p, learning_rate=0.01),
    lambda p: nn.AdamWeightDecay(p, learning_rate=0.01, weight_decay=0.01),
], ids=["SGD", "SGD-momentum", "Adam", "AdamWeightDecay"])
def test_optimizers_train(opt):
    net = MLP(64)
    losses = _train(net, epochs=2, optimizer=opt(net.trainable_params()))
    assert losses[-4:].mean() < losses[:4].mean()


def test_a_bad_strategy_names_the_op_and_the_rule():
    net = MLP(64)
    net.fc1.matmul.shard(((3, 1), (4, 1)))
    with pytest.raises(tessera.ConfigError) as err:
        _train(net, devices=8, epochs=1)
    assert "fc1.matmul" in str(err.value)
    assert "3 does not divide" in err.value.rule
    net = MLP(64)
    net.fc1.matmul.shard(((2, 1),))
    with pytest.raises(ValueError, match=r"fc1\.matmul: in_strategy has 1 entry but MatMul "
                                         r"takes 2 input\(s\)"):
        _train(net, devices=8, epochs=1)
    tessera.set_auto_parallel_context(parallel_mode="stand_alone")
    with pytest.raises(ValueError, match="'stand_alone' is one device"):
        Model(MLP(64), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")).train(
            1, ds.NumpySlicesDataset(_digits(64)).batch(32))
    with pytest.raises(TypeError, match="positive ints"):
        ops.MatMul().shard(((2, 0), (1, 1)))


class Boom(Exception):
    pass


class FailAt(Callback):
    def __init__(self, step):
        self.step, self.seen = step, []

    def on_train_step_end(self, run_context):
        args = run_context.original_args()
        self.seen.append((args.cur_epoch_num, args.cur_step_num, float(args.net_outputs)))
        if args.cur_step_num == self.step:
            raise Boom(f"stop at {self.step}")


@pytest.mark.parametrize("devices", [1, 8])
def test_an_exception_in_a_callback_stops_training_and_reaches_the_caller(devices):
    cb = FailAt(3)
    with pytest.raises(Boom, match="stop at 3"):
        _train(MLP(64, shard=devices == 8), devices=devices, epochs=2, callbacks=[cb])
    assert [s[1] for s in cb.seen] == [1, 2, 3]
    assert all(np.isfinite(s[2]) for s in cb.seen)


def test_run_context_fields_and_request_stop():
    class Stop(Callback):
        def __init__(self):
            self.steps = []

        def on_train_step_end(self, run_context):
            a = run_context.original_args()
            self.steps.append((a.cur_epoch_num, a.cur_step_num, a.batch_num))
            if a.cur_step_num == 10:
                run_context.request_stop()

    cb = Stop()
    losses = _train(MLP(64), epochs=3, callbacks=[cb])
    assert cb.steps[7] == (1, 8, 8) and cb.steps[8] == (2, 9, 8)
    assert len(cb.steps) == 10 and len(losses) == 10


def test_an_unsupported_op_names_the_cell_and_the_op():
    class Inner(nn.Cell):
        def __init__(self):
            super().__init__()
            self.print = ops.Print()

        def construct(self, x):
            self.print("strings alone")  # Print needs a tensor to print with
            return x

    class Outer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.flatten = nn.Flatten()
            self.block = Inner()

        def construct(self, x):
            return self.block(self.flatten(x))

    with pytest.raises(ops.UnsupportedOpError) as err:
        _train(Outer(), epochs=1)
    assert err.value.cell == "block (Inner)" and err.value.op == "Print"
    assert "Cell block (Inner): op Print is not supported: prints at least one tensor" in \
        str(err.value)

    class Scales(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(64, 10)
            self.flatten = nn.Flatten()

        def construct(self, x):
            return ops.softmax(self.fc(self.flatten(x)), axis=0)

    with pytest.raises(ops.UnsupportedOpError, match=r"Cell <root> \(Scales\): op Softmax is not "
                       r"supported: axis 0 is not the last axis"):
        _train(Scales(), epochs=1)


def test_shape_errors_name_the_node():
    class Wrong(nn.Cell):
        def __init__(self):
            super().__init__()
            self.flatten = nn.Flatten()
            self.fc = nn.Dense(60, 10)

        def construct(self, x):
            return self.fc(self.flatten(x))

    with pytest.raises(ValueError, match=r"fc\.matmul"):
        _train(Wrong(), epochs=1)


def test_tessera_train_is_the_module_and_the_config_function():
    assert callable(tessera.train) and tessera.train.Model is Model
    assert list(tessera.train.__signature__.parameters)[:2] == ["config", "devices"]


def test_cells_and_ops_are_traced_not_run_eagerly():
    with pytest.raises(RuntimeError, match="no eager mode"):
        MLP(64)(np.zeros((1, 8, 8), np.float32))


def test_train_arguments_are_checked_naming_them():
    # "2" was a TypeError about int + str, True trained one epoch, and a str callback was an
    # AttributeError: each now names the argument, before anything runs.
    net = MLP(64)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    images, labels = _digits(64)
    data = ds.NumpySlicesDataset({"image": images, "label": labels}).batch(32)
    for epoch, kind in [("2", TypeError), (True, TypeError), (2.5, TypeError), (None, TypeError),
                        (0, ValueError), (-1, ValueError)]:
        with pytest.raises(kind, match="For 'Model.train', .*'epoch'"):
            model.train(epoch, data)
    with pytest.raises(TypeError, match=r"'callbacks\[1\]' must be a Callback .*but got str"):
        model.train(1, data, callbacks=[LossMonitor(), "x"])
    with pytest.raises(TypeError, match="'callbacks' must be a Callback .*but got int"):
        model.train(1, data, callbacks=5)
    assert model.losses == [] and model._runs is None, "nothing ran"
    model.train(np.int64(1), data, callbacks=(Callback(),))
    assert len(model.losses) == 2


def test_layer_sizes_are_checked_naming_the_argument():
    # Dense(64, -1) was accepted and failed in the tracer with an OverflowError naming
    # nothing; Dense(64, 2.5) was a TypeError from the initializer; Dense(True, 10) was 1.
    with pytest.raises(ValueError, match=r"For 'Dense', the 'out_channels' must be a positive "
                                         r"int, but got -1\."):
        nn.Dense(64, -1)
    with pytest.raises(ValueError, match="'in_channels' must be a positive int, but got 0"):
        nn.Dense(0, 10)
    with pytest.raises(TypeError, match=r"For 'Dense', the type of 'out_channels' must be int, "
                                        r"but got float\."):
        nn.Dense(64, 2.5)
    with pytest.raises(TypeError, match="the type of 'in_channels' must be int, but got bool"):
        nn.Dense(True, 10)
    with pytest.raises(ValueError, match="For 'Embedding', the 'vocab_size' must be a positive"):
        nn.Embedding(-3, 4)
    with pytest.raises(TypeError, match="the type of 'embedding_size' must be int"):
        nn.Embedding(8, "4")
    dense = nn.Dense(np.int64(6), 3)
    assert (dense.in_channels, dense.out_channels) == (6, 3)
    assert type(dense.in_channels) is int and dense.weight.shape == (3, 6)


def test_a_named_run_dir_holds_the_runs_and_is_kept(tmp_path):
    # The default directory is temporary (removed with the Model; a process killed by a signal
    # cannot remove it): a named one is the user's and kept. Each train writes run_<n>/ in it
    # (the Model's earlier run, which the next one resumed from, is removed once the next
    # commits), and runs already there, another Model's, are not written over.
    images, labels = _digits(64)
    data = ds.NumpySlicesDataset({"image": images, "label": labels}).batch(32)
    runs = tmp_path / "runs"
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(MLP(64), loss, run_dir=runs)
    model.train(1, data)
    assert sorted(p.name for p in runs.iterdir()) == ["run_1"]
    model.train(1, data)
    assert sorted(p.name for p in runs.iterdir()) == ["run_2"]
    marker = (runs / "run_2" / "tessera_set.json").read_bytes()
    del model
    import gc
    gc.collect()
    assert runs.is_dir(), "a named directory is never removed"
    other = Model(MLP(64), loss, run_dir=str(runs))
    other.train(1, data)
    other.train(1, data)
    assert sorted(p.name for p in runs.iterdir()) == ["run_2", "run_3"]
    assert (runs / "run_2" / "tessera_set.json").read_bytes() == marker, "the earlier run kept"
    with pytest.raises(TypeError, match="run_dir must be a path"):
        Model(MLP(64), loss, run_dir=5)
