"""``Model(network, loss_fn=None, optimizer=None, metrics=None, eval_network=None,
eval_indexes=None)``: ``Model.eval`` of a loss cell of one's own through an ``eval_network``
returning (loss, logits, label), picked by ``eval_indexes`` or given whole to each metric
(MindSpore's rules), against numpy and against ``Model(net, loss_fn, metrics)``."""

import numpy as np
import pytest

import tessera
from tessera import dataset as ds
from tessera import nn
from tessera.train import Model

from nets import fresh_context  # noqa: F401 (the fixture is used by name)
from test_custom_loss_cell import CLASSES, FEATURES, Net, NetWithLoss, _ce, _columns, _set

pytestmark = pytest.mark.usefixtures("fresh_context")

EVAL_N, EVAL_BATCH = 64, 16


class EvalNet(nn.Cell):
    """MindSpore's WithEvalCell pattern: (loss, logits, label) from (x, y)."""

    def __init__(self, net, order=(0, 1, 2)):
        super().__init__()
        self.backbone = net
        self.loss = _ce()
        self.order = order

    def construct(self, x, y):
        logits = self.backbone(x)
        outs = (self.loss(logits, y), logits, y)
        return tuple(outs[i] for i in self.order)


class LogitsAndLabel(nn.Cell):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, x, y):
        return self.net(x), y


class LossOnly(EvalNet):
    def construct(self, x, y):
        return self.loss(self.backbone(x), y)


def _eval_data(seed=5, n=EVAL_N):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, n).astype(np.int32)
    return x, y


def _dataset(x, y, drop_remainder=False):
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(
        EVAL_BATCH, drop_remainder=drop_remainder)


def _numpy_metrics(net, x, y, drop_remainder=False):
    """Accuracy over the samples and the mean over the batches of each batch's mean cross
    entropy, in float64 from the Parameters' values."""
    w = {name.split(".", 1)[1] if name.count(".") > 1 else name: p.asnumpy().astype(np.float64)
         for name, p in net.parameters_and_names()}
    w = {".".join(k.split(".")[-2:]): v for k, v in w.items()}
    n = len(x) // EVAL_BATCH * EVAL_BATCH if drop_remainder else len(x)
    h = np.maximum(x[:n] @ w["fc1.weight"].T + w["fc1.bias"], 0)
    logits = h @ w["fc2.weight"].T + w["fc2.bias"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    per_sample = -logp[np.arange(n), y[:n]]
    losses = [per_sample[s:s + EVAL_BATCH].mean() for s in range(0, n, EVAL_BATCH)]
    return float(np.mean(np.argmax(logits, axis=1) == y[:n])), float(np.mean(losses))


def _trained():
    """A NetWithLoss trained one epoch on one device; returns (net, cell)."""
    tessera.set_context(deterministic="ON")
    net = Net()
    cell = _set(NetWithLoss(net))
    x, _, y = _columns()
    model = Model(cell, optimizer=nn.SGD(cell.trainable_params(), 0.1))
    model.train(1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(16))
    return net, cell


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_eval_network_with_eval_indexes_gives_the_metrics_of_the_trained_network(drop_remainder):
    net, cell = _trained()
    x, y = _eval_data(n=60 if drop_remainder else EVAL_N)  # 60: 12 samples dropped
    metrics = {"accuracy", "loss"}
    own = Model(cell, optimizer=nn.SGD(cell.trainable_params(), 0.1), metrics=metrics,
                eval_network=EvalNet(net), eval_indexes=[0, 1, 2])
    got = own.eval(_dataset(x, y, drop_remainder))
    accuracy, loss = _numpy_metrics(net, x, y, drop_remainder)
    assert got["accuracy"] == accuracy
    assert got["loss"] == pytest.approx(loss, rel=1e-5)
    # The same backbone under Model(net, loss_fn, metrics), which computes them itself.
    plain = Model(net, _ce(), nn.SGD(net.trainable_params(), 0.1), metrics=metrics)
    expected = plain.eval(_dataset(x, y, drop_remainder))
    assert got["accuracy"] == expected["accuracy"]
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    # Other positions, picked by eval_indexes; the parameter names stay the trained network's.
    shuffled = Model(cell, optimizer=nn.SGD(cell.trainable_params(), 0.1), metrics=metrics,
                     eval_network=EvalNet(net, order=(2, 0, 1)), eval_indexes=[1, 2, 0])
    assert shuffled.eval(_dataset(x, y, drop_remainder)) == got
    assert sorted(name for name, _ in cell.parameters_and_names())[0] == "net.fc1.bias"


def test_without_eval_indexes_every_output_goes_to_every_metric():
    net, cell = _trained()
    x, y = _eval_data()
    accuracy, loss = _numpy_metrics(net, x, y)
    opt = nn.SGD(cell.trainable_params(), 0.1)
    got = Model(cell, optimizer=opt, metrics={"acc"},
                eval_network=LogitsAndLabel(net)).eval(_dataset(x, y))
    assert got == {"acc": accuracy}
    got = Model(cell, optimizer=opt, metrics={"loss": nn.Loss()},
                eval_network=LossOnly(net)).eval(_dataset(x, y))
    assert got["loss"] == pytest.approx(loss, rel=1e-5)
    # An untrained network evaluates with the values training would start from, as without
    # eval_network; one-hot labels are taken by their arg-max.
    onehot = np.eye(CLASSES, dtype=np.float32)[y]
    fresh = Net()
    got = Model(fresh, metrics={"accuracy"}, eval_network=LogitsAndLabel(fresh)).eval(
        _dataset(x, onehot))
    by_index = Model(fresh, metrics={"accuracy"}, eval_network=LogitsAndLabel(fresh)).eval(
        _dataset(x, y))
    assert got == by_index and 0 <= got["accuracy"] <= 1


class ReturnsList(nn.Cell):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, x, y):
        return self.net(x), 3


def test_eval_network_refusals_are_named():
    net, cell = _trained()
    x, y = _eval_data()
    opt = nn.SGD(cell.trainable_params(), 0.1)
    with pytest.raises(ValueError, match=r"'eval_indexes' must be a list or None.*length of it "
                                         r"must be three.*\(0, 1, 2\)"):
        Model(cell, optimizer=opt, eval_network=EvalNet(net), eval_indexes=(0, 1, 2))
    with pytest.raises(ValueError, match=r"'eval_indexes'.*\[0, 1\]"):
        Model(cell, optimizer=opt, eval_network=EvalNet(net), eval_indexes=[0, 1])
    with pytest.raises(ValueError, match=r"eval_indexes is used only with an eval_network"):
        Model(cell, optimizer=opt, eval_indexes=[0, 1, 2])
    with pytest.raises(TypeError, match=r"eval_network must be a Cell, but got function"):
        Model(cell, optimizer=opt, eval_network=lambda x, y: x)

    def evaluate(eval_network, metrics=("accuracy", "loss"), eval_indexes=None, data=None):
        model = Model(cell, optimizer=opt, metrics=set(metrics), eval_network=eval_network,
                      eval_indexes=eval_indexes)
        return model.eval(data if data is not None else _dataset(x, y))

    with pytest.raises(ValueError, match=r"'loss' takes one output and 'accuracy' two.*give "
                                         r"eval_indexes=\[loss, logits, label\]"):
        evaluate(EvalNet(net))
    with pytest.raises(ValueError, match=r"returns 3 output\(s\).*'accuracy' takes two"):
        evaluate(EvalNet(net), metrics=("accuracy",))
    with pytest.raises(ValueError, match=r"returns 2 output\(s\); with eval_indexes it must "
                                         r"return at least 3"):
        evaluate(LogitsAndLabel(net), eval_indexes=[0, 1, 1])
    with pytest.raises(ValueError, match=r"eval_indexes \[0, 1, 5\] names output 5, but the "
                                         r"eval_network returns 3"):
        evaluate(EvalNet(net), eval_indexes=[0, 1, 5])
    with pytest.raises(ValueError, match=r"output 2 of the eval_network \(the loss\) has shape "
                                         r"\(16,\)"):
        evaluate(EvalNet(net), eval_indexes=[2, 1, 2])
    with pytest.raises(TypeError, match=r"output 1 of the eval_network \(ReturnsList\) is a int"):
        evaluate(ReturnsList(net), metrics=("accuracy",))
    with pytest.raises(TypeError, match=r"Model.eval: eval_network: the dataset's 3 column\(s\) "
                                        r"\['x', 'y', 'z'\] are fed positionally to "
                                        r"EvalNet.construct\(x, y\), which takes 2$"):
        evaluate(EvalNet(net), eval_indexes=[0, 1, 2], data=ds.NumpySlicesDataset(
            {"x": x, "y": y, "z": y}, shuffle=False).batch(EVAL_BATCH))
    with pytest.raises(ValueError, match=r"the dataset has 10 sample\(s\), no batch of "
                                         r"batch_size 16"):
        evaluate(EvalNet(net), eval_indexes=[0, 1, 2], data=_dataset(x[:10], y[:10], True))


def test_forward_outputs_refuses_inputs_that_do_not_fit_naming_them():
    from tessera._tessera import NetworkBuilder, forward_outputs
    b = NetworkBuilder()
    x, _ = b.input("x", [4, 3], "float32")
    y, _ = b.input("y", [4], "int32")
    x_ok = np.zeros((8, 3), np.float32)
    y_ok = np.zeros(8, np.int32)
    out = forward_outputs(b, [x, y], [x], [], [x_ok, y_ok])
    assert len(out) == 1 and out[0].shape == (2, 4, 3)
    with pytest.raises(ValueError, match=r"1 column\(s\) for 2 graph input\(s\)"):
        forward_outputs(b, [x, y], [x], [], [x_ok])
    with pytest.raises(ValueError, match=r"column 0 has shape \[8, 2\]; the network takes "
                                         r"samples of shape \[3\]"):
        forward_outputs(b, [x, y], [x], [], [np.zeros((8, 2), np.float32), y_ok])
    with pytest.raises(ValueError, match=r"column 1 has 6 samples in batches of 4; every column"):
        forward_outputs(b, [x, y], [x], [], [x_ok, np.zeros(6, np.int32)])
    with pytest.raises(ValueError, match=r"6 samples do not make whole batches of 4"):
        forward_outputs(b, [x, y], [x], [], [x_ok[:6], y_ok[:6]])
    with pytest.raises(ValueError, match=r"output 1: .*expected dtype f32, got i32"):
        forward_outputs(b, [x, y], [y], [], [x_ok, y_ok])
