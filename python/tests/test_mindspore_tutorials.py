"""MindSpore users' scripts as the official tutorials write them, with ``import mindspore as ms``
read as ``import tessera as ms`` and nothing else changed (adapted to tiny data): the names
they import exist, and what they compute is what they compute on one device."""

import numpy as np
import pytest

import tessera as ms
from tessera import dataset as ds
from tessera import nn, ops
from tessera.common.initializer import initializer
from tessera.train import CheckpointConfig, LossMonitor, Model, ModelCheckpoint

from conftest import CASES, assert_same_file, read_ckpt
from nets import fresh_context  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("fresh_context")

_RS = np.random.RandomState(5)
X = _RS.rand(64, 1, 4, 4).astype(np.float32)
Y = (np.arange(64) % 4).astype(np.int32)


def _dataset(batch=16):
    return ds.NumpySlicesDataset({"image": X, "label": Y}, shuffle=False).batch(batch)


class Network(nn.Cell):
    """The beginner tutorials' network (``Flatten`` and a ``SequentialCell`` of Dense + ReLU),
    on 4x4 images."""

    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.dense_relu_sequential = nn.SequentialCell(nn.Dense(16, 8), nn.ReLU(),
                                                       nn.Dense(8, 4))

    def construct(self, x):
        return self.dense_relu_sequential(self.flatten(x))


def _train(net, epochs=1):
    model = Model(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    model.train(epochs, _dataset(), callbacks=[LossMonitor()])
    return model.losses


def test_data_parallel_tutorial_with_parallel_mode_names():
    # "Data Parallel": set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL,
    # gradients_mean=True) — tessera had no ParallelMode (an AttributeError at that line).
    ms.set_context(mode=ms.GRAPH_MODE, deterministic="ON")
    ms.set_seed(1)
    one = _train(Network())
    ms.set_seed(1)
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                 device_num=4)
    assert _train(Network()) == one
    assert ms.ParallelMode.SEMI_AUTO_PARALLEL == "semi_auto_parallel"
    with pytest.raises(ValueError, match="parallel_mode 'auto_parallel' is not supported"):
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.AUTO_PARALLEL)


def test_the_older_context_module():
    # `from mindspore import context` / `from mindspore.context import ParallelMode`
    from tessera import context
    from tessera.context import ParallelMode

    context.set_context(mode=context.GRAPH_MODE)
    context.set_auto_parallel_context(parallel_mode=ParallelMode.SEMI_AUTO_PARALLEL, device_num=2)
    assert ms._context._STATE["parallel_mode"] == "semi_auto_parallel"
    context.reset_auto_parallel_context()
    assert ms._context._STATE["device_num"] == 1


def test_get_auto_parallel_context_returns_what_was_set():
    # "ms.get_auto_parallel_context('device_num')" in the distributed tutorials: an
    # AttributeError before
    assert ms.get_auto_parallel_context("parallel_mode") == ms.ParallelMode.STAND_ALONE
    assert ms.get_auto_parallel_context("device_num") == 1
    # unset, the engine takes the mean: what this returns is what runs (MindSpore says False)
    assert ms.get_auto_parallel_context("gradients_mean") is True
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, device_num=4,
                                 gradients_mean=False)
    assert [ms.get_auto_parallel_context(k) for k in ("parallel_mode", "device_num",
                                                      "gradients_mean")] == [
        "data_parallel", 4, False]
    from tessera import context
    assert context.get_auto_parallel_context("device_num") == 4
    context.reset_auto_parallel_context()
    assert ms.get_auto_parallel_context("device_num") == 1
    with pytest.raises(ValueError, match="'dataset_strategy' is not a key of the auto parallel"):
        ms.get_auto_parallel_context("dataset_strategy")
    with pytest.raises(TypeError, match="attr_key must be a str"):
        ms.get_auto_parallel_context(None)


class OpNet(nn.Cell):
    """"Operator-level Parallelism": Parameters from ``initializer("normal", ...)``, primitives
    sharded by ``.shard``."""

    def __init__(self):
        super().__init__()
        self.flatten = ops.Flatten()
        self.fc1_weight = ms.Parameter(initializer("normal", [16, 8], ms.float32))
        self.fc2_weight = ms.Parameter(initializer("normal", [8, 4], ms.float32))
        self.matmul1 = ops.MatMul()
        self.relu1 = ops.ReLU()
        self.matmul2 = ops.MatMul()

    def construct(self, x):
        x = self.flatten(x)
        x = self.matmul1(x, self.fc1_weight)
        x = self.relu1(x)
        return self.matmul2(x, self.fc2_weight)


def test_operator_parallel_tutorial_gives_one_devices_losses():
    ms.set_context(mode=ms.GRAPH_MODE, deterministic="ON")
    ms.set_seed(1)
    one = _train(OpNet(), epochs=2)
    ms.set_seed(1)
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL,
                                 device_num=4, gradients_mean=True)
    net = OpNet()
    net.matmul1.shard(((2, 1), (1, 2)))
    net.relu1.shard(((4, 1),))
    net.matmul2.shard(((1, 4), (4, 1)))
    assert _train(net, epochs=2) == one


def test_save_and_load_tutorial(tmp_path, monkeypatch):
    # "Saving and Loading the Model": train, save_checkpoint(model, "model.ckpt"), a new
    # network, load_checkpoint + load_param_into_net -> ([], [])
    monkeypatch.chdir(tmp_path)
    ms.set_seed(1)
    model = Network()
    _train(model)
    ms.save_checkpoint(model, "model.ckpt")
    model2 = Network()
    param_dict = ms.load_checkpoint("model.ckpt")
    param_not_load, _ = ms.load_param_into_net(model2, param_dict)
    assert param_not_load == []
    for (name, a), (_, b) in zip(model.parameters_and_names(), model2.parameters_and_names()):
        assert np.array_equal(a.asnumpy(), b.asnumpy()), name
    # the API page's example: filter_prefix leaves those parameters out of the net's load
    part = ms.load_checkpoint("model.ckpt", filter_prefix="dense_relu_sequential.0")
    assert ms.load_param_into_net(Network(), part)[0] == ["dense_relu_sequential.0.weight",
                                                          "dense_relu_sequential.0.bias"]


def test_model_checkpoint_tutorial_loads_the_ckpt_name_it_prints(tmp_path, monkeypatch):
    # ModelCheckpoint(prefix="lenet", directory="./lenet", config) saves `lenet-1_4`; the
    # tutorial then loads "./lenet/lenet-1_4.ckpt", which was "does not exist".
    monkeypatch.chdir(tmp_path)
    net = Network()
    config_ck = CheckpointConfig(save_checkpoint_steps=4, keep_checkpoint_max=10)
    ckpoint = ModelCheckpoint(prefix="lenet", directory="./lenet", config=config_ck)
    model = Model(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    model.train(1, _dataset(), callbacks=[ckpoint, LossMonitor()])
    param_dict = ms.load_checkpoint("./lenet/lenet-1_4.ckpt")
    assert np.array_equal(param_dict["dense_relu_sequential.2.bias"].asnumpy(),
                          net.dense_relu_sequential[2].bias.asnumpy())
    with pytest.raises(ValueError, match="lenet-1_3.ckpt does not exist"):
        ms.load_checkpoint("./lenet/lenet-1_3.ckpt")


def test_transform_checkpoints_tutorial_names(tmp_path):
    # "Model Transformation" (MindSpore 2.x): ms.rank_list_for_transform,
    # ms.transform_checkpoint_by_rank and ms.transform_checkpoints, top-level names
    case = CASES / "case1_dp2mp4_to_2x2"
    src, dst = str(case / "strategy/A.ckpt"), str(case / "strategy/B.ckpt")
    ms.transform_checkpoints(str(case / "src_ckpt"), str(tmp_path / "out"), "converted_", src,
                             dst)
    expected = case / "expected" / "convert_ckpt_A_to_B"
    for r in range(4):
        f = f"rank_{r}/converted_{r}.ckpt"
        assert_same_file(tmp_path / "out" / f, expected / f)
    ranks = ms.rank_list_for_transform(0, src, dst)
    files = {r: str(case / f"src_ckpt/rank_{r}/checkpoint_{r}.ckpt") for r in ranks}
    ms.transform_checkpoint_by_rank(0, files, str(tmp_path / "r0.ckpt"), src, dst)
    assert_same_file(tmp_path / "r0.ckpt", expected / "rank_0/converted_0.ckpt")
    tensors = ms.load_distributed_checkpoint(None, [str(case / f"src_ckpt/rank_{r}/"
                                                        f"checkpoint_{r}.ckpt") for r in range(8)],
                                             dst, src, rank_id=0)
    assert tensors and ms.Model is Model and ms.LossMonitor is LossMonitor


def _from_file(net, path):
    """``net`` with every Parameter loaded from ``path`` (all of them: ``([], [])``)."""
    assert ms.load_param_into_net(net, ms.load_checkpoint(path)) == ([], [])
    return net


def test_an_untrained_network_saves_the_values_training_starts_from(tmp_path, monkeypatch):
    # The tutorials save a freshly built network ("init.ckpt") before training: the file holds
    # the values the engine starts from under the current seed, so training loaded from it
    # gives the fresh run's losses bit for bit.
    monkeypatch.chdir(tmp_path)
    ms.set_context(deterministic="ON")
    ms.set_seed(7)
    net = Network()
    ms.save_checkpoint(net, "init.ckpt")
    fresh = _train(net, epochs=2)
    assert _train(_from_file(Network(), "init.ckpt"), epochs=2) == fresh
    # a MindSpore .ckpt, read by an independent reader: every parameter, float32, its shape
    entries = read_ckpt("init.ckpt")
    assert [(n, t, d) for n, t, d, _ in entries] == [
        ("dense_relu_sequential.0.weight", "Float32", [8, 16]),
        ("dense_relu_sequential.0.bias", "Float32", [8]),
        ("dense_relu_sequential.2.weight", "Float32", [4, 8]),
        ("dense_relu_sequential.2.bias", "Float32", [4])]
    # the values depend on the seed (another seed, another file), and saving changed nothing
    ms.set_seed(8)
    ms.save_checkpoint(Network(), "other.ckpt")
    assert all(a[3] != b[3] for a, b in zip(entries, read_ckpt("other.ckpt")))


def test_saved_initial_values_are_what_sharded_ranks_start_from(tmp_path):
    # initializer("normal", ...) Parameters and sharded ops on 4 devices: the ranks fill their
    # slices, and together they hold exactly the saved whole tensors.
    ms.set_context(deterministic="ON")
    ms.set_seed(3)

    def sharded(net):
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL,
                                     device_num=4)
        net.matmul1.shard(((2, 1), (1, 2)))
        net.matmul2.shard(((1, 4), (4, 1)))
        return net

    net = OpNet()
    ms.save_checkpoint(net, str(tmp_path / "init.ckpt"))
    fresh = _train(sharded(net))
    ms.reset_auto_parallel_context()
    loaded = _from_file(OpNet(), str(tmp_path / "init.ckpt"))
    assert _train(sharded(loaded)) == fresh


def test_saving_an_untrained_parameter_without_a_name_or_frozen_is_refused(tmp_path):
    # nothing says what the engine would start those from: a clear error, no file
    p = ms.Parameter(initializer("normal", [2, 2], ms.float32))
    with pytest.raises(ValueError, match="Parameter None: no value yet"):
        ms.save_checkpoint({"w": p}, str(tmp_path / "a.ckpt"))
    net = Network()
    net.dense_relu_sequential[0].weight.requires_grad = False
    with pytest.raises(ValueError, match="dense_relu_sequential.0.weight: no value yet"):
        ms.save_checkpoint(net, str(tmp_path / "b.ckpt"))
    assert not list(tmp_path.iterdir())


def test_train_one_step_cell_as_models_network():
    # "loss_net = nn.WithLossCell(net, loss_fn); train_net = nn.TrainOneStepCell(loss_net,
    # optim); model = Model(train_net)": the run of Model(net, loss_fn, optim), also on 4
    # devices (an AttributeError before: tessera.nn had no TrainOneStepCell)
    ms.set_context(deterministic="ON")
    for devices in (1, 4):
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL,
                                     device_num=devices)
        ms.set_seed(2)
        plain = _train(Network())
        ms.set_seed(2)
        net = Network()
        optim = nn.Momentum(net.trainable_params(), 0.1, 0.9)
        train_net = nn.TrainOneStepCell(nn.WithLossCell(net, nn.CrossEntropyLoss()), optim)
        model = Model(train_net)
        model.train(1, _dataset(), callbacks=[LossMonitor()])
        assert model.losses == plain and model.network is train_net
        assert net.dense_relu_sequential[0].bias.asnumpy().shape == (8,)  # trained values back


def test_train_one_step_cell_what_it_cannot_take():
    net = Network()
    optim = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    loss_net = nn.WithLossCell(net, nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match="sens=1024.0 is not supported"):
        nn.TrainOneStepCell(loss_net, optim, sens=1024.0)
    with pytest.raises(ValueError, match="return_grad=True is not supported"):
        nn.TrainOneStepCell(loss_net, optim, return_grad=True)
    with pytest.raises(TypeError, match="optimizer must be a tessera.nn optimizer"):
        nn.TrainOneStepCell(loss_net, "Momentum")
    train_net = nn.TrainOneStepCell(loss_net, optim, sens=1.0)
    with pytest.raises(ValueError, match="holds its loss and optimizer"):
        Model(train_net, nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match="holds its loss and optimizer"):
        Model(train_net, optimizer=optim)

    class ClippedStep(nn.TrainOneStepCell):  # a custom step: Tessera would skip it
        def construct(self, *inputs):
            return self.network(*inputs)

    with pytest.raises(ValueError, match="ClippedStep overrides TrainOneStepCell.construct"):
        Model(ClippedStep(loss_net, optim))
    from tessera.parallel.auto_parallel import AutoParallel
    with pytest.raises(TypeError, match="a TrainOneStepCell inside AutoParallel"):
        Model(AutoParallel(train_net))


def test_saving_a_parameter_too_large_to_hold_is_an_error_not_an_abort(tmp_path):
    # 2**59 float32 values pass the graph's shape bound but cannot be allocated: a MemoryError
    # naming the parameter (the interpreter aborted on the failed allocation), no file
    p = ms.Parameter(initializer("normal", [2**39, 2**20], ms.float32), name="huge")
    with pytest.raises(MemoryError, match="the initial value of parameter huge"):
        ms.save_checkpoint({"huge": p}, str(tmp_path / "h.ckpt"))
    assert not list(tmp_path.iterdir())
    from tessera import _tessera
    builder = _tessera.NetworkBuilder()
    x, _ = builder.input("data", [2, 3], "float32")
    with pytest.raises(ValueError, match="value `data` is an input, not a parameter"):
        _tessera.initial_values(builder, [x], 1)


def test_mindspore_names_the_engine_lacks_say_why():
    """MindSpore's cells the engine cannot run and its Python training step are absent
    (``hasattr`` is False, so code probing for them takes its other path), and using one
    says what the engine lacks and what to use instead, not only that the name is absent."""
    import tessera as ms
    from tessera import nn

    for name in ("Conv2d", "MaxPool2d", "BatchNorm2d", "LSTM"):
        assert not hasattr(nn, name)
        with pytest.raises(AttributeError) as err:
            getattr(nn, name)
        text = str(err.value)
        assert f"no attribute '{name}'" in text and "not supported" in text, text
        assert "Dense" in text, text  # the cells it has
    with pytest.raises(AttributeError, match="convolution"):
        nn.Conv2d  # noqa: B018
    for name in ("value_and_grad", "grad", "jit"):
        assert not hasattr(ms, name)
        with pytest.raises(AttributeError, match="Model"):
            getattr(ms, name)
    with pytest.raises(AttributeError, match="save_checkpoint"):
        ms.export  # noqa: B018
    # Other absent names: Python's usual message, nothing added.
    with pytest.raises(AttributeError) as err:
        nn.NoSuchCell  # noqa: B018
    assert str(err.value) == "module 'tessera.nn' has no attribute 'NoSuchCell'"
