"""NumPy scalars (``np.int64``, ``np.float32``, ``np.bool_``: what ``arr.sum()``, ``arr[i]`` or
``np.argmax`` give a script) as settings wherever the engine's configuration is built: taken as
the Python int, float or bool of their value, after the same range checks, so a run with them
is the run with Python numbers, bit for bit. They failed with a bare ``TypeError`` from
``json.dumps`` (naming no setting) or were refused as "not an int"."""

import numpy as np
import pytest

import tessera as ms
from tessera import dataset as ds
from tessera import nn
from tessera.parallel.auto_parallel import AutoParallel
from tessera.parallel.nn import GradAccumulation, MicroBatchInterleaved, Pipeline
from tessera.train import CheckpointConfig, Model, ModelCheckpoint

from nets import fresh_context  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("fresh_context")

_RS = np.random.RandomState(3)
X = _RS.rand(32, 16).astype(np.float32)
Y = (np.arange(32) % 4).astype(np.int32)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(16, 8, activation="relu")
        self.fc2 = nn.Dense(8, 4)

    def construct(self, x):
        return self.fc2(self.fc1(x))


def _losses(num, wrap=None, callbacks=None, schedule=None):
    """Losses of one epoch, every setting given through ``num`` (int, float or bool made from
    a Python value: ``int``/``float``/``bool`` themselves, or numpy's types)."""
    i, f, b = num
    net = Net()
    lr = schedule(i, f, b) if schedule else f(0.1)
    opt = nn.Momentum(net.trainable_params(), lr, f(0.9), weight_decay=f(0.01),
                      use_nesterov=b(False), max_grad_norm=f(2.0))
    w = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    model = Model(wrap(w, i, f, b) if wrap else w, optimizer=opt)
    data = ds.NumpySlicesDataset({"x": X, "y": Y}, shuffle=False).batch(8)
    model.train(i(1), data, callbacks=callbacks(i, f, b) if callbacks else None)
    return model.losses


PY = (int, float, bool)
NP = (np.int64, np.float32, np.bool_)


def _context(i, f, b):
    ms.set_seed(i(5))
    ms.set_context(deterministic="ON")
    ms.set_auto_parallel_context(device_num=i(2), parallel_mode="semi_auto_parallel",
                                 gradients_mean=b(True))


def _both(**kw):
    _context(*PY)
    python = _losses(PY, **kw)
    ms.reset_auto_parallel_context()
    _context(*NP)
    numpy = _losses(NP, **kw)
    assert python == numpy and len(python) == 4
    return python


def test_context_optimizer_and_schedules():
    _both()
    _both(schedule=lambda i, f, b: nn.CosineDecayLR(f(0.01), f(0.1), i(4)))
    _both(schedule=lambda i, f, b: nn.PolynomialDecayLR(f(0.1), f(0.01), i(4), f(1.0),
                                                        update_decay_steps=b(False)))


def test_auto_parallel_switches():
    def wrap(w, i, f, b):
        auto = AutoParallel(MicroBatchInterleaved(w, i(2)))
        auto.enable_gradients_mean()  # as the context says
        auto.hsdp(shard_size=i(-1), threshold=i(0))
        auto.comm_fusion({"openstate": b(True), "allreduce": {"mode": "size", "config": i(32)}})
        auto.dataset_strategy(((i(2), i(1)), (i(2),)))
        auto.pipeline(stages=i(1), output_broadcast=b(False), interleave=b(False))
        return auto
    _both(wrap=wrap)


def test_wrappers_and_checkpoint_config(tmp_path):
    _both(wrap=lambda w, i, f, b: Pipeline(GradAccumulation(w, i(2)), i(1),
                                           stage_config={"network._backbone.fc1": i(0)}))
    for k, num in enumerate((PY, NP)):
        i = num[0]
        config = CheckpointConfig(save_checkpoint_steps=i(2), keep_checkpoint_max=i(1),
                                  integrated_save=num[2](True))
        _losses(num, callbacks=lambda *_: [ModelCheckpoint("p", str(tmp_path / str(k)),
                                                           config)])
    assert sorted(p.name for p in (tmp_path / "0").iterdir()) == \
        sorted(p.name for p in (tmp_path / "1").iterdir()) == ["p-1_4"]


def test_range_checks_apply_to_the_value():
    with pytest.raises(ValueError, match="device_num must be a positive int"):
        ms.set_auto_parallel_context(device_num=np.int64(0))
    with pytest.raises(ValueError, match="device_num must be a positive int"):
        ms.set_auto_parallel_context(device_num=np.uint64(2**64 - 1))
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        ms.set_seed(np.int64(-1))
    with pytest.raises(ValueError, match="gradients_mean must be a bool"):
        ms.set_auto_parallel_context(gradients_mean=np.int64(1))  # a number is no bool
    with pytest.raises(ValueError, match="must be > 0"):
        GradAccumulation(Net(), np.int32(0))
    with pytest.raises(TypeError, match="For 'min_lr', the type must be float"):
        nn.CosineDecayLR(np.int64(0), 0.1, 4)  # an int is no float, as for Python ints
    # a float where the engine takes an int: the engine's error names the key
    net = Net()
    auto = AutoParallel(nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True,
                                                                        reduction="mean")))
    auto.comm_fusion({"allreduce": {"mode": "size", "config": np.float32(32)}})
    ms.set_auto_parallel_context(device_num=2)
    model = Model(auto, optimizer=nn.Momentum(net.trainable_params(), 0.1, 0.9))
    with pytest.raises(ms.ConfigError, match="parallel.comm_fusion.allreduce.config"):
        model.train(1, ds.NumpySlicesDataset({"x": X, "y": Y}, shuffle=False).batch(8))


def test_a_bool_setting_is_a_bool():
    # bool("False") is True: a string was taken as use_nesterov=True without a word
    with pytest.raises(TypeError, match="use_nesterov must be a bool, got str"):
        nn.Momentum(Net().trainable_params(), 0.1, 0.9, use_nesterov="False")
    with pytest.raises(TypeError, match="nesterov must be a bool, got str"):
        nn.SGD(Net().trainable_params(), 0.1, 0.9, nesterov="False")
    with pytest.raises(TypeError, match="momentum must be a number, got str"):
        nn.Momentum(Net().trainable_params(), 0.1, "0.9")
