"""Differences from MindSpore 2.10 found by ``scripts/mindspore-api-diff.py`` (a differential
sweep against the real MindSpore), each checked against MindSpore's rule."""

import itertools

import numpy as np
import pytest

import tessera
from tessera import parallel as P


def _mindspore_map(alias_name, tensor_map):
    """MindSpore's ``Layout.__call__`` rule for ``to_dict()['tensor_map']``: a str entry is one
    int (``-1`` for ``"None"``, else the axis counted from the right), a tuple entry stays a
    tuple of such ints, whatever its length."""
    def value(alias):
        return -1 if alias == "None" else len(alias_name) - 1 - alias_name.index(alias)
    return tuple(tuple(value(a) for a in e) if isinstance(e, tuple) else value(e)
                 for e in tensor_map)


@pytest.mark.parametrize("tensor_map", [
    (("dp",), "mp"),             # a one-alias tuple stays a tuple
    ((), "None"),                # an empty tuple stays empty
    (("mp", "None"), "dp"),      # 'None' inside a tuple is -1
    (("dp", "mp"),),
    ("None", ("None",), ("sp", "dp")),
])
def test_layout_tensor_map_keeps_the_shape_of_the_call(tensor_map):
    alias_name = ("dp", "sp", "mp")
    layout = P.Layout((2, 1, 2), alias_name)
    assert layout(*tensor_map).to_dict()["tensor_map"] == _mindspore_map(alias_name, tensor_map)


def test_layout_call_sets_the_map_on_the_layout_too():
    layout = P.Layout((2, 4), ("dp", "mp"))
    with pytest.raises(ValueError, match="tensor_map of layout is None"):
        layout.to_dict()
    copy = layout("mp", ("dp",))
    assert layout.to_dict() == copy.to_dict()
    assert layout.to_dict()["tensor_map"] == _mindspore_map(("dp", "mp"), ("mp", ("dp",)))
    # A failed call leaves the earlier map.
    with pytest.raises(ValueError):
        layout("nope")
    assert layout.to_dict() == copy.to_dict()


@pytest.mark.parametrize("entry", [1, None, ["dp"], ("dp", 1)])
def test_layout_entry_that_is_no_alias_is_a_value_error(entry):
    # MindSpore looks the entry up in alias_name: a ValueError, not a TypeError.
    with pytest.raises(ValueError, match="is not found in .*alias name, 'None' or a tuple"):
        P.Layout((2, 2), ("dp", "mp"))("mp", entry)


def _slices(full, dev, dims):
    """Each rank's block of ``full``: ``dims[i]`` lists the device-matrix axes (counted from the
    right) splitting tensor dim ``i``, the first one outermost."""
    out = []
    for coord in itertools.product(*[range(d) for d in dev]):
        index = []
        for size, axes in zip(full.shape, dims):
            pos, parts = 0, 1
            for ax in axes:
                k = len(dev) - 1 - ax
                pos, parts = pos * dev[k] + coord[k], parts * dev[k]
            index.append(slice(pos * size // parts, (pos + 1) * size // parts))
        out.append(full[tuple(index)])
    return out


def _layout(dev, tensor_map):
    return {"dev_matrix": [{"dim": dev}], "tensor_map": [{"dim": m} for m in tensor_map],
            "param_split_shape": [{"dim": []}], "indices_offset": [{"dim": []}],
            "field": 0, "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}


@pytest.mark.parametrize("dev, tensor_map, shape", [
    ([4, 2, 2], [[1, 2], [0]], (8, 4)),      # dim 0 split over two axes
    ([2, 2, 1], [[2, 1], [-1], [0]], (4, 3, 2)),
    ([2, 2, 2], [[2, 1], []], (4,)),         # 1-D: the writer's trailing empty TensorMap
    ([2, 4], [[0], [1]], (4, 8)),            # extended form, one axis per dim
])
def test_merge_sliced_parameter_reads_extended_tensor_maps(dev, tensor_map, shape):
    dims = [[a for a in m if a >= 0] for m in tensor_map if m]
    full = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    params = [tessera.Parameter(tessera.Tensor(s), name="w") for s in _slices(full, dev, dims)]
    merged = P.merge_sliced_parameter(params, {"w": _layout(dev, tensor_map)})
    np.testing.assert_array_equal(merged.asnumpy(), full)


@pytest.mark.parametrize("func", [P.build_searched_strategy, P.restore_group_info_list])
def test_a_missing_strategy_or_group_file_is_a_value_error(func, tmp_path):
    # MindSpore: "no such strategy file" / "no such group information file", a ValueError
    # (Tessera's CheckpointError is one); an OSError would slip past `except ValueError`.
    for path in (tmp_path / "missing.ckpt", tmp_path):
        with pytest.raises(ValueError) as err:
            func(str(path))
        assert isinstance(err.value, tessera.CheckpointError)
        assert err.value.file == str(path)
        assert "no such" in err.value.rule or "not a regular file" in err.value.rule


def test_build_searched_strategy_of_none_is_a_type_error():
    # MindSpore 2.10 returns None here (docs/MINDSPORE_DIFFERENCES.md, section 12); a name that
    # was never set must not read as "no strategy" further on.
    with pytest.raises(TypeError, match="For 'strategy_filename', the type must be str"):
        P.build_searched_strategy(None)
