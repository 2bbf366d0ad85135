"""Every name of MindSpore 2.10's network API that issue 34 lists (nn, ops, dataset,
communication, AutoParallel and its switches, parallel.nn, train; tests/fixtures/mindspore/
signatures.json, "network", recorded from MindSpore itself by scripts/mindspore-signatures.py)
exists under ``tessera`` at the same path, with MindSpore's signature: MindSpore's parameters
come first with the same names, kinds and defaults; Tessera's additions are keyword-only with
defaults. Names MindSpore records only as ``(*args, **kwargs)`` (decorated classes) are checked
to exist (their documented parameters are tested where they are used, e.g. test_optim.py)."""

import importlib
import inspect
import json

import pytest

from conftest import FIXTURES

RECORDED = json.loads((FIXTURES / "signatures.json").read_text())["network"]


def _ours(name):
    """The tessera object at MindSpore's path with ``mindspore`` replaced by ``tessera``."""
    module, qualname = name.split(":")
    obj = importlib.import_module("tessera" + module[len("mindspore"):])
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj.__init__ if inspect.isclass(obj) else obj


def test_every_recorded_name_exists():
    missing = []
    for name in RECORDED:
        try:
            _ours(name)
        except (AttributeError, ImportError):
            missing.append(name)
    assert missing == []


def _params(target):
    params = list(inspect.signature(target).parameters.values())
    return params[1:] if params and params[0].name == "self" else params


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_signature_matches_mindspore(name):
    theirs = RECORDED[name]
    if [p["kind"] for p in theirs] == ["VAR_POSITIONAL", "VAR_KEYWORD"]:
        pytest.skip(f"{name} is recorded as (*args, **kwargs) (a decorated class)")
    ours = _params(_ours(name))
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
