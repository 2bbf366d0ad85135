"""Findings of the MindSpore differentials (``scripts/mindspore-diff.py``), pinned on the
reference files MindSpore wrote (``tests/fixtures/mindspore/cases``), so CI checks them
without MindSpore.

MindSpore 2.10's CPU wheel cannot run sharded (semi-auto / auto parallel) training at all
("Invalid communication backend: CPU for semi_auto_parallel/auto_parallel mode", see
docs/MINDSPORE_DIFFERENCES.md), so the differentials compare the checkpoint side only."""

import json

import numpy as np
import pytest

import tessera
from tessera import parallel as P

from conftest import CASES

CASE = CASES / "case1_dp2mp4_to_2x2"
A = str(CASE / "strategy/A.ckpt")


def _files(kind, ext):
    return [str(CASE / f"{kind}/rank_{r}/checkpoint_{r}.{ext}") for r in range(8)]


def test_load_distributed_refuses_a_parameter_no_file_holds():
    # MindSpore's safetensors sources of case1 lack net.bf, which strategy A lists. The load
    # returned every other tensor and silently left net.bf out, where convert_checkpoint_by_rank
    # of the same files refuses naming it (docs/PYTHON.md, "A source strategy parameter that no
    # source file holds is an error ... unless allow_missing=True").
    with pytest.raises(tessera.CheckpointError) as err:
        P.load_distributed_checkpoint(None, _files("src_safetensors", "safetensors"), None, A)
    assert err.value.tensor == "net.bf" and "allow-missing" in err.value.rule
    got = P.load_distributed_checkpoint(None, _files("src_safetensors", "safetensors"), None, A,
                                        allow_missing=True)
    assert "net.bf" not in got
    full = P.load_distributed_checkpoint(None, _files("src_ckpt", "ckpt"), None, A)
    assert sorted(got) == sorted(n for n in full if n != "net.bf")
    for name, value in got.items():
        assert np.array_equal(value, full[name]), name


def test_allow_missing_is_a_flag():
    with pytest.raises(TypeError, match="For 'allow_missing', the type must be bool"):
        P.load_distributed_checkpoint(None, _files("src_ckpt", "ckpt"), None, A,
                                      allow_missing="yes")


def test_load_distributed_reads_a_deduplicated_set_with_an_empty_rank(tmp_path):
    # A deduplicated .ckpt set (MindSpore's save_checkpoint(remove_redundancy=True), or
    # `tessera ckpt dedup`) has an empty (0-byte) file for a rank that owns nothing: every
    # tensor of case1 replicated on 8 ranks, saved by rank 0 only. The load refused the set,
    # naming the empty file, although `tessera ckpt convert` merges it.
    full = P.load_distributed_checkpoint(None, _files("src_ckpt", "ckpt"), None, A)
    items = {n: {"dev_matrix": [8], "tensor_map": [-1] * v.ndim, "tensor_shape": list(v.shape),
                 "field": 0, "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}
             for n, v in full.items() if n != "global_step"}
    strategy = tmp_path / "replicated.json"
    strategy.write_text(json.dumps({
        "current_stage": 1,
        "parallel_strategy_item": {"Default/network-Net/MatMul-op0":
                                   {"stage": 0, "parallel_strategy": [[1, 1]]}},
        "parallel_layout_item": items}))
    files = []
    for r in range(8):
        f = tmp_path / f"rank_{r}.ckpt"
        if r == 0:
            tessera.save_checkpoint({n: v.astype(np.float32) if v.dtype == np.float16 else v
                                     for n, v in full.items()}, str(f))
        else:
            f.write_bytes(b"")
        files.append(str(f))
    got = P.load_distributed_checkpoint(None, files, None, str(strategy))
    assert sorted(got) == sorted(full)
    for name, value in got.items():
        assert np.array_equal(value.astype(np.float64), full[name].astype(np.float64)), name
    # a set that lacks what it needs names its empty files
    (tmp_path / "rank_0.ckpt").write_bytes(b"")
    with pytest.raises(tessera.CheckpointError) as err:
        P.load_distributed_checkpoint(None, files, None, str(strategy))
    assert err.value.file == files[0] and "empty (0 bytes)" in err.value.rule
