"""Beyond MindSpore: reshard_plan, layout_slices, verify_checkpoint and progress reporting."""

import shutil

import pytest

from tessera import parallel as P

from conftest import CASES

CASE = CASES / "case1_dp2mp4_to_2x2"
A, B = str(CASE / "strategy/A.ckpt"), str(CASE / "strategy/B.ckpt")


def _volume(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def test_reshard_plan_covers_every_box_from_the_minimal_ranks():
    plan = P.reshard_plan(A, B, src_checkpoints_dir=str(CASE / "src_ckpt"))
    assert [p["rank"] for p in plan] == [0, 1, 2, 3]
    for p in plan:
        assert p["source_ranks"] == P.rank_list_for_convert(p["rank"], A, B)
        assert p["minimal"] == "exact"
        assert p["params"]["net.w1"]["global_shape"] == [64, 32]
        for name, box in p["params"].items():
            # The pieces tile the destination box, and each is held by some source rank of
            # the minimal cover.
            assert sum(_volume(piece["shape"]) for piece in box["pieces"]) == _volume(box["shape"]), name
            for piece in box["pieces"]:
                assert set(piece["holders"]) & set(p["source_ranks"]), name
    # From the strategies alone (scale-free shapes), the same ranks and the same piece holders.
    one = P.reshard_plan(A, B, rank_id=2)
    assert len(one) == 1 and one[0]["rank"] == 2
    assert one[0]["source_ranks"] == plan[2]["source_ranks"]
    holders = lambda p: sorted(sorted(x["holders"]) for x in p["params"]["net.w1"]["pieces"])
    assert holders(one[0]) == holders(plan[2])


def test_layout_slices():
    layout = P.Layout((2, 4), ("dp", "mp"))
    got = P.layout_slices(layout(("dp", "mp"), "None"), (16, 4))
    assert got["split_factors"] == [8, 1] and got["replicas"] == 1
    assert [s["offset"] for s in got["slices"]] == [[2 * r, 0] for r in range(8)]
    assert all(s["shape"] == [2, 4] for s in got["slices"])
    got = P.layout_slices(layout("None", "mp"), [4, 8])
    assert got["replicas"] == 2 and got["slice_shape"] == [4, 2]
    assert got["slices"][5]["offset"] == [0, 2]  # rank 5 = (dp 1, mp 1)


def test_verify_checkpoint_reports_faults_as_data(tmp_path):
    ok = P.verify_checkpoint(str(CASE / "src_ckpt"), A, check_replicas=True)
    assert ok["ok"] and ok["files"] == 8 and not ok["faults"] and ok["replica_pairs"] > 0
    bad = tmp_path / "src"
    shutil.copytree(CASE / "src_ckpt", bad)
    (bad / "rank_3/checkpoint_3.ckpt").chmod(0o600)
    (bad / "rank_3/checkpoint_3.ckpt").write_bytes(b"")
    report = P.verify_checkpoint(str(bad), A)
    assert not report["ok"]
    assert any(f["file"].endswith("checkpoint_3.ckpt") and f["rule"] for f in report["faults"])


def test_progress_callback_sees_every_byte(tmp_path):
    events = []
    P.convert_checkpoints(str(CASE / "src_ckpt"), str(tmp_path / "out"), "c_", A, B,
                          progress=lambda *e: events.append(e))
    starts = [e for e in events if e[0] == "start"]
    assert len(starts) == 1 and starts[0][2] > 0
    advanced = sum(e[2] for e in events if e[0] == "advance")
    assert advanced == starts[0][2]
    assert events[-1][0] == "finish"


def test_progress_true_draws_a_tqdm_bar(tmp_path, capsys):
    pytest.importorskip("tqdm")
    P.convert_checkpoints(str(CASE / "src_ckpt"), str(tmp_path / "out"), "c_", A, B, progress=True)
    assert "converting" in capsys.readouterr().err


def test_progress_must_be_callable(tmp_path):
    with pytest.raises(TypeError):
        P.convert_checkpoints(str(CASE / "src_ckpt"), str(tmp_path / "out"), "c_", A, B, progress=3)


class _Boom:
    """A progress callable raising ``error`` at the ``nth`` event named ``event``."""

    def __init__(self, event, error, nth=1):
        self.event, self.error, self.nth = event, error, nth
        self.events = []

    def __call__(self, event, label, value):
        self.events.append(event)
        if event == self.event and self.events.count(event) == self.nth:
            raise self.error


@pytest.mark.parametrize("event", ["start", "advance", "file"])
@pytest.mark.parametrize("error", [KeyboardInterrupt("stop"), ZeroDivisionError("bug")])
@pytest.mark.parametrize("fmt,fsync", [("ckpt", True), ("safetensors", False)])
def test_progress_exception_stops_the_conversion_and_is_raised(tmp_path, event, error, fmt,
                                                               fsync):
    # The first exception of the callable stops the conversion (no further event), reaches
    # the caller as itself (KeyboardInterrupt included), and nothing is written.
    # Safetensors without fsync writes two files at once (worker threads).
    boom = _Boom(event, error, nth=2 if event == "file" else 1)
    with pytest.raises(type(error)) as raised:
        P.convert_checkpoints(str(CASE / "src_ckpt"), str(tmp_path / "out"), "c_", A, B,
                              output_format=fmt, progress=boom, fsync=fsync)
    assert raised.value is error
    assert boom.events.count(event) == boom.nth and boom.events[-1] == event
    assert list(tmp_path.iterdir()) == [], "nothing written, no staging left"


def test_progress_exception_keeps_the_replaced_output(tmp_path):
    # With force=True the old output is replaced only at the commit: stopped before it, the
    # old output stays as it was.
    out = tmp_path / "out"
    P.convert_checkpoints(str(CASE / "src_ckpt"), str(out), "c_", A, None, progress=False)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(KeyboardInterrupt):
        P.convert_checkpoints(str(CASE / "src_ckpt"), str(out), "c_", A, B, force=True,
                              progress=_Boom("advance", KeyboardInterrupt()))
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_progress_exception_stops_the_other_writers(tmp_path):
    files = {s: str(CASE / f"src_ckpt/rank_{s}/checkpoint_{s}.ckpt") for s in range(8)}
    with pytest.raises(ZeroDivisionError):
        P.convert_checkpoint_by_rank(0, files, str(tmp_path / "r0.ckpt"), A, B,
                                     progress=_Boom("advance", ZeroDivisionError()))
    with pytest.raises(KeyboardInterrupt):
        P.unified_safetensors(str(CASE / "src_ckpt"), A, str(tmp_path / "unified"),
                              progress=_Boom("advance", KeyboardInterrupt()))
    assert list(tmp_path.iterdir()) == []
