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

from conftest import CASES, assert_same_file
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


def test_an_untrained_network_cannot_be_saved_yet(tmp_path):
    # The tutorials save a freshly built network; its initial values are drawn by the engine
    # when training starts, so there is nothing to save yet: a clear error, no file.
    with pytest.raises(ValueError, match="no value yet; the engine draws it"):
        ms.save_checkpoint(Network(), str(tmp_path / "model.ckpt"))
    assert not (tmp_path / "model.ckpt").exists()
