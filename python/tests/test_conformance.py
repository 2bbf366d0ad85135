"""The MindSpore 2.10 reference cases through tessera.parallel: every expected output is
reproduced from Python (tensor names, dtypes, shapes, bytes and, for .ckpt, order)."""

import json

import numpy as np
import pytest

from tessera import parallel as P
from tessera import CheckpointError

from conftest import CASES, assert_same_file, read_any, read_ckpt


def _strategy(case, name):
    return str(case / "strategy" / name)


@pytest.mark.parametrize("flavour,expected", [(".ckpt", "convert_ckpt_A_to_B"),
                                              (".json", "convert_ckpt_A_to_B_json")])
def test_convert_checkpoints_a_to_b(case, tmp_path, flavour, expected):
    P.convert_checkpoints(str(case / "src_ckpt"), str(tmp_path / "out"), "converted_",
                          _strategy(case, "A" + flavour), _strategy(case, "B" + flavour))
    for r in range(4):
        f = f"rank_{r}/converted_{r}.ckpt"
        assert_same_file(tmp_path / "out" / f, case / "expected" / expected / f)


def test_convert_checkpoints_from_unsharded_remakes_the_sources(case, tmp_path):
    # How the reference sources were made: convert_checkpoints(full, src_strategy=None -> A).
    P.convert_checkpoints(str(case / "full_ckpt"), str(tmp_path / "out"), "checkpoint_", None,
                          _strategy(case, "A.ckpt"))
    for r in range(8):
        f = f"rank_{r}/checkpoint_{r}.ckpt"
        assert_same_file(tmp_path / "out" / f, case / "src_ckpt" / f)


def test_convert_checkpoints_a_to_full(case, tmp_path):
    P.convert_checkpoints(case / "src_ckpt", tmp_path / "out", "merged_", _strategy(case, "A.ckpt"))
    assert_same_file(tmp_path / "out/rank_0/merged_0.ckpt",
                     case / "expected/convert_ckpt_A_to_full/rank_0/merged_0.ckpt")


def test_convert_safetensors(tmp_path):
    case = CASES / "case1_dp2mp4_to_2x2"
    args = (case / "src_safetensors", _strategy(case, "A.ckpt"), _strategy(case, "B.ckpt"))
    # The safetensors sources lack the bf16 parameter their strategy lists: MindSpore leaves
    # it out silently, Tessera names it unless allowed.
    with pytest.raises(CheckpointError) as err:
        P.convert_checkpoints(args[0], tmp_path / "refused", "converted_", args[1], args[2],
                              output_format="safetensors")
    assert err.value.tensor == "net.bf" and "allow-missing" in err.value.rule
    assert not (tmp_path / "refused").exists()
    P.convert_checkpoints(args[0], tmp_path / "sf", "converted_", args[1], args[2],
                          output_format="safetensors", allow_missing=True)
    P.convert_checkpoints(args[0], tmp_path / "ck", "converted_", args[1], args[2],
                          allow_missing=True)
    for r in range(4):
        assert_same_file(tmp_path / f"sf/rank_{r}/converted_{r}.safetensors",
                         case / f"expected/convert_sf_A_to_B/rank_{r}/converted_{r}.safetensors")
        # Order aside (the safetensors sources have no order of their own to keep).
        assert_same_file(tmp_path / f"ck/rank_{r}/converted_{r}.ckpt",
                         case / f"expected/convert_sf_A_to_B_as_ckpt/rank_{r}/converted_{r}.ckpt",
                         order=False)


# The minimal source ranks per destination rank, worked out in docs/MINDSPORE_DIFFERENCES.md.
MINIMAL = {
    "case1_dp2mp4_to_2x2": [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 6, 7], [0, 1, 2, 3, 6, 7]],
    "case3_opt_shard_to_4": [[0, 1, 2, 3, 4, 5], [0, 1, 4, 5, 6, 7], [0, 1, 2, 3, 6, 7], [2, 3, 4, 5, 6, 7]],
}


def test_rank_list_for_convert_is_a_minimal_subset_of_mindspores(case):
    theirs = json.loads((case / "expected/rank_list_for_convert.json").read_text())
    for r in range(4):
        ours = P.rank_list_for_convert(r, _strategy(case, "A.ckpt"), _strategy(case, "B.ckpt"))
        assert ours == MINIMAL[case.name][r]
        assert set(ours) <= set(theirs["A_to_B"][str(r)])
    assert P.rank_list_for_convert(0) == [0]


def test_convert_checkpoint_by_rank_from_the_minimal_files(case, tmp_path):
    for r in range(4):
        needed = P.rank_list_for_convert(r, _strategy(case, "A.ckpt"), _strategy(case, "B.ckpt"))
        files = {s: str(case / f"src_ckpt/rank_{s}/checkpoint_{s}.ckpt") for s in needed}
        out = tmp_path / f"rank_{r}.ckpt"
        P.convert_checkpoint_by_rank(r, files, str(out), _strategy(case, "A.ckpt"),
                                     _strategy(case, "B.ckpt"))
        assert_same_file(out, case / f"expected/convert_by_rank_A_to_B/rank_{r}.ckpt")
    # One source file fewer than the minimum is refused, naming the missing rank.
    files.pop(needed[0])
    with pytest.raises(CheckpointError) as err:
        P.convert_checkpoint_by_rank(3, files, str(tmp_path / "short.ckpt"),
                                     _strategy(case, "A.ckpt"), _strategy(case, "B.ckpt"))
    assert f"source rank {needed[0]}" in str(err.value)


@pytest.mark.parametrize("src,redundancy,expected", [
    ("src_safetensors", True, "unified_safetensors"),
    ("src_safetensors_dedup", False, "unified_safetensors_dedup")])
def test_unified_safetensors(case, tmp_path, src, redundancy, expected):
    P.unified_safetensors(str(case / src), _strategy(case, "A.ckpt"), str(tmp_path / "u"),
                          merge_with_redundancy=redundancy)
    want = case / "expected" / expected
    assert json.loads((tmp_path / "u/param_name_map.json").read_text()) == \
        json.loads((want / "param_name_map.json").read_text())
    for f in sorted(p.name for p in want.glob("*.safetensors")):
        assert_same_file(tmp_path / "u" / f, want / f, order=False)


def test_load_distributed_checkpoint_writes_each_rank(case, tmp_path):
    P.load_distributed_checkpoint(None, predict_strategy=_strategy(case, "B.ckpt"),
                                  format="safetensors",
                                  unified_safetensors_dir=str(case / "expected/unified_safetensors"),
                                  dst_safetensors_dir=str(tmp_path / "d"))
    for r in range(4):
        f = f"rank_{r}/net.safetensors"
        assert_same_file(tmp_path / "d" / f, case / "expected/load_distributed_B" / f, order=False)


def _as_array(dtype, shape, raw):
    np_dtype = {"Float32": "<f4", "Float16": "<f2", "Int32": "<i4", "Int64": "<i8"}
    if dtype == "BFloat16":  # returned widened to float32
        return (np.frombuffer(raw, "<u2").astype("<u4") << 16).view("<f4").reshape(shape)
    return np.frombuffer(raw, np_dtype[dtype]).reshape(shape)


def test_load_distributed_checkpoint_returns_arrays(case):
    files = [str(case / f"src_ckpt/rank_{s}/checkpoint_{s}.ckpt") for s in range(8)]
    for r in range(4):
        want, _ = read_any(case / f"expected/load_distributed_B/rank_{r}/net.safetensors")
        from_unified = P.load_distributed_checkpoint(
            None, predict_strategy=_strategy(case, "B.ckpt"), format="safetensors",
            unified_safetensors_dir=str(case / "expected/unified_safetensors"), rank_id=r)
        from_files = P.load_distributed_checkpoint(
            None, files, _strategy(case, "B.ckpt"), _strategy(case, "A.ckpt"), rank_id=r)
        for got in (from_unified, from_files):
            for name, (dtype, shape, raw) in want.items():
                assert isinstance(got[name], np.ndarray)
                np.testing.assert_array_equal(got[name], _as_array(dtype, shape, raw), err_msg=name)
    first = next(iter(from_files))
    renamed = P.load_distributed_checkpoint(
        None, files, _strategy(case, "B.ckpt"), _strategy(case, "A.ckpt"), rank_id=0,
        name_map={first: "renamed"})
    assert "renamed" in renamed and first not in renamed and len(renamed) == len(from_files)


def test_load_segmented_checkpoints(case):
    expected = json.loads((case / "expected/load_segmented_checkpoints.json").read_text())
    got = P.load_segmented_checkpoints(str(case / "segmented"))
    assert sorted(got) == sorted(expected)
    full = {n: (t, d, b) for n, t, d, b in read_ckpt(case / "full_ckpt/rank_0/full.ckpt")}
    for name, arr in got.items():
        assert list(arr.shape) == expected[name]["shape"]
        dtype, dims, raw = full[name]
        np.testing.assert_array_equal(arr, _as_array(dtype, dims, raw))
    first, last = sorted(got)[0], sorted(got)[-1]
    only = P.load_segmented_checkpoints(str(case / "segmented"), specify_prefix=first)
    assert sorted(only) == sorted(n for n in got if n.startswith(first))
    rest = P.load_segmented_checkpoints(str(case / "segmented"), filter_prefix=[first],
                                        choice_func=lambda n: n != last)
    assert sorted(rest) == sorted(n for n in got if not n.startswith(first) and n != last)
    assert len(rest) < len(got)


def test_build_searched_strategy(case):
    for s in "AB":
        assert P.build_searched_strategy(_strategy(case, f"{s}.ckpt")) == \
            json.loads((case / f"expected/build_searched_strategy_{s}.json").read_text())


def test_merge_pipeline_strategys_prefixes_stages(tmp_path):
    case = CASES / "case1_dp2mp4_to_2x2"
    stages = tmp_path / "stages"
    stages.mkdir()
    (stages / "stage0.ckpt").write_bytes((case / "strategy/A.ckpt").read_bytes())
    P.merge_pipeline_strategys(str(stages), str(tmp_path / "merged.ckpt"))
    merged = P.build_searched_strategy(str(tmp_path / "merged.ckpt"))
    original = P.build_searched_strategy(_strategy(case, "A.ckpt"))
    assert merged == {f"0-{name}": layout for name, layout in original.items()}


def test_restore_group_info_list():
    case = CASES / "case5_group_info"
    assert P.restore_group_info_list(str(case / "group_info.pb")) == [0, 1, 2, 3]
    # MindSpore returns [] for a file without ckpt_restore_rank_list; Tessera says so.
    with pytest.raises(CheckpointError) as err:
        P.restore_group_info_list(str(case / "group_info_no_restore.pb"))
    assert err.value.file.endswith("group_info_no_restore.pb")


def _listify(v):
    return [_listify(x) for x in v] if isinstance(v, (list, tuple)) else v


def test_layout_to_dict_and_errors_match_mindspore():
    cases = json.loads((CASES / "case0_layout_to_dict/layouts.json").read_text())
    n_ok = n_err = 0
    for c in cases:
        def run():
            if isinstance(c["call"], str):  # to_dict() before __call__
                return P.Layout((2, 4), ("dp", "mp")).to_dict()
            rank_list = c["rank_list"]
            layout = P.Layout(tuple(c["device_matrix"]), tuple(c["alias_name"]), rank_list)
            call = [tuple(e) if isinstance(e, list) else e for e in c["call"]]
            return layout(*call).to_dict()
        if "error" in c:
            kind, message = c["error"].split(": ", 1)
            assert kind == "ValueError"
            with pytest.raises(ValueError) as err:
                run()
            assert str(err.value).startswith(message), (c["call"], str(err.value))
            n_err += 1
        else:
            got = run()
            assert isinstance(got["device_matrix"], tuple) and isinstance(got["alias_name"], tuple)
            assert {k: _listify(v) for k, v in got.items()} == c["to_dict"], c["call"]
            n_ok += 1
    assert n_ok >= 9 and n_err >= 7


def _full_file(case):
    return str(case / "full_ckpt/rank_0/full.ckpt")


def _assert_arrays_equal_file(got, path):
    want, _ = read_any(path)
    assert sorted(got) == sorted(want)
    for name, (dtype, shape, raw) in want.items():
        np.testing.assert_array_equal(got[name], _as_array(dtype, shape, raw), err_msg=name)


def test_convert_checkpoint_by_rank_from_an_unsharded_source(case, tmp_path):
    # src_strategy_file=None: the one full file slices into each destination rank, tensor for
    # tensor what the sharded sources give.
    for r in range(4):
        out = tmp_path / f"rank_{r}.ckpt"
        P.convert_checkpoint_by_rank(r, {0: _full_file(case)}, str(out), None,
                                     _strategy(case, "B.ckpt"))
        assert_same_file(out, case / f"expected/convert_by_rank_A_to_B/rank_{r}.ckpt",
                         order=False)
    # An unsharded source is one file, given as rank 0.
    with pytest.raises(CheckpointError, match="unsharded"):
        P.convert_checkpoint_by_rank(0, {1: _full_file(case)}, str(tmp_path / "x.ckpt"), None,
                                     _strategy(case, "B.ckpt"))
    with pytest.raises(ValueError, match="both None"):
        P.convert_checkpoint_by_rank(0, {0: _full_file(case)}, str(tmp_path / "y.ckpt"))


def test_load_distributed_checkpoint_without_predict_strategy_gives_whole_tensors(case, tmp_path):
    # predict_strategy=None: one device predicts, so every tensor comes whole, from the sharded
    # files, from the unified checkpoint, and written to rank_0/.
    full = case / "expected/convert_ckpt_A_to_full/rank_0/merged_0.ckpt"
    files = [str(case / f"src_ckpt/rank_{s}/checkpoint_{s}.ckpt") for s in range(8)]
    _assert_arrays_equal_file(
        P.load_distributed_checkpoint(None, files, None, _strategy(case, "A.ckpt")), full)
    unified = str(case / "expected/unified_safetensors")
    whole = P.load_distributed_checkpoint(None, format="safetensors",
                                          unified_safetensors_dir=unified)
    for name, arr in P.load_distributed_checkpoint(None, files, None,
                                                   _strategy(case, "A.ckpt")).items():
        if name in whole:
            np.testing.assert_array_equal(whole[name], arr, err_msg=name)
    P.load_distributed_checkpoint(None, format="safetensors", unified_safetensors_dir=unified,
                                  dst_safetensors_dir=str(tmp_path / "d"))
    assert sorted(p.name for p in (tmp_path / "d").glob("rank_*")) == ["rank_0"]
    written, _ = read_any(tmp_path / "d/rank_0/net.safetensors")
    assert sorted(written) == sorted(whole)
    with pytest.raises(CheckpointError, match="rank 1"):
        P.load_distributed_checkpoint(None, files, None, _strategy(case, "A.ckpt"), rank_id=1)


def test_load_distributed_checkpoint_from_an_unsharded_file(case):
    # train_strategy_filename=None: the one file is unsharded; each rank's slices under B equal
    # those from the eight sharded files.
    files = [str(case / f"src_ckpt/rank_{s}/checkpoint_{s}.ckpt") for s in range(8)]
    for r in range(4):
        from_full = P.load_distributed_checkpoint(None, [_full_file(case)],
                                                  _strategy(case, "B.ckpt"), rank_id=r)
        from_shards = P.load_distributed_checkpoint(None, files, _strategy(case, "B.ckpt"),
                                                    _strategy(case, "A.ckpt"), rank_id=r)
        for name, arr in from_shards.items():
            np.testing.assert_array_equal(from_full[name], arr, err_msg=name)
