"""Arguments that MindSpore scripts pass and Tessera cannot apply: each is refused or warned
about, naming it, never silently dropped; and out-of-range values are refused at the call that
takes them, naming the argument."""

import warnings

import numpy as np
import pytest

import tessera
from tessera import dataset as ds
from tessera import nn
from tessera import parallel as P
from tessera.parallel.auto_parallel import AutoParallel
from tessera.train import Model

from conftest import CASES
from nets import fresh_context  # noqa: F401  (a fixture)

CASE = CASES / "case1_dp2mp4_to_2x2"
A, B = str(CASE / "strategy/A.ckpt"), str(CASE / "strategy/B.ckpt")
SRC = CASE / "src_ckpt"
FILES = [str(SRC / f"rank_{r}/checkpoint_{r}.ckpt") for r in range(8)]

_RS = np.random.RandomState(0)
X = _RS.randn(64, 8).astype(np.float32)
Y = (np.arange(64) % 4).astype(np.int32)


class Net(nn.Cell):
    def __init__(self, shard=False):
        super().__init__()
        self.fc = nn.Dense(8, 4)
        if shard:
            self.fc.matmul.shard(((1, 1), (2, 1)))

    def construct(self, x):
        return self.fc(x)


def _model(net=None, wrap=None):
    net = net or Net()
    with_loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True,
                                                                     reduction="mean"))
    top = wrap(with_loss) if wrap else with_loss
    return Model(top, optimizer=nn.SGD(net.trainable_params(), 0.1), metrics={"acc"})


def _data():
    return ds.NumpySlicesDataset((X, Y), shuffle=False).batch(16)


def _losses(**train_kwargs):
    model = _model()
    model.train(1, _data(), **train_kwargs)
    return model.losses


# ------------------------------------------------------------------------- Model, dataset, nn

def test_dataset_sink_mode_true_warns_naming_it_and_a_non_bool_is_refused(fresh_context):
    with pytest.warns(UserWarning, match="dataset_sink_mode=True has no effect"):
        sunk = _losses(dataset_sink_mode=True)
    assert sunk == _losses()  # the run itself is the same
    with pytest.raises(TypeError, match="'dataset_sink_mode' must be bool, but got str"):
        _losses(dataset_sink_mode="yes")
    model = _model()
    model.train(1, _data())
    with pytest.warns(UserWarning, match="Model.eval: dataset_sink_mode=True"):
        model.eval(_data(), dataset_sink_mode=True)
    with pytest.raises(TypeError, match="Model.eval.*dataset_sink_mode"):
        model.eval(_data(), dataset_sink_mode=1)


@pytest.mark.parametrize("num_samples, error", [(-1, ValueError), (0, ValueError),
                                                (2.5, TypeError), (True, TypeError)])
def test_numpy_slices_num_samples_out_of_range_is_refused(num_samples, error):
    # -1 was taken as a slice bound: every sample but the last, silently.
    with pytest.raises(error, match="num_samples"):
        ds.NumpySlicesDataset((X, Y), num_samples=num_samples)
    assert len(ds.NumpySlicesDataset((X, Y), num_samples=5)._columns[0]) == 5


@pytest.mark.parametrize("batch_size", [True, 2**70])
def test_batch_size_bool_or_beyond_64_bits_is_refused_at_batch(batch_size):
    # True was batches of one; 2**70 a bare OverflowError once Model.train started.
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        ds.NumpySlicesDataset((X, Y)).batch(batch_size, drop_remainder=True)


def test_cross_entropy_ignore_index_that_is_a_class_is_refused():
    # The loss would count label 0 as any other: ignore_index=0 cannot be ignored silently.
    with pytest.raises(ValueError, match="ignore_index=0 is not supported"):
        nn.CrossEntropyLoss(ignore_index=0)
    with pytest.raises(TypeError, match="ignore_index"):
        nn.CrossEntropyLoss(ignore_index=1.5)
    nn.CrossEntropyLoss(ignore_index=-1)  # matches no class index: nothing to ignore
    nn.CrossEntropyLoss()


def test_parameter_layerwise_parallel_is_refused():
    with pytest.raises(ValueError, match="layerwise_parallel=True is not supported"):
        tessera.Parameter(np.zeros(3, np.float32), name="w", layerwise_parallel=True)
    with pytest.raises(TypeError, match="parallel_optimizer must be a bool"):
        tessera.Parameter(np.zeros(3, np.float32), name="w", parallel_optimizer="no")


def test_parallel_optimizer_false_under_hsdp_warns_naming_the_parameter(fresh_context):
    tessera.set_auto_parallel_context(device_num=2, parallel_mode="semi_auto_parallel")
    net = Net()
    net.fc.weight = tessera.Parameter(np.ones((4, 8), np.float32), parallel_optimizer=False)

    def wrap(with_loss):
        auto = AutoParallel(with_loss)
        auto.hsdp()
        return auto

    with pytest.warns(UserWarning, match=r"parallel_optimizer=False\) of \['fc.weight'\]"):
        _model(net, wrap).train(1, _data())


def test_trainable_params_recurse_false_gives_the_cells_own_only():
    class Outer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.inner = Net()
            self.scale = tessera.Parameter(np.ones(1, np.float32))

        def construct(self, x):
            return self.inner(x)

    net = Outer()
    assert [p.name for p in net.trainable_params()] == ["scale", "inner.fc.weight",
                                                        "inner.fc.bias"]
    assert [p.name for p in net.trainable_params(recurse=False)] == ["scale"]
    with pytest.raises(TypeError, match="recurse"):
        net.trainable_params(recurse="no")


# --------------------------------------------------------------------------------- context

@pytest.mark.parametrize("seed", [True, 2**63])
def test_set_seed_refuses_a_bool_or_a_seed_beyond_64_bits_at_the_call(seed, fresh_context):
    # 2**63 reached the engine as "u64 value was too large", naming no setting.
    with pytest.raises(ValueError, match="set_seed: seed must be a non-negative int"):
        tessera.set_seed(seed)
    assert tessera.get_seed() == 1


@pytest.mark.parametrize("device_num", [True, 2**70])
def test_device_num_refuses_a_bool_or_a_count_beyond_64_bits(device_num, fresh_context):
    with pytest.raises(ValueError, match="device_num must be a positive int"):
        tessera.set_auto_parallel_context(device_num=device_num)


def test_context_gradients_mean_reaches_the_engine(fresh_context):
    tessera.set_context(deterministic="ON")
    tessera.set_auto_parallel_context(device_num=2, parallel_mode="data_parallel")
    default = _losses()
    tessera.set_auto_parallel_context(gradients_mean=True)
    mean = _losses()
    tessera.set_auto_parallel_context(gradients_mean=False)
    summed = _losses()
    assert mean == default
    assert summed[0] == mean[0] and summed[1:] != mean[1:], "the sum takes a larger step"
    with pytest.raises(ValueError, match="gradients_mean must be a bool"):
        tessera.set_auto_parallel_context(gradients_mean=1)
    tessera.set_auto_parallel_context(gradients_mean=True, parallel_mode="semi_auto_parallel")
    with pytest.warns(UserWarning, match=r"gradients_mean=True\) has no effect under "
                                         "AutoParallel"):
        _model(wrap=AutoParallel).train(1, _data())


def test_shard_strategies_under_data_parallel_warn_naming_the_ops(fresh_context):
    tessera.set_auto_parallel_context(device_num=2, parallel_mode="data_parallel")
    with pytest.warns(UserWarning, match=r"shard strategies of \['fc.matmul'\] have no effect"):
        _model(Net(shard=True)).train(1, _data())
    tessera.set_auto_parallel_context(parallel_mode="semi_auto_parallel")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _model(Net(shard=True)).train(1, _data())


# ------------------------------------------------------------------------- checkpoint tools

@pytest.mark.parametrize("flag", ["force", "allow_missing"])
def test_convert_flags_must_be_bools_named_in_the_error(flag, tmp_path):
    # force=1 was pyo3's "'int' object is not an instance of 'bool'", naming no argument.
    with pytest.raises(TypeError, match=f"For '{flag}', the type must be bool"):
        P.convert_checkpoints(str(SRC), str(tmp_path / "out"), "net", A, B, **{flag: 1})
    assert not (tmp_path / "out").exists()


def test_other_flags_must_be_bools_named_in_the_error(tmp_path):
    with pytest.raises(TypeError, match="For 'force'"):
        P.convert_checkpoint_by_rank(0, dict(enumerate(FILES)), str(tmp_path / "x.ckpt"), A, B,
                                     force="yes")
    with pytest.raises(TypeError, match="For 'force'"):
        P.merge_pipeline_strategys(str(CASE / "strategy"), str(tmp_path / "m.ckpt"), force=1)
    # check_replicas="no" was bool("no"): the replica check ran.
    with pytest.raises(TypeError, match="For 'check_replicas'"):
        P.verify_checkpoint(str(SRC), A, check_replicas="no")


def test_load_distributed_checkpoint_refuses_arguments_of_the_other_format(tmp_path):
    # dst_safetensors_dir with format="ckpt" returned the arrays and wrote nothing.
    with pytest.raises(ValueError, match="dst_safetensors_dir applies only when format is "
                                         "'safetensors'"):
        P.load_distributed_checkpoint(None, FILES, B, A, dst_safetensors_dir=str(tmp_path / "d"))
    assert not (tmp_path / "d").exists()
    with pytest.raises(ValueError, match="unified_safetensors_dir applies only"):
        P.load_distributed_checkpoint(None, FILES, B, A, unified_safetensors_dir=str(tmp_path))
    with pytest.raises(ValueError, match="checkpoint_filenames and train_strategy_filename "
                                         "apply only when format is 'ckpt'"):
        P.load_distributed_checkpoint(None, FILES, B, A, format="safetensors",
                                      unified_safetensors_dir=str(tmp_path))
    with pytest.raises(ValueError, match="output_format='ckpt' has no effect without "
                                         "dst_safetensors_dir"):
        P.load_distributed_checkpoint(None, FILES, B, A, output_format="ckpt")
    assert set(P.load_distributed_checkpoint(None, FILES, B, A)) >= {"net.w1"}


def test_eval_refuses_nan_or_infinite_inputs_naming_the_column_and_sample(fresh_context):
    # Model.eval returned an accuracy for NaN inputs (argmax of NaN scores is class 0).
    model = _model()
    model.train(1, _data())
    bad = X.copy()
    bad[5, 2] = np.inf
    with pytest.raises(ValueError, match="column column_0: sample 5 holds NaN or infinity"):
        model.eval(ds.NumpySlicesDataset((bad, Y), shuffle=False).batch(16))
    assert 0.0 <= model.eval(_data())["acc"] <= 1.0


def test_group_ckpt_save_file_refuses_a_directory(tmp_path):
    # A directory was taken: each rank wrote "<dir>_<rank>" beside it (under tessera launch,
    # the file was then moved onto the directory: a bare OSError after training).
    auto = AutoParallel(nn.WithLossCell(Net(), nn.CrossEntropyLoss()))
    with pytest.raises(ValueError, match="set_group_ckpt_save_file: .* is a directory"):
        auto.set_group_ckpt_save_file(str(tmp_path))
    auto.set_group_ckpt_save_file(str(tmp_path / "group_info.pb"))
    auto.set_group_ckpt_save_file(str(tmp_path / "rank_{rank}" / "group_info.pb"))


@pytest.mark.parametrize("setting, key", [
    (lambda ap: ap.hsdp(threshold=2**70), r"parallel\.hsdp\.threshold = 2**70"),
    (lambda ap: ap.hsdp(threshold=2**63), r"parallel\.hsdp\.threshold = 2**63"),
    (lambda ap: ap.hsdp(shard_size=2**64), r"parallel\.hsdp\.shard_size = 2**64"),
    (lambda ap: ap.comm_fusion({"allreduce": {"mode": "size", "config": 2**70}}),
     r"parallel\.comm_fusion\.allreduce\.config = 2**70"),
    (lambda ap: ap.comm_fusion({"allreduce": {"mode": "index", "config": [0, -2**63 - 1]}}),
     r"parallel\.comm_fusion\.allreduce\.config\[1\] = -2**63-1"),
    (lambda ap: ap.dataset_strategy(((2**70, 1), (1,))),
     r"parallel\.dataset_strategy\[0\]\[0\] = 2**70"),
])
def test_ints_beyond_64_bits_are_refused_naming_the_setting(setting, key, fresh_context):
    # Beyond 2**64 they reached the engine as floats ("got float 1.1805916207174113e21"), from
    # 2**63 as "u64 value was too large at line 1 column 112", naming nothing.
    for power in ("-2**63-1", "2**70", "2**64", "2**63"):
        key = key.replace(power, str(eval(power)))
    tessera.set_auto_parallel_context(device_num=2, parallel_mode="semi_auto_parallel")

    def wrap(with_loss):
        ap = AutoParallel(with_loss)
        setting(ap)
        return ap

    with pytest.raises(ValueError, match=f"Model.train: the setting {key} is outside the "
                                         r"engine's integers \(-2\*\*63 \.\. 2\*\*63 - 1\)"):
        _model(wrap=wrap).train(1, _data())
