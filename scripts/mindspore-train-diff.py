#!/usr/bin/env python3
"""Differential sweep of TRAINING NUMBERS: Tessera's Python package against the real MindSpore
2.10 (CPU wheel), stand-alone and ``data_parallel`` on 2 processes.

Usage (any Python with numpy drives; each side runs in its own venv)::

    python3 scripts/mindspore-train-diff.py [--cases N] [--seed S] [--dp-every K]
        [--ms-python /tmp/ms-venv/bin/python] [--tessera-python /tmp/py-venv-h/bin/python]
        [--msrun /tmp/ms-venv/bin/msrun] [--work DIR] [--only I,J,..] [--no-dp]
        [--rtol R] [--atol A] [--fixture NAME:I] [--two-rounds] [--three-rounds]
        [--four-rounds]

Case *i* (seed ``S + i``) draws a small network — 1-3 ``Dense`` layers (with or without bias,
activations ``relu``/``tanh``/``gelu``/none), an optional ``LayerNorm`` and a ``Dropout(p=0)``
— a loss (``SoftmaxCrossEntropyWithLogits`` sparse or dense, ``CrossEntropyLoss``, ``MSELoss``,
reduction ``mean`` or ``sum``), an optimizer (``SGD``, ``Momentum``, ``Adam``,
``AdamWeightDecay`` with momentum, nesterov, betas, eps and weight decay, with or without
parameter groups), a learning rate (a float, a per-step list from MindSpore's dynamic-lr
functions, or a ``LearningRateSchedule`` Cell), a batch size, steps per epoch and epochs, the
``Model(net, loss, opt)`` or ``Model(TrainOneStepCell(WithLossCell(net, loss), opt))`` form,
and random initial weights and data (numpy, no shuffle). A second round of draws
(``extend_case``, its own generator) adds stand-alone ``ReLU``/``Tanh``/``GELU`` (exact and
tanh)/``Softmax`` Cells, an ``Embedding`` in front (int ids; gather or one-hot), ``Adam``'s
``use_amsgrad``/``use_nesterov`` (Tessera runs each and refuses the pair: counted as
unsupported), global-norm
clipping (MindSpore: ``ops.clip_by_global_norm`` of the reduced gradients in a
``TrainOneStepCell`` subclass; Tessera: the optimizer's ``max_grad_norm``), a loss Cell of
``ops`` (``ReduceSum``/``ReduceMean`` of every squared difference, the sum sometimes divided by
the constant 3), and ``Model.eval`` (``acc``, ``loss``) of the trained network in batches of
another size (the remainder dropped). A third round (``extend_case_sigmoid``, its own generator
again) gives some hidden ``Dense`` layers without an activation ``activation="sigmoid"`` or
``"silu"`` and inserts stand-alone ``nn.Sigmoid``/``nn.SiLU`` Cells (``--two-rounds`` leaves it
out: the cases as drawn before it, those of the fixtures written then). A fourth round
(``extend_case_moreops``, its own generator; ``--three-rounds`` leaves it out) inserts
stand-alone ``nn.LeakyReLU(alpha)``/``nn.ELU``/``nn.Mish`` Cells and Cells applying
``ops.softplus``/``abs``/``square``/``maximum``/``minimum`` (of a constant)/``pow(x, 3)``.
A fifth round (``extend_case_losscell``, its own generator; ``--four-rounds`` leaves it out)
trains some cases as a loss Cell of one's own — ``Model(NetWithLoss(net, loss),
optimizer=opt)`` or ``TrainOneStepCell`` of it, a ``WithLossCell``-like subclass or a loss
computed inline from ``ops`` (squares or the per-sample cross entropy, times a 0/1 mask column
fed as the dataset's middle column, ``construct(self, x, mask, y)``, reduced by
``ReduceMean``, ``ReduceSum``, ``ReduceSum`` over or times the reciprocal of ``x.shape[0]``,
``0.5 · ReduceSum`` or over the mask's sum) — and checks ``Model(net).predict`` of the trained
network on the training inputs (stand-alone).
Both sides build the same network from the same numpy values and train it; per-step losses,
final weights and the metrics are compared with ``--rtol`` (default 2e-4) / ``--atol`` (default 1e-5 times the
tensor's scale).

Every ``--dp-every``-th case (default 3) also runs in ``data_parallel`` on 2 ranks: MindSpore
under ``msrun --worker_num=2`` (each rank reads its half of every global batch, batch size per
device = global / 2, ``gradients_mean`` True or False; the step's loss is the ranks' mean (for
reduction ``mean``) or sum), Tessera with ``set_auto_parallel_context(device_num=2,
parallel_mode="data_parallel", gradients_mean=...)`` and the global batch (difference 8 of
docs/MINDSPORE_DIFFERENCES.md).

Counted apart, not as differences (docs/MINDSPORE_DIFFERENCES.md, differences 8, 16 and 17):
a setting Tessera refuses as unsupported (``tessera_unsupported``: the cross-entropy losses'
``sum`` reduction and dense labels; also a run Tessera stops at an infinite loss where
MindSpore's losses go non-finite), ``data_parallel`` with a ``sum`` loss and
``gradients_mean=True`` (``dp_known_sum_mean``), and ``data_parallel`` with a loss divided by
its mask's sum where the ranks' halves of a batch hold different mask sums
(``dp_known_masked_mean``: each MindSpore rank takes its own masked mean), and
``0.5 · ReduceSum`` over a global batch of 2 under ``gradients_mean=False``
(``dp_known_constant_rows``: Tessera reads the factor as ``1 / x.shape[0]``, a mean). MindSpore 2.10's CPU ``Momentum`` ignores
``use_nesterov``: MindSpore's side runs ``SGD(momentum, nesterov=True)`` for it, the documented
rule.

Not drawn, since one side lacks them: ``Lamb``/``LARS``/``AdaFactor``,
``BatchNorm``, ``parallel.nn.GradAccumulation``
(MindSpore runs it in the semi-auto and auto modes only), ``sink_size`` (MindSpore's CPU runs
sink mode as non-sink).

``--fixture NAME:I`` writes case I's inputs and MindSpore's numbers as
``tests/fixtures/mindspore/generated/training/NAME.npz`` (for
python/tests/test_mindspore_training_diff.py). Exit code 0 when no case differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# ---------------------------------------------------------------------------------------------
# Case generation (driver)
# ---------------------------------------------------------------------------------------------


def gen_case(seed: int, dp: bool, third_round: bool = True, fourth_round: bool = True,
             fifth_round: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    loss = str(rng.choice(["sce_sparse", "sce_dense", "ce", "mse"], p=[0.4, 0.05, 0.2, 0.35]))
    # Tessera's cross-entropy losses take reduction "mean" only: "sum" is drawn rarely, to check
    # that it is refused (not trained wrongly).
    reduction = str(rng.choice(["mean", "sum"], p=[0.5, 0.5] if loss == "mse" else [0.93, 0.07]))
    in_dim = int(rng.integers(2, 9))
    n_layers = int(rng.integers(1, 4))
    layers, dim = [], in_dim
    classes = int(rng.integers(2, 6))
    for li in range(n_layers):
        last = li == n_layers - 1
        out = classes if last else int(rng.integers(2, 9))
        act = None if last else str(rng.choice(["relu", "tanh", "gelu", "none"]))
        layers.append({"kind": "dense", "in": dim, "out": out, "bias": bool(rng.random() < 0.75),
                       "act": None if act == "none" else act})
        # (LayerNorm over 2 features is ill-conditioned: x - mean is ±d/2, and its gradient
        # amplifies f32 rounding past any tolerance.)
        if not last and out >= 3 and rng.random() < 0.25:
            layers.append({"kind": "layernorm", "dim": out})
        if not last and rng.random() < 0.2:
            layers.append({"kind": "dropout"})
        dim = out
    opt = str(rng.choice(["SGD", "Momentum", "Adam", "AdamWeightDecay"]))
    o = {"name": opt}
    if opt == "SGD":
        o["momentum"] = float(rng.choice([0.0, 0.0, 0.5, 0.9]))
        o["nesterov"] = bool(o["momentum"] > 0 and rng.random() < 0.4)
        base = 0.05
    elif opt == "Momentum":
        o["momentum"] = float(rng.choice([0.0, 0.5, 0.9]))
        o["nesterov"] = bool(rng.random() < 0.4)
        base = 0.05
    else:
        o["beta1"] = float(rng.choice([0.9, 0.8, 0.5]))
        o["beta2"] = float(rng.choice([0.999, 0.99, 0.9]))
        o["eps"] = float(rng.choice([1e-8, 1e-6, 1e-3]))
        base = 0.01
    o["weight_decay"] = float(rng.choice([0.0, 0.0, 0.01, 0.1]))
    o["groups"] = bool(o["weight_decay"] > 0 and rng.random() < 0.4)
    batch = int(rng.choice([2, 4, 6, 8]))
    spe = int(rng.integers(1, 4))
    epochs = int(rng.integers(1, 4))
    total = spe * epochs
    lr_kind = str(rng.choice(["float", "float", "list", "dyn", "sched"]))
    lr = {"kind": lr_kind}
    if lr_kind == "float":
        lr["value"] = base
    elif lr_kind == "list":
        lr["values"] = [float(np.float32(base * v)) for v in rng.uniform(0.2, 1.5, total)]
    elif lr_kind == "dyn":
        fn = str(rng.choice(["cosine", "exponential", "warmup", "polynomial", "piecewise"]))
        lr["fn"] = fn
        de = int(rng.integers(1, epochs + 1))
        if fn == "cosine":
            lr["args"] = [base * 0.1, base, total, spe, de]
        elif fn == "exponential":
            lr["args"] = [base, 0.7, total, spe, de, bool(rng.random() < 0.5)]
        elif fn == "warmup":
            lr["args"] = [base, total, spe, de]
        elif fn == "polynomial":
            lr["args"] = [base, base * 0.1, total, spe, de, float(rng.choice([0.5, 1.0, 2.0])),
                          bool(rng.random() < 0.5)]
        else:
            ms_ = sorted(set(int(x) for x in rng.integers(1, total + 1, 2)) | {total})
            lr["args"] = [ms_, [float(base * (0.5 ** k)) for k in range(len(ms_))]]
    else:
        s = str(rng.choice(["cosine", "warmup", "polynomial", "exponential"]))
        lr["sched"] = s
        ds = int(rng.integers(1, total + 2))
        if s == "cosine":
            lr["args"] = [base * 0.1, base, ds]
        elif s == "warmup":
            lr["args"] = [base, ds]
        elif s == "polynomial":
            lr["args"] = [base, base * 0.1, ds, float(rng.choice([0.5, 1.0, 2.0])),
                          bool(rng.random() < 0.5)]
        else:
            lr["args"] = [base, 0.8, ds, bool(rng.random() < 0.5)]
    case = {"seed": seed, "loss": loss, "reduction": reduction, "in_dim": in_dim,
            "classes": classes, "layers": layers, "opt": o, "lr": lr, "batch": batch,
            "steps_per_epoch": spe, "epochs": epochs,
            "wrap": bool(rng.random() < 0.25), "dp": None}
    if dp:
        case["dp"] = {"gradients_mean": bool(rng.random() < 0.5)}
    extend_case(case)
    if third_round:
        extend_case_sigmoid(case)
        if fourth_round:
            extend_case_moreops(case)
            if fifth_round:
                extend_case_losscell(case)
    return case


def extend_case(case: dict) -> None:
    """The second round's draws, from their own generator (so the first round's cases keep
    their seeds' networks): stand-alone activation Cells, an ``Embedding`` in front, ``Adam``'s
    ``use_amsgrad``/``use_nesterov``, global-norm clipping in a ``TrainOneStepCell``, a loss Cell
    of ``ops`` (a ``ReduceSum``/``ReduceMean`` of squares over every row), and ``Model.eval``."""
    rng = np.random.default_rng(case["seed"] + 20_000_000)
    layers = []
    for li, l in enumerate(case["layers"]):
        layers.append(l)
        last_dense = l["kind"] == "dense" and all(x["kind"] != "dense"
                                                  for x in case["layers"][li + 1:])
        if l["kind"] == "dense" and not last_dense and l["act"] is None and rng.random() < 0.4:
            layers.append({"kind": "act", "act": str(rng.choice(
                ["relu", "tanh", "gelu_exact", "gelu_tanh", "softmax"]))})
    case["layers"] = layers
    if rng.random() < 0.2:
        # ids in [0, vocab): the first Dense reads embedding rows of in_dim features.
        case["layers"].insert(0, {"kind": "embedding", "vocab": int(rng.integers(2, 10)),
                                  "dim": case["in_dim"], "one_hot": bool(rng.random() < 0.4)})
    o = case["opt"]
    if o["name"] == "Adam":
        o["amsgrad"] = bool(rng.random() < 0.1)
        o["adam_nesterov"] = bool(rng.random() < 0.1)
    case["clip"] = float(rng.choice([0.05, 0.5, 2.0])) if rng.random() < 0.2 else None
    if case["clip"] is not None:
        case["wrap"] = True  # MindSpore's clipping lives in a TrainOneStepCell of one's own
    if case["loss"] == "mse" and rng.random() < 0.3:
        case["loss"] = "custom"
    case["eval"] = not case["wrap"] and not case["dp"]
    # Model.eval's batches (MindSpore's Loss metric averages the batches' losses): a size that
    # leaves a remainder drops it (Tessera's batch refuses a remainder without
    # drop_remainder=True, difference 16).
    n = case["batch"] * case["steps_per_epoch"]
    case["eval_batch"] = int(rng.integers(1, n + 1))
    # The loss Cell of ops: its sum divided by a constant that counts no rows, sometimes.
    case["custom_div"] = (3.0 if case["loss"] == "custom" and case["reduction"] == "sum"
                          and rng.random() < 0.5 else None)


def extend_case_sigmoid(case: dict) -> None:
    """The third round's draws, from their own generator (the earlier rounds' draws stay as they
    were): a hidden ``Dense`` without an activation gets ``activation="sigmoid"`` or ``"silu"``
    (MindSpore's activation names), and a stand-alone ``nn.Sigmoid`` or ``nn.SiLU`` Cell follows
    some hidden ``Dense`` layers."""
    rng = np.random.default_rng(case["seed"] + 30_000_000)
    dense = [i for i, l in enumerate(case["layers"]) if l["kind"] == "dense"]
    layers = []
    for i, l in enumerate(case["layers"]):
        layers.append(l)
        if l["kind"] != "dense" or i == dense[-1]:
            continue
        if l["act"] is None and rng.random() < 0.3:
            l["act"] = str(rng.choice(["sigmoid", "silu"]))
        if rng.random() < 0.25:
            layers.append({"kind": "act", "act": str(rng.choice(["sigmoid", "silu"]))})
    case["layers"] = layers


def extend_case_moreops(case: dict) -> None:
    """The fourth round's draws, from their own generator again: after some hidden ``Dense``
    layers a stand-alone ``nn.LeakyReLU(alpha)``, ``nn.ELU()``, ``nn.Mish()`` or a Cell applying
    ``ops.softplus``, ``ops.abs``, ``ops.square``, ``ops.maximum(x, c)``/``ops.minimum(x, c)``
    (``c`` a constant tensor of shape ``()``) or ``ops.pow(x, 3)``."""
    rng = np.random.default_rng(case["seed"] + 40_000_000)
    dense = [i for i, l in enumerate(case["layers"]) if l["kind"] == "dense"]
    layers = []
    for i, l in enumerate(case["layers"]):
        layers.append(l)
        if l["kind"] != "dense" or i == dense[-1] or rng.random() >= 0.35:
            continue
        act = str(rng.choice(["leaky_relu", "elu", "mish", "softplus", "abs", "square",
                              "maximum", "minimum", "pow3"]))
        extra = {"kind": "act", "act": act}
        if act == "leaky_relu":
            extra["alpha"] = float(rng.choice([0.01, 0.2, -0.5, 1.5]))
        if act in ("maximum", "minimum"):
            extra["c"] = float(np.round(rng.normal(0, 0.5), 2))
        layers.append(extra)
    case["layers"] = layers


LOSSCELL_REDUCES = ("mean", "sum", "sum_div_rows", "norm", "sum_times_inv_rows", "half_sum")


def extend_case_losscell(case: dict) -> None:
    """The fifth round's draws, from their own generator again: the network and its loss
    trained as a loss Cell of one's own, ``Model(NetWithLoss(net, ...), optimizer=opt)`` (or
    ``Model(TrainOneStepCell(NetWithLoss(...), opt))`` when the case wraps), of one of two
    forms: ``"withloss"``, a ``WithLossCell``-like subclass of ``nn.Cell`` calling the drawn
    loss Cell; ``"inline"``, a loss computed in ``construct`` from ``ops`` — the squared
    differences (float labels) or the per-sample cross entropy ``-Σ log_softmax · one_hot``
    (class labels), times a 0/1 mask column when ``mask`` is drawn (the dataset's third column,
    fed positionally: ``construct(self, x, mask, y)``; the mask is one per sample or, for float
    labels, one per element), reduced by ``ReduceMean`` (``"mean"``), ``ReduceSum`` (``"sum"``),
    ``ReduceSum`` over ``x.shape[0]`` (``"sum_div_rows"``: MindSpore's ranks divide by their
    own rows), ``ReduceSum`` times ``1 / x.shape[0]`` (``"sum_times_inv_rows"``), ``ReduceSum``
    times 0.5 (``"half_sum"``, a sum) or by the mask's ``ReduceSum`` (``"norm"``, a masked
    mean); the two over ``x.shape[0]`` sometimes ``negated``, as a negative log-likelihood is
    written (``Σ(-v) / -x.shape[0]``, ``Σ(-v) · (-1 / x.shape[0])``). Also
    ``Model(net).predict`` of the trained network on the training inputs (stand-alone)."""
    rng = np.random.default_rng(case["seed"] + 50_000_000)
    case["predict"] = bool(rng.random() < 0.3)
    if rng.random() >= 0.6:
        case["losscell"] = None
        return
    inline = rng.random() < 0.7 and case["loss"] in ("sce_sparse", "ce", "mse", "custom")
    lc = {"form": "inline" if inline else "withloss"}
    if inline:
        lc["reduce"] = str(rng.choice(LOSSCELL_REDUCES))
        mask = rng.random() < (0.9 if lc["reduce"] == "norm" else 0.6)
        lc["mask"] = (None if not mask else "row" if case["loss"] not in ("mse", "custom")
                      or rng.random() < 0.5 else "full")
        if lc["reduce"] == "norm" and lc["mask"] is None:
            lc["reduce"] = "mean"
    if lc.get("reduce") in ("sum_div_rows", "sum_times_inv_rows"):
        # The negative log-likelihood's way, from its own generator (the draws above stay as
        # they were): the negated terms' sum over -x.shape[0] or times -1 / x.shape[0].
        lc["negated"] = bool(np.random.default_rng(case["seed"] + 70_000_000).random() < 0.3)
    case["losscell"] = lc
    # MindSpore needs eval_network for the metrics of a loss Cell of one's own.
    case["eval"] = False


def losscell_reduction(case: dict) -> str:
    """``"sum"`` when the case's loss adds up its rows (the ranks' losses add up in
    ``data_parallel``), else ``"mean"``."""
    lc = case.get("losscell")
    if lc and lc["form"] == "inline":
        return "sum" if lc["reduce"] in ("sum", "half_sum") else "mean"
    return case["reduction"]


def gen_arrays(case: dict) -> dict:
    rng = np.random.default_rng(case["seed"] + 10_000_000)
    arrays = {}
    for i, l in enumerate(case["layers"]):
        if l["kind"] == "dense":
            arrays[f"l{i}.weight"] = rng.normal(0, 1 / np.sqrt(l["in"]), (l["out"], l["in"])
                                                ).astype(np.float32)
            if l["bias"]:
                arrays[f"l{i}.bias"] = rng.normal(0, 0.1, (l["out"],)).astype(np.float32)
    n = case["batch"] * case["steps_per_epoch"]
    arrays["x"] = rng.normal(0, 1, (n, case["in_dim"])).astype(np.float32)
    first = case["layers"][0]
    if first["kind"] == "embedding":
        arrays["l0.embedding_table"] = rng.normal(0, 0.5, (first["vocab"], first["dim"])
                                                  ).astype(np.float32)
        arrays["x"] = rng.integers(0, first["vocab"], n).astype(np.int32)
    c = case["classes"]
    if case["loss"] in ("sce_sparse", "ce"):
        arrays["y"] = rng.integers(0, c, n).astype(np.int32)
    elif case["loss"] == "sce_dense":
        p = rng.random((n, c)).astype(np.float32)
        arrays["y"] = (p / p.sum(1, keepdims=True)).astype(np.float32)
    else:
        arrays["y"] = rng.normal(0, 1, (n, c)).astype(np.float32)
    lc = case.get("losscell")
    if lc and lc.get("mask"):
        mrng = np.random.default_rng(case["seed"] + 60_000_000)
        # One per sample: [n] for the per-sample cross entropy, [n, 1] for the squares.
        shape = ((n,) if case["loss"] not in ("mse", "custom") else (n, 1)) \
            if lc["mask"] == "row" else (n, c)
        mask = (mrng.random(shape) < 0.6).astype(np.float32)
        # Every rank's half of every batch keeps a sample (a masked mean of none is NaN).
        mask[::max(1, case["batch"] // 2)] = 1.0
        arrays["mask"] = mask
    return arrays


# ---------------------------------------------------------------------------------------------
# Running one case on a side (`m` is the `mindspore` or the `tessera` module)
# ---------------------------------------------------------------------------------------------


def build(m, case, arrays):
    nn = m.nn

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.names = []
            for i, l in enumerate(case["layers"]):
                name = f"l{i}"
                if l["kind"] == "dense":
                    w = m.Tensor(arrays[f"{name}.weight"])
                    b = m.Tensor(arrays[f"{name}.bias"]) if l["bias"] else None
                    kw = {"weight_init": w, "has_bias": l["bias"], "activation": l["act"]}
                    if b is not None:
                        kw["bias_init"] = b
                    cell = nn.Dense(l["in"], l["out"], **kw)
                elif l["kind"] == "layernorm":
                    cell = nn.LayerNorm((l["dim"],))
                elif l["kind"] == "embedding":
                    cell = nn.Embedding(l["vocab"], l["dim"], use_one_hot=l["one_hot"],
                                        embedding_table=m.Tensor(
                                            arrays[f"{name}.embedding_table"]))
                elif l["kind"] == "act" and l["act"] in OP_ACTS:
                    cell = op_act(m, l)
                elif l["kind"] == "act":
                    cell = {"relu": nn.ReLU, "tanh": nn.Tanh, "softmax": nn.Softmax,
                            "sigmoid": nn.Sigmoid, "silu": nn.SiLU,
                            "gelu_exact": lambda: nn.GELU(approximate=False),
                            "gelu_tanh": lambda: nn.GELU(approximate=True)}[l["act"]]()
                else:
                    cell = nn.Dropout(p=0.0)
                setattr(self, name, cell)
                self.names.append(name)

        def construct(self, x):
            for name in self.names:
                x = getattr(self, name)(x)
            return x

    net = Net()
    red = case["reduction"]
    if case["loss"] == "sce_sparse":
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction=red)
    elif case["loss"] == "sce_dense":
        loss = nn.SoftmaxCrossEntropyWithLogits(sparse=False, reduction=red)
    elif case["loss"] == "ce":
        loss = nn.CrossEntropyLoss(reduction=red)
    elif case["loss"] == "custom":
        loss = squares_loss(m, red, case.get("custom_div"))
    else:
        loss = nn.MSELoss(reduction=red)
    return net, loss


OP_ACTS = ("leaky_relu", "elu", "mish", "softplus", "abs", "square", "maximum", "minimum",
           "pow3")


def op_act(m, l):
    """The fourth round's activation ``l`` (see ``extend_case_moreops``) as a Cell of ``m``."""
    nn, ops = m.nn, m.ops
    if l["act"] == "leaky_relu":
        return nn.LeakyReLU(l["alpha"])
    if l["act"] == "elu":
        return nn.ELU()
    if l["act"] == "mish":
        return nn.Mish()
    kind = l["act"]
    # MindSpore's constant is a Tensor attribute; Tessera's a Python number (its ops take traced
    # tensors, Parameters and Python scalars).
    c = m.Tensor(np.float32(l.get("c", 0.0))) if m.__name__ == "mindspore" else l.get("c", 0.0)

    class OpAct(nn.Cell):
        def __init__(self):
            super().__init__()
            self.kind, self.c = kind, c

        def construct(self, x):
            if self.kind == "softplus":
                return ops.softplus(x)
            if self.kind == "abs":
                return ops.abs(x)
            if self.kind == "square":
                return ops.square(x)
            if self.kind == "maximum":
                return ops.maximum(x, self.c)
            if self.kind == "minimum":
                return ops.minimum(x, self.c)
            return ops.pow(x, 3)

    return OpAct()


def squares_loss(m, red, div=None):
    """A loss Cell of ``ops``: the ``sum`` or ``mean`` of every squared difference — a sum over
    the rows, which ``data_parallel`` leaves split over the ranks — the sum divided by ``div``
    when given (a constant: MindSpore's ranks divide their own sums by it)."""

    class SquaresLoss(m.nn.Cell):
        def __init__(self):
            super().__init__()
            self.reduce = m.ops.ReduceSum() if red == "sum" else m.ops.ReduceMean()
            self.div = div

        def construct(self, logits, label):
            d = logits - label
            if self.div is None:
                return self.reduce(d * d)
            return self.reduce(d * d) / self.div

    return SquaresLoss()


def loss_cell(m, case, net, loss):
    """The fifth round's loss Cell of one's own around ``net`` (see ``extend_case_losscell``),
    or ``None`` when the case has none."""
    lc = case.get("losscell")
    if not lc:
        return None
    nn, ops = m.nn, m.ops
    if lc["form"] == "withloss":
        class NetWithLoss(nn.Cell):
            def __init__(self, backbone, loss_fn):
                super().__init__(auto_prefix=False)
                self.backbone, self.loss_fn = backbone, loss_fn

            def construct(self, x, y):
                return self.loss_fn(self.backbone(x), y)

        return NetWithLoss(net, loss)
    # (Settings as attributes: MindSpore's graph mode reads a Cell's, not a closure's.)
    settings = {"classes": case["classes"], "kind": lc["reduce"],
                "squares": case["loss"] in ("mse", "custom"),
                "row_mask": lc["mask"] == "row", "negated": bool(lc.get("negated"))}

    class InlineLoss(nn.Cell):
        def __init__(self, backbone):
            super().__init__(auto_prefix=False)
            self.backbone = backbone
            self.sum = ops.ReduceSum()
            self.mean = ops.ReduceMean()
            self.rows = ops.ReduceSum()
            self.classes, self.kind = settings["classes"], settings["kind"]
            self.squares, self.row_mask = settings["squares"], settings["row_mask"]
            self.negated = settings["negated"]

        def per_sample(self, x, y):
            out = self.backbone(x)
            if self.squares:
                d = out - y
                return d * d
            return -self.rows(ops.log_softmax(out, -1) * ops.one_hot(y, self.classes, 1.0, 0.0),
                              1)

        def reduce(self, v, x, mask):
            if self.kind == "mean":
                return self.mean(v)
            if self.kind == "sum":
                return self.sum(v)
            if self.kind == "sum_div_rows" and self.negated:
                return self.sum(-v) / (-x.shape[0])
            if self.kind == "sum_div_rows":
                return self.sum(v) / x.shape[0]
            if self.kind == "sum_times_inv_rows" and self.negated:
                return self.sum(-v) * (-1.0 / x.shape[0])
            if self.kind == "sum_times_inv_rows":
                return self.sum(v) * (1.0 / x.shape[0])
            if self.kind == "half_sum":
                return self.sum(v) * 0.5
            if self.squares and self.row_mask:
                return self.sum(v) / (self.sum(mask) * self.classes)
            return self.sum(v) / self.sum(mask)

    if lc["mask"]:
        class MaskedLoss(InlineLoss):
            def construct(self, x, mask, y):
                return self.reduce(self.per_sample(x, y) * mask, x, mask)

        return MaskedLoss(net)

    class PlainLoss(InlineLoss):
        def construct(self, x, y):
            return self.reduce(self.per_sample(x, y), x, None)

    return PlainLoss(net)


def clip_step(m, net_with_loss, opt, clip):
    """MindSpore's ``TrainOneStepCell`` with ``ops.clip_by_global_norm`` of the reduced
    gradients (the pattern of its tutorials); Tessera's own is the optimizer's
    ``max_grad_norm``."""

    class ClipStep(m.nn.TrainOneStepCell):
        def construct(self, *inputs):
            loss = self.network(*inputs)
            grads = self.grad_no_sens(self.network, self.weights)(*inputs)
            grads = self.grad_reducer(grads)
            grads = m.ops.clip_by_global_norm(grads, clip)
            return m.ops.depend(loss, self.optimizer(grads))

    return ClipStep(net_with_loss, opt)


def make_lr(m, case):
    nn, lr = m.nn, case["lr"]
    if lr["kind"] == "float":
        return lr["value"]
    if lr["kind"] == "list":
        return list(lr["values"])
    if lr["kind"] == "dyn":
        fn = {"cosine": nn.cosine_decay_lr, "exponential": nn.exponential_decay_lr,
              "warmup": nn.warmup_lr, "polynomial": nn.polynomial_decay_lr,
              "piecewise": nn.piecewise_constant_lr}[lr["fn"]]
        return list(fn(*lr["args"]))
    cls = {"cosine": nn.CosineDecayLR, "warmup": nn.WarmUpLR, "polynomial": nn.PolynomialDecayLR,
           "exponential": nn.ExponentialDecayLR}[lr["sched"]]
    return cls(*lr["args"])


def make_opt(m, case, net):
    nn, o = m.nn, case["opt"]
    lr = make_lr(m, case)
    params = net.trainable_params()
    wd = o["weight_decay"]
    if o["groups"]:
        decay = [p for p in params if p.name.endswith("weight")]
        rest = [p for p in params if not p.name.endswith("weight")]
        # (MindSpore refuses a group whose params are empty: such a group is left out.)
        params = [g for g in ({"params": decay, "weight_decay": wd},
                              {"params": rest, "weight_decay": 0.0}) if g["params"]]
        params.append({"order_params": net.trainable_params()})
    if o["name"] == "Momentum" and o["nesterov"] and o["momentum"] > 0 \
            and m.__name__ == "mindspore":
        # MindSpore 2.10's CPU ApplyMomentum ignores use_nesterov (docs/
        # MINDSPORE_DIFFERENCES.md, difference 16): its SGD runs the documented Nesterov rule.
        return nn.SGD(params, learning_rate=lr, momentum=o["momentum"], weight_decay=wd,
                      nesterov=True)
    kw = {}
    if case.get("clip") is not None and m.__name__ != "mindspore":
        kw["max_grad_norm"] = case["clip"]
    if o["name"] == "SGD":
        return nn.SGD(params, learning_rate=lr, momentum=o["momentum"], weight_decay=wd,
                      nesterov=o["nesterov"], **kw)
    if o["name"] == "Momentum":
        return nn.Momentum(params, learning_rate=lr, momentum=o["momentum"], weight_decay=wd,
                           use_nesterov=o["nesterov"], **kw)
    if o["name"] == "Adam":
        return nn.Adam(params, learning_rate=lr, beta1=o["beta1"], beta2=o["beta2"],
                       eps=o["eps"], weight_decay=wd, use_amsgrad=o.get("amsgrad", False),
                       use_nesterov=o.get("adam_nesterov", False), **kw)
    return nn.AdamWeightDecay(params, learning_rate=lr, beta1=o["beta1"], beta2=o["beta2"],
                              eps=o["eps"], weight_decay=wd, **kw)


def run_one(m, side, case, arrays, rank=None, nranks=1, predict=True):
    """Trains the case; returns (losses, {name: array}) — on rank ``rank`` of ``nranks``
    (MindSpore's data_parallel) the rank's rows of every global batch."""
    net, loss = build(m, case, arrays)
    opt = make_opt(m, case, net)
    x, y = arrays["x"], arrays["y"]
    # The dataset's columns, fed positionally to a loss Cell of one's own (data, mask, label).
    names = ["data", "mask", "label"] if "mask" in arrays else ["data", "label"]
    cols = [arrays[n if n != "data" else "x"] if n != "label" else y for n in names]
    batch = case["batch"]
    if rank is not None:
        per = batch // nranks
        idx = np.concatenate([np.arange(k * batch + rank * per, k * batch + (rank + 1) * per)
                              for k in range(case["steps_per_epoch"])])
        x, y, batch = x[idx], y[idx], per
        cols = [c[idx] for c in cols]
    if side == "ms":
        # MindSpore's NumpySlicesDataset fails on 0-d int rows under numpy 2 ("Unable to avoid
        # copy"): a random-accessible source of arrays gives the same batches.
        class Source:
            def __getitem__(self, k):
                return tuple(np.array(c[k]) for c in cols)

            def __len__(self):
                return len(x)
        def source():
            return m.dataset.GeneratorDataset(Source(), names, shuffle=False)
    else:
        def source():
            return m.dataset.NumpySlicesDataset(dict(zip(names, cols)), shuffle=False)
    ds = source().batch(batch)
    losses = []
    Model = m.train.Model
    metrics = None
    if case.get("eval") and rank is None:
        metrics = {"loss"} if case["loss"] in ("mse", "custom") else {"acc", "loss"}
    own = loss_cell(m, case, net, loss)
    if case["wrap"]:
        with_loss = own if own is not None else m.nn.WithLossCell(net, loss)
        if case.get("clip") is not None and side == "ms":
            step = clip_step(m, with_loss, opt, case["clip"])
        else:
            step = m.nn.TrainOneStepCell(with_loss, opt)
        model = Model(step)
    elif own is not None:
        model = Model(own, optimizer=opt)
    else:
        model = Model(net, loss, opt, metrics=metrics)
    if side == "ms":
        class Rec(m.train.Callback):
            def on_train_step_end(self, run_context):
                out = run_context.original_args().net_outputs
                if isinstance(out, (tuple, list)):
                    out = out[0]
                losses.append(float(out.asnumpy()))
        model.train(case["epochs"], ds, callbacks=[Rec()], dataset_sink_mode=False)
    else:
        model.train(case["epochs"], ds)
        losses = [float(v) for v in model.losses]
    weights = {}
    for name, p in net.parameters_and_names():
        weights[name] = np.asarray(p.asnumpy(), dtype=np.float32)
    if case.get("predict") and predict:
        # Model.predict of the trained network (the one without its loss) on the inputs.
        try:
            weights["__predict__"] = np.asarray(
                Model(net).predict(m.Tensor(arrays["x"])).asnumpy(), dtype=np.float32)
        except Exception as e:  # noqa: BLE001 - recorded per case
            weights["__predict__"] = f"{type(e).__name__}: {e}"[:500]
    if metrics:
        # Recorded apart: an eval failure does not hide the training numbers.
        try:
            kw = {"dataset_sink_mode": False} if side == "ms" else {}
            eb = case.get("eval_batch", batch)
            eds = source().batch(eb, drop_remainder=len(x) % eb != 0)
            weights["__eval__"] = {k: float(v) for k, v in model.eval(eds, **kw).items()}
        except Exception as e:  # noqa: BLE001 - recorded per case
            weights["__eval__"] = f"{type(e).__name__}: {e}"[:500]
    return losses, weights


def side_main(side, cases_file, out_dir):
    """Runs every case of ``cases_file`` on one side, one result file per case."""
    os.environ.setdefault("GLOG_v", "3")
    import warnings
    if side.startswith("ms"):
        import mindspore as m
        import mindspore.dataset  # noqa: F401
        m.set_context(mode=m.GRAPH_MODE, device_target="CPU")
    else:
        import tessera as m
    cases = json.load(open(cases_file))
    rank = None
    if side == "ms-dp":
        from mindspore.communication import get_rank, init
        init()
        rank = get_rank()
    for c in cases:
        i = c["index"]
        arrays = dict(np.load(os.path.join(out_dir, f"case{i}_in.npz")))
        tag = f"{side}{'' if rank is None else rank}"
        res = {"losses": None, "error": None, "warnings": []}
        try:
            with warnings.catch_warnings(record=True) as ws:
                warnings.simplefilter("always")
                if side == "ms-dp":
                    m.reset_auto_parallel_context()
                    m.set_auto_parallel_context(parallel_mode="data_parallel",
                                                gradients_mean=c["dp"]["gradients_mean"])
                    losses, w = run_one(m, "ms", c, arrays, rank=rank, nranks=2,
                                        predict=False)
                elif side == "tessera-dp":
                    m.reset_auto_parallel_context()
                    m.set_auto_parallel_context(device_num=2, parallel_mode="data_parallel",
                                                gradients_mean=c["dp"]["gradients_mean"])
                    losses, w = run_one(m, "tessera", c, arrays, predict=False)
                else:
                    if side == "tessera":
                        m.reset_auto_parallel_context()
                    losses, w = run_one(m, side, c, arrays)
            res["warnings"] = sorted({str(x.message)[:300] for x in ws
                                      if issubclass(x.category, UserWarning)})
            res["losses"] = losses
            res["eval"] = w.pop("__eval__", None)
            if isinstance(w.get("__predict__"), str):
                res["predict_error"] = w.pop("__predict__")
            np.savez(os.path.join(out_dir, f"case{i}_{tag}.npz"), **w)
        except Exception as e:  # noqa: BLE001 - recorded per case
            res["error"] = f"{type(e).__name__}: {e}"[:2000]
            res["trace"] = traceback.format_exc()[-3000:]
        with open(os.path.join(out_dir, f"case{i}_{tag}.json"), "w") as f:
            json.dump(res, f)


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def load(work, i, tag):
    p = os.path.join(work, f"case{i}_{tag}.json")
    if not os.path.exists(p):
        return None, None
    r = json.load(open(p))
    w = os.path.join(work, f"case{i}_{tag}.npz")
    return r, (dict(np.load(w)) if os.path.exists(w) else None)


def compare(ref, got, rtol, atol):
    """A list of disagreements between two sides' (result, weights)."""
    (r1, w1), (r2, w2) = ref, got
    out = []
    if r1 is None or r2 is None:
        return ["a side wrote no result"]
    if r1["error"] or r2["error"]:
        if not r1["error"] and ("supported" in r2["error"] or "must be False" in r2["error"]):
            return []  # Tessera's documented limitation, counted apart
        if not r1["error"] and "invalid loss" in r2["error"] \
                and not np.isfinite(r1["losses"]).all():
            return []  # diverged: MindSpore trains on into NaN, Tessera stops (difference 16)
        if bool(r1["error"]) != bool(r2["error"]):
            out.append(f"refusal: ms={r1['error']!r} tessera={r2['error']!r}")
        return out
    l1, l2 = np.array(r1["losses"]), np.array(r2["losses"])
    if l1.shape != l2.shape:
        return [f"loss count ms={len(l1)} tessera={len(l2)}"]
    scale = max(1.0, float(np.abs(l1).max()))
    bad = np.abs(l1 - l2) > rtol * np.abs(l1) + atol * scale
    if bad.any():
        k = int(np.argmax(bad))
        out.append(f"loss step {k}: ms={l1[k]!r} tessera={l2[k]!r}")
    if set(w1) != set(w2):
        out.append(f"names ms={sorted(w1)} tessera={sorted(w2)}")
        return out
    e1, e2 = r1.get("eval"), r2.get("eval")
    if e1 is not None or e2 is not None:
        if isinstance(e1, dict) and isinstance(e2, dict):
            for k in sorted(e1):
                if k not in e2 or abs(e1[k] - e2[k]) > rtol * abs(e1[k]) + atol * 10:
                    out.append(f"eval {k}: ms={e1[k]!r} tessera={e2.get(k)!r}")
        elif isinstance(e1, dict) and "supported" not in str(e2):
            out.append(f"eval: ms={e1!r} tessera={e2!r}")
        elif not isinstance(e1, dict) and isinstance(e2, dict):
            out.append(f"eval: ms={e1!r} tessera={e2!r}")
    p1, p2 = r1.get("predict_error"), r2.get("predict_error")
    if p1 or p2:
        out.append(f"predict: ms={p1!r} tessera={p2!r}")
    for n in sorted(w1):
        a, b = w1[n], w2[n]
        if a.shape != b.shape:
            out.append(f"{n}: shape {a.shape} vs {b.shape}")
            continue
        s = max(float(np.abs(a).max()), 1e-3)
        d = np.abs(a - b)
        if (d > rtol * np.abs(a) + atol * s).any():
            out.append(f"{n}: max |diff| {d.max():.3g} (scale {s:.3g})")
    return out


def max_rel(ref, got):
    (r1, w1), (r2, w2) = ref, got
    if not r1 or not r2 or r1["error"] or r2["error"] or w1 is None or w2 is None:
        return None
    e = 0.0
    for n in w1:
        if n in w2 and w1[n].shape == w2[n].shape:
            e = max(e, float(np.abs(w1[n] - w2[n]).max() / max(np.abs(w1[n]).max(), 1e-3)))
    return e


def dp_reference(work, i, case):
    """MindSpore's data_parallel result: the ranks' losses combined, rank 0's weights (the
    ranks' weights are checked equal)."""
    r0, w0 = load(work, i, "ms-dp0")
    r1, w1 = load(work, i, "ms-dp1")
    if r0 is None or r1 is None:
        return None, None
    if r0["error"] or r1["error"]:
        return {"error": r0["error"] or r1["error"], "losses": None}, None
    l = np.array(r0["losses"]) + np.array(r1["losses"])
    if losscell_reduction(case) == "mean":
        l = l / 2
    for n in w0:
        if not np.array_equal(w0[n], w1[n], equal_nan=True):
            print(f"  case {i}: MindSpore's dp ranks disagree on {n}")
    return {"error": None, "losses": l.tolist()}, w0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--side")
    ap.add_argument("args", nargs="*")
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dp-every", type=int, default=3)
    ap.add_argument("--no-dp", action="store_true")
    ap.add_argument("--ms-python", default="/tmp/ms-venv/bin/python")
    ap.add_argument("--tessera-python", default="/tmp/py-venv-h/bin/python")
    ap.add_argument("--msrun", default="/tmp/ms-venv/bin/msrun")
    ap.add_argument("--work", default="/tmp/mstraindiff")
    ap.add_argument("--only")
    ap.add_argument("--rtol", type=float, default=2e-4)
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--fixture", action="append", default=[])
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--two-rounds", action="store_true")
    ap.add_argument("--three-rounds", action="store_true")
    ap.add_argument("--four-rounds", action="store_true")
    a = ap.parse_args()
    if a.side:
        side_main(a.side, *a.args)
        return 0
    work = os.path.abspath(a.work)
    if os.path.isdir(work) and os.path.exists(os.path.join(work, ".mstraindiff")):
        shutil.rmtree(work)
    os.makedirs(work, exist_ok=True)
    open(os.path.join(work, ".mstraindiff"), "w").close()
    only = [int(x) for x in a.only.split(",")] if a.only else range(a.cases)
    cases = []
    for i in only:
        dp = not a.no_dp and a.dp_every > 0 and i % a.dp_every == 0
        c = gen_case(a.seed + i, dp, third_round=not a.two_rounds,
                     fourth_round=not a.three_rounds,
                     fifth_round=not (a.three_rounds or a.four_rounds))
        c["index"] = i
        if dp and c["batch"] % 2:
            c["batch"] += 1
        cases.append(c)
        np.savez(os.path.join(work, f"case{i}_in.npz"), **gen_arrays(c))
    dp_cases = [c for c in cases if c["dp"]]
    json.dump(cases, open(os.path.join(work, "cases.json"), "w"), indent=1)
    json.dump(dp_cases, open(os.path.join(work, "dp_cases.json"), "w"), indent=1)
    me = os.path.abspath(__file__)
    env = dict(os.environ, GLOG_v="3", PYTHONWARNINGS="ignore::DeprecationWarning")
    cf, dcf = os.path.join(work, "cases.json"), os.path.join(work, "dp_cases.json")
    jobs = [([a.ms_python, me, "--side", "ms", cf, work], "ms.log"),
            ([a.tessera_python, me, "--side", "tessera", cf, work], "tessera.log")]
    if dp_cases:
        jobs.append(([a.tessera_python, me, "--side", "tessera-dp", dcf, work], "tessera-dp.log"))
        jobs.append(([a.msrun, "--worker_num=2", "--local_worker_num=2",
                      f"--master_port={free_port()}", f"--log_dir={work}/msrun_log", "--join=True",
                      me, "--side", "ms-dp", dcf, work], "ms-dp.log"))
    # msrun starts its workers with the `python` on PATH: the MindSpore venv's.
    ms_env = dict(env, PATH=os.path.dirname(a.ms_python) + os.pathsep + env.get("PATH", ""))
    for cmd, log in jobs:
        with open(os.path.join(work, log), "w") as f:
            subprocess.run(cmd, env=ms_env if cmd[0] == a.msrun else env, stdout=f,
                           stderr=subprocess.STDOUT, cwd=work)
    counts = {"cases": 0, "agree": 0, "differ": 0, "both_refuse": 0, "tessera_unsupported": 0,
              "dp_known_sum_mean": 0, "dp_known_masked_mean": 0,
              "dp_known_constant_rows": 0, "dp_cases": 0, "dp_agree": 0,
              "dp_differ": 0}
    worst = 0.0
    for c in cases:
        i = c["index"]
        counts["cases"] += 1
        ms, te = load(work, i, "ms"), load(work, i, "tessera")
        diffs = compare(ms, te, a.rtol, a.atol)
        e = max_rel(ms, te)
        worst = max(worst, e or 0.0)
        if ms[0] and te[0] and ms[0]["error"] and te[0]["error"]:
            counts["both_refuse"] += 1
        elif ms[0] and te[0] and te[0]["error"] and not ms[0]["error"]:
            counts["tessera_unsupported"] += 1
            print(f"  case {i} unsupported by Tessera: {te[0]['error'][:160]}")
        if diffs:
            counts["differ"] += 1
            print(f"case {i} (seed {c['seed']}) DIFFERS: {summary(c)}")
            for d in diffs:
                print("   ", d)
            if a.verbose:
                for r in (ms[0], te[0]):
                    if r and r.get("trace"):
                        print(r["trace"])
        else:
            counts["agree"] += 1
            if a.verbose:
                print(f"case {i} agrees (max rel {e}) {summary(c)}")
        for side, r in (("ms", ms[0]), ("tessera", te[0])):
            if r and r["warnings"]:
                print(f"  case {i} {side} warns: {r['warnings']}")
        if c["dp"] and losscell_reduction(c) == "sum" and c["dp"]["gradients_mean"]:
            # Known departure (docs/MINDSPORE_DIFFERENCES.md, difference 8): MindSpore averages
            # the ranks' gradients of their local sums (half the global sum's on 2 ranks);
            # Tessera's gradient is the global loss's.
            counts["dp_known_sum_mean"] += 1
        elif c["dp"] and not c["dp"]["gradients_mean"] and (c.get("losscell") or {}).get(
                "reduce") == "half_sum" and c["batch"] == 2:
            # Known ambiguity (difference 16): 0.5 · Σ over a global batch of 2 rows reads as
            # Σ · (1 / x.shape[0]), a mean, which Tessera scales as MindSpore's ranks' means.
            counts["dp_known_constant_rows"] += 1
        elif c["dp"] and unequal_mask_counts(c, np.load(os.path.join(work, f"case{i}_in.npz"))):
            # Known departure (difference 17): a masked mean (Σ loss·mask / Σ mask) is each
            # MindSpore rank's own; Tessera's is the global batch's, which differs when the
            # ranks' halves hold different mask counts.
            counts["dp_known_masked_mean"] += 1
        elif c["dp"]:
            counts["dp_cases"] += 1
            ref = dp_reference(work, i, c)
            got = load(work, i, "tessera-dp")
            d2 = compare(ref, got, a.rtol * 5, a.atol * 5)
            if d2:
                counts["dp_differ"] += 1
                print(f"case {i} (seed {c['seed']}) DATA_PARALLEL DIFFERS "
                      f"(gradients_mean={c['dp']['gradients_mean']}): {summary(c)}")
                for d in d2:
                    print("   ", d)
            else:
                counts["dp_agree"] += 1
    for spec in a.fixture:
        name, i = spec.split(":")
        write_fixture(work, name, [c for c in cases if c["index"] == int(i)][0])
    print(json.dumps(counts), f"worst weight rel diff {worst:.3g}")
    return 1 if counts["differ"] or counts["dp_differ"] else 0


def unequal_mask_counts(case, arrays, nranks=2):
    """Whether the case divides by its mask's sum (``"norm"``) and some global batch gives the
    ranks' shares different mask sums."""
    lc = case.get("losscell")
    if not lc or lc["form"] != "inline" or lc["reduce"] != "norm":
        return False
    mask = np.asarray(arrays["mask"], np.float64).reshape(len(arrays["mask"]), -1).sum(1)
    per = case["batch"] // nranks
    for k in range(case["steps_per_epoch"]):
        shares = [mask[k * case["batch"] + r * per:k * case["batch"] + (r + 1) * per].sum()
                  for r in range(nranks)]
        if len(set(shares)) > 1:
            return True
    return False


def summary(c):
    o = dict(c["opt"])
    layers = [(x["kind"], x.get("out"), x.get("bias"), x.get("act")) for x in c["layers"]]
    return (f"layers={layers} loss={c['loss']}/{c['reduction']} opt={o} lr={c['lr']} batch={c['batch']}"
            f" spe={c['steps_per_epoch']} epochs={c['epochs']} wrap={c['wrap']}"
            f" clip={c.get('clip')} eval={c.get('eval')}/{c.get('eval_batch')}"
            f" div={c.get('custom_div')} losscell={c.get('losscell')}"
            f" predict={c.get('predict')}")


def write_fixture(work, name, case):
    """Case inputs and MindSpore's numbers as one small .npz for python/tests."""
    i = case["index"]
    out = dict(np.load(os.path.join(work, f"case{i}_in.npz")))
    r, w = load(work, i, "ms")
    out["case_json"] = np.array(json.dumps({k: v for k, v in case.items() if k != "index"}))
    out["ms_losses"] = np.array(r["losses"], dtype=np.float64)
    if isinstance(r.get("eval"), dict):
        for k, v in r["eval"].items():
            out[f"ms_eval.{k}"] = np.array(v, dtype=np.float64)
    for n, v in w.items():
        out[f"ms_final.{n}"] = v
    if case["dp"]:
        rd, wd = dp_reference(work, i, case)
        out["ms_dp_losses"] = np.array(rd["losses"], dtype=np.float64)
        for n, v in wd.items():
            out[f"ms_dp_final.{n}"] = v
    d = os.path.join(ROOT, "tests/fixtures/mindspore/generated/training")
    os.makedirs(d, exist_ok=True)
    np.savez_compressed(os.path.join(d, f"{name}.npz"), **out)
    print("wrote", os.path.join(d, f"{name}.npz"))


if __name__ == "__main__":
    sys.exit(main())
