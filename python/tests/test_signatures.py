"""tessera.parallel's signatures against MindSpore 2.10's, as recorded from MindSpore itself
(tests/fixtures/mindspore/signatures.json, written by scripts/mindspore-signatures.py):
MindSpore's parameters come first with the same names, kinds and defaults; Tessera's
additions are keyword-only with defaults."""

import inspect
import json

import pytest

from tessera import parallel as P

from conftest import FIXTURES

RECORDED = json.loads((FIXTURES / "signatures.json").read_text())


def test_recorded_from_mindspore_2_10():
    assert RECORDED["mindspore"] == "2.10.0"


def _target(name):
    if name.startswith("Layout."):
        method = getattr(P.Layout, name.split(".", 1)[1])
        return list(inspect.signature(method).parameters.values())[1:]  # without self
    return list(inspect.signature(getattr(P, name)).parameters.values())


@pytest.mark.parametrize("name", sorted(RECORDED["signatures"]))
def test_signature_matches_mindspore(name):
    theirs = RECORDED["signatures"][name]
    ours = _target(name)
    assert len(ours) >= len(theirs), name
    for want, got in zip(theirs, ours):
        assert got.name == want["name"], f"{name}: parameter {got.name} vs {want['name']}"
        assert got.kind.name == want["kind"], f"{name}.{got.name}"
        if "default" in want:
            assert got.default is not inspect.Parameter.empty, f"{name}.{got.name} needs a default"
            assert repr(got.default) == want["default"], f"{name}.{got.name}"
        else:
            assert got.default is inspect.Parameter.empty, f"{name}.{got.name} has no default in MindSpore"
    for extra in ours[len(theirs):]:
        assert extra.kind is inspect.Parameter.KEYWORD_ONLY, f"{name}: extra {extra.name} must be keyword-only"
        assert extra.default is not inspect.Parameter.empty, f"{name}: extra {extra.name} needs a default"


def test_every_mindspore_name_is_exported():
    for name in RECORDED["signatures"]:
        assert name.split(".")[0] in P.__all__
