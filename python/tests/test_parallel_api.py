"""The rest of MindSpore's ``mindspore.parallel`` public API (2.5 to 2.10, from MindSpore's API
pages, mindspore.cn/docs/en/r2.10.0/api_python/mindspore.parallel.html and the modules'
``__all__``): ``merge_sliced_parameter`` against MindSpore's reference cases; the older
``transform_*`` names; and the names with no engine counterpart (``DistributedDataParallel``,
``parallel.strategy``, the search's algorithm parameters, ``set_op_strategy_config``), which
exist with MindSpore's signatures and raise ``NotImplementedError`` naming what to use instead.
Also: ``CheckpointConfig``'s switches are bools, not truthy values."""

import inspect

import numpy as np
import pytest

import tessera
from tessera import parallel as P
from tessera.common import Parameter
from tessera.train import CheckpointConfig

from conftest import CASES, CONVERSION_CASES


def _rank_file(case, rank):
    (path,) = (case / "src_ckpt" / f"rank_{rank}").glob("*.ckpt")
    return str(path)


@pytest.mark.parametrize("name", CONVERSION_CASES)
def test_merge_sliced_parameter_rebuilds_mindspores_full_checkpoint(name):
    """Every parameter of the 8 ranks' checkpoint files that MindSpore saved, merged by the
    layouts of its strategy file, is MindSpore's full checkpoint, bit for bit (case3 holds
    optimizer-sharded parameters: each rank saved a piece of its block)."""
    case = CASES / name
    strategy = P.build_searched_strategy(str(case / "strategy" / "A.ckpt"))
    ranks = [tessera.load_checkpoint(_rank_file(case, r)) for r in range(8)]
    (full_file,) = (case / "full_ckpt" / "rank_0").glob("*.ckpt")
    full = tessera.load_checkpoint(str(full_file))
    for param in strategy:
        merged = P.merge_sliced_parameter([r[param] for r in ranks], strategy)
        assert isinstance(merged, Parameter) and merged.name == param
        want = full[param].asnumpy()
        got = merged.asnumpy()
        assert got.dtype == want.dtype and got.shape == want.shape, param
        assert np.array_equal(got, want), param
    if name == "case3_opt_shard_to_4":
        assert any(v["opt_weight_shard_size"] > 1 for v in strategy.values())


def _p(values, name="net.emb"):
    return Parameter(np.asarray(values, dtype=np.float32), name)


def _layout(dev_matrix, tensor_map, split=(), opt_size=0, field=0):
    return {"dev_matrix": [{"dim": list(dev_matrix)}], "tensor_map": [{"dim": list(tensor_map)}],
            "param_split_shape": [{"dim": list(split)}], "indices_offset": [{"dim": []}],
            "field": field, "opt_weight_shard_step": 0, "opt_weight_shard_size": opt_size}


def test_merge_sliced_parameter_without_strategy_concatenates_axis_0():
    # MindSpore's example: four slices of 3 give 12 values, in rank order
    parts = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]]
    merged = P.merge_sliced_parameter([_p(v) for v in parts])
    assert merged.shape == (12,) and merged.asnumpy().tolist() == list(range(1, 13))


def test_merge_sliced_parameter_layouts():
    # dev (2, 2), map (1, 0): rank r = 2*a + b holds block (a, b) of a 4x4 tensor
    full = np.arange(16, dtype=np.float32).reshape(4, 4)
    slices = [_p(full[2 * a:2 * a + 2, 2 * b:2 * b + 2]) for a in range(2) for b in range(2)]
    merged = P.merge_sliced_parameter(slices, {"net.emb": _layout((2, 2), (1, 0))})
    assert np.array_equal(merged.asnumpy(), full)
    # map (0, 1): rows follow the last device axis
    slices = [_p(full[2 * b:2 * b + 2, 2 * a:2 * a + 2]) for a in range(2) for b in range(2)]
    merged = P.merge_sliced_parameter(slices, {"net.emb": _layout((2, 2), (0, 1))})
    assert np.array_equal(merged.asnumpy(), full)
    # uneven row blocks (param_split_shape, MindSpore's manual split)
    rows = np.arange(16, dtype=np.float32).reshape(8, 2)
    merged = P.merge_sliced_parameter([_p(rows[:3]), _p(rows[3:])],
                                      {"net.emb": _layout((2,), (0, -1), split=(3, 5))})
    assert np.array_equal(merged.asnumpy(), rows)
    # a replicated scalar
    merged = P.merge_sliced_parameter([_p(2.5), _p(2.5)], {"net.emb": _layout((2,), ())})
    assert merged.shape == () and merged.asnumpy() == 2.5


def test_merge_sliced_parameter_errors():
    one = _p([1.0, 2.0])
    with pytest.raises(TypeError, match="'sliced_parameters' should be list"):
        P.merge_sliced_parameter((one, one))
    with pytest.raises(ValueError, match="should not be empty"):
        P.merge_sliced_parameter([])
    with pytest.raises(TypeError, match="should be 'Parameter'.*at index 1"):
        P.merge_sliced_parameter([one, np.ones(2)])
    with pytest.raises(TypeError, match="'strategy' should be dict"):
        P.merge_sliced_parameter([one], [1])
    with pytest.raises(ValueError, match="same name.*at index 1"):
        P.merge_sliced_parameter([one, _p([1.0, 2.0], "other")])
    with pytest.raises(KeyError, match="net.emb should be a key"):
        P.merge_sliced_parameter([one, one], {"other": _layout((2,), (0,))})
    with pytest.raises(ValueError, match="device_count is 4"):
        P.merge_sliced_parameter([one, one], {"net.emb": _layout((2, 2), (0,))})
    with pytest.raises(ValueError, match="same when slice manner is even"):
        P.merge_sliced_parameter([one, _p([1.0])], {"net.emb": _layout((2,), (0,))})
    with pytest.raises(ValueError, match="slice 1 should be 5 in 0 axis, but got 2"):
        P.merge_sliced_parameter([_p([1, 2, 3]), one], {"net.emb": _layout((2,), (0,), (3, 5))})
    with pytest.raises(ValueError, match="param_split_shape length in strategy should be 2"):
        P.merge_sliced_parameter([one, one], {"net.emb": _layout((2,), (0,), (2,))})
    with pytest.raises(ValueError, match="tensor_map.*holds 3"):
        P.merge_sliced_parameter([one, one], {"net.emb": _layout((2,), (3,))})
    with pytest.raises(ValueError, match="embedding field"):
        P.merge_sliced_parameter([one, one], {"net.emb": _layout((2,), (0,), field=2)})
    with pytest.raises(ValueError, match=r"tensor_map \[0, 0\]\) breaks a layout rule"):
        P.merge_sliced_parameter([_p([[1.0]])] * 2, {"net.emb": _layout((2,), (0, 0))})
    with pytest.raises(ValueError, match="must be a dict"):
        P.merge_sliced_parameter([one, one], {"net.emb": "(2,), (0,)"})
    with pytest.raises(ValueError, match="opt_weight_shard_size.*or -1.*got -3"):
        P.merge_sliced_parameter([one, one], {"net.emb": _layout((2,), (0,), opt_size=-3)})
    with pytest.raises(ValueError, match="no 'tensor_map'"):
        P.merge_sliced_parameter([one, one], {"net.emb": {"dev_matrix": [{"dim": [2]}]}})
    # replicas that differ: MindSpore keeps one silently; here the ranks are named
    with pytest.raises(ValueError, match="ranks 0 and 1 hold the same block"):
        P.merge_sliced_parameter([one, _p([1.0, 3.0])], {"net.emb": _layout((2,), (-1,))})
    # optimizer-shard pieces of a scalar (no axis 0 to cut)
    with pytest.raises(ValueError, match="optimizer-shard pieces.*ranks \\[0, 1\\]"):
        P.merge_sliced_parameter([_p(1.0), _p(1.0)], {"net.emb": _layout((2,), (), opt_size=2)})
    with pytest.raises(ValueError, match="opt_weight_shard_size 2 does not divide.*3 ranks"):
        P.merge_sliced_parameter([one] * 3, {"net.emb": _layout((3,), (-1,), opt_size=2)})


def test_merge_sliced_parameter_optimizer_shards():
    # dev (4,), map (-1,): one block held by 4 ranks; shard size 2 cuts them into runs [0, 1]
    # and [2, 3], each rank holding half of the block; size -1 cuts the whole group in 4
    full = np.arange(8, dtype=np.float32)
    halves = [full[:4], full[4:], full[:4], full[4:]]
    merged = P.merge_sliced_parameter([_p(v) for v in halves],
                                      {"net.emb": _layout((4,), (-1,), opt_size=2)})
    assert np.array_equal(merged.asnumpy(), full)
    quarters = [full[2 * i:2 * i + 2] for i in range(4)]
    merged = P.merge_sliced_parameter([_p(v) for v in quarters],
                                      {"net.emb": _layout((4,), (-1,), opt_size=-1)})
    assert np.array_equal(merged.asnumpy(), full)


# MindSpore's signatures, from its API pages (r2.10.0).
SIGNATURES = {
    "merge_sliced_parameter": "(sliced_parameters, strategy=None)",
    "set_op_strategy_config": "(mode='SAVE', path='')",
    "set_algo_parameters": "(**kwargs)",
    "get_algo_parameters": "(attr_key)",
    "reset_algo_parameters": "()",
    "distributed:DistributedDataParallel": "(module, init_sync=True, process_group=None, "
    "bucket_cap_mb=None, find_unused_parameters=False, average_in_collective=False, "
    "static_graph=False, reducer_mode='CppReducer')",
    "strategy:enable_save_strategy_online": "()",
    "strategy:clear_strategy_metadata": "()",
    "strategy:get_strategy_metadata": "(network, rank_id=None)",
    "strategy:get_current_strategy_metadata": "(network)",
}


def _obj(name):
    import importlib
    module, _, attr = name.rpartition(":")
    owner = importlib.import_module("tessera.parallel" + (f".{module}" if module else ""))
    return getattr(owner, attr)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_is_mindspores(name):
    obj = _obj(name)
    sig = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    params = [p for p in sig.parameters.values() if p.name != "self"]
    assert str(sig.replace(parameters=params)) == SIGNATURES[name]
    if not name.startswith(("distributed:", "strategy:")):
        assert name in P.__all__


def test_transform_names_are_the_conversions():
    assert P.transform_checkpoints is P.convert_checkpoints
    assert P.transform_checkpoint_by_rank is P.convert_checkpoint_by_rank
    assert P.rank_list_for_transform is P.rank_list_for_convert
    for name in ("transform_checkpoints", "transform_checkpoint_by_rank",
                 "rank_list_for_transform"):
        assert name in P.__all__ and getattr(tessera, name) is getattr(P, name)
    assert tessera.merge_sliced_parameter is P.merge_sliced_parameter  # mindspore's top level


def test_distributed_data_parallel_names_what_to_use():
    from tessera.parallel.distributed import DistributedDataParallel
    with pytest.raises(NotImplementedError, match="PyNative.*Model.train.*data_parallel"):
        DistributedDataParallel(tessera.nn.Dense(2, 2))


@pytest.mark.parametrize("call", [
    lambda S: S.enable_save_strategy_online(), lambda S: S.clear_strategy_metadata(),
    lambda S: S.get_strategy_metadata("net"), lambda S: S.get_strategy_metadata("net", 0),
    lambda S: S.get_current_strategy_metadata("net")])
def test_strategy_metadata_names_what_to_use(call):
    from tessera.parallel import strategy
    with pytest.raises(NotImplementedError, match="save_param_strategy_file.*build_searched"):
        call(strategy)


def test_search_settings_are_refused_not_ignored():
    with pytest.raises(NotImplementedError, match="fully_use_devices.*sharding_propagation"):
        P.set_algo_parameters(fully_use_devices=False)
    with pytest.raises(ValueError, match="keyword fully_use_device is not recognized"):
        P.set_algo_parameters(fully_use_device=False)
    with pytest.raises(NotImplementedError, match="elementwise_op_strategy_follow"):
        P.get_algo_parameters("elementwise_op_strategy_follow")
    with pytest.raises(ValueError, match="keyword nope is not recognized"):
        P.get_algo_parameters("nope")
    assert P.reset_algo_parameters() is None
    with pytest.raises(NotImplementedError, match=r"save_operator_strategy_file\(path\)"):
        P.set_op_strategy_config("SAVE", "/tmp/ops.json")
    with pytest.raises(NotImplementedError, match=r"load_operator_strategy_file\(path\)"):
        P.set_op_strategy_config(mode="LOAD", path="/tmp/ops.json")
    with pytest.raises(ValueError, match="'SAVE' or 'LOAD'"):
        P.set_op_strategy_config("save")
    with pytest.raises(TypeError, match="'path' must be str"):
        P.set_op_strategy_config("SAVE", 3)


@pytest.mark.parametrize("switch", ["async_save", "crc_check", "exception_save",
                                    "remove_redundancy", "integrated_save"])
@pytest.mark.parametrize("value", ["", "False", "True", 0, 1, None])
def test_checkpoint_config_switches_are_bools(switch, value):
    """A string (or a number) is not judged by its truthiness: ``crc_check=""`` was accepted as
    off and ``integrated_save="True"`` refused as unsupported; each is a TypeError naming the
    switch."""
    with pytest.raises(TypeError, match=f"'{switch}'.*must be bool"):
        CheckpointConfig(**{switch: value})


def test_checkpoint_config_switch_values():
    assert CheckpointConfig(async_save=np.bool_(False), crc_check=False,
                            integrated_save=np.bool_(True))._recipe()["keep_checkpoint_max"] == 5
    for mode in ("thread", "process", True):
        with pytest.raises(ValueError, match=r"\['async_save'\] are not supported"):
            CheckpointConfig(async_save=mode)
    with pytest.raises(ValueError, match=r"\['crc_check', 'integrated_save'\] are not supported"):
        CheckpointConfig(crc_check=True, integrated_save=False)
