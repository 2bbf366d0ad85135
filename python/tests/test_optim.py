"""Optimizers, learning rates and parameter groups from Python (issue 34): MindSpore's dynamic
learning-rate functions and schedule classes, the engine's per-step rate, parameter groups
mapped onto the engine's weight-decay filter (or refused), mint.optim.AdamW and the
max_grad_norm addition."""

import math

import numpy as np
import pytest

import tessera
from tessera import nn
from tessera.dataset import NumpySlicesDataset
from tessera.mint.optim import AdamW
from tessera.train import Callback, Model

from nets import MLP, fresh_context  # noqa: F401 (the fixture is used by name)

pytestmark = pytest.mark.usefixtures("fresh_context")

RNG = np.random.RandomState(0)
X = RNG.rand(64, 64).astype(np.float32)
Y = (np.arange(64) % 10).astype(np.int32)


class Rates(Callback):
    """Records every step's learning rate and global step as the engine reports them."""

    def __init__(self):
        self.lrs, self.steps = [], []

    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        self.lrs.append(p.cur_lr)
        self.steps.append(p.cur_step_num)


def _train(make_opt, epochs=1, batch=16, net=None, callbacks=()):
    net = net or MLP()
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  make_opt(net))
    rates = Rates()
    model.train(epochs, NumpySlicesDataset((X, Y), shuffle=False).batch(batch),
                callbacks=[rates, *callbacks])
    return model, net, rates


def _values(net):
    return {name: p.asnumpy() for name, p in net.parameters_and_names()}


# MindSpore's documented examples (mindspore.nn.*_lr docstrings, 2.x).
def test_dynamic_lr_functions_give_mindspores_documented_examples():
    assert nn.piecewise_constant_lr([2, 5, 10], [0.1, 0.05, 0.01]) == \
        [0.1, 0.1, 0.05, 0.05, 0.05, 0.01, 0.01, 0.01, 0.01, 0.01]
    assert nn.exponential_decay_lr(0.1, 0.9, 6, 2, 1) == \
        [0.1, 0.1, 0.09000000000000001, 0.09000000000000001, 0.08100000000000002,
         0.08100000000000002]
    assert nn.cosine_decay_lr(0.01, 0.1, 6, 2, 2) == \
        [0.1, 0.1, 0.05500000000000001, 0.05500000000000001, 0.01, 0.01]
    assert nn.polynomial_decay_lr(0.1, 0.01, 6, 2, 2, 0.5) == \
        [0.1, 0.1, 0.07363961030678928, 0.07363961030678928, 0.01, 0.01]
    assert nn.warmup_lr(0.1, 6, 2, 2) == [0.0, 0.0, 0.05, 0.05, 0.1, 0.1]


def _epochs(total, per_epoch):
    return np.floor(np.arange(total) / per_epoch)


@pytest.mark.parametrize("per_epoch,decay", [(1, 3), (3, 2), (2, 5)])
def test_dynamic_lr_functions_follow_the_formulas(per_epoch, decay):
    total = 17
    e = _epochs(total, per_epoch)
    np.testing.assert_allclose(nn.cosine_decay_lr(0.002, 0.3, total, per_epoch, decay),
                               0.002 + 0.5 * 0.298 * (1 + np.cos(np.pi * np.minimum(e, decay)
                                                                  / decay)),
                               rtol=1e-14)
    np.testing.assert_allclose(nn.exponential_decay_lr(0.3, 0.7, total, per_epoch, decay),
                               0.3 * 0.7 ** (e / decay), rtol=1e-14)
    np.testing.assert_allclose(nn.exponential_decay_lr(0.3, 0.7, total, per_epoch, decay, True),
                               0.3 * 0.7 ** np.floor(e / decay), rtol=1e-14)
    np.testing.assert_allclose(nn.polynomial_decay_lr(0.3, 0.01, total, per_epoch, decay, 2.0),
                               0.29 * (1 - np.minimum(e, decay) / decay) ** 2 + 0.01, rtol=1e-14)
    d = decay * np.maximum(np.ceil(e / decay), 1)
    np.testing.assert_allclose(
        nn.polynomial_decay_lr(0.3, 0.01, total, per_epoch, decay, 2.0, update_decay_epoch=True),
        0.29 * (1 - e / d) ** 2 + 0.01, rtol=1e-14)
    np.testing.assert_allclose(nn.warmup_lr(0.3, total, per_epoch, decay),
                               0.3 * np.minimum(e, decay) / decay, rtol=1e-14)


def test_dynamic_lr_argument_errors_name_the_argument():
    with pytest.raises(ValueError, match="max_lr.*greater than the 'min_lr'"):
        nn.cosine_decay_lr(0.1, 0.1, 4, 1, 2)
    with pytest.raises(TypeError, match="'learning_rate'.*float"):
        nn.exponential_decay_lr(1, 0.9, 4, 1, 1)
    with pytest.raises(ValueError, match="'total_step'"):
        nn.warmup_lr(0.1, 0, 1, 1)
    with pytest.raises(ValueError, match="size of 'milestone'"):
        nn.piecewise_constant_lr([1, 2], [0.1])
    with pytest.raises(ValueError, match="milestone\\[1\\]"):
        nn.piecewise_constant_lr([3, 2], [0.1, 0.2])


def test_schedule_classes_follow_the_formulas():
    steps = np.arange(25)
    cases = [
        (nn.CosineDecayLR(0.01, 0.2, 7),
         0.01 + 0.5 * 0.19 * (1 + np.cos(np.pi * np.minimum(steps, 7) / 7))),
        (nn.WarmUpLR(0.2, 6), 0.2 * np.minimum(steps, 6) / 6),
        (nn.PolynomialDecayLR(0.2, 0.01, 9, 0.5),
         0.19 * (1 - np.minimum(steps, 9) / 9) ** 0.5 + 0.01),
        (nn.PolynomialDecayLR(0.2, 0.01, 4, 1.5, update_decay_steps=True),
         0.19 * (1 - steps / (4 * np.maximum(np.ceil(steps / 4), 1))) ** 1.5 + 0.01),
        (nn.ExponentialDecayLR(0.2, 0.5, 3), 0.2 * 0.5 ** (steps / 3)),
        (nn.ExponentialDecayLR(0.2, 0.5, 3, is_stair=True), 0.2 * 0.5 ** np.floor(steps / 3)),
    ]
    for schedule, want in cases:
        got = [schedule._value(int(s)) for s in steps]
        np.testing.assert_allclose(got, want, rtol=1e-14, err_msg=type(schedule).__name__)
        assert schedule(np.int32(5)) == np.float32(want[5])


@pytest.mark.parametrize("make_lr", [
    lambda: nn.CosineDecayLR(0.01, 0.2, 7),
    lambda: nn.WarmUpLR(0.2, 6),
    lambda: nn.PolynomialDecayLR(0.2, 0.01, 5, 2.0),
    lambda: nn.PolynomialDecayLR(0.2, 0.01, 4, 1.5, update_decay_steps=True),
    lambda: nn.ExponentialDecayLR(0.2, 0.5, 3, is_stair=True),
    # a rising polynomial has no engine rule: the optimizer passes per-step values
    lambda: nn.PolynomialDecayLR(0.01, 0.2, 5, 1.0),
], ids=["cosine", "warmup", "poly", "poly-update", "exp-stair", "poly-rising"])
def test_the_engines_step_rate_is_the_schedules(make_lr):
    schedule = make_lr()
    _, _, rates = _train(lambda net: nn.SGD(net.trainable_params(), learning_rate=schedule),
                         epochs=3)
    assert len(rates.lrs) == 12
    np.testing.assert_allclose(rates.lrs, [schedule._value(s) for s in range(12)], rtol=1e-12)


def test_a_list_of_rates_is_used_step_by_step_and_changes_training():
    lrs = nn.cosine_decay_lr(0.001, 0.1, 8, 2, 3)
    _, _, rates = _train(lambda net: nn.Momentum(net.trainable_params(), lrs, 0.9), epochs=2)
    assert rates.lrs == lrs
    # a constant list trains exactly as the number does; a list differing at step 5 only
    # changes the losses from step 6 on
    const, _, _ = _train(lambda net: nn.Momentum(net.trainable_params(), 0.05, 0.9), epochs=2)
    as_list, _, _ = _train(lambda net: nn.Momentum(net.trainable_params(), [0.05] * 8, 0.9),
                           epochs=2)
    bumped, _, r = _train(lambda net: nn.Momentum(net.trainable_params(),
                                                  [0.05] * 5 + [0.2] * 3, 0.9), epochs=2)
    assert as_list.losses == const.losses
    assert bumped.losses[:6] == const.losses[:6]
    assert bumped.losses[6] != const.losses[6]
    assert r.lrs == [0.05] * 5 + [0.2] * 3


def test_a_tensor_learning_rate_is_a_number_or_per_step_rates():
    lrs = np.array(nn.exponential_decay_lr(0.1, 0.5, 4, 1, 1), np.float32)
    _, _, rates = _train(lambda net: nn.SGD(net.trainable_params(), tessera.Tensor(lrs)))
    assert rates.lrs == [float(v) for v in lrs]
    _, _, rates = _train(lambda net: nn.SGD(net.trainable_params(), tessera.Tensor(0.25)))
    assert rates.lrs == [0.25] * 4
    with pytest.raises(ValueError, match=r"Tensor of shape \(2, 2\)"):
        nn.SGD(MLP().trainable_params(), tessera.Tensor(np.ones((2, 2))))


def test_a_second_train_continues_the_schedule():
    lrs = nn.warmup_lr(0.1, 8, 1, 8)
    model, _, rates = _train(lambda net: nn.SGD(net.trainable_params(), learning_rate=lrs))
    assert rates.lrs == lrs[:4]
    second = Rates()
    model.train(1, NumpySlicesDataset((X, Y), shuffle=False).batch(16), callbacks=[second])
    assert second.lrs == lrs[4:]
    with pytest.raises(ValueError, match="learning_rate gives rates for 8 steps, but training "
                                         "runs to global step 12"):
        model.train(1, NumpySlicesDataset((X, Y), shuffle=False).batch(16))


def test_learning_rate_errors():
    net = MLP()
    with pytest.raises(ValueError, match=r"learning_rate\[1\] = -0.1 is out of range"):
        nn.SGD(net.trainable_params(), learning_rate=[0.1, -0.1])

    class Mine(nn.LearningRateSchedule):
        def construct(self, global_step):
            return 0.1

    with pytest.raises(TypeError, match="Mine; Tessera runs the schedules of tessera.nn only"):
        nn.Adam(net.trainable_params(), learning_rate=Mine())
    with pytest.raises(ValueError, match="loss_scale must be 1.0"):
        nn.Momentum(net.trainable_params(), 0.1, 0.9, loss_scale=1024.0)


def _groups(net, decay, other):
    weights = [p for p in net.trainable_params() if p.name.endswith("weight")]
    biases = [p for p in net.trainable_params() if p.name.endswith("bias")]
    return [{"params": weights, "weight_decay": decay},
            {"params": biases, "weight_decay": other},
            {"order_params": net.trainable_params()}]


def test_groups_differing_in_weight_decay_decay_exactly_their_parameters():
    # One full-batch SGD step from the same initial values (same seed): a decayed parameter
    # is that of the run decaying everything, an undecayed one that of the run decaying nothing.
    one_step = {"epochs": 1, "batch": 64}
    _, all_decay, _ = _train(lambda n: nn.SGD(n.trainable_params(), 0.5, weight_decay=0.1),
                             **one_step)
    _, no_decay, _ = _train(lambda n: nn.SGD(n.trainable_params(), 0.5), **one_step)
    _, grouped, _ = _train(lambda n: nn.SGD(_groups(n, 0.1, 0.0), 0.5), **one_step)
    a, b, g = _values(all_decay), _values(no_decay), _values(grouped)
    for name in a:
        assert not np.array_equal(a[name], b[name]), name  # the decay shows in one step
        want = a[name] if name.endswith("weight") else b[name]
        assert np.array_equal(g[name], want), name


def test_group_settings_the_engine_cannot_honour_are_errors():
    net = MLP()
    params = net.trainable_params()
    with pytest.raises(ValueError, match="parameter group 1 sets 'lr' = 0.01, not the "
                                         "optimizer's learning_rate"):
        nn.Momentum([{"params": params[:2]}, {"params": params[2:], "lr": 0.01}], 0.1, 0.9)
    nn.Momentum([{"params": params[:2]}, {"params": params[2:], "lr": 0.1}], 0.1, 0.9)  # same lr
    with pytest.raises(ValueError, match="parameter group 0 sets 'grad_centralization'"):
        nn.Adam([{"params": params, "grad_centralization": True}])
    with pytest.raises(ValueError, match="parameter group 0 has key 'momentum'"):
        nn.Adam([{"params": params, "momentum": 0.5}])
    with pytest.raises(ValueError, match=r"weight_decay \[0.01, 0.02\]"):
        nn.AdamWeightDecay([{"params": params[:2], "weight_decay": 0.01},
                            {"params": params[2:], "weight_decay": 0.02}])
    with pytest.raises(ValueError, match="fc1.weight is in parameter groups 0 and 1"):
        nn.SGD([{"params": params[:1]}, {"params": params[:2]}])
    # a network Parameter the optimizer does not update
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.SGD(params[:3], 0.1))
    with pytest.raises(ValueError, match=r"Parameters \['fc2.bias'\] are not in the optimizer"):
        model.train(1, NumpySlicesDataset((X, Y)).batch(16))


def test_mint_adamw_is_pytorchs_rule():
    # Without decay PyTorch's AdamW is Adam with ε inside the bias correction: with ε tiny the
    # losses are nn.Adam's to rounding (bitwise or not: ε is below f32's resolution against
    # √v̂ for all but the tiniest gradients, so that depends on the data and the machine)...
    adam, _, _ = _train(lambda n: nn.Adam(n.trainable_params(), 1e-3, eps=1e-12), epochs=2)
    mint, _, _ = _train(lambda n: AdamW(n.trainable_params(), lr=1e-3, eps=1e-12,
                                        weight_decay=0.0), epochs=2)
    np.testing.assert_allclose(mint.losses, adam.losses, rtol=1e-4)
    # ... and with an ε that counts against √v̂, where ε sits shows: another run.
    adam, _, _ = _train(lambda n: nn.Adam(n.trainable_params(), 1e-3, eps=1e-2), epochs=2)
    mint, _, _ = _train(lambda n: AdamW(n.trainable_params(), lr=1e-3, eps=1e-2,
                                        weight_decay=0.0), epochs=2)
    assert max(abs(a - b) for a, b in zip(mint.losses, adam.losses)) > 1e-6
    # MindSpore's AdamWeightDecay has no bias correction: a different run
    adamw, _, _ = _train(lambda n: nn.AdamWeightDecay(n.trainable_params(), 1e-3, eps=1e-12),
                         epochs=2)
    assert abs(adamw.losses[-1] - mint.losses[-1]) > 1e-3
    with pytest.raises(ValueError, match="amsgrad and maximize must be False"):
        AdamW(MLP().trainable_params(), amsgrad=True)
    with pytest.raises(ValueError, match="parameter group 0 sets 'eps'"):
        AdamW([{"params": MLP().trainable_params(), "eps": 1e-3}])


def test_mint_adamw_decays_every_parameter_or_says_why_not():
    class Norm(nn.Cell):
        def __init__(self):
            super().__init__()
            self.flatten = nn.Flatten()
            self.gamma = nn.Dense(64, 10)

        def construct(self, x):
            return self.gamma(self.flatten(x))

    with pytest.raises(ValueError, match=r"never decays \['gamma.bias', 'gamma.weight'\]"):
        _train(lambda n: AdamW(n.trainable_params()), net=Norm())
    # with a group giving them no decay it trains
    model, _, _ = _train(lambda n: AdamW([{"params": n.trainable_params(), "weight_decay": 0.0}]),
                         net=Norm())
    assert len(model.losses) == 4


def test_max_grad_norm_clips_the_update():
    full = {"epochs": 2, "batch": 64}
    free, _, _ = _train(lambda n: nn.SGD(n.trainable_params(), 0.5), **full)
    clipped, _, _ = _train(lambda n: nn.SGD(n.trainable_params(), 0.5, max_grad_norm=1e-4), **full)
    assert clipped.losses[0] == free.losses[0]
    assert abs(free.losses[1] - free.losses[0]) > 1e-2
    assert abs(clipped.losses[1] - clipped.losses[0]) < 1e-4
    with pytest.raises(ValueError, match="max_grad_norm = 0.0 is out of range"):
        nn.Momentum(MLP().trainable_params(), 0.1, 0.9, max_grad_norm=0.0)


def test_optimizer_signatures_are_mindsporess_with_keyword_only_additions():
    import inspect
    for cls in (nn.SGD, nn.Momentum, nn.Adam, nn.AdamWeightDecay, nn.Lamb, AdamW):
        extra = inspect.signature(cls).parameters["max_grad_norm"]
        assert extra.kind is inspect.Parameter.KEYWORD_ONLY and extra.default is None
    sig = inspect.signature(AdamW)
    assert list(sig.parameters)[:7] == ["params", "lr", "betas", "eps", "weight_decay",
                                        "amsgrad", "maximize"]
    assert sig.parameters["weight_decay"].default == 1e-2
    assert sig.parameters["maximize"].kind is inspect.Parameter.KEYWORD_ONLY
    assert math.isclose(inspect.signature(nn.AdamWeightDecay).parameters["eps"].default, 1e-6)


def test_adam_use_amsgrad_and_use_nesterov_reach_the_engine():
    # Each flag is the engine's train.use_amsgrad / train.use_nesterov: a different run from
    # plain Adam (AMSGrad only where a second moment shrinks, so over several epochs).
    runs = {}
    for flags in ({}, {"use_amsgrad": True}, {"use_nesterov": True}):
        args = nn.Adam(MLP().trainable_params(), 1e-2, **flags)._engine_args()
        assert args["use_amsgrad"] is flags.get("use_amsgrad", False)
        assert args["use_nesterov"] is flags.get("use_nesterov", False)
        _, net, _ = _train(lambda n, f=flags: nn.Adam(n.trainable_params(), 1e-2, **f), epochs=3)
        runs[tuple(flags)] = _values(net)
    for flag in ("use_amsgrad", "use_nesterov"):
        diff = max(np.abs(runs[(flag,)][k] - runs[()][k]).max() for k in runs[()])
        assert diff > 1e-6, f"{flag} changes the trained weights"
    # MindSpore runs the pair as AMSGrad alone: refused rather than one switch doing nothing.
    with pytest.raises(ValueError, match="use_nesterov=True with use_amsgrad=True is not"):
        nn.Adam(MLP().trainable_params(), use_nesterov=True, use_amsgrad=True)
    with pytest.raises(TypeError, match="use_amsgrad must be a bool"):
        nn.Adam(MLP().trainable_params(), use_amsgrad="True")


def test_lamb_trains_with_mindsporess_defaults():
    import inspect
    sig = inspect.signature(nn.Lamb)
    assert list(sig.parameters)[:6] == ["params", "learning_rate", "beta1", "beta2", "eps",
                                        "weight_decay"]
    assert sig.parameters["learning_rate"].default is inspect.Parameter.empty
    assert math.isclose(sig.parameters["eps"].default, 1e-6)
    opt = nn.Lamb(MLP().trainable_params(), 1e-2, weight_decay=0.01)
    assert opt._engine_args()["optimizer"] == "lamb"
    lamb, lamb_net, _ = _train(lambda n: nn.Lamb(n.trainable_params(), 1e-2, weight_decay=0.01),
                               epochs=2)
    adam, adam_net, _ = _train(lambda n: nn.Adam(n.trainable_params(), 1e-2, weight_decay=0.01),
                               epochs=2)
    assert all(math.isfinite(x) for x in lamb.losses)
    assert lamb.losses[-1] < lamb.losses[0]
    lamb_w, adam_w = _values(lamb_net), _values(adam_net)
    assert max(np.abs(lamb_w[k] - adam_w[k]).max() for k in lamb_w) > 1e-5
    with pytest.raises(Exception, match="train.beta1"):
        _train(lambda n: nn.Lamb(n.trainable_params(), 1e-2, beta1=1.5))
