"""``parallel.auto_parallel.AutoParallel`` and ``parallel.nn``: every switch MindSpore 2.10's class
has, each checked as MindSpore checks it and each changing what the engine does; ``shard`` with
``Layout``s and ``out_strategy``; the ``Pipeline`` wrapper's stage names. Ranks run as threads
of this process (``set_auto_parallel_context(device_num=N)``)."""

import inspect
import json
import os

import numpy as np
import pytest

import tessera
from tessera import dataset as ds
from tessera import nn
from tessera.parallel import Layout
from tessera.parallel.auto_parallel import AutoParallel
from tessera.parallel.nn import GradAccumulation, MicroBatchInterleaved, Pipeline
from tessera.train import Model

from nets import MLP, fresh_context  # noqa: F401 (the fixture is used by name)

pytestmark = pytest.mark.usefixtures("fresh_context")


def _data(n=128, batch=32):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 64)).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(batch)


def _loss():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def _train(devices, net=None, setup=None, wrap=None, epochs=1):
    """Losses of ``net`` (an MLP by default) wrapped in AutoParallel, on ``devices`` ranks;
    ``setup(parallel_net)`` calls switches, ``wrap(with_loss)`` adds wrappers."""
    tessera.set_seed(5)
    tessera.set_auto_parallel_context(device_num=devices)
    net = net or MLP(64)
    inner = nn.WithLossCell(net, _loss())
    if wrap is not None:
        inner = wrap(inner)
    parallel_net = AutoParallel(inner, parallel_mode="semi_auto")
    if setup is not None:
        setup(parallel_net)
    model = Model(parallel_net, optimizer=nn.Momentum(net.trainable_params(), 0.05, 0.9))
    model.train(epochs, _data())
    return model.losses


SWITCHES = {
    "comm_fusion": ["config"],
    "dataset_strategy": ["config"],
    "disable_gradient_fp32_sync": [],
    "disable_loss_repeated_mean": [],
    "disable_strategy_file_only_for_trainable_params": [],
    "dump_local_norm": ["file_path"],
    "enable_device_local_norm": [],
    "enable_fp32_communication": [],
    "enable_gradients_mean": [],
    "hsdp": ["shard_size", "threshold", "optimizer_level"],
    "load_operator_strategy_file": ["file_path"],
    "load_param_strategy_file": ["file_path"],
    "no_init_parameters_in_compile": [],
    "pipeline": ["stages", "output_broadcast", "interleave", "scheduler"],
    "print_local_norm": [],
    "save_operator_strategy_file": ["file_path"],
    "save_param_strategy_file": ["file_path"],
    "set_group_ckpt_save_file": ["file_path"],
    "transformer_opt": ["file_path"],
}


def test_every_switch_has_mindsporess_parameters():
    assert list(inspect.signature(AutoParallel).parameters) == ["network", "parallel_mode"]
    assert inspect.signature(AutoParallel).parameters["parallel_mode"].default == "semi_auto"
    for name, params in SWITCHES.items():
        assert list(inspect.signature(getattr(AutoParallel, name)).parameters)[1:] == params, name
    hsdp = inspect.signature(AutoParallel.hsdp).parameters
    assert (hsdp["shard_size"].default, hsdp["threshold"].default,
            hsdp["optimizer_level"].default) == (-1, 64, "level1")
    pipe = inspect.signature(AutoParallel.pipeline).parameters
    assert (pipe["stages"].default, pipe["scheduler"].default) == (1, "1f1b")


def test_switches_check_types_and_values_as_mindspore_does():
    p = AutoParallel(nn.WithLossCell(MLP(64), _loss()))
    with pytest.raises(ValueError, match="parallel_mode"):
        AutoParallel(p.network, parallel_mode="auto")
    with pytest.raises(TypeError, match="network must be a Cell"):
        AutoParallel(lambda x: x)
    with pytest.raises(ValueError, match="shard_size must be a positive integer or -1, but got 0"):
        p.hsdp(shard_size=0)
    with pytest.raises(ValueError, match="threshold must be a positive integer or 0"):
        p.hsdp(threshold=-1)
    with pytest.raises(ValueError, match="Optimizer level"):
        p.hsdp(optimizer_level="level4")
    with pytest.raises(TypeError, match="shard_size must be an int"):
        p.hsdp(shard_size="8")
    with pytest.raises(ValueError, match="stages must be > 0"):
        p.pipeline(stages=0)
    with pytest.raises(ValueError, match="scheduler"):
        p.pipeline(stages=2, scheduler="fifo")
    with pytest.raises(ValueError, match="dataset_strategy"):
        p.dataset_strategy("model_parallel")
    with pytest.raises(TypeError, match="file_path must be a str"):
        p.save_param_strategy_file(3)
    with pytest.raises(KeyError, match="allgatherv"):
        p.comm_fusion({"allgatherv": {"mode": "auto", "config": None}})


def test_gradients_are_summed_over_replicas_unless_gradients_mean_is_on():
    one = _train(1)
    mean = _train(4, setup=lambda p: p.enable_gradients_mean())
    summed = _train(4)  # MindSpore's default: the sum over the 4 data-parallel replicas
    assert mean == pytest.approx(one, abs=1e-5)
    assert summed[0] == pytest.approx(one[0], abs=1e-5)  # the first step's loss precedes updates
    assert abs(summed[1] - one[1]) > 1e-3


def test_hsdp_pipeline_and_fusion_keep_one_devices_losses():
    one = _train(1)

    def setup(p):
        p.enable_gradients_mean()
        p.hsdp(threshold=0, optimizer_level="level2")
        p.comm_fusion({"openstate": True, "allreduce": {"mode": "size", "config": 1}})

    assert _train(4, setup=setup) == pytest.approx(one, abs=1e-5)

    def staged(p):
        p.enable_gradients_mean()
        p.pipeline(stages=2, scheduler="gpipe")

    def wrap(w):
        return Pipeline(w, 2, stage_config={"_backbone.fc1": 0, "_backbone.fc2": 1})

    assert _train(4, setup=staged, wrap=wrap) == pytest.approx(one, abs=1e-5)
    assert _train(4, setup=lambda p: p.enable_gradients_mean(),
                  wrap=lambda w: GradAccumulation(w, 2)) == pytest.approx(one, abs=1e-5)
    assert _train(2, setup=lambda p: p.enable_gradients_mean(),
                  wrap=lambda w: MicroBatchInterleaved(w, 2)) == pytest.approx(one, abs=1e-5)


def test_a_stage_config_naming_a_missing_cell_is_an_error():
    def wrap(w):
        return Pipeline(w, 2, stage_config={"_backbone.fc9": 0})

    with pytest.raises(ValueError, match=r"'_backbone\.fc9'.*_backbone\.fc1"):
        _train(4, setup=lambda p: p.pipeline(stages=2), wrap=wrap)


def test_layout_strategies_and_out_strategy_equal_tuple_strategies():
    def tuples():
        net = MLP(64)
        net.fc1.matmul.shard(((2, 1), (4, 1)))
        return net

    def layouts():
        net = MLP(64)
        layout = Layout((2, 4), ("dp", "mp"))
        net.fc1.matmul.shard((layout("dp", "None"), layout("mp", "None")),
                             out_strategy=(layout("dp", "mp"),))
        return net

    setup = lambda p: p.enable_gradients_mean()  # noqa: E731
    one = _train(1)
    assert _train(8, net=tuples(), setup=setup) == pytest.approx(one, abs=1e-5)
    assert _train(8, net=layouts(), setup=setup) == pytest.approx(one, abs=1e-5)
    # The Layouts reach the engine: a device matrix of 4 on 8 devices is its error.
    wrong = MLP(64)
    small = Layout((2, 2), ("dp", "mp"))
    wrong.fc1.matmul.shard((small("dp", "None"), small("mp", "None")))
    with pytest.raises(tessera.ConfigError) as err:
        _train(8, net=wrong, setup=setup)
    assert "8" in str(err.value) and "4" in str(err.value)
    net = MLP(64)
    with pytest.raises(TypeError, match="mixes tuples and Layouts"):
        net.fc1.matmul.shard(((2, 1), Layout((2, 4), ("dp", "mp"))("mp", "None")))
    with pytest.raises(ValueError, match="out_strategy needs an in_strategy"):
        net.fc1.matmul.shard(out_strategy=((2, 1),))


def test_norms_group_info_and_strategy_files_are_written(tmp_path):
    norms = tmp_path / "norms"
    groups = tmp_path / "groups" / "comm_group.ckpt"
    strategy = tmp_path / "param.ckpt"

    def setup(p):
        p.enable_gradients_mean()
        p.dump_local_norm(str(norms))
        p.enable_device_local_norm()
        p.set_group_ckpt_save_file(str(groups))
        p.save_param_strategy_file(str(strategy))

    _train(2, setup=setup)
    dump = json.loads((norms / "rank_1" / "local_norm_step_1.json").read_text())
    local = [p["local_norm"] for p in dump["params"]]
    assert dump["device_local_norm"] == pytest.approx(float(np.sqrt(np.sum(np.square(local)))))
    assert sorted(os.listdir(groups.parent)) == ["comm_group_0.ckpt", "comm_group_1.ckpt"]
    assert strategy.read_bytes()[:1]  # MindSpore's protobuf, non-empty
    summary = tessera.parallel.build_searched_strategy(str(strategy))
    assert "fc1.weight" in summary


def test_device_local_norm_needs_dump_local_norm():
    def setup(p):
        p.enable_device_local_norm()

    with pytest.raises(ValueError, match="dump_local_norm"):
        _train(2, setup=setup)


def test_transformer_opt_sets_the_overlaps_the_engine_has_and_refuses_the_rest(tmp_path):
    p = AutoParallel(nn.WithLossCell(MLP(64), _loss()))
    good = tmp_path / "speed_up.json"
    good.write_text(json.dumps({"grad_computation_allreduce_overlap": True,
                                "enable_concat_eliminate_opt": False}))
    p.transformer_opt(str(good))
    assert p._keys["parallel"]["overlap"] == {"grad_computation_allreduce_overlap": True}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"interleaved_matmul_comm": True}))
    with pytest.raises(ValueError, match="interleaved_matmul_comm.*not supported"):
        p.transformer_opt(str(bad))
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"make_it_fast": True}))
    with pytest.raises(ValueError, match="unknown key 'make_it_fast'"):
        p.transformer_opt(str(unknown))


def test_an_engine_refusal_names_the_key():
    # hsdp's shard_size must divide the devices: the engine's rule, with its key.
    with pytest.raises(tessera.ConfigError, match="shard_size"):
        _train(4, setup=lambda p: p.hsdp(shard_size=3, threshold=0))


def test_no_init_parameters_trains_the_same():
    one = _train(1)
    with nn.utils.no_init_parameters():
        net = MLP(64)
    assert all(p._deferred for p in net.trainable_params())
    assert _train(1, net=net) == one


@pytest.mark.parametrize("mode", ["sharding_propagation", "recursive_programming"])
def test_the_search_modes_train_as_one_device_and_save_their_strategies(mode, tmp_path):
    one = _train(1)
    saved = tmp_path / "ops.json"
    net = MLP(64)
    if mode == "sharding_propagation":
        net.fc1.matmul.shard(((2, 1), (2, 1)))  # the anchor propagation starts from

    tessera.set_seed(5)
    tessera.set_auto_parallel_context(device_num=4)
    parallel_net = AutoParallel(nn.WithLossCell(net, _loss()), parallel_mode=mode)
    parallel_net.enable_gradients_mean()
    parallel_net.save_operator_strategy_file(str(saved))
    model = Model(parallel_net, optimizer=nn.Momentum(net.trainable_params(), 0.05, 0.9))
    model.train(1, _data())
    assert model.losses == pytest.approx(one, abs=1e-5)
    found = json.loads(saved.read_text())
    assert "fc1.matmul" in json.dumps(found)


def test_parameter_broadcast_and_shared_parameter_sync():
    from tessera.parallel import parameter_broadcast, sync_pipeline_shared_parameters
    from tessera.train import engine_config

    net = MLP(64)
    parallel_net = AutoParallel(nn.WithLossCell(net, _loss()))
    parameter_broadcast(parallel_net, {})
    parts = engine_config.unwrap(parallel_net)
    config = engine_config.engine_config(
        parts, nn.Momentum(net.trainable_params(), 0.05, 0.9), {}, epochs=1, output_dir="out",
        resume_from=None, devices=4, deferred_init=False)
    assert config["train"]["parameter_broadcast"] is True
    # A run with it trains as one device (the broadcast of equal values changes nothing).
    one = _train(1)
    assert _train(4, setup=lambda p: (p.enable_gradients_mean(),
                                      parameter_broadcast(p, None))) == pytest.approx(one, abs=1e-5)
    with pytest.raises(ValueError, match="initial_rank=2"):
        parameter_broadcast(parallel_net, None, initial_rank=2)
    with pytest.raises(TypeError, match="layout must be a dict"):
        parameter_broadcast(parallel_net, [1])
    sync_pipeline_shared_parameters(parallel_net)
    with pytest.raises(TypeError, match="must be a Cell"):
        sync_pipeline_shared_parameters("net")


def test_the_param_strategy_file_target_is_checked_before_training(tmp_path):
    parallel_net = AutoParallel(nn.WithLossCell(MLP(64), _loss()))
    with pytest.raises(ValueError, match="save_param_strategy_file: .* is a directory"):
        parallel_net.save_param_strategy_file(str(tmp_path))
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="save_param_strategy_file: .* is not a directory"):
        parallel_net.save_param_strategy_file(str(tmp_path / "file" / "sub" / "s.ckpt"))
    target = tmp_path / "later" / "strategy.ckpt"

    def setup(p):
        p.save_param_strategy_file(str(target))  # its directory can be made
        target.mkdir(parents=True)  # but then the path becomes a directory

    with pytest.raises(ValueError, match="save_param_strategy_file: .* is a directory"):
        _train(2, setup=setup)


def test_a_strategy_file_that_cannot_be_written_changes_no_parameter(tmp_path, monkeypatch):
    import errno
    import shutil

    def no_space(source, destination, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", destination)

    target = tmp_path / "s.ckpt"
    net = MLP(64)
    monkeypatch.setattr(shutil, "copyfile", no_space)
    with pytest.raises(tessera.CheckpointIOError, match="save_param_strategy_file") as err:
        _train(2, net=net, setup=lambda p: p.save_param_strategy_file(str(target)))
    assert err.value.file == str(target) and "No space left" in err.value.rule
    assert os.listdir(tmp_path) == []  # no temporary file left
    with pytest.raises(ValueError, match="no value yet"):
        net.fc1.weight.asnumpy()  # the Parameters were not updated
    monkeypatch.undo()
    _train(2, net=net, setup=lambda p: p.save_param_strategy_file(str(target)))
    assert target.read_bytes() and net.fc1.weight.asnumpy().shape == (32, 64)


def test_model_puts_its_loss_inside_an_autoparallel_network():
    # MindSpore's documented `Model(AutoParallel(net), loss_fn=loss, optimizer=opt)`: the
    # AutoParallel's settings are the job's. Its switches were lost (the loss wrapped the
    # AutoParallel, traced as a plain cell): on 4 devices with no parallel_mode in the context
    # it was refused as one device; with a context mode, its switches did nothing.
    def losses(loss_inside, mean):
        tessera.set_seed(5)
        tessera.set_auto_parallel_context(device_num=4)
        net = MLP(64)
        opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
        if loss_inside:
            parallel_net = AutoParallel(nn.WithLossCell(net, _loss()))
            model = Model(parallel_net, optimizer=opt)
        else:
            parallel_net = AutoParallel(net)
            model = Model(parallel_net, loss_fn=_loss(), optimizer=opt)
        if mean:
            parallel_net.enable_gradients_mean()
        model.train(1, _data())
        return np.array(model.losses)

    for mean in (False, True):
        np.testing.assert_array_equal(losses(False, mean), losses(True, mean))
    assert not np.array_equal(losses(False, False), losses(False, True))


_WRAPPERS = {"Pipeline": lambda net: Pipeline(net, 2),
             "GradAccumulation": lambda net: GradAccumulation(net, 2),
             "MicroBatchInterleaved": lambda net: MicroBatchInterleaved(net, 2),
             "AutoParallel": AutoParallel}


@pytest.mark.parametrize("wrap", sorted(_WRAPPERS))
def test_a_wrapper_inside_the_loss_cell_is_refused_naming_it(wrap):
    # Traced as a plain cell inside the loss cell, its settings were silently lost.
    net = MLP(64)
    inner = _WRAPPERS[wrap](net)
    opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    makes = [lambda: Model(nn.WithLossCell(inner, _loss()), optimizer=opt)]
    if wrap != "AutoParallel":  # Model(AutoParallel(net), loss_fn) is MindSpore's own form
        makes.append(lambda: Model(inner, loss_fn=_loss(), optimizer=opt))
    for make in makes:
        with pytest.raises(TypeError, match=f"the backbone of the loss cell is a {wrap}"):
            make()
