"""The common ops added to ``tessera.ops``/``tessera.nn`` as compositions of the engine's ops
(``Square``, ``Abs``, ``Maximum``/``Minimum``, ``Rsqrt``, ``Pow``, ``LeakyReLU``, ``Elu``,
``Softplus``, ``Mish``, ``ExpandDims``/``Squeeze``, ``nn.Identity``) and the Tensor methods:
forward values against numpy, one SGD step's weights against numpy with MindSpore's gradient
(also at ties and kinks: MindSpore 2.10 gives ``maximum`` ½ to each operand at a tie, ``abs`` 0
at 0, ``leaky_relu`` ``(1 + alpha)/2`` at 0, ``elu`` ``alpha`` at 0, ``softplus`` ½ at 0),
sharded on 2 and 4 devices bitwise as on one, and a bad strategy refused naming the node."""

import json
import warnings

import numpy as np
import pytest

import tessera
from tessera import dataset as ds
from tessera import nn, ops
from tessera.train import Model

from nets import fresh_context  # noqa: F401 (the fixture is used by name)
from test_ops import close, forward

pytestmark = pytest.mark.usefixtures("fresh_context")

# Edge values: large magnitudes, tiny ones, zero and the softplus threshold's neighbourhood.
EDGE = np.array([[-30, -2, -1e-8, 0, 1e-8, 0.5, 2, 19, 21, 25]], np.float32)
# Non-finite values: each op maps them as numpy does (NaN stays NaN).
ODD = np.array([[np.nan, -np.inf, np.inf, -0.0, 3.0]], np.float32)


def _softplus(x, beta=1.0, threshold=None):
    b = beta * x.astype(np.float64)
    y = (np.maximum(b, 0) + np.log1p(np.exp(-np.abs(b)))) / beta
    return y if threshold is None else np.where(b > threshold, x, y)


FORWARD = {
    "square": (lambda s, x: ops.square(x), lambda x: x * x, 0),
    "Square": (lambda s, x: ops.Square()(x), lambda x: x * x, 0),
    "pow2": (lambda s, x: x ** 2, lambda x: x * x, 0),
    "abs": (lambda s, x: ops.abs(x), np.abs, 0),
    "abs_op": (lambda s, x: abs(x), np.abs, 0),
    "maximum": (lambda s, x: ops.maximum(x, 0.5), lambda x: np.maximum(x, 0.5), 0),
    "maximum_left": (lambda s, x: ops.maximum(0.0, x), lambda x: np.maximum(x, 0.0), 0),
    "minimum": (lambda s, x: ops.Minimum()(x, 0.5), lambda x: np.minimum(x, 0.5), 0),
    "maximum_tensors": (lambda s, x: ops.Maximum()(x, -x), np.abs, 0),
    "minimum_broadcast": (lambda s, x: ops.minimum(x, s.w), lambda x: np.minimum(x, W), 0),
    "rsqrt": (lambda s, x: ops.rsqrt(x), lambda x: 1 / np.sqrt(x.astype(np.float64)), 1e-6),
    "pow3": (lambda s, x: ops.pow(x, 3), lambda x: x.astype(np.float64) ** 3, 1e-6),
    "pow-2": (lambda s, x: ops.Pow()(x, -2.0), lambda x: x.astype(np.float64) ** -2.0, 1e-6),
    "pow0": (lambda s, x: ops.pow(x, 0), lambda x: np.ones_like(x), 0),
    "pow1": (lambda s, x: ops.pow(x, 1), lambda x: x, 0),
    "pow0.5": (lambda s, x: ops.pow(x, 0.5), lambda x: np.sqrt(x), 1e-6),
    "pow1.5": (lambda s, x: ops.pow(x, 1.5), lambda x: x.astype(np.float64) ** 1.5, 1e-5),
    "leaky_relu": (lambda s, x: ops.leaky_relu(x), lambda x: np.where(x > 0, x, 0.2 * x), 0),
    "nn.LeakyReLU": (lambda s, x: nn.LeakyReLU(-0.5)(x), lambda x: np.where(x > 0, x, -0.5 * x),
                     0),
    "elu": (lambda s, x: ops.elu(x), lambda x: np.where(x > 0, x, np.expm1(x)), 1e-6),
    "nn.ELU": (lambda s, x: nn.ELU(2.0)(x), lambda x: np.where(x > 0, x, 2 * np.expm1(x)), 1e-6),
    "softplus": (lambda s, x: ops.softplus(x), lambda x: _softplus(x, 1, 20), 1e-6),
    "softplus_beta": (lambda s, x: ops.softplus(x, 2, 10), lambda x: _softplus(x, 2, 10), 1e-6),
    "Softplus": (lambda s, x: ops.Softplus()(x), _softplus, 1e-6),
    "mish": (lambda s, x: ops.mish(x), lambda x: x * np.tanh(_softplus(x)), 1e-6),
    "nn.Mish": (lambda s, x: nn.Mish()(x), lambda x: x * np.tanh(_softplus(x)), 1e-6),
    "nn.Identity": (lambda s, x: nn.Identity()(x) * 1.0, lambda x: x, 0),
}
W = np.linspace(-1, 1, EDGE.shape[1]).astype(np.float32)


@pytest.mark.parametrize("name", sorted(FORWARD))
def test_forward_matches_numpy(name):
    f, want, tol = FORWARD[name]
    x = EDGE if "sqrt" not in name and "pow0.5" != name and "1.5" not in name else np.abs(EDGE)
    got = forward(f, x, w=W) if "broadcast" in name else forward(f, x)
    with np.errstate(all="ignore"):
        expected = np.asarray(want(x), np.float32)
    if tol == 0:  # exact compositions: bitwise
        np.testing.assert_array_equal(got, expected)
    else:
        close(got, expected, tol)


@pytest.mark.parametrize("name, want", [
    ("abs", np.abs), ("maximum", lambda x: np.maximum(x, 0.5)),
    ("minimum", lambda x: np.minimum(x, 0.5)), ("square", np.square),
    ("leaky_relu", lambda x: np.where(x > 0, x, 0.2 * x)),
    ("nn.ELU", lambda x: np.where(x > 0, x, 2 * np.expm1(x))),
])
def test_non_finite_inputs(name, want):
    f = FORWARD[name][0]
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(forward(f, ODD), want(ODD).astype(np.float32))


def test_shape_ops_and_tensor_methods():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    close(forward(lambda s, x: ops.expand_dims(x, 1).reshape(2, 12), x), x.reshape(2, 12))
    close(forward(lambda s, x: ops.unsqueeze(x, -1).squeeze(-1).squeeze(), x), x)
    close(forward(lambda s, x: ops.Squeeze(1)(ops.ExpandDims()(x, 1)), x), x)
    close(forward(lambda s, x: x.expand_dims(-4).squeeze(0), x), x)
    close(forward(lambda s, x: x.transpose(0, 2, 1), x), x.transpose(0, 2, 1))
    close(forward(lambda s, x: x.transpose((0, 2, 1)).reshape((2, -1)), x),
          x.transpose(0, 2, 1).reshape(2, -1))
    close(forward(lambda s, x: x.sum(axis=(1, 2)), x), x.sum((1, 2)))
    close(forward(lambda s, x: x.sum(2, keepdims=True), x), x.sum(2, keepdims=True))
    close(forward(lambda s, x: x.mean(1), x), x.mean(1))
    close(forward(lambda s, x: x.mean((1, 2), True), x), x.mean((1, 2), keepdims=True))
    close(forward(lambda s, x: ops.squeeze(x.mean(2, keep_dims=True), 2), x), x.mean(2))
    assert forward(lambda s, x: ops.reshape(x, (2, 12)).sum(1) * 0 + x.shape[1], x).tolist() \
        == [3.0, 3.0]


@pytest.mark.parametrize("call, rule", [
    (lambda x: ops.squeeze(x, 1), "dim 1 of the input .* is 3, not 1"),
    (lambda x: ops.expand_dims(x, 4), "axis 4 is out of range"),
    (lambda x: ops.pow(x, x), "a tensor exponent is not supported"),
    (lambda x: ops.maximum(x, x.sum(2)), r"\(2, 3, 4\) and \(2, 3\) do not broadcast"),
    (lambda x: x.sum(1, dtype=tessera.float32), "dtype and initial"),
])
def test_bad_arguments_name_the_rule(call, rule):
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises((ValueError, TypeError, NotImplementedError), match=rule):
        forward(lambda s, t: call(t), x)


# ---- Gradients: one SGD step of w ← w − lr·∂L/∂w, L = mean((x·f(w) − y)²) --------------------

LR = 0.5


class OnWeights(nn.Cell):
    """``x · f(w)`` (``f(w, v)`` with two weights), the weights at chosen points."""

    def __init__(self, f, w, v=None):
        super().__init__()
        self.f = f
        self.w = tessera.Parameter(tessera.Tensor(w), name="w")
        self.v = None if v is None else tessera.Parameter(tessera.Tensor(v), name="v")

    def construct(self, x):
        return x * (self.f(self.w) if self.v is None else self.f(self.w, self.v))


def _step(net, x, y):
    tessera.set_context(deterministic="ON")
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), LR))
    data = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(len(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.train(1, data)
    return {p.name: p.asnumpy() for p in net.trainable_params()}


def _data(n):
    rng = np.random.default_rng(11)
    x = rng.uniform(0.5, 1.5, (4, n)).astype(np.float32)
    y = rng.standard_normal((4, n)).astype(np.float32)
    return x, y


def _numpy_step(x, y, values, fx, grads):
    """The weights after the step, from ``f``'s value ``fx`` and its gradients ``grads`` (one
    array per weight), in float64."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    upstream = (2 * (x * fx - y) * x).sum(0) / x.size
    return [v - LR * upstream * g for v, g in zip(values, grads)]


KINK = np.array([-2, -0.5, 0, 0, 0.5, 1.5], np.float32)


def _sig(z):
    return 1 / (1 + np.exp(-z))


# f (of tessera), f (numpy, float64), f' (MindSpore's rule)
UNARY_GRADS = {
    "abs": (ops.abs, np.abs, np.sign),
    "square": (ops.square, np.square, lambda w: 2 * w),
    "pow3": (lambda w: ops.pow(w, 3), lambda w: w ** 3, lambda w: 3 * w ** 2),
    "pow-1": (lambda w: ops.pow(w, -1), lambda w: 1 / w, lambda w: -1 / w ** 2),
    "pow2.5": (lambda w: ops.pow(w, 2.5), lambda w: w ** 2.5, lambda w: 2.5 * w ** 1.5),
    "rsqrt": (ops.rsqrt, lambda w: w ** -0.5, lambda w: -0.5 * w ** -1.5),
    "leaky_relu": (lambda w: ops.leaky_relu(w, 0.1),
                   lambda w: np.where(w > 0, w, 0.1 * w),
                   lambda w: np.where(w > 0, 1, np.where(w < 0, 0.1, 0.55))),
    "leaky_relu_big": (nn.LeakyReLU(3.0), lambda w: np.where(w > 0, w, 3 * w),
                       lambda w: np.where(w > 0, 1, np.where(w < 0, 3, 2))),
    "elu": (nn.ELU(0.5), lambda w: np.where(w > 0, w, 0.5 * np.expm1(w)),
            lambda w: np.where(w > 0, 1, 0.5 * np.exp(w))),
    "softplus": (ops.softplus, _softplus, _sig),
    "softplus_beta": (lambda w: ops.softplus(w, 2.0, 1.0),
                      lambda w: _softplus(w, 2.0, 1.0),
                      lambda w: np.where(2 * w > 1, 1, _sig(2 * w))),
    "mish": (nn.Mish(), lambda w: w * np.tanh(_softplus(w)),
             lambda w: np.tanh(_softplus(w)) + w * (1 - np.tanh(_softplus(w)) ** 2) * _sig(w)),
}


@pytest.mark.parametrize("name", sorted(UNARY_GRADS))
def test_one_sgd_step_has_mindspores_gradient(name):
    f, fn, df = UNARY_GRADS[name]
    w = KINK if name not in ("pow-1", "pow2.5", "rsqrt") else np.abs(KINK) + 0.25
    x, y = _data(len(w))
    got = _step(OnWeights(f, w), x, y)["w"]
    w64 = w.astype(np.float64)
    (want,) = _numpy_step(x, y, [w64], fn(w64), [df(w64)])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)


@pytest.mark.parametrize("larger", [True, False])
def test_maximum_and_minimum_split_a_tie(larger):
    w = np.array([-1, 0, 0.5, 2, 3], np.float32)
    v = np.array([-2, 0, 0.5, 3, 3], np.float32)
    f = ops.maximum if larger else ops.minimum
    x, y = _data(len(w))
    got = _step(OnWeights(f, w, v), x, y)
    pick = np.where(w > v, 1.0, np.where(w < v, 0.0, 0.5))
    pick = pick if larger else np.where(w == v, 0.5, 1 - pick)
    fx = np.maximum(w, v) if larger else np.minimum(w, v)
    want_w, want_v = _numpy_step(x, y, [w, v], fx, [pick, 1 - pick])
    np.testing.assert_allclose(got["w"], want_w, rtol=2e-6, atol=2e-7)
    np.testing.assert_allclose(got["v"], want_v, rtol=2e-6, atol=2e-7)


def test_maximum_of_a_scalar_gives_half_at_the_tie():
    w = np.array([-1, 0.5, 0.5, 2], np.float32)
    x, y = _data(len(w))
    got = _step(OnWeights(lambda t: ops.maximum(t, 0.5), w), x, y)["w"]
    (want,) = _numpy_step(x, y, [w], np.maximum(w, 0.5), [np.array([0, 0.5, 0.5, 1])])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)


# ---- Sharded: semi-auto on 2 and 4 devices, bitwise as one device ----------------------------

def _w(out, inp, seed):
    rng = np.random.default_rng(seed)
    return tessera.Tensor((0.5 * rng.standard_normal((out, inp))).astype(np.float32))


class Net(nn.Cell):
    """Dense(6→8) → op → Dense(8→4), ``op`` a Cell or a primitive (``prim``) with optional
    Parameter ``p [8]`` (a second operand)."""

    def __init__(self, op, second=False):
        super().__init__()
        self.fc1 = nn.Dense(6, 8, weight_init=_w(8, 6, 1))
        self.op = op
        self.second = second
        if second:
            self.p = tessera.Parameter(tessera.Tensor(np.linspace(-1, 1, 8).astype(np.float32)),
                                       name="p")
        self.fc2 = nn.Dense(8, 4, weight_init=_w(4, 8, 2))

    def construct(self, x):
        h = self.fc1(x)
        return self.fc2(self.op(h, self.p) if self.second else self.op(h))


def _batches():
    rng = np.random.default_rng(5)
    x = (2 * rng.standard_normal((24, 6))).astype(np.float32)
    y = rng.integers(0, 4, 24).astype(np.int32)
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(8)


def _train(net, devices=1):
    tessera.reset_auto_parallel_context()
    tessera.set_seed(3)
    tessera.set_context(deterministic="ON")
    mode = "stand_alone" if devices == 1 else "semi_auto_parallel"
    tessera.set_auto_parallel_context(device_num=devices, parallel_mode=mode)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss, nn.SGD(net.trainable_params(), 0.5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.train(1, _batches())
    return model, np.array(model.losses), {p.name: p.asnumpy() for p in net.trainable_params()}


# name → (make the op, strategy of a batch split, of a feature split, takes p)
SHARDED = {
    "square": (ops.Square, ((2, 1),), ((1, 2),), False),
    "abs": (ops.Abs, ((2, 1),), ((1, 2),), False),
    "rsqrt_of_square": (lambda: _Chain(ops.Square(), ops.Rsqrt()), None, None, False),
    "pow3": (lambda: _PowCell(3), ((2, 1), ()), ((1, 2),), False),
    "leaky_relu": (lambda: ops.LeakyReLU(0.3), ((2, 1),), ((1, 2),), False),
    "elu": (lambda: ops.Elu(1.0), ((2, 1),), ((1, 2),), False),
    "softplus": (lambda: ops.Softplus(beta=2.0, threshold=1.0), ((2, 1),), ((1, 2),), False),
    "mish": (ops.Mish, ((2, 1),), ((1, 2),), False),
    "maximum": (ops.Maximum, ((2, 1), (1,)), ((1, 2), (2,)), True),
    "minimum_scalar": (lambda: _Scalar(ops.Minimum()), ((2, 1), ()), ((1, 2), ()), False),
}


class _Chain(nn.Cell):
    def __init__(self, a, b):
        super().__init__()
        self.a, self.b = a, b

    def construct(self, x):
        return self.b(self.a(x) + 1.0)


class _PowCell(nn.Cell):
    def __init__(self, p):
        super().__init__()
        self.pow, self.p = ops.Pow(), p

    def construct(self, x):
        return self.pow(x, self.p)


class _Scalar(nn.Cell):
    def __init__(self, prim):
        super().__init__()
        self.prim = prim

    def construct(self, x):
        return self.prim(x, 0.25)


def _shard(op, strategy):
    target = op
    for attr in ("pow", "prim"):
        target = getattr(target, attr, target)
    if isinstance(op, _Chain):
        op.a.shard(((2, 1),))
        op.b.shard(((2, 1),))
    else:
        target.shard(strategy)
    return op


@pytest.mark.parametrize("name", sorted(SHARDED))
@pytest.mark.parametrize("split", ["batch", "features"])
def test_sharded_trains_bitwise_as_one_device(name, split):
    make, batch, features, second = SHARDED[name]
    if split == "features" and features is None:
        pytest.skip("batch split only")
    _, *one = _train(Net(make(), second))
    net = Net(_shard(make(), batch if split == "batch" else features), second)
    if split == "features":
        net.fc1.matmul.shard(((1, 1), (2, 1)))
    _, *two = _train(net, devices=2)
    np.testing.assert_array_equal(two[0], one[0])
    for k, v in one[1].items():
        np.testing.assert_array_equal(two[1][k], v, err_msg=k)


def test_four_devices_and_every_node_takes_the_strategy():
    _, *one = _train(Net(ops.Maximum(), True))
    net = Net(ops.Maximum().shard(((2, 2), (2,))), True)
    model, *four = _train(net, devices=4)
    np.testing.assert_array_equal(four[0], one[0])
    for k, v in one[1].items():
        np.testing.assert_array_equal(four[1][k], v, err_msg=k)
    saved = json.loads((model._checkpoint / "strategy.json").read_text())["ops"]
    got = {op["name"]: op["in_strategy"] for op in saved if op["name"].startswith("op")}
    full, p = [2, 2], [2]
    assert got == {
        "op.sub": [full, p], "op.pos": [full], "op.neg": [full], "op.negpart": [full],
        "op.half_x": [full, []], "op.half_y": [p, []], "op.mid": [full, p],
        "op.broadcast_y": [p, full], "op.inner": [full] * 3, "op": [full] * 3}, got


@pytest.mark.parametrize("op, strategy, message", [
    (ops.LeakyReLU(), ((2,),), r"^op: strategy \(2,\) has 1 dim"),
    (ops.Elu(), ((2, 1), (1,)), "^op: in_strategy has 2 entries but Elu takes 1"),
    (ops.Maximum(), ((2, 1),), "^op: in_strategy has 1 entry but Maximum takes 2"),
    (ops.Mish(), ((3, 1),), r"^op\.pos \(ReLU\): strategy \(\(3, 1\),\): dim 0 .* 3 does not"),
    (ops.Maximum(), ((2, 1), (3,)), r"^op\.sub \(Sub\): strategy .*input 1 .* 3 does not"),
])
def test_a_bad_strategy_names_the_node(op, strategy, message):
    op.shard(strategy)
    net = Net(op, isinstance(op, ops.Maximum))
    with pytest.raises(ValueError, match=message):
        _train(net, devices=2)


def test_dense_takes_the_new_activations_by_name():
    for name, cell in [("leakyrelu", nn.LeakyReLU), ("elu", nn.ELU), ("mish", nn.Mish)]:
        dense = nn.Dense(3, 2, activation=name)
        assert isinstance(dense.activation, cell)


def test_parameters_take_operators_in_construct():
    # A Parameter on the left of an operator (`self.w ** 2`, `self.b * 2.0`, `-self.b`,
    # `self.w @ x`) is the traced tensor there, as MindSpore's Parameter is a Tensor: each
    # raised TypeError before (Parameter had no operators; a traced tensor no __rmatmul__).
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    w = np.random.default_rng(6).standard_normal((4, 4)).astype(np.float32)
    b = np.random.default_rng(7).standard_normal((4,)).astype(np.float32)

    def f(s, x):
        return (s.w @ x.transpose() + 0).transpose() * (s.b * 2.0) - s.b ** 2 + abs(-s.b) / s.b

    got = forward(f, x, w=w, b=b)
    close(got, (w @ x.T).T * (b * 2.0) - b ** 2 + np.abs(-b) / b)
    # Outside construct there is no traced tensor to apply them to.
    p = tessera.Parameter(w, name="w")
    with pytest.raises(RuntimeError, match=r"\* of Parameter w: tessera.ops run inside "
                                           "construct"):
        p * 2.0
