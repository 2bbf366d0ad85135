"""MindSpore options beyond the plain conversions: unified_safetensors' file_suffix,
choice_func and split_dst_file; load_distributed_checkpoint with a layout dict, with name_map
and dst_safetensors_dir, and with encrypted .ckpt files (dec_key / dec_mode), as
load_segmented_checkpoints reads them too; fsync=False on every writer. Outputs are judged by the pure-Python readers of
conftest and against the runs without the option."""

import json
import shutil

import numpy as np
import pytest

import tessera
from tessera import _tessera
from tessera import parallel as P

from conftest import CASES, assert_same_file, read_any

CASE = CASES / "case1_dp2mp4_to_2x2"
A, B = str(CASE / "strategy/A.ckpt"), str(CASE / "strategy/B.ckpt")
SRC_ST = str(CASE / "src_safetensors")
UNIFIED = str(CASE / "expected/unified_safetensors")
FILES = [str(CASE / f"src_ckpt/rank_{r}/checkpoint_{r}.ckpt") for r in range(8)]


def _index(directory):
    return json.loads((directory / "param_name_map.json").read_text())["weight_map"]


def _layout_dict(case):
    """MindSpore's own _convert_to_list output of strategy B (recorded), as a layout dict."""
    recorded = json.loads((case / "expected/layout_list_B.json").read_text())
    recorded.pop("_fields")
    return recorded


def _same_arrays(x, y):
    assert sorted(x) == sorted(y)
    for name in x:
        np.testing.assert_array_equal(x[name], y[name], err_msg=name)


# ------------------------------------------------------------------ unified_safetensors options

def test_choice_func_drops_and_renames(tmp_path):
    P.unified_safetensors(SRC_ST, A, str(tmp_path / "base"))
    names = sorted(_index(tmp_path / "base"))
    drop, rename = names[0], names[1]
    seen = []

    def choice(name):
        seen.append(name)
        if name == drop:
            return False
        return f"new.{name}" if name == rename else True

    P.unified_safetensors(SRC_ST, A, str(tmp_path / "u"), choice_func=choice)
    index = _index(tmp_path / "u")
    assert drop not in index and rename not in index and f"new.{rename}" in index
    assert set(index) == {f"new.{rename}" if n == rename else n for n in names if n != drop}
    assert set(seen) >= set(names)
    ours, _ = read_any(tmp_path / "u" / index[f"new.{rename}"])
    base, _ = read_any(tmp_path / "base" / _index(tmp_path / "base")[rename])
    assert ours[f"new.{rename}"] == base[rename]
    assert drop not in ours


def test_choice_func_errors(tmp_path):
    with pytest.raises(ValueError, match="must be bool or str, but got <class 'int'>"):
        P.unified_safetensors(SRC_ST, A, str(tmp_path / "a"), choice_func=lambda n: 1)

    def broken(name):
        raise KeyError(name)

    with pytest.raises(KeyError):
        P.unified_safetensors(SRC_ST, A, str(tmp_path / "b"), choice_func=broken)
    with pytest.raises(TypeError, match="choice_func"):
        P.unified_safetensors(SRC_ST, A, str(tmp_path / "c"), choice_func="net.w1")
    with pytest.raises(ValueError, match="same name"):
        P.unified_safetensors(SRC_ST, A, str(tmp_path / "d"), choice_func=lambda n: "x")
    for d in "abcd":
        assert not (tmp_path / d / "param_name_map.json").exists()


def test_file_suffix_picks_the_files(tmp_path):
    src = tmp_path / "src"
    stale = CASE / "src_safetensors/rank_0/checkpoint_0.safetensors"
    for r in range(8):
        (src / f"rank_{r}").mkdir(parents=True)
        shutil.copy(CASE / f"src_safetensors/rank_{r}/checkpoint_{r}.safetensors",
                    src / f"rank_{r}/net_rank_{r}-1_10.safetensors")
        shutil.copy(stale, src / f"rank_{r}/net_rank_{r}-2_20.safetensors")
    P.unified_safetensors(str(src), A, str(tmp_path / "u"), file_suffix="1_10")
    P.unified_safetensors(SRC_ST, A, str(tmp_path / "base"))
    assert_same_file(tmp_path / "u/part0.safetensors", tmp_path / "base/part0.safetensors")
    # Without the suffix the newest step is taken: the stale copies.
    P.unified_safetensors(str(src), A, str(tmp_path / "newest"))
    assert read_any(tmp_path / "newest/part0.safetensors") != \
        read_any(tmp_path / "base/part0.safetensors")
    with pytest.raises(tessera.CheckpointError, match="9_99"):
        P.unified_safetensors(str(src), A, str(tmp_path / "x"), file_suffix="9_99")
    with pytest.raises(TypeError, match="file_suffix"):
        P.unified_safetensors(str(src), A, str(tmp_path / "y"), file_suffix=10)


def test_split_dst_file_runs_fill_one_directory(tmp_path):
    P.unified_safetensors(SRC_ST, A, str(tmp_path / "whole"), max_part_size=64)
    parts = sorted(p.name for p in (tmp_path / "whole").glob("part*.safetensors"))
    assert len(parts) >= 3
    dst = tmp_path / "split"
    P.unified_safetensors(SRC_ST, A, str(dst), split_dst_file=(2, 3), max_part_size=64)
    second = sorted(p.name for p in dst.glob("part*.safetensors"))
    assert second and not (dst / "param_name_map.json").exists()
    assert not (dst / "hyper_param.safetensors").exists()
    P.unified_safetensors(SRC_ST, A, str(dst), split_dst_file=(1, 3), max_part_size=64)
    assert (dst / "param_name_map.json").exists() and (dst / "hyper_param.safetensors").exists()
    P.unified_safetensors(SRC_ST, A, str(dst), split_dst_file=(3, 3), max_part_size=64)
    assert sorted(p.name for p in dst.glob("part*.safetensors")) == parts
    for name in parts + ["hyper_param.safetensors"]:
        assert_same_file(dst / name, tmp_path / "whole" / name)
    assert _index(dst) == _index(tmp_path / "whole")
    # The merged directory loads like the whole one.
    got = P.load_distributed_checkpoint(None, predict_strategy=B, format="safetensors",
                                        unified_safetensors_dir=str(dst), rank_id=1)
    want = P.load_distributed_checkpoint(None, predict_strategy=B, format="safetensors",
                                         unified_safetensors_dir=UNIFIED, rank_id=1)
    _same_arrays(got, want)
    # A part already written is not overwritten without force.
    with pytest.raises(tessera.CheckpointError):
        P.unified_safetensors(SRC_ST, A, str(dst), split_dst_file=(2, 3), max_part_size=64)


@pytest.mark.parametrize("value,kind", [((0, 2), ValueError), ((3, 2), ValueError),
                                        ((1, 0), ValueError), ((1, 2, 3), ValueError),
                                        ((True, 2), ValueError), ("12", TypeError)])
def test_split_dst_file_errors(tmp_path, value, kind):
    with pytest.raises(kind, match="split_dst_file"):
        P.unified_safetensors(SRC_ST, A, str(tmp_path / "x"), split_dst_file=value)
    assert not (tmp_path / "x").exists()


# --------------------------------------------------------- load_distributed_checkpoint options

@pytest.mark.parametrize("case_name", ["case1_dp2mp4_to_2x2", "case3_opt_shard_to_4"])
def test_predict_strategy_layout_dict_equals_the_strategy_file(tmp_path, case_name):
    case = CASES / case_name
    layouts = _layout_dict(case)
    strategy = str(case / "strategy/B.ckpt")
    unified = str(case / "expected/unified_safetensors")
    files = [str(case / f"src_ckpt/rank_{r}/checkpoint_{r}.ckpt") for r in range(8)]
    train = str(case / "strategy/A.ckpt")
    for r in range(4):
        _same_arrays(
            P.load_distributed_checkpoint(None, predict_strategy=layouts, format="safetensors",
                                          unified_safetensors_dir=unified, rank_id=r),
            P.load_distributed_checkpoint(None, predict_strategy=strategy, format="safetensors",
                                          unified_safetensors_dir=unified, rank_id=r))
        _same_arrays(P.load_distributed_checkpoint(None, files, layouts, train, rank_id=r),
                     P.load_distributed_checkpoint(None, files, strategy, train, rank_id=r))
    P.load_distributed_checkpoint(None, predict_strategy=layouts, format="safetensors",
                                  unified_safetensors_dir=unified,
                                  dst_safetensors_dir=str(tmp_path / "d"))
    for r in range(4):
        f = f"rank_{r}/net.safetensors"
        assert_same_file(tmp_path / "d" / f, case / "expected/load_distributed_B" / f, order=False)


def test_predict_strategy_dict_errors():
    good = _layout_dict(CASE)
    bad_entries = [{"w": []}, {"w": [[2, 2], [0, 1], [], 1]}, {"w": [[2, "2"], [0], [], 0]},
                   {3: [[2], [0], [], 0]}, {"w": "layout"}]
    for bad in bad_entries:
        with pytest.raises(ValueError, match="the first four elements must be dev_matrix"):
            P.load_distributed_checkpoint(None, FILES, bad, A)
    name = list(good)[-1]
    with_group = dict(good)
    with_group[name] = list(good[name][:4]) + [True, "opt_group_0"]
    with pytest.raises(ValueError, match="opt_group_0"):
        P.load_distributed_checkpoint(None, FILES, with_group, A)
    # A layout that does not cover the training devices' shapes names the parameter.
    wrong = dict(good)
    wrong[name] = [[3], [0]] + list(good[name][2:])
    with pytest.raises(tessera.CheckpointError) as err:
        P.load_distributed_checkpoint(None, FILES, wrong, A)
    assert err.value.tensor == name
    with pytest.raises(TypeError, match="predict_strategy"):
        P.load_distributed_checkpoint(None, FILES, 42, A)


def test_name_map_with_dst_safetensors_dir(tmp_path):
    plain, renamed = tmp_path / "plain", tmp_path / "renamed"
    P.load_distributed_checkpoint(None, predict_strategy=B, format="safetensors",
                                  unified_safetensors_dir=UNIFIED, dst_safetensors_dir=str(plain))
    first = sorted(_index(CASE / "expected/unified_safetensors"))[0]
    P.load_distributed_checkpoint(None, predict_strategy=B, format="safetensors",
                                  unified_safetensors_dir=UNIFIED,
                                  dst_safetensors_dir=str(renamed), rank_id=2,
                                  name_map={first: "renamed.w"})
    assert sorted(p.name for p in renamed.iterdir() if p.name.startswith("rank_")) == ["rank_2"]
    ours, _ = read_any(renamed / "rank_2/net.safetensors")
    want, _ = read_any(plain / "rank_2/net.safetensors")
    want["renamed.w"] = want.pop(first)
    assert ours == want
    with pytest.raises(TypeError, match="name_map"):
        P.load_distributed_checkpoint(None, predict_strategy=B, format="safetensors",
                                      unified_safetensors_dir=UNIFIED,
                                      dst_safetensors_dir=str(tmp_path / "x"), name_map=[first])
    second = sorted(_index(CASE / "expected/unified_safetensors"))[1]
    with pytest.raises(tessera.CheckpointError, match="after renaming"):
        P.load_distributed_checkpoint(None, predict_strategy=B, format="safetensors",
                                      unified_safetensors_dir=UNIFIED,
                                      dst_safetensors_dir=str(tmp_path / "y"),
                                      name_map={first: second})
    assert not (tmp_path / "y" / "rank_0").exists()


# ------------------------------------------------------------------------ encrypted checkpoints

KEY = bytes(range(32))


def _encrypt_all(tmp_path, mode, key=KEY):
    out = []
    for r, f in enumerate(FILES):
        dst = tmp_path / f"enc_{mode}" / f"rank_{r}.ckpt"
        dst.parent.mkdir(exist_ok=True)
        _tessera.encrypt_checkpoint_file(f, str(dst), key, mode)
        out.append(str(dst))
    return out


@pytest.mark.parametrize("mode,key", [("AES-GCM", KEY), ("AES-CBC", KEY[:24]),
                                      ("SM4-CBC", KEY[:16])])
def test_dec_key_reads_encrypted_checkpoints(tmp_path, mode, key):
    files = _encrypt_all(tmp_path, mode, key)
    assert open(files[0], "rb").read() != open(FILES[0], "rb").read()
    for r in range(4):
        _same_arrays(P.load_distributed_checkpoint(None, files, B, A, dec_key=key, dec_mode=mode,
                                                   rank_id=r),
                     P.load_distributed_checkpoint(None, FILES, B, A, rank_id=r))


def test_dec_key_errors(tmp_path):
    files = _encrypt_all(tmp_path, "AES-GCM")
    with pytest.raises(tessera.CheckpointError, match="encrypted") as err:
        P.load_distributed_checkpoint(None, files, B, A)
    assert err.value.file in files
    with pytest.raises(tessera.CheckpointError, match="wrong dec_key") as err:
        P.load_distributed_checkpoint(None, files, B, A, dec_key=bytes(32))
    assert err.value.file in files
    with pytest.raises(tessera.CheckpointError, match="dec_mode='AES-GCM'"):
        P.load_distributed_checkpoint(None, files, B, A, dec_key=KEY, dec_mode="AES-CBC")
    with pytest.raises(tessera.CheckpointError, match="16, 24, 32 bytes"):
        P.load_distributed_checkpoint(None, files, B, A, dec_key=b"short")
    with pytest.raises(TypeError, match="dec_key"):
        P.load_distributed_checkpoint(None, files, B, A, dec_key="0123456789abcdef")
    with pytest.raises(ValueError, match="dec_mode"):
        P.load_distributed_checkpoint(None, files, B, A, dec_key=KEY, dec_mode="AES-XTS")
    with pytest.raises(ValueError, match="dec_key must be None"):
        P.load_distributed_checkpoint(None, predict_strategy=B, format="safetensors",
                                      unified_safetensors_dir=UNIFIED, dec_key=KEY)
    with pytest.raises(ValueError, match="dec_mode must be default"):
        P.load_distributed_checkpoint(None, predict_strategy=B, format="safetensors",
                                      unified_safetensors_dir=UNIFIED, dec_mode="AES-CBC")


def test_load_segmented_checkpoints_decrypts(tmp_path):
    seg = tmp_path / "seg"
    seg.mkdir()
    for f in sorted((CASE / "segmented").glob("*.ckpt")):
        _tessera.encrypt_checkpoint_file(str(f), str(seg / f.name), KEY[:16], "SM4-CBC")
    got = P.load_segmented_checkpoints(str(seg), dec_key=KEY[:16], dec_mode="SM4-CBC")
    _same_arrays(got, P.load_segmented_checkpoints(str(CASE / "segmented")))
    with pytest.raises(tessera.CheckpointError, match="encrypted"):
        P.load_segmented_checkpoints(str(seg))
    with pytest.raises(tessera.CheckpointError, match="not an encrypted"):
        P.load_segmented_checkpoints(str(CASE / "segmented"), dec_key=KEY[:16], dec_mode="SM4-CBC")


# ------------------------------------------------------------------------------------ fsync=False

def _set_files(directory):
    """Every file under ``directory`` (relative path → bytes), the set id blanked out: two
    writes of the same set differ in nothing else."""
    set_id = json.loads((directory / "tessera_set.json").read_text())["id"].encode()
    return {str(p.relative_to(directory)): p.read_bytes().replace(set_id, b"#")
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("output_format", ["ckpt", "safetensors"])
def test_fsync_false_converts_to_the_same_files(tmp_path, output_format):
    src = str(CASE / "src_ckpt")
    for fsync in (True, False):
        P.convert_checkpoints(src, str(tmp_path / str(fsync)), "checkpoint_", A, B,
                              output_format=output_format, fsync=fsync)
    durable = _set_files(tmp_path / "True")
    assert len(durable) == 6, sorted(durable)  # four ranks, the strategy B and the marker
    assert "strategy.json" in durable, sorted(durable)
    assert _set_files(tmp_path / "False") == durable


def test_fsync_false_on_the_other_writers(tmp_path):
    for fsync in (True, False):
        out = tmp_path / str(fsync)
        P.unified_safetensors(SRC_ST, A, str(out / "unified"), fsync=fsync)
        P.convert_checkpoint_by_rank(1, {r: FILES[r] for r in range(8)},
                                     str(out / "rank1.ckpt"), A, B, fsync=fsync)
        P.load_distributed_checkpoint(None, predict_strategy=B, format="safetensors",
                                      unified_safetensors_dir=UNIFIED,
                                      dst_safetensors_dir=str(out / "sliced"), fsync=fsync)
    for name in ("unified", "sliced"):
        assert _set_files(tmp_path / "False" / name) == _set_files(tmp_path / "True" / name)
    assert_same_file(tmp_path / "False/rank1.ckpt", tmp_path / "True/rank1.ckpt")
    with pytest.raises(TypeError, match="fsync"):
        P.convert_checkpoints(str(CASE / "src_ckpt"), str(tmp_path / "x"), "checkpoint_", A, B,
                              fsync=0)
