"""One process per rank: a script run as ``tessera launch --nproc N -- python3 script.py`` trains
one N-device job (``communication.init()`` joins it) and gives, step for step, the losses of the
same script run alone on one device; an exception on one rank stops every rank with its
traceback. See launched.py for how the binary is found."""

import textwrap

import pytest

from launched import RESULT, require_launch, results, run

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
    from tessera.train import Callback, Model

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
    model.train(epoch=2, train_dataset=data, callbacks=[Boom()])
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


def test_an_exception_on_one_rank_stops_every_rank_with_its_traceback(script, tmp_path):
    job = run(script, 4, tmp_path, {"FAIL_RANK": "2"}, timeout=300)
    assert job.returncode != 0
    text = job.stdout + job.stderr
    assert "ValueError: boom on rank 2 at step 2" in text
    assert "Traceback" in text
    assert RESULT not in text  # no rank finished
