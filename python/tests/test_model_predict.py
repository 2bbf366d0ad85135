"""``Model.predict``: the network's output for one input, computed forward by the engine from
the Parameters' current values (given, loaded or trained), checked against numpy forwards of
those values, against ``eval`` and, when /tmp/ms-venv holds MindSpore, against MindSpore's own
``Model.predict`` on the same weights; and its refusals."""

import os
import pathlib
import subprocess
import textwrap
import warnings

import numpy as np
import pytest

import tessera
from tessera import dataset as ds
from tessera import nn
from tessera.parallel.auto_parallel import AutoParallel
from tessera.train import Model

from nets import MLP, fresh_context  # noqa: F401 (the fixture is used by name)

pytestmark = pytest.mark.usefixtures("fresh_context")

MS_PYTHON = pathlib.Path("/tmp/ms-venv/bin/python")


def _loss():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def _fill(net, seed=0):
    """Random values loaded into every Parameter of ``net``; returns them by name."""
    rng = np.random.default_rng(seed)
    values = {name: rng.normal(0, 0.5, p.shape).astype(np.float32)
              for name, p in net.parameters_and_names()}
    not_loaded, _ = tessera.load_param_into_net(net, values)
    assert not not_loaded
    return values


def _mlp_numpy(w, x):
    h = np.maximum(x.reshape(len(x), -1) @ w["fc1.weight"].T + w["fc1.bias"], 0)
    return h @ w["fc2.weight"].T + w["fc2.bias"]


def _layer_norm(x, gamma, beta, eps=1e-7):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


class TokenNet(nn.Cell):
    """Embedding → LayerNorm → Dense+ReLU over token ids ``[batch, seq]``."""

    def __init__(self, vocab=20, dim=8, out=4):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm((dim,))
        self.fc = nn.Dense(dim, out, activation="relu")

    def construct(self, ids):
        return self.fc(self.norm(self.embedding(ids)))


def _token_numpy(w, ids):
    h = _layer_norm(w["embedding.embedding_table"][ids], w["norm.gamma"], w["norm.beta"])
    return np.maximum(h @ w["fc.weight"].T + w["fc.bias"], 0)


def _x(n, seed=1):
    return np.random.default_rng(seed).standard_normal((n, 64)).astype(np.float32)


def test_predict_of_dense_relu_dense_equals_numpy_and_returns_a_tensor():
    net = MLP(64)
    w = _fill(net)
    x = _x(12)
    out = Model(net).predict(tessera.Tensor(x))
    assert isinstance(out, tessera.Tensor)
    assert out.shape == (12, 10) and out.dtype == np.float32
    np.testing.assert_allclose(out.asnumpy(), _mlp_numpy(w, x), rtol=1e-5, atol=1e-5)
    # a numpy array works alike; a batch of one too
    np.testing.assert_array_equal(Model(net).predict(x).asnumpy(), out.asnumpy())
    one = Model(net).predict(x[:1])
    assert one.shape == (1, 10)
    np.testing.assert_allclose(one.asnumpy(), _mlp_numpy(w, x[:1]), rtol=1e-5, atol=1e-5)


def test_predict_of_an_embedding_layer_norm_network_keeps_token_ids_int32():
    net = TokenNet()
    w = _fill(net)
    ids = np.random.default_rng(2).integers(0, 20, (5, 7))  # int64: taken as int32
    out = Model(net).predict(ids)
    assert out.shape == (5, 7, 4) and out.dtype == np.float32
    np.testing.assert_allclose(out.asnumpy(), _token_numpy(w, ids), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(Model(net).predict(tessera.Tensor(ids, np.int32)).asnumpy(),
                                  out.asnumpy())


def test_predict_of_a_layer_norm_equals_numpy():
    net = nn.LayerNorm((6,))
    w = _fill(net)
    x = np.random.default_rng(3).normal(2.0, 3.0, (4, 3, 6)).astype(np.float32)
    out = Model(net).predict(x).asnumpy()
    np.testing.assert_allclose(out, _layer_norm(x, w["gamma"], w["beta"]), rtol=1e-4,
                               atol=1e-5)


def test_predict_runs_in_eval_mode_dropout_is_the_identity():
    class Dropped(nn.Cell):
        def __init__(self):
            super().__init__()
            self.mlp = MLP(64)
            self.dropout = nn.Dropout(p=0.5)

        def construct(self, x):
            return self.mlp(self.dropout(x))

    net = Dropped()
    w = {k.removeprefix("mlp."): v for k, v in _fill(net).items()}
    x = _x(6)
    np.testing.assert_allclose(Model(net).predict(x).asnumpy(), _mlp_numpy(w, x), rtol=1e-5,
                               atol=1e-5)


def test_predict_after_train_uses_the_trained_values_and_matches_eval():
    tessera.set_seed(3)
    net = MLP(64)
    before_values = _fill(net)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + 2 * (x[:, 1] > 0).astype(np.int32)
    model = Model(net, _loss(), nn.Momentum(net.trainable_params(), 0.05, 0.9),
                  metrics={"accuracy"})
    before = model.predict(x).asnumpy()  # predicts with net, not with the loss cell
    np.testing.assert_allclose(before, _mlp_numpy(before_values, x), rtol=1e-5, atol=1e-5)
    model.train(3, ds.NumpySlicesDataset((x, y), shuffle=False).batch(16))
    trained = {name: p.asnumpy() for name, p in net.parameters_and_names()}
    after = model.predict(x).asnumpy()
    assert not np.allclose(after, before)
    np.testing.assert_allclose(after, _mlp_numpy(trained, x), rtol=1e-5, atol=1e-5)
    accuracy = model.eval(ds.NumpySlicesDataset((x, y), shuffle=False).batch(16))["accuracy"]
    assert accuracy == pytest.approx(np.mean(after.argmax(1) == y))
    # a new Model of the same network predicts the same (the values live in the Parameters)
    np.testing.assert_array_equal(Model(net).predict(x).asnumpy(), after)


def test_predict_under_auto_parallel_runs_the_wrapped_network_on_one_device():
    tessera.set_seed(5)
    tessera.set_auto_parallel_context(device_num=2)
    net = MLP(64)
    model = Model(AutoParallel(net), loss_fn=_loss(),
                  optimizer=nn.Momentum(net.trainable_params(), 0.05, 0.9))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    y = rng.integers(0, 10, 32).astype(np.int32)
    model.train(1, ds.NumpySlicesDataset((x, y), shuffle=False).batch(16))
    trained = {name: p.asnumpy() for name, p in net.parameters_and_names()}
    np.testing.assert_allclose(model.predict(x).asnumpy(), _mlp_numpy(trained, x), rtol=1e-5,
                               atol=1e-5)
    # Model(AutoParallel(net)) without a loss predicts too
    np.testing.assert_allclose(Model(AutoParallel(net)).predict(x).asnumpy(),
                               _mlp_numpy(trained, x), rtol=1e-5, atol=1e-5)


def test_predict_computes_nan_as_mindspore_does():
    # MindSpore predicts NaN inputs (its CPU ReLU turns NaN into 0, as the engine's does).
    net = nn.Dense(64, 3)
    w = _fill(net)
    x = _x(3)
    x[1, 5] = np.nan
    out = Model(net).predict(x).asnumpy()
    assert np.isnan(out[1]).all()
    np.testing.assert_allclose(out[[0, 2]], x[[0, 2]] @ w["weight"].T + w["bias"], rtol=1e-5,
                               atol=1e-5)
    relu = Model(MLP(64)).network
    _fill(relu)
    assert np.isfinite(Model(relu).predict(x).asnumpy()).all()


def test_a_model_without_loss_predicts_but_does_not_train_or_evaluate():
    # MindSpore trains Model(net) as it is (its construct takes the columns and returns the
    # loss): an MLP takes one column, not (data, label), and returns no scalar loss.
    net = MLP(64)
    _fill(net)
    model = Model(net, metrics={"accuracy"})
    data = ds.NumpySlicesDataset((_x(8), np.zeros(8, np.int32))).batch(4)
    with pytest.raises(TypeError, match=r"Model.train: the dataset's 2 column\(s\) .* are fed "
                                        r"positionally to MLP.construct\(x\), which takes 1 .*"
                                        r"give loss_fn"):
        model.train(1, data)
    with pytest.raises(TypeError, match=r"Model.train: MLP.construct returned a tensor of shape "
                                        r"\(4, 10\).*must return its loss.*give loss_fn"):
        model.train(1, ds.NumpySlicesDataset((_x(8),)).batch(4))
    with pytest.raises(ValueError, match=r"Model.eval: the network \(MLP\) computes its own "
                                         r"loss.*eval_network"):
        model.eval(data)
    assert model.predict(_x(2)).shape == (2, 10)


@pytest.mark.parametrize("args, error, match", [
    ((), ValueError, r"got 0 inputs; the engine's forward runs a network of one input"),
    ((_x(2), _x(2)), ValueError, r"got 2 inputs"),
    (([[1.0] * 64],), TypeError, r"the input must be a tessera.Tensor or a numpy array, but got "
                                 r"list"),
    ((np.zeros((0, 64), np.float32),), ValueError,
     r"the input data can not be empty \(shape \(0, 64\)\)"),
    ((np.float32(1.0),), TypeError, r"the input must be .* but got float32"),
    ((np.array(1.0, np.float32),), ValueError, r"the input is a scalar; it must be a batch"),
    ((np.full((2, 64), "a"),), TypeError,
     r"the input has dtype <U1; the network's input must be numbers"),
    ((np.ones((3, 65), np.float32),), ValueError,
     r"tracing the network on the input of shape \(3, 65\), float32: .*65"),
    ((np.ones((3, 64), np.int32),), ValueError,
     r"tracing the network on the input of shape \(3, 64\), int32: .*floating-point"),
    ((np.full((2, 64), 1e300),), ValueError,
     r"sample 0 of the input holds 1e\+300, beyond float32"),
    ((np.full((2, 64), 2**40),), ValueError,
     r"predict_data: sample 0 holds 1099511627776, beyond int32"),
])
def test_bad_input_is_refused_naming_the_rule(args, error, match):
    net = MLP(64)
    _fill(net)
    with pytest.raises(error, match=f"^Model.predict: .*{match}"):
        Model(net).predict(*args)


def test_float_token_ids_are_refused_naming_the_lookup():
    net = TokenNet()
    _fill(net)
    with pytest.raises(ValueError, match=r"Model.predict: tracing the network on the input of "
                                         r"shape \(2, 3\), float32: .*Gather: the indices "
                                         r"must be int"):
        Model(net).predict(np.zeros((2, 3), np.float32))


def test_parameters_without_values_take_the_values_training_starts_from():
    # A fresh network predicts with its initializers' draws, as MindSpore initialises a network
    # before predicting: the values one training step of a vanishing learning rate starts from
    # (and leaves, to float32's precision).
    x = _x(6)
    fresh = Model(MLP(64)).predict(x).asnumpy()
    net = MLP(64)
    model = Model(net, _loss(), nn.SGD(net.trainable_params(), learning_rate=1e-30))
    labels = np.zeros(8, np.int32)
    model.train(1, ds.NumpySlicesDataset((_x(8, seed=3), labels)).batch(8))
    np.testing.assert_allclose(fresh, model.predict(x).asnumpy(), rtol=1e-6, atol=1e-7)
    assert np.abs(fresh).max() > 0
    with nn.utils.no_init_parameters():
        deferred = nn.Dense(64, 3)
    w = {"weight": deferred.weight, "bias": deferred.bias}
    got = Model(deferred).predict(x).asnumpy()
    values = dict(zip(w, tessera.common.parameter.initial_values(list(w.values()))))
    np.testing.assert_allclose(got, x @ values["weight"].T + values["bias"], rtol=1e-5,
                               atol=1e-6)


def test_a_frozen_parameter_without_a_value_is_refused_naming_it():
    net = MLP(64)
    net.fc1.weight.requires_grad = False
    with pytest.raises(ValueError, match=r"Model.predict: .*Parameter fc1.weight: "
                                         r"requires_grad=False needs a value"):
        Model(net).predict(_x(2))


def test_networks_ending_in_their_loss_are_refused():
    net = MLP(64)
    _fill(net)
    opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    with_loss = nn.WithLossCell(net, _loss())
    for model in (Model(with_loss, optimizer=opt), Model(AutoParallel(with_loss), optimizer=opt)):
        with pytest.raises(TypeError, match=r"Model.predict: the network ends in its loss \(a "
                                            r"WithLossCell.*give the network itself"):
            model.predict(_x(2))
    step = Model(nn.TrainOneStepCell(with_loss, opt))
    with pytest.raises(TypeError, match=r"Model.predict: the network is a TrainOneStepCell, "
                                        r"which MindSpore's predict runs as it is \(one "
                                        r"training step"):
        step.predict(_x(2))


def test_backend_and_config():
    net = MLP(64)
    _fill(net)
    model = Model(net)
    with pytest.raises(ValueError, match=r"`backend` should be 'lite' or None, but got 'gpu'"):
        model.predict(_x(2), backend="gpu")
    with pytest.warns(UserWarning, match=r"backend='lite' has no effect"):
        lite = model.predict(_x(2), backend="lite")
    with pytest.warns(UserWarning, match=r"config has no effect"):
        model.predict(_x(2), config={"configPath": "x.ini"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(model.predict(_x(2)).asnumpy(), lite.asnumpy())


def test_outputs_the_engine_cannot_return_are_refused():
    class Ids(nn.Cell):
        def construct(self, ids):
            return ids

    class Two(nn.Cell):
        def construct(self, x):
            return x, x

    class Total(nn.Cell):
        def __init__(self):
            super().__init__()
            self.sum = tessera.ops.ReduceSum()

        def construct(self, x):
            return self.sum(x, 0)

    with pytest.raises(TypeError, match=r"the network's output is int32; the engine's forward "
                                        r"returns float32 outputs only"):
        Model(Ids()).predict(np.zeros((2, 3), np.int32))
    with pytest.raises(TypeError, match=r"Model.predict: the network returns a tuple, not one "
                                        r"tensor"):
        Model(Two()).predict(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"Model.predict: the output has shape \[3\]; its first "
                                         r"dim must be the batch \(2\)"):
        Model(Total()).predict(np.zeros((2, 3), np.float32))


def test_a_frozen_parameter_without_value_is_named():
    net = MLP(64)
    net.fc1.weight.requires_grad = False
    with pytest.raises(ValueError, match=r"Model.predict: tracing the network on the input of "
                                         r"shape \(2, 64\), float32: Parameter fc1.weight: "
                                         r"requires_grad=False needs a value"):
        Model(net).predict(_x(2))


def _mindspore_works():
    if not MS_PYTHON.exists():
        return False
    try:
        return subprocess.run([str(MS_PYTHON), "-c", "import mindspore"], capture_output=True,
                              timeout=300).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class GatherNet(nn.Cell):
    """A lookup (``ops.Gather``) of token ids ``[batch]`` → LayerNorm → Dense+ReLU, written
    alike in MindSpore below (the MindSpore in /tmp/ms-venv fails in ``nn.Embedding``'s
    reshape, a NumPy 1.x extension under NumPy 2)."""

    def __init__(self):
        super().__init__()
        self.table = tessera.Parameter(np.zeros((20, 8), np.float32), name="table")
        self.gather = tessera.ops.Gather()
        self.norm = nn.LayerNorm((8,))
        self.fc = nn.Dense(8, 4, activation="relu")

    def construct(self, ids):
        return self.fc(self.norm(self.gather(self.table, ids, 0)))


@pytest.mark.skipif(not _mindspore_works(), reason="MindSpore (/tmp/ms-venv) is not available")
def test_predict_equals_mindspore_predict_on_the_same_weights(tmp_path):
    net = GatherNet()
    w = _fill(net, seed=7)
    ids = np.random.default_rng(8).integers(0, 20, 6).astype(np.int32)
    ckpt = tmp_path / "net.ckpt"
    tessera.save_checkpoint(net, str(ckpt))
    np.save(tmp_path / "ids.npy", ids)
    script = textwrap.dedent(f"""
        import numpy as np, mindspore as ms
        from mindspore import nn, ops, Parameter, Tensor
        from mindspore.train import Model

        class GatherNet(nn.Cell):
            def __init__(self):
                super().__init__()
                self.table = Parameter(Tensor(np.zeros((20, 8), np.float32)), name="table")
                self.gather = ops.Gather()
                self.norm = nn.LayerNorm((8,))
                self.fc = nn.Dense(8, 4, activation="relu")

            def construct(self, ids):
                return self.fc(self.norm(self.gather(self.table, ids, 0)))

        net = GatherNet()
        not_loaded, _ = ms.load_param_into_net(net, ms.load_checkpoint({str(ckpt)!r}))
        assert not not_loaded, not_loaded
        out = Model(net).predict(Tensor(np.load({str(tmp_path / 'ids.npy')!r})))
        np.save({str(tmp_path / 'ms.npy')!r}, out.asnumpy())
    """)
    env = dict(os.environ, GLOG_v="3")
    done = subprocess.run([str(MS_PYTHON), "-c", script], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = np.load(tmp_path / "ms.npy")
    ours = Model(net).predict(tessera.Tensor(ids)).asnumpy()
    assert ours.shape == theirs.shape == (6, 4)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    # both are the forward of the values saved (not of the zeros the networks were made with)
    h = _layer_norm(w["table"][ids], w["norm.gamma"], w["norm.beta"])
    np.testing.assert_allclose(theirs, np.maximum(h @ w["fc.weight"].T + w["fc.bias"], 0),
                               rtol=1e-4, atol=1e-5)
