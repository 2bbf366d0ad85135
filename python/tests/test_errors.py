"""Bad input raises MindSpore's exception types, and checkpoint errors name the file, the
tensor and the rule broken; nothing on disk is damaged."""

import shutil

import pytest

import tessera
from tessera import parallel as P

from conftest import CASES

CASE = CASES / "case1_dp2mp4_to_2x2"
A, B = str(CASE / "strategy/A.ckpt"), str(CASE / "strategy/B.ckpt")


def test_exception_classes():
    assert issubclass(tessera.CheckpointError, ValueError)
    assert issubclass(tessera.CheckpointIOError, OSError)
    assert issubclass(tessera.ConfigError, ValueError)
    assert P.CheckpointError is tessera.CheckpointError


@pytest.mark.parametrize("call,kind", [
    (lambda: P.rank_list_for_convert("0", A, B), TypeError),
    (lambda: P.rank_list_for_convert(True, A, B), TypeError),
    (lambda: P.rank_list_for_convert(-1, A, B), ValueError),
    (lambda: P.rank_list_for_convert(0, 42, B), TypeError),
    (lambda: P.convert_checkpoints(str(CASE), "/tmp/x", 7, A, B), TypeError),
    (lambda: P.convert_checkpoints(str(CASE), "/tmp/x", "c_", A, B, output_format="npz"), ValueError),
    (lambda: P.convert_checkpoints(str(CASE), "/tmp/x", "c_", A, B, process_num=0), ValueError),
    (lambda: P.convert_checkpoints(str(CASE), "/tmp/x", "c_", None, None), ValueError),
    (lambda: P.convert_checkpoint_by_rank(0, {0: A}, "/tmp/x.ckpt", None, None), ValueError),
    (lambda: P.convert_checkpoint_by_rank(0, [A], "/tmp/x.ckpt", A, B), TypeError),
    (lambda: P.unified_safetensors(str(CASE), A, "/tmp/x", file_suffix=11), TypeError),
    (lambda: P.unified_safetensors(str(CASE), A, "/tmp/x", split_dst_file=(2, 1)), ValueError),
    (lambda: P.load_distributed_checkpoint(object(), predict_strategy=B), TypeError),
    (lambda: P.load_distributed_checkpoint(None, predict_strategy={"w": []}), ValueError),
    (lambda: P.load_distributed_checkpoint(None, predict_strategy=B, dec_key="k"), TypeError),
    (lambda: P.load_segmented_checkpoints(str(CASE), net=object()), TypeError),
    (lambda: P.Layout([2, 4], ("dp", "mp")), TypeError),
    (lambda: P.Layout((2, 4), ["dp", "mp"]), TypeError),
    (lambda: P.Layout((2, 4), ("dp", 1)), TypeError),
    (lambda: P.Layout((2, 4), ("dp", "mp"), rank_list=(0, 1)), TypeError),
    # MindSpore looks the entry up in alias_name: "The axis 1 is not found in ...", a ValueError
    (lambda: P.Layout((2, 4), ("dp", "mp"))(1), ValueError),
    (lambda: P.layout_slices("not a layout", (4, 4)), TypeError),
    (lambda: P.layout_slices(P.Layout((2, 4), ("dp", "mp"))("dp", "mp"), (3, 4)), ValueError),
])
def test_bad_arguments(call, kind):
    with pytest.raises(kind):
        call()


def test_missing_directory_is_an_os_error_naming_it(tmp_path):
    with pytest.raises(tessera.CheckpointIOError) as err:
        P.convert_checkpoints(str(tmp_path / "nowhere"), str(tmp_path / "out"), "c_", A, B)
    assert err.value.file == str(tmp_path / "nowhere")
    assert err.value.tensor is None and "failed" in err.value.rule


def test_corrupt_strategy_names_the_file(tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"\xff\xff\xff garbage")
    with pytest.raises(tessera.CheckpointError) as err:
        P.rank_list_for_convert(0, str(bad), B)
    assert err.value.file == str(bad) and err.value.rule


def test_truncated_checkpoint_names_file_and_tensor(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(CASE / "src_ckpt", src)
    victim = src / "rank_0/checkpoint_0.ckpt"
    data = victim.read_bytes()
    victim.chmod(0o600)
    victim.write_bytes(data[: len(data) - 40])
    with pytest.raises(tessera.CheckpointError) as err:
        P.convert_checkpoints(str(src), str(tmp_path / "out"), "c_", A, B)
    assert err.value.file == str(victim)
    assert err.value.rule
    assert not (tmp_path / "out").exists(), "nothing is written when planning fails"


def test_existing_output_is_kept_unless_forced(tmp_path):
    files = {s: str(CASE / f"src_ckpt/rank_{s}/checkpoint_{s}.ckpt") for s in range(8)}
    out = tmp_path / "mine.ckpt"
    out.write_bytes(b"a file the user owns")
    with pytest.raises(tessera.CheckpointError) as err:
        P.convert_checkpoint_by_rank(0, files, str(out), A, B)
    assert err.value.file == str(out) and "force" in str(err.value)
    # Python's switch is force=True (the library's wording is the command line's --force).
    assert "pass force=True" in str(err.value) and "--force" not in str(err.value)
    assert "force=True" in err.value.rule
    assert out.read_bytes() == b"a file the user owns"
    P.convert_checkpoint_by_rank(0, files, str(out), A, B, force=True)
    assert out.stat().st_size > 100


def test_rank_outside_the_destination(tmp_path):
    files = {s: str(CASE / f"src_ckpt/rank_{s}/checkpoint_{s}.ckpt") for s in range(8)}
    with pytest.raises(tessera.CheckpointError) as err:
        P.convert_checkpoint_by_rank(9, files, str(tmp_path / "o.ckpt"), A, B)
    assert "rank 9 is not a destination rank" in err.value.rule
    assert not (tmp_path / "o.ckpt").exists()


def test_layout_messages_are_mindsporess():
    with pytest.raises(ValueError, match="The axis xx is not found in"):
        P.Layout((2, 4), ("dp", "mp"))("xx")
    with pytest.raises(ValueError, match="The tensor_map of layout is None"):
        P.Layout((2, 4), ("dp", "mp")).to_dict()


@pytest.mark.parametrize("rank", [2**63, 2**64, 10**30])
def test_huge_rank_is_refused_naming_the_argument(rank):
    # It was an OverflowError from the binding ("int too big to convert"), naming nothing.
    with pytest.raises(ValueError, match=r"For 'rank_id', the value must be at most 2\*\*63 - 1"):
        P.rank_list_for_convert(rank, A, B)
    with pytest.raises(ValueError, match="'rank_id'"):
        P.convert_checkpoint_by_rank(rank, {0: A}, "/tmp/never-written.ckpt", A, B)


@pytest.mark.parametrize("name", ["empty.ckpt", "empty.safetensors"])
def test_empty_checkpoint_file_is_named(tmp_path, name):
    # A 0-byte .ckpt read as a checkpoint with no tensor: the error was about rank 0 and the
    # destination strategy, naming neither the file nor that it is empty.
    empty = tmp_path / name
    empty.write_bytes(b"")
    with pytest.raises(tessera.CheckpointError) as err:
        tessera.load_checkpoint(str(empty))
    assert err.value.file == str(empty) and "empty (0 bytes)" in str(err.value)
    with pytest.raises(tessera.CheckpointError, match="empty"):
        P.load_distributed_checkpoint(None, [str(empty)])
