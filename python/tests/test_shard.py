"""``Cell.shard`` and the functional ``shard`` (MindSpore's, in GRAPH mode): the splits fixed on
a Cell's inputs and parameters reach the ops that read them (the engine's cheapest strategy that
splits them so), the rest follows the mode, and every run trains as one device."""

import json

import numpy as np
import pytest

import tessera
from tessera import dataset as ds
from tessera import nn, ops
from tessera.parallel import Layout
from tessera.parallel.auto_parallel import AutoParallel
from tessera.train import Model

from nets import MLP, fresh_context  # noqa: F401 (the fixture is used by name)

pytestmark = pytest.mark.usefixtures("fresh_context")


def _data():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(16)


def _model(net, devices, tmp_path=None, mode="sharding_propagation"):
    """``net`` trained one epoch in ``AutoParallel(mode)`` on ``devices`` ranks: the Model."""
    tessera.set_seed(2)
    tessera.set_auto_parallel_context(device_num=devices)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    parallel_net = AutoParallel(nn.WithLossCell(net, loss), parallel_mode=mode)
    parallel_net.enable_gradients_mean()
    if tmp_path is not None:
        parallel_net.save_operator_strategy_file(str(tmp_path / "ops.json"))
    model = Model(parallel_net, optimizer=nn.Momentum(net.trainable_params(), 0.05, 0.9))
    model.train(1, _data())
    return model


def _train(net, devices, tmp_path=None, mode="sharding_propagation"):
    return _model(net, devices, tmp_path, mode).losses


def _saved_op(model, name):
    """Op ``name``'s entry in the strategies of the set ``model`` trained last."""
    ops_saved = json.loads((model._checkpoint / "strategy.json").read_text())["ops"]
    return next(op for op in ops_saved if op["name"] == name)


def _strategy_of(tmp_path, op):
    """The in-strategy the saved operator strategy file records for ``op``."""
    text = (tmp_path / "ops.json").read_text()
    found = json.loads(text)
    entries = found.get("ops", found) if isinstance(found, dict) else found
    blob = json.dumps(entries)
    assert op in blob, blob[:500]
    return blob


def test_a_cells_input_split_reaches_the_op_that_reads_it(tmp_path):
    one = _train(MLP(64), 1)
    net = MLP(64)
    net.fc1.shard(((4, 1),))  # fc1's input: the batch split 4 ways
    assert _train(net, 4, tmp_path) == pytest.approx(one, abs=1e-5)
    blob = _strategy_of(tmp_path, "fc1.matmul")
    # fc1.matmul reads the input split (4, 1): its strategy starts with [4, 1].
    start = blob.index("fc1.matmul")
    assert "[4, 1]" in blob[start:start + 400]


def test_a_layout_and_a_parameter_plan_fix_their_splits(tmp_path):
    one = _train(MLP(64), 1)
    net = MLP(64)
    layout = Layout((2, 2), ("dp", "mp"))
    net.fc1.shard((layout("dp", "None"),), parameter_plan={"weight": (2, 1)})
    assert _train(net, 4, tmp_path) == pytest.approx(one, abs=1e-5)
    blob = _strategy_of(tmp_path, "fc1.matmul")
    start = blob.index("fc1.matmul")
    assert "[2, 1], [2, 1]" in blob[start:start + 400].replace("[[", "[").replace("]]", "]")


def test_a_sharded_function_anchors_its_inputs():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.mlp = MLP(64)
            self.scale = tessera.shard(lambda x: ops.mul(x, 0.5), ((2, 1),))

        def construct(self, x):
            return self.mlp(self.scale(x))

    class Plain(Net):
        def __init__(self):
            super().__init__()
            self.scale = lambda x: ops.mul(x, 0.5)

    assert _train(Net(), 2) == pytest.approx(_train(Plain(), 1), abs=1e-5)


def test_bad_shard_arguments_name_the_rule():
    net = MLP(64)
    with pytest.raises(TypeError, match="out_strategy must be a tuple"):
        net.fc1.shard(((4, 1),), out_strategy=[(4, 1)])
    with pytest.raises(TypeError, match="in_strategy must be a tuple"):
        net.fc1.shard([(4, 1)])
    net.fc1.shard(((4, 1, 1),))
    with pytest.raises(ValueError, match=r"strategy \(4, 1, 1\) has 3 dim\(s\) but the input has 2"):
        _train(net, 4)
    other = MLP(64)
    other.fc1.shard(((4, 1),), parameter_plan={"gamma": (2, 1)})
    with pytest.raises(ValueError, match="parameter_plan names 'gamma'"):
        _train(other, 4)


def test_reshard_inside_construct_moves_the_value_to_its_layout(tmp_path):
    from tessera.parallel.function import reshard

    class Net(nn.Cell):
        def __init__(self, layout=None):
            super().__init__()
            self.fc1 = nn.Dense(64, 32, activation="relu")
            self.fc2 = nn.Dense(32, 10)
            self.layout = layout

        def construct(self, x):
            h = self.fc1(x)
            if self.layout is not None:
                h = reshard(h, self.layout)
            return self.fc2(h)

    one = _train(Net(), 1, mode="semi_auto")
    layout = Layout((2, 2), ("dp", "mp"))
    model = _model(Net(layout("dp", "mp")), 4, mode="semi_auto")
    assert model.losses == pytest.approx(one, abs=1e-5)
    # The node is in the run's strategies with the layout's splits, (2, 2) in and out.
    entry = _saved_op(model, "reshard")
    assert json.dumps(entry).count("[2, 2]") >= 2, entry
    # A layout of the wrong rank names the rule.
    with pytest.raises(ValueError, match=r"reshard: layout .* has 3 dim\(s\)"):
        _train(Net(layout("dp", "mp", "None")), 4, mode="semi_auto")


def test_out_strategy_lays_a_cells_output_out():
    one = _train(MLP(64), 1)
    net = MLP(64)
    net.fc1.shard(((2, 1),), out_strategy=((2, 2),))
    model = _model(net, 4)
    assert model.losses == pytest.approx(one, abs=1e-5)
    assert _saved_op(model, "fc1.reshard")["in_strategy"] == [[2, 2]]
    wrong = MLP(64)
    wrong.fc1.shard(((2, 1),), out_strategy=((2, 2), (2, 2)))
    with pytest.raises(ValueError, match="out_strategy has 2 entries but it returns 1"):
        _train(wrong, 4)
