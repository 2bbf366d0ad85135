"""The transformer ops of ``tessera.ops`` and the Cells built on them (issue 34): every op's
forward value against numpy on one device (the engine's executor, ``forward_network``), losses
against numpy at the first step, sharded ops against one device, and errors naming the Cell, the
op and the rule."""

import math

import numpy as np
import pytest

import tessera
from tessera import _trace, nn, ops
from tessera import dataset as ds
from tessera._tessera import NetworkBuilder, forward_network
from tessera.common.initializer import Normal, Zero, initializer
from tessera.train import Model

from nets import fresh_context  # noqa: F401 (the fixture is used by name)

pytestmark = pytest.mark.usefixtures("fresh_context")

RNG = np.random.default_rng(7)


class Fn(nn.Cell):
    """``f(self, x)`` as a Cell, with Parameters ``params`` (name → value, set when run)."""

    def __init__(self, f, **params):
        super().__init__()
        for name, value in params.items():
            setattr(self, name, tessera.Parameter(initializer(Zero(), np.shape(value))))
        self.f = f

    def construct(self, x):
        return self.f(self, x)


def trace(f, x, **params):
    """Traces ``Fn(f, **params)`` on an input like ``x``; returns (builder, cell, input, out,
    trace)."""
    cell = Fn(f, **params)
    builder = NetworkBuilder()
    cell._name_tree("")
    dtype = "int32" if x.dtype.kind == "i" else "float32"
    with _trace.tracing(builder) as tr:
        xin = _trace.Tensor(*builder.input("data", list(x.shape), dtype), dtype=dtype)
        out = cell(xin)
    return builder, cell, xin, out, tr


def forward(f, x, **params):
    """The engine's forward value of ``f(cell, x)`` on one device, Parameters set to
    ``params``."""
    builder, cell, xin, out, tr = trace(f, x, **params)
    values = [(tr.params[id(getattr(cell, k))].id, np.asarray(v, np.float32))
              for k, v in params.items() if id(getattr(cell, k)) in tr.params]
    return forward_network(builder, xin.id, out.id, values, x)


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(got, np.asarray(want, np.float32), rtol=tol, atol=tol)


X = RNG.standard_normal((4, 3, 5)).astype(np.float32)


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_batch_matmul_with_transposes(ta, tb):
    w = RNG.standard_normal((4, 5, 2) if not tb else (4, 2, 5)).astype(np.float32)
    x = X if not ta else np.ascontiguousarray(X.transpose(0, 2, 1))
    got = forward(lambda s, x: ops.BatchMatMul(ta, tb)(x, s.w), x, w=w)
    a = x.transpose(0, 2, 1) if ta else x
    b = w.transpose(0, 2, 1) if tb else w
    close(got, a @ b)


def test_matmul_of_a_3d_input_the_operator_and_functional_forms():
    w = RNG.standard_normal((2, 5)).astype(np.float32)
    close(forward(lambda s, x: ops.MatMul(transpose_b=True)(x, s.w), X, w=w), X @ w.T)
    v = RNG.standard_normal((5, 2)).astype(np.float32)
    close(forward(lambda s, x: x @ s.v, X, v=v), X @ v)
    x2 = np.ascontiguousarray(X[:, 0, :])
    close(forward(lambda s, x: ops.matmul(x, s.v), x2, v=v), x2 @ v)
    close(forward(lambda s, x: ops.bmm(x, s.w), X, w=np.stack([v] * 4)), X @ v)


@pytest.mark.parametrize("prim,fn", [
    (ops.ReduceSum, np.sum), (ops.ReduceMean, np.mean), (ops.ReduceMax, np.max)])
@pytest.mark.parametrize("axis,keep", [(1, False), (-1, True), ((1, 2), False), ((2, 1), True)])
def test_reductions(prim, fn, axis, keep):
    got = forward(lambda s, x: prim(keep)(x, axis), X)
    close(got, fn(X, axis=axis if isinstance(axis, int) else tuple(axis), keepdims=keep))


def test_functional_reductions():
    close(forward(lambda s, x: ops.sum(x, 2), X), X.sum(2))
    close(forward(lambda s, x: ops.mean(x, (1, 2), True), X), X.mean((1, 2), keepdims=True))
    close(forward(lambda s, x: ops.amax(x, -1), X), X.max(-1))


def test_unary_ops():
    pos = np.abs(X) + 0.1
    close(forward(lambda s, x: ops.Sqrt()(x), pos), np.sqrt(pos))
    close(forward(lambda s, x: ops.sqrt(x), pos), np.sqrt(pos))
    close(forward(lambda s, x: ops.Log()(x), pos), np.log(pos))
    close(forward(lambda s, x: ops.log(x), pos), np.log(pos))
    close(forward(lambda s, x: ops.Exp()(x), X), np.exp(X))
    close(forward(lambda s, x: ops.Neg()(x), X), -X)
    close(forward(lambda s, x: -x, X), -X)
    erf = np.vectorize(math.erf)
    close(forward(lambda s, x: ops.gelu(x), X), 0.5 * X * (1 + erf(X / np.sqrt(2))))
    close(forward(lambda s, x: nn.GELU(approximate=False)(x), X),
          0.5 * X * (1 + erf(X / np.sqrt(2))))
    tanh = 0.5 * X * (1 + np.tanh(np.sqrt(2 / np.pi) * (X + 0.044715 * X ** 3)))
    close(forward(lambda s, x: ops.gelu(x, approximate="tanh"), X), tanh)


def test_scalars_and_operators():
    y = RNG.standard_normal((4, 3, 5)).astype(np.float32)
    close(forward(lambda s, x: x * 2.0, X), X * 2)
    close(forward(lambda s, x: 0.5 * x, X), X * 0.5)
    close(forward(lambda s, x: x * -3, X), X * -3)
    close(forward(lambda s, x: x + 1, X), X + 1)
    close(forward(lambda s, x: 1 - x, X), 1 - X)
    close(forward(lambda s, x: x - 1.5, X), X - 1.5)
    close(forward(lambda s, x: x / 4, X), X / 4)
    close(forward(lambda s, x: 2 / (x * x + 1), X), 2 / (X * X + 1))
    close(forward(lambda s, x: ops.Mul()(x, 0.5), X), X * 0.5)
    close(forward(lambda s, x: ops.mul(3.0, x), X), 3 * X)
    close(forward(lambda s, x: (x + s.y) * (x - s.y) / s.y, X, y=y), (X + y) * (X - y) / y)


def _names(f, x, **params):
    return trace(f, x, **params)[0].node_names()


def test_softmax_of_a_scaled_tensor_is_one_scaled_softmax():
    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    close(forward(lambda s, x: ops.Softmax()(x * 0.25), X), softmax(X * 0.25))
    close(forward(lambda s, x: ops.softmax(x, axis=2), X), softmax(X))
    close(forward(lambda s, x: nn.Softmax()(x), X), softmax(X))
    assert _names(lambda s, x: ops.Softmax()(x * 0.25), X) == ["softmax"]
    # used elsewhere too, the product is a node of its own
    assert _names(lambda s, x: ops.Softmax()(x * 0.25) + x * 0.5, X) == [
        "softmax", "mul_1.value", "mul_1", "add"]
    # a negative scale is no softmax scale: the Mul is kept
    assert _names(lambda s, x: ops.Softmax()(x * -1.0), X) == ["mul.value", "mul", "softmax"]
    e = np.exp(X - X.max(-1, keepdims=True))
    close(forward(lambda s, x: ops.LogSoftmax()(x), X), np.log(e / e.sum(-1, keepdims=True)))


def test_gather_and_embedding():
    ids = RNG.integers(0, 7, (4, 3)).astype(np.int32)
    table = RNG.standard_normal((7, 5)).astype(np.float32)
    close(forward(lambda s, x: ops.Gather()(s.table, x, 0), ids, table=table), table[ids])
    close(forward(lambda s, x: ops.gather(s.table, x, 0), ids, table=table), table[ids])

    for one_hot in (False, True):
        emb = nn.Embedding(7, 5, use_one_hot=one_hot)
        cell = Fn(lambda s, x: s.emb(x))
        cell.emb = emb
        builder = NetworkBuilder()
        cell._name_tree("")
        with _trace.tracing(builder) as tr:
            xin = _trace.Tensor(*builder.input("data", [4, 3], "int32"), dtype="int32")
            out = cell(xin)
        assert emb.embedding_table.name == "emb.embedding_table"
        got = forward_network(builder, xin.id, out.id,
                              [(tr.params[id(emb.embedding_table)].id, table)], ids)
        close(got, table[ids])


def test_one_hot():
    ids = RNG.integers(0, 6, (4, 3)).astype(np.int32)
    close(forward(lambda s, x: ops.OneHot()(x, 6, 1.0, 0.0), ids), np.eye(6)[ids])
    close(forward(lambda s, x: ops.one_hot(x, 6), ids), np.eye(6)[ids])


def test_concat_split_cast_transpose_reshape():
    close(forward(lambda s, x: ops.Concat(2)((x, x * 2.0)), X), np.concatenate([X, X * 2], 2))
    close(forward(lambda s, x: ops.cat((x, x), axis=-2), X), np.concatenate([X, X], 1))
    close(forward(lambda s, x: ops.Split(1, 3)(x)[2], X), X[:, 2:3])
    close(forward(lambda s, x: ops.split(ops.concat((x, x), 2), 5, axis=2)[1], X), X)
    half = X.astype(np.float16).astype(np.float32)
    close(forward(lambda s, x: ops.Cast()(ops.Cast()(x, tessera.float16), tessera.float32), X),
          half, tol=0)
    close(forward(lambda s, x: ops.cast(x, tessera.float32), X), X)
    close(forward(lambda s, x: ops.transpose(x, (0, 2, 1)), X), X.transpose(0, 2, 1))
    close(forward(lambda s, x: ops.reshape(x, (4, -1)), X), X.reshape(4, -1))


def _layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def test_layer_norm_primitive_and_cell():
    g, b = RNG.standard_normal(5).astype(np.float32), RNG.standard_normal(5).astype(np.float32)
    got = forward(lambda s, x: ops.LayerNorm(-1, -1, 1e-5)(x, s.g, s.b)[0], X, g=g, b=b)
    close(got, _layer_norm(X, g, b, 1e-5))
    ln = nn.LayerNorm((5,), epsilon=1e-5)
    assert [n for n, _ in ln.parameters_and_names()] == ["gamma", "beta"]
    cell = Fn(lambda s, x: s.ln(x))
    cell.ln = ln
    assert _names(lambda s, x: ln(x), X) == ["layer_norm"]
    x2 = np.ascontiguousarray(X[:, 0, :])
    close(forward(lambda s, x: ops.LayerNorm(1, 1)(x, s.g, s.b)[0], x2, g=g, b=b),
          _layer_norm(x2, g, b, 1e-7))


def test_dropout_masks_and_scales():
    x = np.ones((8, 64), np.float32)
    got = forward(lambda s, x: ops.Dropout(0.75)(x)[0], x)
    kept = got != 0
    assert np.allclose(got[kept], 1 / 0.75) and 0.6 < kept.mean() < 0.9
    again = forward(lambda s, x: nn.Dropout(p=0.25)(x), x)
    assert (again == got).all(), "site 1 with keep 0.75: the same mask"
    other = forward(lambda s, x: ops.Dropout(0.75, Seed0=3)(x)[0], x)
    assert (other != got).any()
    close(forward(lambda s, x: nn.Dropout(p=0.0)(x), x), x)
    # the second site has seed 2 even after an identity (p = 0) site
    two = forward(lambda s, x: nn.Dropout(p=0.25)(nn.Dropout(p=0.0)(x)), x)
    assert (two != got).any()
    assert _names(lambda s, x: nn.Dropout(p=0.0)(x) + x, x) == ["add"]


def test_masked_fill_and_triu():
    def f(s, x):
        mask = ops.Triu(1)(ops.ones((3, 5), tessera.float32))
        return ops.MaskedFill()(x, mask, -1e9)

    close(forward(f, X), np.where(np.triu(np.ones((3, 5)), 1) > 0, -1e9, X))
    close(forward(lambda s, x: ops.masked_fill(x, ops.triu(ops.ones((3, 5)), 0), 0.0), X),
          np.where(np.triu(np.ones((3, 5))) > 0, 0, X))
    close(forward(lambda s, x: x + ops.ones((3, 5)) + ops.zeros(5), X), X + 1)
    close(forward(lambda s, x: ops.stop_gradient(x) * 1.0, X), X)


def _first_loss(backbone, loss_fn, data, labels):
    tessera.set_auto_parallel_context(device_num=1)
    model = Model(backbone, loss_fn, nn.SGD(backbone.trainable_params(), learning_rate=1e-9))
    model.train(1, ds.NumpySlicesDataset((data, labels), shuffle=False).batch(len(data)))
    return model.losses[0]


class Bias(nn.Cell):
    """``x + b`` with ``b`` zero: the logits are the input at the first step."""

    def __init__(self, n):
        super().__init__()
        self.b = tessera.Parameter(initializer(Zero(), (n,)))

    def construct(self, x):
        return x + self.b


def test_losses_against_numpy():
    logits = RNG.standard_normal((8, 6)).astype(np.float32)
    labels = RNG.integers(0, 6, 8).astype(np.int32)
    shifted = logits - logits.max(1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    ce = -logp[np.arange(8), labels].mean()
    close(_first_loss(Bias(6), nn.CrossEntropyLoss(), logits, labels), ce)
    targets = RNG.standard_normal((8, 6)).astype(np.float32)
    close(_first_loss(Bias(6), nn.MSELoss(), logits, targets), ((logits - targets) ** 2).mean())
    close(_first_loss(Bias(6), nn.MSELoss(reduction="sum"), logits, targets),
          ((logits - targets) ** 2).sum(), tol=1e-4)


# Sharded ops against one device.

class Mixer(nn.Cell):
    """Most new ops in one network on ``[n, 8, 8]`` digits; ``shard`` splits them over 4
    devices (batch 2 ways, and features or rows 2 ways)."""

    def __init__(self, shard=False):
        super().__init__()
        self.fc = nn.Dense(8, 16, weight_init=Normal(0.1))
        self.ln = nn.LayerNorm((16,))
        self.scores = ops.BatchMatMul(transpose_b=True)
        self.softmax = ops.Softmax()
        self.context = ops.BatchMatMul()
        self.square = ops.Mul()
        self.shift = ops.Add()
        self.sqrt = ops.Sqrt()
        self.log = ops.Log()
        self.exp = ops.Exp()
        self.mean = ops.ReduceMean(keep_dims=True)
        self.total = ops.ReduceSum()
        self.concat = ops.Concat(1)
        self.split = ops.Split(2, 2)
        self.neg = ops.Neg()
        self.dropout = nn.Dropout(p=0.1)
        self.head = nn.Dense(64 + 8, 10, weight_init=Normal(0.1))
        if shard:
            self.fc.matmul.shard(((2, 1, 1), (2, 1)))
            self.fc.bias_add.shard(((2, 1, 2), (2,)))
            self.ln.layer_norm.shard(((2, 2, 1), (1,), (1,)))
            self.scores.shard(((2, 1, 1), (2, 1, 1)))
            self.softmax.shard(((2, 2, 1),))
            self.context.shard(((2, 2, 1), (2, 1, 1)))
            self.square.shard(((2, 2, 1), (2, 2, 1)))
            self.shift.shard(((2, 2, 1), ()))                     # () for the scalar
            self.sqrt.shard(((2, 2, 1),))
            self.log.shard(((2, 2, 1),))
            self.exp.shard(((2, 1, 2),))
            self.mean.shard(((2, 2, 1),))
            self.total.shard(((2, 1, 2),))
            self.split.shard(((2, 2, 1),))
            self.neg.shard(((2, 1, 2),))
            self.dropout.dropout.shard(((2, 2, 1),))
            self.head.matmul.shard(((2, 1), (2, 1)))
            self.concat.shard(((2, 1), (2, 1)))

    def construct(self, x):
        h = self.ln(self.fc(x))                                   # [n, 8, 16]
        probs = self.softmax(self.scores(h, h) * 0.25)            # [n, 8, 8] (ScaledSoftmax)
        h = self.context(probs, h)                                # [n, 8, 16]
        h = self.log(self.sqrt(self.shift(self.square(h, h), 1.0)) + 1.0)  # [n, 8, 16]
        h = self.dropout(h - self.mean(h, 2))
        a, b = self.split(h)                                      # [n, 8, 8] each
        pooled = self.total(self.neg(self.exp(b * 0.1)), 2)       # [n, 8]
        flat = ops.reshape(a, (-1, 64))
        return self.head(self.concat((flat, pooled)))


def _train_mixer(shard, devices, steps=3):
    tessera.set_auto_parallel_context(device_num=devices, parallel_mode="semi_auto_parallel")
    x = RNG.standard_normal((64, 8, 8)).astype(np.float32)
    y = (np.arange(64) % 10).astype(np.int32)
    net = Mixer(shard)
    model = Model(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.05, 0.9))
    data = ds.NumpySlicesDataset((x, y), shuffle=False).batch(16, drop_remainder=True)
    model.train(1, data)
    return np.array(model.losses[:steps])


def test_sharded_ops_give_one_devices_losses():
    global RNG
    RNG = np.random.default_rng(11)
    one = _train_mixer(False, 1)
    RNG = np.random.default_rng(11)
    four = _train_mixer(True, 4)
    assert len(one) == 3 and np.isfinite(one).all()
    np.testing.assert_allclose(four, one, rtol=0, atol=1e-5)
    assert len(set(one.tolist())) == 3, "the network trains (losses change)"


class Tokens(nn.Cell):
    """Token ids ``[n, 6]`` through a looked-up and a one-hot embedding (their tables' rows
    split when sharded: vocabulary parallel), a half-precision round trip, a sum over the
    sequence and a dense head."""

    def __init__(self, shard=False):
        super().__init__()
        self.lookup = nn.Embedding(16, 8, embedding_table=Normal(0.1))
        self.onehot = nn.Embedding(16, 8, use_one_hot=True, embedding_table=Normal(0.1))
        self.add = ops.Add()
        self.to_half, self.to_float = ops.Cast(), ops.Cast()
        self.total = ops.ReduceSum()
        self.head = nn.Dense(8, 10, weight_init=Normal(0.1))
        if shard:
            self.lookup.gather.shard(((2, 1), (2, 1)))
            self.onehot.matmul.shard(((2, 1, 2), (2, 1)))
            self.add.shard(((2, 2, 1), (2, 2, 1)))
            self.to_half.shard(((2, 2, 1),))
            self.total.shard(((2, 2, 1),))

    def construct(self, ids):
        h = self.add(self.lookup(ids), self.onehot(ids))
        h = self.to_float(self.to_half(h, tessera.float16), tessera.float32)
        return self.head(self.total(h, 1))


def _train_tokens(shard, devices):
    tessera.set_auto_parallel_context(device_num=devices, parallel_mode="semi_auto_parallel")
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 16, (64, 6)).astype(np.int32)
    y = (ids.sum(1) % 10).astype(np.int32)
    net = Tokens(shard)
    model = Model(net, nn.CrossEntropyLoss(), nn.Momentum(net.trainable_params(), 0.05, 0.9))
    model.train(1, ds.NumpySlicesDataset((ids, y), shuffle=False).batch(16))
    return np.array(model.losses[:3])


def test_sharded_token_ops_give_one_devices_losses():
    one, four = _train_tokens(False, 1), _train_tokens(True, 4)
    assert len(one) == 3 and len(set(one.tolist())) == 3
    np.testing.assert_allclose(four, one, rtol=0, atol=1e-5)


# Errors name the Cell, the op and the rule.

def _error(f, x=X, error=ValueError, **params):
    with pytest.raises(error) as err:
        forward(f, x, **params)
    return err.value


def test_bad_axes_name_the_cell_the_op_and_the_rule():
    e = _error(lambda s, x: ops.ReduceSum()(x, 3))
    assert "Cell <root> (Fn): op ReduceSum: axis 3 is out of range for a 3-D input" in str(e)
    e = _error(lambda s, x: ops.ReduceMean()(x, (1, -2)))
    assert "op ReduceMean: axis (1, -2) repeats a dim" in str(e)
    e = _error(lambda s, x: ops.Split(1, 2)(x))
    assert "op Split: output_num=2 does not divide dim 1 (3)" in str(e)
    e = _error(lambda s, x: ops.Concat(4)((x, x)))
    assert "op Concat: axis 4 is out of range" in str(e)
    ids = np.zeros((4, 3), np.int32)
    e = _error(lambda s, x: ops.OneHot().shard(((2, 1),))(x, 4, 1.0, 0.0), ids)
    assert "one_hot: OneHot's strategy is one tuple of its output's 3 dims" in str(e)


def test_unsupported_attributes_name_the_cell_the_op_and_the_rule():
    U = ops.UnsupportedOpError
    e = _error(lambda s, x: ops.Softmax(axis=1)(x), error=U)
    assert e.op == "Softmax" and e.cell == "<root> (Fn)" and "not the last axis" in e.rule
    e = _error(lambda s, x: ops.LayerNorm(1, 1)(x, s.g, s.b)[0], error=U,
               g=np.ones(5), b=np.zeros(5))
    assert e.op == "LayerNorm" and "begin_norm_axis=1 is not the last axis" in e.rule
    e = _error(lambda s, x: nn.LayerNorm((5,), begin_norm_axis=1)(x), error=U)
    assert e.op == "LayerNorm" and "begin_norm_axis=1" in e.rule
    e = _error(lambda s, x: ops.Gather()(s.t, x, 1), np.zeros((4, 3), np.int32), U,
               t=np.zeros((7, 5)))
    assert e.op == "Gather" and "on axis 0 (got 1)" in e.rule
    e = _error(lambda s, x: ops.OneHot(axis=0)(x, 4, 1.0, 0.0), np.zeros((4, 3), np.int32), U)
    assert e.op == "OneHot" and "axis=0" in e.rule
    e = _error(lambda s, x: ops.OneHot()(x, 4, 2.0, 0.0), np.zeros((4, 3), np.int32), U)
    assert "on_value and off_value" in e.rule
    e = _error(lambda s, x: ops.Cast()(x, tessera.int32), error=U)
    assert e.op == "Cast" and "float types only" in e.rule
    e = _error(lambda s, x: ops.Triu(1)(x), error=U)
    assert e.op == "Triu" and "ops.ones(shape)" in e.rule
    e = _error(lambda s, x: ops.LayerNorm(-1, -1)(x, s.g, s.b)[1] + x, error=U,
               g=np.ones(5), b=np.zeros(5))
    assert e.op == "LayerNorm's mean" and "only y" in e.rule
    e = _error(lambda s, x: ops.Dropout(0.5)(x)[1] * x, error=U)
    assert e.op == "Dropout's mask"
    e = _error(lambda s, x: ops.Print()("strings", "alone"), error=U)
    assert e.op == "Print" and "at least one tensor" in e.rule
    with pytest.raises(U, match=r"op CrossEntropyLoss is not supported: labels must be int"):
        _first_loss(Bias(6), nn.CrossEntropyLoss(), np.zeros((8, 6), np.float32),
                    np.zeros((8,), np.float32))


def test_shape_mismatches_name_the_node():
    e = _error(lambda s, x: ops.BatchMatMul()(x, x))
    assert str(e).startswith("batch_matmul: inner dims 5 and 3 differ")
    e = _error(lambda s, x: ops.Concat(2)((x, ops.transpose(x, (0, 2, 1)))))
    assert str(e).startswith("concat: input `transpose` has shape [4, 5, 3], but Concat needs")
    e = _error(lambda s, x: ops.MaskedFill()(x, ops.ones((4, 4)), 0.0))
    assert str(e).startswith("masked_fill: input `ones` has shape [4, 4], but MaskedFill needs")
    e = _error(lambda s, x: x + s.w, w=np.zeros(4))
    assert str(e).startswith("add: `data` [4, 3, 5] and `w` [4] cannot be broadcast")
    # inside a Cell, the node is named after the Cell's path
    cell = Fn(lambda s, x: s.inner(x))
    cell.inner = nn.Dense(4, 2)
    with pytest.raises(ValueError, match=r"^inner\.matmul: "):
        builder = NetworkBuilder()
        cell._name_tree("")
        with _trace.tracing(builder):
            cell(_trace.Tensor(*builder.input("data", [4, 3, 5], "float32")))


def test_dropout_is_the_identity_in_model_eval():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(4, 3, weight_init=Normal(0.1))
            self.drop = nn.Dropout(p=0.5)

        def construct(self, x):
            return self.drop(self.fc(x))

    model = Model(Net(), nn.CrossEntropyLoss())
    x = np.zeros((8, 4), np.float32)
    y = np.zeros(8, np.int32)
    for training, expected in ((True, True), (False, False)):
        builder = model._trace(4, [("x", x), ("y", y)], training=training)[0]
        assert ("drop" in builder.node_names()) is expected
