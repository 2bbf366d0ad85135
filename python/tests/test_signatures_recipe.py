"""The signatures of the optimizers, learning rates, datasets, checkpoint callbacks and value
Parameters against MindSpore 2.10's, as recorded from MindSpore itself
(tests/fixtures/mindspore/signatures.json, "network"): MindSpore's parameters come first with
the same names, kinds and defaults; Tessera's additions are keyword-only with defaults. Names
MindSpore records only as ``(*args, **kwargs)`` (decorated classes) are checked for their
documented parameters in test_optim.py instead."""

import inspect
import json

import pytest

import tessera
from tessera import dataset, mint, nn, train
from tessera.common import initializer as init_module

from conftest import FIXTURES

RECORDED = json.loads((FIXTURES / "signatures.json").read_text())["network"]

OURS = {
    "mindspore:Parameter": tessera.Parameter,
    "mindspore.nn:SGD": nn.SGD, "mindspore.nn:Momentum": nn.Momentum, "mindspore.nn:Adam": nn.Adam,
    "mindspore.nn:AdamWeightDecay": nn.AdamWeightDecay,
    "mindspore.nn:warmup_lr": nn.warmup_lr, "mindspore.nn:cosine_decay_lr": nn.cosine_decay_lr,
    "mindspore.nn:polynomial_decay_lr": nn.polynomial_decay_lr,
    "mindspore.nn:exponential_decay_lr": nn.exponential_decay_lr,
    "mindspore.nn:piecewise_constant_lr": nn.piecewise_constant_lr,
    "mindspore.nn:CosineDecayLR": nn.CosineDecayLR, "mindspore.nn:WarmUpLR": nn.WarmUpLR,
    "mindspore.nn:PolynomialDecayLR": nn.PolynomialDecayLR,
    "mindspore.nn:ExponentialDecayLR": nn.ExponentialDecayLR,
    "mindspore.mint.optim:AdamW": mint.optim.AdamW,
    "mindspore.dataset:GeneratorDataset": dataset.GeneratorDataset,
    "mindspore.dataset:MnistDataset.shuffle": dataset.MnistDataset.shuffle,
    "mindspore.train:ModelCheckpoint": train.ModelCheckpoint,
    "mindspore.train:CheckpointConfig": train.CheckpointConfig,
    "mindspore.common.initializer:initializer": init_module.initializer,
}


def _params(target):
    params = list(inspect.signature(target).parameters.values())
    return params[1:] if params and params[0].name == "self" else params


def test_every_name_is_recorded():
    assert sorted(set(OURS) - set(RECORDED)) == []


@pytest.mark.parametrize("name", sorted(OURS))
def test_signature_matches_mindspore(name):
    theirs = RECORDED[name]
    if [p["kind"] for p in theirs] == ["VAR_POSITIONAL", "VAR_KEYWORD"]:
        pytest.skip(f"{name} is recorded as (*args, **kwargs) (a decorated class)")
    ours = _params(OURS[name])
    assert len(ours) >= len(theirs), name
    for want, got in zip(theirs, ours):
        assert got.name == want["name"], f"{name}: parameter {got.name} vs {want['name']}"
        assert got.kind.name == want["kind"], f"{name}.{got.name}"
        if "default" not in want:
            assert got.default is inspect.Parameter.empty, f"{name}.{got.name} has a default"
        elif want["default"].startswith("mindspore."):  # a dtype object: mindspore.float32
            assert repr(got.default).lower() == want["default"].split(".")[-1], name
        else:
            assert repr(got.default) == want["default"], f"{name}.{got.name}"
    for extra in ours[len(theirs):]:
        assert extra.kind is inspect.Parameter.KEYWORD_ONLY, f"{name}: extra {extra.name}"
        assert extra.default is not inspect.Parameter.empty, f"{name}: extra {extra.name}"
