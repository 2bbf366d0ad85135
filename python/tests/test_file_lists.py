"""Per-rank file lists checked against the training strategy: ``load_distributed_checkpoint``'s
``checkpoint_filenames`` (exactly one file per training device, MindSpore's rule) and
``convert_checkpoint_by_rank``'s ``checkpoint_files_map`` (no rank past the devices, every
needed rank present); one file for two ranks only when they are replicas."""

import pytest

from tessera import parallel as P
from tessera.parallel import CheckpointError

from conftest import CASES

CASE = CASES / "case1_dp2mp4_to_2x2"  # trained on 8 devices, dev [2,4]
A = str(CASE / "strategy/A.ckpt")
B = str(CASE / "strategy/B.ckpt")


def _file(rank):
    return str(CASE / f"src_ckpt/rank_{rank}/checkpoint_{rank}.ckpt")


def _load(ranks, train=A):
    return P.load_distributed_checkpoint(None, [_file(r) for r in ranks], B, train, rank_id=0)


def test_all_eight_files_load():
    assert _load(range(8))


@pytest.mark.parametrize("ranks, given", [
    (range(6), "6 files given"),
    (range(1), "1 file given"),
    ([*range(8), 0], "9 files given"),
    ([], "0 files given"),
])
def test_a_list_of_another_length_is_refused(ranks, given):
    with pytest.raises(CheckpointError) as info:
        _load(ranks)
    text = str(info.value)
    assert isinstance(info.value, ValueError)  # MindSpore's exception type
    assert text.startswith("checkpoint_filenames:"), text
    assert given in text and "8 devices" in text and "8 needed" in text, text
    assert "A.ckpt" in text, text
    # About the list the caller gave, not about rank folders it never named.
    assert "holds no checkpoint file" not in text, text


def test_one_file_for_two_ranks_holding_different_slices_is_refused():
    with pytest.raises(CheckpointError, match="ranks 0 and 1 are given the same file"):
        _load([0, 0, 2, 3, 4, 5, 6, 7])


def test_without_a_training_strategy_the_list_is_one_file():
    with pytest.raises(CheckpointError, match=r"checkpoint_filenames: 2 files given.*exactly 1"):
        _load([0, 1], train=None)


def test_checkpoint_files_map_rank_past_the_devices_is_refused(tmp_path):
    out = tmp_path / "out.ckpt"
    files = {r: _file(r) for r in range(8)}
    files[8] = _file(0)
    with pytest.raises(CheckpointError, match=r"checkpoint_files_map: 9 files given.*8 devices"):
        P.convert_checkpoint_by_rank(0, files, str(out), A, B)
    assert not out.exists()


def test_checkpoint_files_map_missing_a_needed_rank_is_named(tmp_path):
    out = tmp_path / "out.ckpt"
    needed = P.rank_list_for_convert(0, A, B)
    files = {r: _file(r) for r in needed[:-1]}
    with pytest.raises(CheckpointError) as info:
        P.convert_checkpoint_by_rank(0, files, str(out), A, B)
    text = str(info.value)
    assert text.startswith("checkpoint_files_map:"), text
    assert f"needs source rank {needed[-1]}, which has no file" in text, text
    assert not out.exists()
    files[needed[-1]] = _file(needed[-1])
    P.convert_checkpoint_by_rank(0, files, str(out), A, B)
    assert out.exists()


def test_checkpoint_files_map_one_file_for_two_ranks_is_refused(tmp_path):
    files = {r: _file(r) for r in range(8)}
    files[5] = _file(4)
    with pytest.raises(CheckpointError, match="ranks 4 and 5 are given the same file"):
        P.convert_checkpoint_by_rank(0, files, str(tmp_path / "out.ckpt"), A, B)


def test_a_file_list_error_names_the_argument_in_its_attributes(tmp_path):
    # `file` was None: the culprit is the argument the message names, as `file` names the
    # culprit of every other CheckpointError.
    with pytest.raises(CheckpointError) as info:
        _load(range(6))
    rule = str(info.value)[len("checkpoint_filenames: "):]
    assert (info.value.file, info.value.tensor, info.value.rule) == (
        "checkpoint_filenames", None, rule)
    with pytest.raises(CheckpointError) as info:
        _load([0, 0, 2, 3, 4, 5, 6, 7])
    assert info.value.file == "checkpoint_filenames"
    assert "ranks 0 and 1 are given the same file" in info.value.rule
    files = {r: _file(r) for r in range(8)}
    files[8] = _file(0)
    with pytest.raises(CheckpointError) as info:
        P.convert_checkpoint_by_rank(0, files, str(tmp_path / "out.ckpt"), A, B)
    assert info.value.file == "checkpoint_files_map"
    assert info.value.rule.startswith("9 files given")
