"""Your own network, second slice of issue 34: trained weights back in the Parameters and a
second `Model.train` continuing from them; `MnistDataset` with `map` (vision.Rescale,
vision.Normalize, vision.HWC2CHW, transforms.TypeCast) and `batch`; `Model.eval` with
metrics; `TimeMonitor`."""

import numpy as np
import pytest

import tessera
from tessera import nn
from tessera.dataset import MnistDataset, NumpySlicesDataset, transforms, vision
from tessera.train import LossMonitor, Model, TimeMonitor

from conftest import REPO
from nets import MLP, fresh_context  # noqa: F401 (the fixture is used by name)

DIGITS = REPO / "data" / "digits"


pytestmark = pytest.mark.usefixtures("fresh_context")


def _digits(usage, batch, num_samples=None):
    d = MnistDataset(str(DIGITS), usage=usage, num_samples=num_samples)
    d = d.map([vision.Rescale(1.0 / 16, 0.0), vision.Normalize([0.3], [0.4]), vision.HWC2CHW()],
              input_columns="image")
    d = d.map(transforms.TypeCast(np.int32), input_columns="label")
    return d.batch(batch)


def _model(net, **kw):
    return Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                 nn.Momentum(net.trainable_params(), 0.05, 0.9), **kw)


def _values(net):
    return {name: p.asnumpy() for name, p in net.parameters_and_names()}


def test_weights_are_read_back_and_a_second_train_continues():
    net = MLP()
    model = _model(net)
    with pytest.raises(ValueError, match="fc1.weight: no value yet"):
        net.fc1.weight.asnumpy()
    model.train(2, _digits("train", 50))
    first = list(model.losses)
    after1 = _values(net)
    assert sorted(after1) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert after1["fc1.weight"].shape == (32, 64) and after1["fc1.weight"].dtype == np.float32
    assert np.array_equal(net.fc1.weight.data, after1["fc1.weight"])
    assert len(first) == 60 and first[0] > 2.0

    model.train(2, _digits("train", 50))
    second = list(model.losses)
    after2 = _values(net)
    assert len(second) == 60
    # continues from the trained weights, not from the initializers
    assert second[0] < 0.3 * first[0]
    assert abs(second[0] - first[-1]) < 0.2
    assert second[-1] < first[-1]
    for name in after1:
        assert not np.array_equal(after1[name], after2[name]), name

    # a fresh Model of a fresh network starts from the initializers again
    fresh = _model(MLP())
    fresh.train(1, _digits("train", 50))
    assert fresh.losses[0] > 2.0


def test_second_train_counts_epochs_and_steps_from_one():
    net = MLP()
    model = _model(net)
    model.train(1, _digits("train", 50))
    seen = []

    class Record(tessera.train.Callback):
        def on_train_step_end(self, run_context):
            p = run_context.original_args()
            seen.append((p.cur_epoch_num, p.cur_step_num))

    model.train(2, _digits("train", 50), callbacks=[Record()])
    assert seen[0] == (1, 1) and seen[29] == (1, 30) and seen[30] == (2, 31)
    assert seen[-1] == (2, 60)


def test_sharded_weights_read_back_whole_match_one_device():
    tessera.set_context(deterministic="ON")
    one = MLP()
    _model(one).train(1, _digits("train", 48, num_samples=1200))
    tessera.set_auto_parallel_context(device_num=8, parallel_mode="semi_auto_parallel")
    eight = MLP(shard=True)
    _model(eight).train(1, _digits("train", 48, num_samples=1200))
    a, b = _values(one), _values(eight)
    for name in a:
        assert a[name].shape == b[name].shape
        np.testing.assert_allclose(a[name], b[name], rtol=0, atol=1e-5, err_msg=name)


def test_mnist_map_batch_trains_an_mlp_past_80_percent():
    net = MLP()
    model = _model(net, metrics={"Accuracy"})
    model.train(3, _digits("train", 50), callbacks=[LossMonitor(0)])
    result = model.eval(_digits("test", 33))
    assert list(result) == ["Accuracy"]
    assert result["Accuracy"] > 0.8

    # the dict form and the loss metric; the result follows the network's forward pass
    model2 = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                   metrics={"accuracy": nn.Accuracy(), "loss": nn.Loss()})
    r2 = model2.eval(_digits("test", 11))
    assert r2["accuracy"] == pytest.approx(result["Accuracy"], abs=1e-12)
    assert 0 < r2["loss"] < 1.0


def test_eval_forward_matches_numpy():
    """Model.eval's forward pass (the engine's executor) equals numpy's on the trained weights."""
    x = np.random.default_rng(0).normal(size=(40, 8, 8)).astype(np.float32)
    y = (np.arange(40) % 10).astype(np.int32)
    net = MLP()
    model = _model(net, metrics={"acc", "loss"})
    model.train(2, NumpySlicesDataset((x, y), shuffle=False).batch(10))
    w = _values(net)
    h = np.maximum(x.reshape(40, 64) @ w["fc1.weight"].T + w["fc1.bias"], 0)
    logits = h @ w["fc2.weight"].T + w["fc2.bias"]
    shifted = logits - logits.max(1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    got = model.eval(NumpySlicesDataset((x, y)).batch(10))
    assert got["acc"] == pytest.approx(np.mean(logits.argmax(1) == y))
    assert got["loss"] == pytest.approx(-logp[np.arange(40), y].mean(), rel=1e-5)


def test_eval_errors():
    net = MLP()
    with pytest.raises(ValueError, match="no metrics"):
        _model(net).eval(_digits("test", 33))
    # an untrained network is evaluated on the values training would start from (MindSpore
    # initialises a network before evaluating it), the same as after a vanishing step
    fresh = _model(net, metrics={"accuracy", "loss"}).eval(_digits("test", 33))
    net2 = MLP()
    model = Model(net2, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.SGD(net2.trainable_params(), learning_rate=1e-30),
                  metrics={"accuracy", "loss"})
    model.train(1, _digits("train", 50))
    stepped = model.eval(_digits("test", 33))
    assert fresh["accuracy"] == pytest.approx(stepped["accuracy"], abs=1e-12)
    assert fresh["loss"] == pytest.approx(stepped["loss"], rel=1e-6)
    assert fresh["loss"] > 1.5  # untrained: near ln 10
    with pytest.raises(ValueError, match="callbacks are not supported"):
        _model(net, metrics={"accuracy"}).eval(_digits("test", 33), callbacks=[TimeMonitor()])
    with pytest.raises(ValueError, match="metric 'f1' is not supported"):
        _model(net, metrics={"f1"})
    with pytest.raises(TypeError, match="not a tessera.nn metric"):
        _model(net, metrics={"acc": "Accuracy"})


def test_eval_refuses_an_empty_dataset_and_labels_beyond_the_classes():
    x = np.random.default_rng(1).normal(size=(40, 8, 8)).astype(np.float32)
    y = (np.arange(40) % 10).astype(np.int32)
    model = _model(MLP(), metrics={"Accuracy", "loss"})
    model.train(1, NumpySlicesDataset((x, y)).batch(10))
    # 8 samples, batches of 16 without the remainder: the metrics were NaN (mean of nothing)
    few = NumpySlicesDataset((x[:8], y[:8])).batch(16, drop_remainder=True)
    with pytest.raises(ValueError, match="Model.eval: the dataset has 8 sample.*no batch of "
                                         "batch_size 16"):
        model.eval(few)
    # Labels beyond the classes: 'loss' raised numpy's IndexError, 'Accuracy' counted them wrong
    bad = y.copy()
    bad[13] = 12
    with pytest.raises(ValueError, match=r"Model.eval: column \S+: sample 13 has label 12, but "
                                         r"the network's output has 10 classes \(class indices "
                                         r"0..9\)"):
        model.eval(NumpySlicesDataset((x, bad)).batch(10))
    assert set(model.eval(NumpySlicesDataset((x, y)).batch(10))) == {"Accuracy", "loss"}


def test_time_monitor_prints_every_epoch(capsys):
    _model(MLP()).train(2, _digits("train", 50), callbacks=[TimeMonitor()])
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("Train epoch time:")]
    assert len(lines) == 2 and "per step time:" in lines[0]


def test_mnist_dataset_columns_and_usage():
    train = MnistDataset(DIGITS, usage="train")
    assert train.get_col_names() == ["image", "label"]
    image, label = train._columns
    assert image.shape == (1500, 8, 8, 1) and image.dtype == np.uint8
    assert label.shape == (1500,) and label.dtype == np.uint32
    assert train.get_dataset_size() == 1500
    assert MnistDataset(DIGITS, usage="test").get_dataset_size() == 297
    assert MnistDataset(DIGITS).get_dataset_size() == 1797
    assert MnistDataset(DIGITS, usage="all").get_dataset_size() == 1797
    few = MnistDataset(DIGITS, usage="train", num_samples=100)
    assert few.get_dataset_size() == 100
    assert np.array_equal(few._columns[0], image[:100])
    assert few.batch(20).get_dataset_size() == 5
    assert MnistDataset(DIGITS, shuffle=False)._shuffle is False


def test_map_operations_exact_values():
    img = np.array([[[0, 10], [20, 30]], [[40, 50], [255, 1]]], dtype=np.uint8)  # HWC 2x2x2
    r = vision.Rescale(1.0 / 255, -0.5)(img)
    assert r.dtype == np.float32 and r.shape == (2, 2, 2)
    np.testing.assert_array_equal(r, img.astype(np.float32) * np.float32(1 / 255) + np.float32(-0.5))
    n = vision.Normalize(mean=[10.0, 20.0], std=[2.0, 5.0])(img)
    assert n.dtype == np.float32
    np.testing.assert_array_equal(n[..., 0], (img[..., 0].astype(np.float32) - 10) / np.float32(2))
    np.testing.assert_array_equal(n[..., 1], (img[..., 1].astype(np.float32) - 20) / np.float32(5))
    assert n[1, 0, 0] == 15.0 and n[0, 1, 1] == 2.0
    c = vision.HWC2CHW()(img)
    assert c.shape == (2, 2, 2) and c.dtype == np.uint8
    assert c[0].tolist() == [[0, 20], [40, 255]] and c[1].tolist() == [[10, 30], [50, 1]]
    t = transforms.TypeCast(np.int32)(np.array([2.7, -1.5, 3.0], dtype=np.float32))
    assert t.dtype == np.int32 and t.tolist() == [2, -1, 3]
    assert transforms.TypeCast("float16")(np.array([1], np.uint8)).dtype == np.float16

    # through a pipeline: the same values, every sample, once at map time
    d = NumpySlicesDataset({"image": np.stack([img, img[::-1]]), "label": np.array([1, 2])})
    d = d.map([vision.Rescale(1.0 / 255, -0.5), vision.HWC2CHW()], input_columns=["image"])
    d = d.map(transforms.TypeCast("int32"), input_columns="label")
    assert d._columns[0].shape == (2, 2, 2, 2)
    np.testing.assert_array_equal(d._columns[0][0], vision.HWC2CHW()(r))
    np.testing.assert_array_equal(d._columns[0][1], vision.HWC2CHW()(
        vision.Rescale(1.0 / 255, -0.5)(img[::-1])))
    assert d._columns[1].dtype == np.int32


def test_mnist_and_map_errors(tmp_path):
    missing = tmp_path / "no_such_dir"
    with pytest.raises(ValueError, match=str(missing)):
        MnistDataset(missing)
    with pytest.raises(ValueError, match="usage must be 'train', 'test', 'all' or None, got 'val'"):
        MnistDataset(DIGITS, usage="val")
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte does not exist"):
        MnistDataset(tmp_path, usage="test")
    with pytest.raises(ValueError, match="input_columns 'pixels' is not a column"):
        MnistDataset(DIGITS, usage="test").map(vision.HWC2CHW(), input_columns="pixels")
    with pytest.raises(ValueError, match="HWC2CHW: images must be <H, W, C>"):
        NumpySlicesDataset(np.zeros((2, 3))).map(vision.HWC2CHW())
    with pytest.raises(ValueError, match="Normalize: 3 mean/std value"):
        MnistDataset(DIGITS, usage="test").map(vision.Normalize([0, 0, 0], [1, 1, 1]))


def test_initial_values_of_other_types_are_refused():
    # numpy and tensor values are supported (test_params.py); other objects are not
    with pytest.raises(TypeError, match="default_input must be initializer"):
        tessera.Parameter("zeros", name="w")


def test_stopped_train_keeps_the_weights():
    net = MLP()
    model = _model(net)
    model.train(1, _digits("train", 50))
    before = _values(net)

    class Stop(tessera.train.Callback):
        def on_train_step_end(self, run_context):
            run_context.request_stop()

    model.train(1, _digits("train", 50), callbacks=[Stop()])
    assert len(model.losses) == 1
    after = _values(net)
    for name in before:
        assert np.array_equal(before[name], after[name]), name
    model.train(1, _digits("train", 50))
    assert model.losses[0] < 0.5


def test_the_readmes_example_runs_as_written():
    """README.md's example, word for word (from its Python block), on 8 sharded ranks: it
    trains, and `Model.eval` reports the accuracy the README shows (> 0.8)."""
    text = (REPO / "README.md").read_text()
    start = text.index("```python\nimport tessera\nfrom tessera import nn, ops, dataset as ds")
    block = text[start + len("```python\n"):text.index("```", start + 10)]
    block = block.replace('"data/digits"', repr(str(DIGITS)))
    block = block.replace("print(model.eval(test))", "result = model.eval(test)")
    scope = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["result"]["Accuracy"] > 0.8, scope["result"]


def test_a_sub_cells_parameters_keep_the_networks_names(fresh_context):
    """Asking a sub-Cell for its parameters (an optimizer over one layer's) before or after
    training renames nothing: the network's names stay ``fc1.weight``, ``fc1.bias``."""
    net = MLP(64)
    first = net.fc1.trainable_params()
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), 0.05, 0.9))
    rng = np.random.default_rng(0)
    images = rng.standard_normal((64, 64)).astype(np.float32)
    labels = rng.integers(0, 10, 64).astype(np.int32)
    model.train(1, NumpySlicesDataset({"image": images, "label": labels},
                                      shuffle=False).batch(32))
    assert [p.name for p in net.fc1.trainable_params()] == ["fc1.weight", "fc1.bias"]
    assert [p.name for p in first] == ["fc1.weight", "fc1.bias"]
    assert net.fc1.weight.asnumpy().shape == (32, 64)
