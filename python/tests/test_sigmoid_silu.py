"""``Sigmoid`` and ``SiLU`` (``x * sigmoid(x)``): ``nn.Sigmoid``/``nn.SiLU``, ``ops.Sigmoid``/
``ops.SiLU``, ``ops.sigmoid``/``ops.silu`` and ``Dense(activation="sigmoid"|"silu")`` train as
the same maths written with other ops, and the same on one device and sharded on two."""

import warnings

import numpy as np
import pytest

import tessera
from tessera import dataset as ds
from tessera import nn, ops
from tessera.train import Model

from nets import fresh_context  # noqa: F401 (the fixture is used by name)

pytestmark = pytest.mark.usefixtures("fresh_context")


def _data(steps=3, batch=8, features=6, classes=4):
    rng = np.random.default_rng(5)
    x = (2 * rng.standard_normal((steps * batch, features))).astype(np.float32)
    y = rng.integers(0, classes, steps * batch).astype(np.int32)
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(batch)


class _Exact(nn.Cell):
    """``1 / (1 + e^-x)`` (``silu``: times ``x``) from ``Exp``, ``Neg``, ``Add`` and
    ``RealDiv``: the reference the Sigmoid op must match."""

    def __init__(self, silu):
        super().__init__()
        self.silu = silu
        self.exp, self.neg = ops.Exp(), ops.Neg()

    def construct(self, x):
        s = 1.0 / (self.exp(self.neg(x)) + 1.0)
        return x * s if self.silu else s


def _w(out, inp, seed):
    """Fixed initial weights: the runs compared start from the same values."""
    rng = np.random.default_rng(seed)
    return tessera.Tensor((0.5 * rng.standard_normal((out, inp))).astype(np.float32))


class Net(nn.Cell):
    """Dense(6→8) → act1 → Dense(8→8) → act2 → Dense(8→4)."""

    def __init__(self, act1, act2):
        super().__init__()
        self.fc1 = nn.Dense(6, 8, weight_init=_w(8, 6, 1))
        self.act1 = act1
        self.fc2 = nn.Dense(8, 8, weight_init=_w(8, 8, 2))
        self.act2 = act2
        self.fc3 = nn.Dense(8, 4, weight_init=_w(4, 8, 3))

    def construct(self, x):
        return self.fc3(self.act2(self.fc2(self.act1(self.fc1(x)))))


class Functional(nn.Cell):
    """``ops.sigmoid`` and ``ops.silu`` as functions."""

    def __init__(self, name):
        super().__init__()
        self.fn = getattr(ops, name)

    def construct(self, x):
        return self.fn(x)


def _train(net, devices=1, deterministic=False):
    tessera.reset_auto_parallel_context()
    tessera.set_seed(3)
    tessera.set_context(deterministic="ON" if deterministic else "OFF")
    if devices == 1:
        tessera.set_auto_parallel_context(device_num=1, parallel_mode="stand_alone")
    else:
        tessera.set_auto_parallel_context(device_num=devices,
                                          parallel_mode="semi_auto_parallel")
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss, nn.SGD(net.trainable_params(), 0.5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.train(1, _data())
    params = {p.name: p.asnumpy() for p in net.trainable_params()}
    return np.array(model.losses), params


def _assert_same(got, want, tol):
    (l1, p1), (l2, p2) = got, want
    assert l1.shape == l2.shape and np.abs(l1 - l2).max() <= tol, (l1, l2)
    for name, value in p2.items():
        assert np.abs(p1[name] - value).max() <= tol, name


def test_sigmoid_and_silu_train_as_their_formulas():
    want = _train(Net(_Exact(False), _Exact(True)))
    assert np.isfinite(want[0]).all() and want[0][0] != want[0][-1]
    _assert_same(_train(Net(nn.Sigmoid(), nn.SiLU())), want, 2e-6)
    _assert_same(_train(Net(Functional("sigmoid"), Functional("silu"))), want, 2e-6)
    prims = Net(ops.Sigmoid(), ops.SiLU())
    _assert_same(_train(prims), want, 2e-6)
    # Neither is the other: SiLU's formula differs from Sigmoid's.
    other = _train(Net(nn.Sigmoid(), nn.Sigmoid()))
    assert np.abs(other[0] - want[0]).max() > 1e-3


def test_dense_takes_sigmoid_and_silu_by_name():
    class Named(nn.Cell):
        def __init__(self, a1, a2):
            super().__init__()
            self.fc1 = nn.Dense(6, 8, weight_init=_w(8, 6, 1), activation=a1)
            self.fc2 = nn.Dense(8, 8, weight_init=_w(8, 8, 2), activation=a2)
            self.fc3 = nn.Dense(8, 4, weight_init=_w(4, 8, 3))

        def construct(self, x):
            return self.fc3(self.fc2(self.fc1(x)))

    want = _train(Net(nn.Sigmoid(), nn.SiLU()))
    _assert_same(_train(Named("sigmoid", "SiLU")), want, 0)


def _sharded(batch_split):
    net = Net(nn.Sigmoid(), nn.SiLU())
    if batch_split:
        net.act1.sigmoid.shard(((2, 1),))
        net.act2.silu.shard(((2, 1),))
    else:  # the features split: model parallel
        net.fc1.matmul.shard(((1, 1), (2, 1)))
        net.act1.sigmoid.shard(((1, 2),))
        net.act2.silu.shard(((1, 2),))
    return net


@pytest.mark.parametrize("batch_split", [True, False])
def test_sharded_on_two_devices_trains_as_one(batch_split):
    one = _train(Net(nn.Sigmoid(), nn.SiLU()), deterministic=True)
    two = _train(_sharded(batch_split), devices=2, deterministic=True)
    _assert_same(two, one, 0)


def test_silu_strategy_reaches_both_of_its_nodes():
    tessera.set_auto_parallel_context(device_num=2, parallel_mode="semi_auto_parallel")
    net = _sharded(False)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss, nn.SGD(net.trainable_params(), 0.5))
    model.train(1, _data(steps=1))
    import json
    ops_saved = json.loads((model._checkpoint / "strategy.json").read_text())["ops"]
    by_name = {op["name"]: op for op in ops_saved}
    assert {"act1", "act2", "act2.sigmoid"} <= set(by_name), sorted(by_name)
    assert "[1, 2]" in json.dumps(by_name["act2.sigmoid"])
    assert "[1, 2]" in json.dumps(by_name["act2"])


def test_a_silu_strategy_of_the_wrong_rank_names_the_node():
    tessera.set_auto_parallel_context(device_num=2, parallel_mode="semi_auto_parallel")
    net = Net(nn.Sigmoid(), nn.SiLU())
    net.act2.silu.shard(((2,),))
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    with pytest.raises(ValueError, match="act2.*strategy"):
        Model(net, loss, nn.SGD(net.trainable_params(), 0.5)).train(1, _data(steps=1))
