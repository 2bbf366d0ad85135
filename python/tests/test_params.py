"""Parameters from values (issue 34): ``Parameter(array)``, ``Parameter(Tensor(array))``,
``Parameter(initializer(array))`` start training from exactly those values, on one device
and sharded (every rank takes its slice: the engine's ``Initializer::Values``); frozen
Parameters (``requires_grad=False``) keep them; ``tessera.Tensor`` holds values."""

import numpy as np
import pytest

import tessera
from tessera import _trace, nn
from tessera.common.initializer import initializer
from tessera.dataset import NumpySlicesDataset
from tessera.train import Model

from nets import MLP, fresh_context  # noqa: F401 (the fixture is used by name)

pytestmark = pytest.mark.usefixtures("fresh_context")

RNG = np.random.RandomState(3)
X = RNG.rand(64, 64).astype(np.float32)
Y = (np.arange(64) % 10).astype(np.int32)
GIVEN = {
    "fc1.weight": (RNG.randn(32, 64) * 0.1).astype(np.float32),
    "fc1.bias": (RNG.randn(32) * 0.1).astype(np.float32),
    "fc2.weight": (RNG.randn(10, 32) * 0.1).astype(np.float32),
    "fc2.bias": (RNG.randn(10) * 0.1).astype(np.float32),
}
WRAPS = {"array": lambda a: a, "Tensor": tessera.Tensor,
         "initializer": lambda a: initializer(tessera.Tensor(a))}


def _net(shard=False, wrap=WRAPS["array"]):
    net = MLP(shard=shard)
    for cell, attr in (("fc1", "weight"), ("fc1", "bias"), ("fc2", "weight"), ("fc2", "bias")):
        setattr(getattr(net, cell), attr, tessera.Parameter(wrap(GIVEN[f"{cell}.{attr}"])))
    return net


def _numpy_loss(batch):
    """The first step's loss from GIVEN, computed in numpy (float64)."""
    x, y = X[:batch].astype(np.float64), Y[:batch]
    h = np.maximum(x @ GIVEN["fc1.weight"].T + GIVEN["fc1.bias"], 0)
    logits = h @ GIVEN["fc2.weight"].T + GIVEN["fc2.bias"]
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return -logp[np.arange(batch), y].mean()


def _train(net, lr, epochs=1):
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.SGD(net.trainable_params(), learning_rate=lr))
    model.train(epochs, NumpySlicesDataset((X, Y), shuffle=False).batch(16))
    return model


@pytest.mark.parametrize("wrap", sorted(WRAPS))
@pytest.mark.parametrize("devices", [1, 8])
def test_training_starts_from_exactly_the_given_values(wrap, devices):
    if devices > 1:
        tessera.set_auto_parallel_context(device_num=devices, parallel_mode="semi_auto_parallel")
    net = _net(shard=devices > 1, wrap=WRAPS[wrap])
    # before training the Parameters hold the given values
    assert np.array_equal(net.fc1.weight.asnumpy(), GIVEN["fc1.weight"])
    model = _train(net, lr=0.0)
    # a learning rate of 0 keeps every value: read back whole from every rank's piece
    for name, p in net.parameters_and_names():
        assert np.array_equal(p.asnumpy(), GIVEN[name]), name
    np.testing.assert_allclose(model.losses[0], _numpy_loss(16), rtol=1e-5)


def test_a_sharded_run_from_values_is_one_devices_run():
    tessera.set_context(deterministic="ON")
    one = _train(_net(), lr=0.1, epochs=2)
    tessera.set_auto_parallel_context(device_num=8, parallel_mode="semi_auto_parallel")
    net = _net(shard=True)
    eight = _train(net, lr=0.1, epochs=2)
    assert eight.losses == one.losses
    np.testing.assert_allclose(one.losses[0], _numpy_loss(16), rtol=1e-5)
    assert not np.array_equal(net.fc1.weight.asnumpy(), GIVEN["fc1.weight"])  # it trained


def test_value_parameter_errors():
    with pytest.raises(ValueError, match=r"initializer: shape \(3, 3\) differs from the "
                                         r"values' shape \(2, 2\)"):
        initializer(np.zeros((2, 2), np.float32), (3, 3))
    with pytest.raises(ValueError, match="values of dtype int64 are not supported"):
        tessera.Parameter(np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError, match="NaN or infinity"):
        tessera.Parameter(np.array([1.0, np.nan], np.float32))
    net = MLP()
    net.fc1.weight = tessera.Parameter(np.zeros((64, 32), np.float32))  # transposed
    with pytest.raises(ValueError, match="fc1"):
        _train(net, lr=0.1)


def test_tensor_holds_values_and_is_not_the_traced_tensor():
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    t = tessera.Tensor(a, tessera.common.tensor.np.float32)
    assert t.shape == (2, 3) and t.dtype == np.float32 and t.ndim == 2 and t.size == 6
    assert np.array_equal(t.asnumpy(), a.astype(np.float32))
    t.asnumpy()[0, 0] = 99
    assert t.asnumpy()[0, 0] == 0  # a copy
    assert tessera.Tensor([1.5, 2.5]).dtype == np.float32  # Python floats: float32
    assert tessera.Tensor(a).dtype == np.float64  # numpy keeps its dtype
    assert tessera.Tensor(a, "int32").dtype == np.int32

    class Float16:  # MindSpore's mstype objects print their name capitalised
        def __str__(self):
            return "Float16"

    assert tessera.Tensor(a, Float16()).dtype == np.float16
    assert not isinstance(t, _trace.Tensor)
    assert np.array_equal(np.asarray(tessera.Tensor(a)), a)
    assert np.array_equal(tessera.Parameter(tessera.Tensor(a, "float32")).asnumpy(),
                          a.astype(np.float32))


@pytest.mark.parametrize("devices", [1, 8])
def test_frozen_parameters_keep_their_values(devices):
    if devices > 1:
        tessera.set_auto_parallel_context(device_num=devices, parallel_mode="semi_auto_parallel")
    net = _net(shard=devices > 1)
    net.fc1.weight.requires_grad = False
    net.fc1.bias = tessera.Parameter(GIVEN["fc1.bias"], requires_grad=False)
    assert [p.name for p in net.trainable_params()] == ["fc2.weight", "fc2.bias"]
    model = _train(net, lr=0.5, epochs=2)
    assert np.array_equal(net.fc1.weight.asnumpy(), GIVEN["fc1.weight"])
    assert np.array_equal(net.fc1.bias.asnumpy(), GIVEN["fc1.bias"])
    assert not np.array_equal(net.fc2.weight.asnumpy(), GIVEN["fc2.weight"])
    assert model.losses[-1] < model.losses[0]
    # a second train continues (the frozen ones are not in the checkpoint: they keep their values)
    model.train(1, NumpySlicesDataset((X, Y), shuffle=False).batch(16))
    assert np.array_equal(net.fc1.weight.asnumpy(), GIVEN["fc1.weight"])


def test_freezing_after_training_keeps_the_trained_value():
    net = MLP()
    model = _train(net, lr=0.5)
    trained = net.fc1.weight.asnumpy()
    net.fc1.weight.requires_grad = False
    model.optimizer = nn.SGD(net.trainable_params(), 0.5)
    model.train(1, NumpySlicesDataset((X, Y), shuffle=False).batch(16))
    assert np.array_equal(net.fc1.weight.asnumpy(), trained)


def test_a_frozen_parameter_without_a_value_is_an_error():
    net = MLP()
    net.fc1.weight.requires_grad = False
    with pytest.raises(ValueError, match="fc1.weight: requires_grad=False needs a value to keep"):
        _train(net, lr=0.1)


def test_a_frozen_parameter_in_the_optimizer_is_an_error():
    net = _net()
    params = net.trainable_params()
    net.fc2.bias.requires_grad = False
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.SGD(params, learning_rate=0.1))
    with pytest.raises(ValueError, match=r"Parameters \['fc2.bias'\] are frozen"):
        model.train(1, NumpySlicesDataset((X, Y)).batch(16))


def test_value_errors_name_the_parameter():
    with pytest.raises(ValueError, match="Parameter p: the values hold NaN or infinity"):
        tessera.Parameter(np.array([1.0, np.nan], np.float32), name="p")
    with pytest.raises(ValueError, match="Parameter p: values of dtype int64"):
        tessera.Parameter(np.zeros(2, np.int64), name="p")
    net = MLP()
    with pytest.raises(ValueError, match="fc1.bias: the values hold NaN or infinity"):
        tessera.load_param_into_net(net, {"fc1.bias": np.full(32, np.nan, np.float32)})
    with pytest.raises(ValueError, match="fc1.bias: values of dtype int64"):
        tessera.load_param_into_net(net, {"fc1.bias": np.zeros(32, np.int64)})


def test_a_refused_dict_loads_nothing():
    net = _net()
    good = {"fc1.weight": np.full((32, 64), 7, np.float32)}
    refused = [
        ({**good, "fc2.weight": np.zeros((3, 3), np.float32)}, False, "fc2.weight has shape"),
        ({**good, "fc2.bias": np.full(10, np.inf, np.float32)}, False, "fc2.bias"),
        ({**good, "fc2.bias": np.zeros(10, np.int32)}, False, "fc2.bias"),
        ({**good, "fc2.bias": np.zeros(10, np.float64)}, True,
         "fc2.bias is float64 in the dict and float32 in the network; strict_load=True"),
    ]
    for parameters, strict, message in refused:
        with pytest.raises(ValueError, match=message):
            tessera.load_param_into_net(net, parameters, strict_load=strict)
        for name, p in net.parameters_and_names():
            assert np.array_equal(p.asnumpy(), GIVEN[name]), (message, name)
    tessera.load_param_into_net(net, good)
    assert np.array_equal(net.fc1.weight.asnumpy(), good["fc1.weight"])


# ----------------------------------------------------------- strict_load, return_param_dict

def _values(net):
    return {name: p.asnumpy() for name, p in net.parameters_and_names()}


def test_strict_load_false_loads_a_prefixed_dict_as_mindspore_does():
    # MindSpore's default also loads `network.fc1.weight` into `fc1.weight` (the dict of a
    # checkpoint saved from a wrapper cell); it was ignored: nothing loaded, no error.
    prefixed = {f"network.{k}": v for k, v in GIVEN.items()}
    prefixed["global_step"] = np.array([3], np.int32)
    net = MLP()
    assert tessera.load_param_into_net(net, prefixed) == ([], ["global_step"])
    for name, value in _values(net).items():
        assert np.array_equal(value, GIVEN[name]), name
    # strict_load=True loads exact names only and returns what it left out
    strict = _net()
    before = _values(strict)
    assert tessera.load_param_into_net(strict, prefixed, strict_load=True) == (
        list(GIVEN), list(prefixed))
    assert all(np.array_equal(v, before[k]) for k, v in _values(strict).items())
    # float64 values are converted without strict_load and refused with it
    wide = {k: v.astype(np.float64) for k, v in GIVEN.items()}
    assert tessera.load_param_into_net(MLP(), wide) == ([], [])
    with pytest.raises(ValueError, match="fc1.weight is float64 in the dict"):
        tessera.load_param_into_net(MLP(), wide, strict_load=True)
    with pytest.raises(TypeError, match="For 'strict_load', the type must be bool"):
        tessera.load_param_into_net(MLP(), GIVEN, strict_load=1)
    with pytest.raises(TypeError, match="For 'net', the type must be Cell"):
        tessera.load_param_into_net(GIVEN, GIVEN)


def test_loaders_take_a_network_and_strict_load_as_mindspore_does(tmp_path):
    from tessera import parallel as P

    path = str(tmp_path / "full.ckpt")
    tessera.save_checkpoint({f"network.{k}": v for k, v in GIVEN.items()}, path)
    # load_distributed_checkpoint: into the network (None returned), or the dict as well
    net = MLP()
    assert P.load_distributed_checkpoint(net, [path]) is None
    assert all(np.array_equal(v, GIVEN[k]) for k, v in _values(net).items())
    net = MLP()
    got = P.load_distributed_checkpoint(net, [path], return_param_dict=True)
    assert sorted(got) == sorted(f"network.{k}" for k in GIVEN)
    assert np.array_equal(net.fc2.bias.asnumpy(), GIVEN["fc2.bias"])
    strict = _net()
    P.load_distributed_checkpoint(strict, [path], strict_load=True)  # exact names: none
    assert np.array_equal(strict.fc1.weight.asnumpy(), GIVEN["fc1.weight"])
    # load_segmented_checkpoints: into `net` too
    net = MLP()
    assert sorted(P.load_segmented_checkpoints(str(tmp_path), net=net)) == sorted(got)
    assert np.array_equal(net.fc1.bias.asnumpy(), GIVEN["fc1.bias"])
    # switches that would do nothing: refused, naming them
    for call in (lambda: P.load_distributed_checkpoint(None, [path], strict_load=True),
                 lambda: P.load_segmented_checkpoints(str(tmp_path), strict_load=True),
                 lambda: tessera.load_checkpoint(path, strict_load=True)):
        with pytest.raises(ValueError, match="strict_load=True applies only when"):
            call()
    with pytest.raises(ValueError, match="return_param_dict=True do not apply with "
                                         "dst_safetensors_dir"):
        P.load_distributed_checkpoint(None, None, None, format="safetensors",
                                      unified_safetensors_dir=str(tmp_path),
                                      dst_safetensors_dir=str(tmp_path / "o"),
                                      return_param_dict=True)
    with pytest.raises(TypeError, match="For 'return_param_dict', the type must be bool"):
        P.load_distributed_checkpoint(None, [path], return_param_dict="yes")
    with pytest.raises(TypeError, match="For 'network', the type must be tessera.nn.Cell"):
        P.load_distributed_checkpoint({}, [path])
