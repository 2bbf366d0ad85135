"""Training numbers against MindSpore 2.10 (CPU), pinned: each fixture of
``tests/fixtures/mindspore/generated/training/`` holds one case of
``scripts/mindspore-train-diff.py`` (the network, loss, optimizer and learning rate as JSON, the
initial weights and the data) and the per-step losses and final weights MindSpore trained from
them, stand-alone and, for most, in ``data_parallel`` on 2 processes (``msrun``; each rank read
its half of every global batch). Tessera must reproduce both from the same values, so CI checks
the numbers without MindSpore; the ``eval_*`` fixtures also hold MindSpore's ``Model.eval``
metrics of the trained network (``ms_eval.<name>``). Regenerate with ``--fixture NAME:INDEX``
(see the script): ``eval_embedding_ce`` is ``--seed 1000 --no-dp --only 8``, ``eval_mse_sum``
``--only 29`` of the same, ``momentum_embedding_sum_div3_dp_sum_grads`` ``--seed 1000
--dp-every 1 --only 625``, each with ``--two-rounds`` (the fixtures predate the script's third
round of draws, Sigmoid and SiLU). The ``losscell_*`` fixtures (the fifth round: a loss Cell of
one's own, ``construct(self, x, mask, y)`` with a mask column) are ``--seed 5000 --dp-every 1
--only I`` for I = 406 (``mse_times_inv_rows``), 593 (``masked_ce_predict``, which also holds
MindSpore's ``Model.predict`` of the trained network, ``ms_final.__predict__``), 295
(``masked_nll_div_neg_rows``) and 541 (``mse_times_neg_inv_rows``).

MindSpore 2.10's CPU ``ApplyMomentum`` ignores ``use_nesterov`` (docs/MINDSPORE_DIFFERENCES.md,
difference 16): for ``Momentum(use_nesterov=True)`` the fixture holds MindSpore's
``SGD(momentum, nesterov=True)`` numbers, the documented Nesterov rule."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

import tessera
from tessera import nn

from conftest import FIXTURES

TRAINING = FIXTURES / "generated" / "training"
CASES = sorted(TRAINING.glob("*.npz"))
# f32 rounding: the two sides sum in different orders; a few steps keep it below this.
RTOL, ATOL = 2e-4, 1e-5


def _load(path):
    data = dict(np.load(path))
    case = json.loads(str(data.pop("case_json")))
    return case, data


def _script():
    """``scripts/mindspore-train-diff.py`` as a module: the builders of its cases' network,
    loss and optimizer, which take the package (``tessera`` here) as an argument."""
    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "mindspore-train-diff.py"
    spec = importlib.util.spec_from_file_location("mindspore_train_diff", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT = _script()


def _train(case, arrays, metrics=None, predict=False):
    net, loss = SCRIPT.build(tessera, case, arrays)
    opt = SCRIPT.make_opt(tessera, case, net)
    # A loss Cell of one's own (the script's fifth round) takes the columns positionally:
    # (data, mask, label) when the case has a mask.
    columns = {"data": arrays["x"]}
    if "mask" in arrays:
        columns["mask"] = arrays["mask"]
    columns["label"] = arrays["y"]

    def source():
        return tessera.dataset.NumpySlicesDataset(columns, shuffle=False)

    own = SCRIPT.loss_cell(tessera, case, net, loss)
    if case["wrap"]:
        with_loss = own if own is not None else nn.WithLossCell(net, loss)
        model = tessera.train.Model(nn.TrainOneStepCell(with_loss, opt))
    elif own is not None:
        model = tessera.train.Model(own, optimizer=opt)
    else:
        model = tessera.train.Model(net, loss, opt, metrics=metrics)
    model.train(case["epochs"], source().batch(case["batch"]))
    weights = {n: p.asnumpy() for n, p in net.parameters_and_names()}
    if predict:
        weights["__predict__"] = tessera.train.Model(net).predict(
            tessera.Tensor(arrays["x"])).asnumpy()
    if metrics:
        eb = case.get("eval_batch", case["batch"])
        return model.eval(source().batch(eb, drop_remainder=len(arrays["x"]) % eb != 0))
    return np.array(model.losses), weights


def _check(losses, weights, data, prefix):
    want = data[f"{prefix}_losses"]
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(losses, want, rtol=RTOL, atol=ATOL * scale)
    names = {k[len(prefix) + 7:] for k in data if k.startswith(f"{prefix}_final.")}
    assert names == set(weights)
    for name in names:
        ref = data[f"{prefix}_final.{name}"]
        np.testing.assert_allclose(weights[name], ref, rtol=RTOL,
                                   atol=ATOL * max(float(np.abs(ref).max()), 1e-3),
                                   err_msg=name)


@pytest.fixture
def fresh_context():
    tessera.reset_auto_parallel_context()
    yield
    tessera.reset_auto_parallel_context()


def test_the_fixtures_are_there_and_small():
    assert len(CASES) >= 6, f"{TRAINING} lacks the training fixtures"
    assert sum(p.stat().st_size for p in CASES) < 200_000


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_stand_alone_training_gives_mindspore_s_numbers(path, fresh_context):
    case, data = _load(path)
    # Model.predict of the trained network, when the fixture holds MindSpore's.
    losses, weights = _train(case, data, predict="ms_final.__predict__" in data)
    _check(losses, weights, data, "ms")


@pytest.mark.parametrize("path", [p for p in CASES if "ms_dp_losses" in np.load(p)],
                         ids=lambda p: p.stem)
def test_data_parallel_training_gives_mindspore_s_numbers(path, fresh_context):
    # MindSpore: 2 processes, each its half of every global batch, batch size per device
    # = global / 2; the step's loss is the ranks' mean (reduction "mean") or sum. Tessera: the
    # global batch on 2 devices. With gradients_mean=False MindSpore sums the ranks' gradients
    # of their local means: twice the global mean's (the MSE cases failed here: Tessera's
    # engine did not scale a loss whose rows are summed whole, MSELoss's ReduceMean; nor a
    # loss Cell's sum times 1 / x.shape[0], nor one over -x.shape[0] or times -1 / x.shape[0],
    # the losscell_* fixtures, each taken for a sum).
    case, data = _load(path)
    tessera.set_auto_parallel_context(device_num=2, parallel_mode="data_parallel",
                                      gradients_mean=case["dp"]["gradients_mean"])
    losses, weights = _train(case, data)
    _check(losses, weights, data, "ms_dp")


@pytest.mark.parametrize("path", [p for p in CASES if any(k.startswith("ms_eval.")
                                                           for k in np.load(p))],
                         ids=lambda p: p.stem)
def test_eval_after_training_gives_mindspore_s_metrics(path, fresh_context):
    # MindSpore: Model(net, loss, opt, metrics=...).eval of the training data in batches of
    # eval_batch (the remainder dropped; its Loss metric averages the batches' losses). Tessera cast
    # an Embedding's token ids to float32 in eval (its Gather refused them), refused the float
    # labels of an MSELoss, and computed the "loss" metric as the softmax cross entropy
    # whatever the loss, over samples rather than batches.
    case, data = _load(path)
    want = {k[len("ms_eval."):]: float(v) for k, v in data.items() if k.startswith("ms_eval.")}
    got = _train(case, data, metrics=set(want))
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=RTOL, abs=ATOL), key


def test_the_loss_metric_of_a_loss_cell_of_one_s_own_is_refused():
    # MindSpore averages the Model's own loss Cell; Tessera reported the softmax cross entropy
    # of the outputs for any loss Cell: another loss than the one trained, silently.
    class TwiceCrossEntropy(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

        def construct(self, logits, label):
            return self.ce(logits, label) * 2.0

    x = np.random.default_rng(3).normal(size=(8, 3)).astype(np.float32)
    y = (np.arange(8) % 2).astype(np.int32)
    net = nn.Dense(3, 2, weight_init=tessera.Tensor(np.full((2, 3), 0.1, np.float32)))
    model = tessera.train.Model(net, TwiceCrossEntropy(), nn.SGD(net.trainable_params(), 0.1),
                                metrics={"loss", "acc"})
    data = tessera.dataset.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(4)
    model.train(1, data)
    with pytest.raises(ValueError, match=r"'loss' metric of a TwiceCrossEntropy loss is not "
                                         r"supported"):
        model.eval(data)
    # A loss Cell of one's own on float targets: the loss is named, not the labels' shape.
    t = np.random.default_rng(4).normal(size=(8, 2)).astype(np.float32)
    net = nn.Dense(3, 2, weight_init=tessera.Tensor(np.full((2, 3), 0.1, np.float32)))
    model = tessera.train.Model(net, SCRIPT.squares_loss(tessera, "sum"), nn.SGD(net.trainable_params(), 0.01),
                                metrics={"loss"})
    data = tessera.dataset.NumpySlicesDataset({"data": x, "label": t}, shuffle=False).batch(4)
    model.train(1, data)
    with pytest.raises(ValueError, match=r"'loss' metric of a SquaresLoss loss is not supported"):
        model.eval(data)


def test_an_empty_parameter_group_is_refused_as_mindspore_does():
    # MindSpore's Optimizer refuses it when made ("For 'Optimizer', the argument group `params`
    # must not be empty."); Tessera accepted it.
    params = nn.Dense(3, 2).trainable_params()
    with pytest.raises(ValueError, match=r"group `params` must not be empty .*group 1"):
        nn.Momentum([{"params": params, "weight_decay": 0.1},
                     {"params": [], "weight_decay": 0.0}], 0.1, 0.9)
