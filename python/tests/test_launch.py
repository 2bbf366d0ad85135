"""One process per rank: a script run as ``tessera launch --nproc N -- python3 script.py`` trains
one N-device job (``communication.init()`` joins it) and gives, step for step, the losses of the
same script run alone on one device; an exception on one rank stops every rank with its
traceback. See launched.py for how the binary is found."""

import textwrap

import pytest

import tessera

from launched import REPO, RESULT, require_launch, results, run

# A network with AutoParallel's switches: 2 pipeline stages × 2 data-parallel ranks, hsdp, 4
# micro-batches, the gradient mean. It prints one RESULT line per rank.
SCRIPT = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    import tessera as ms
    import tessera.dataset as ds
    from tessera import nn
    from tessera.communication import init, get_rank, get_group_size
    from tessera.parallel.auto_parallel import AutoParallel
    from tessera.parallel.nn import Pipeline
    from tessera.train import Callback, CheckpointConfig, Model, ModelCheckpoint

    if os.environ.get("DETERMINISTIC") == "1":
        ms.set_context(deterministic="ON")
    init()
    ms.set_seed(3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 16)).astype(np.float32)
    y = rng.integers(0, 10, 256).astype(np.int32)
    data = ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=True).batch(32)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.layer1 = nn.Dense(16, 64, activation="relu")
            self.layer2 = nn.Dense(64, 10)

        def construct(self, x):
            return self.layer2(self.layer1(x))

    class Boom(Callback):
        def on_train_step_end(self, run_context):
            step = run_context.original_args().cur_step_num
            if str(get_rank()) == os.environ.get("FAIL_RANK") and step == 2:
                raise ValueError(f"boom on rank {get_rank()} at step {step}")

    net = Net()
    opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    wl = Pipeline(nn.WithLossCell(net, loss), 4,
                  stage_config={"_backbone.layer1": 0, "_backbone.layer2": 1})
    p = AutoParallel(wl, parallel_mode="semi_auto")
    p.hsdp(threshold=0)
    p.pipeline(stages=2)
    p.enable_gradients_mean()
    p.save_param_strategy_file(os.path.abspath(f"param_{get_rank()}.ckpt"))
    p.set_group_ckpt_save_file(os.path.abspath(f"group_{get_rank()}.ckpt"))
    model = Model(network=p, optimizer=opt)
    callbacks = [Boom()]
    if os.environ.get("CKPT") == "1":
        config = CheckpointConfig(save_checkpoint_steps=4, keep_checkpoint_max=2)
        callbacks.append(ModelCheckpoint("net", os.path.abspath("ckpts"), config))
    model.train(epoch=2, train_dataset=data, callbacks=callbacks)
    print("RESULT " + json.dumps({"rank": get_rank(), "size": get_group_size(),
                                  "losses": model.losses,
                                  "w": float(net.layer2.weight.asnumpy().sum())}), flush=True)
''')


@pytest.fixture
def script(tmp_path):
    require_launch()
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.parametrize("deterministic", [False, True])
def test_four_ranks_give_one_devices_losses(script, tmp_path, deterministic):
    env = {"DETERMINISTIC": "1" if deterministic else "0"}
    alone = run(script, None, tmp_path, env)
    assert alone.returncode == 0, alone.stderr
    one = results(alone)[0]
    assert one["size"] == 1 and len(one["losses"]) == 16
    job = run(script, 4, tmp_path, env)
    assert job.returncode == 0, job.stdout + job.stderr
    ranks = results(job)
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, r in ranks.items():
        assert r["size"] == 4
        if deterministic:
            assert r["losses"] == one["losses"], rank
            assert r["w"] == one["w"]
        else:
            assert r["losses"] == pytest.approx(one["losses"], abs=1e-5), rank
            assert r["w"] == pytest.approx(one["w"], abs=1e-4)
    # Each rank wrote the strategy and group-info files it was asked for, at exactly that path.
    for rank in range(4):
        assert (tmp_path / f"param_{rank}.ckpt").stat().st_size > 0
        assert (tmp_path / f"group_{rank}.ckpt").stat().st_size > 0
    assert not list(tmp_path.glob("group_*_*.ckpt"))


def test_model_checkpoint_under_the_launcher_keeps_the_newest_sets(script, tmp_path):
    job = run(script, 4, tmp_path, {"CKPT": "1"})
    assert job.returncode == 0, (job.stdout + job.stderr)[-3000:]
    # 16 steps (2 epochs of 8), a set every 4: the newest two are steps 12 and 16.
    assert sorted(p.name for p in (tmp_path / "ckpts").iterdir()) == ["net-2_4", "net-2_8"]
    weights = tessera.load_checkpoint(str(tmp_path / "ckpts" / "net-2_8"))
    final = results(job)[0]["w"]
    assert float(weights["layer2.weight"].asnumpy().sum()) == pytest.approx(final, abs=1e-6)


def test_an_exception_on_one_rank_stops_every_rank_with_its_traceback(script, tmp_path):
    job = run(script, 4, tmp_path, {"FAIL_RANK": "2"}, timeout=300)
    assert job.returncode != 0
    text = job.stdout + job.stderr
    assert "ValueError: boom on rank 2 at step 2" in text
    assert "Traceback" in text
    assert RESULT not in text  # no rank finished


FLAGSHIP = REPO / "python" / "examples" / "autoparallel_flagship.py"
MINDSPORE_FLAGSHIP_IMPORTS = (
    "import mindspore as ms", "import mindspore.dataset as ds", "from mindspore import",
    "from mindspore.communication", "from mindspore.common.initializer",
    "from mindspore.parallel", "from mindspore.train", "from mindspore.nn.utils")


def _loss_lines(text):
    """``(epoch, step, loss)`` of every LossMonitor line of rank 0 (or of the lone process)."""
    out = []
    for line in text.splitlines():
        if line.startswith("[worker "):
            if not line.startswith("[worker 0] "):
                continue
            line = line[len("[worker 0] "):]
        if line.startswith("epoch: ") and ", loss is " in line:
            head, loss = line.split(", loss is ")
            epoch, step = head[len("epoch: "):].split(" step: ")
            out.append((int(epoch), int(step), float(loss)))
    return out


def test_the_flagship_example_differs_from_mindsporess_only_in_its_imports():
    ours = FLAGSHIP.read_text().splitlines()
    theirs = [line.replace("tessera", "mindspore") for line in ours]
    changed = [a for a, b in zip(ours, theirs) if a != b]
    assert changed and all(line.startswith(MINDSPORE_FLAGSHIP_IMPORTS) for line in
                           (c.replace("tessera", "mindspore") for c in changed)), changed


@pytest.mark.parametrize("deterministic", [False, True])
def test_the_flagship_example_on_eight_ranks_gives_one_devices_losses(tmp_path, deterministic):
    require_launch()
    script = tmp_path / "flagship.py"
    text = FLAGSHIP.read_text()
    if deterministic:  # one added line, after the context MindSpore's script sets
        text = text.replace("ms.set_context(mode=ms.GRAPH_MODE)",
                            "ms.set_context(mode=ms.GRAPH_MODE)\nms.set_context("
                            "deterministic=\"ON\")", 1)
    script.write_text(text)
    env = {"DATA_PATH": str(REPO / "data" / "digits28")}
    alone = run(script, None, tmp_path, env)
    assert alone.returncode == 0, alone.stderr[-3000:]
    job = run(script, 8, tmp_path, env)
    assert job.returncode == 0, (job.stdout + job.stderr)[-3000:]
    one, eight = _loss_lines(alone.stdout), _loss_lines(job.stdout)
    # 1,760 samples in batches of 32, 2 epochs.
    assert len(one) == 110 and [s[:2] for s in eight] == [s[:2] for s in one]
    if deterministic:
        assert [s[2] for s in eight] == [s[2] for s in one]
    else:
        assert [s[2] for s in eight] == pytest.approx([s[2] for s in one], abs=1e-5)
    assert one[-1][2] < one[0][2] / 2  # it learns
    # ops.Print printed at every micro-batch of every step: on one device 4 accumulated
    # micro-batches per step; on 8 ranks each of stage 0's 4 ranks prints its share of each.
    assert alone.stdout.count("out is:") == 110 * 4
    assert job.stdout.count("out is:") == 110 * 4 * 4
