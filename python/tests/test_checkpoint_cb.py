"""ModelCheckpoint and CheckpointConfig over the engine's periodic checkpoint sets, and
load_checkpoint of a set (issue 34)."""

import os
import shutil

import numpy as np
import pytest

import tessera
from tessera import nn
from tessera.dataset import NumpySlicesDataset
from tessera.train import (Callback, CheckpointConfig, Model, ModelCheckpoint,
                           load_checkpoint)

from nets import MLP, fresh_context  # noqa: F401 (the fixture is used by name)

pytestmark = pytest.mark.usefixtures("fresh_context")

RNG = np.random.RandomState(1)
X = RNG.rand(64, 64).astype(np.float32)
Y = (np.arange(64) % 10).astype(np.int32)


def _data():
    return NumpySlicesDataset((X, Y), shuffle=False).batch(16)  # 4 steps per epoch


def _model(net):
    return Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                 nn.Momentum(net.trainable_params(), 0.05, 0.9))


class Listing(Callback):
    """The ModelCheckpoint directory's entries after every step (it runs after the
    ModelCheckpoint callback)."""

    def __init__(self, directory):
        self.directory, self.seen = directory, []

    def on_train_step_end(self, run_context):
        self.seen.append(sorted(os.listdir(self.directory)))


def _weights(values):
    return {k: v.asnumpy() for k, v in values.items() if not k.startswith("moments.")
            and k != "global_step"}


def test_sets_are_written_while_training_and_only_the_newest_are_kept(tmp_path):
    net = MLP()
    model = _model(net)
    config = CheckpointConfig(save_checkpoint_steps=2, keep_checkpoint_max=3)
    listing = Listing(tmp_path)
    model.train(3, _data(), callbacks=[ModelCheckpoint("net", str(tmp_path), config), listing])
    # global steps 2, 4, …, 12 saved: (epoch, step in epoch) names, the 3 newest kept
    assert sorted(os.listdir(tmp_path)) == ["net-2_4", "net-3_2", "net-3_4"]
    # a set appears within a step of being saved, and at most 3 are ever there
    assert listing.seen[0] == [] and listing.seen[2] == ["net-1_2"]
    assert listing.seen[8] == ["net-1_4", "net-2_2", "net-2_4"]
    assert all(len(s) <= 3 for s in listing.seen)
    final = load_checkpoint(str(tmp_path / "net-3_4"))
    trained = {name: p.asnumpy() for name, p in net.parameters_and_names()}
    assert _weights(final).keys() == trained.keys()
    for name, value in trained.items():
        assert np.array_equal(_weights(final)[name], value), name
    assert final["global_step"].asnumpy().tolist() == [12]
    assert "moments.fc1.weight" in final
    earlier = load_checkpoint(str(tmp_path / "net-2_4"))
    assert earlier["global_step"].asnumpy().tolist() == [8]
    assert not np.array_equal(earlier["fc1.weight"].asnumpy(), trained["fc1.weight"])


def test_the_final_weights_are_saved_when_the_last_step_was_not(tmp_path):
    net = MLP()
    model = _model(net)
    config = CheckpointConfig(3, keep_checkpoint_max=10)
    model.train(2, _data(), callbacks=[ModelCheckpoint(directory=str(tmp_path), config=config)])
    # steps 3 and 6 (1_3, 2_2), then the final weights at step 8 (2_4)
    assert sorted(os.listdir(tmp_path)) == ["CKP-1_3", "CKP-2_2", "CKP-2_4"]
    final = _weights(load_checkpoint(str(tmp_path / "CKP-2_4")))
    for name, p in net.parameters_and_names():
        assert np.array_equal(final[name], p.asnumpy())


def test_save_checkpoint_seconds_saves_when_the_time_has_passed(tmp_path):
    import time

    class SlowStep(Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 2:
                time.sleep(1.2)

    config = CheckpointConfig(save_checkpoint_steps=None, save_checkpoint_seconds=1)
    _model(MLP()).train(1, _data(), callbacks=[SlowStep(), ModelCheckpoint("t", str(tmp_path),
                                                                           config)])
    # the steps take milliseconds: only the one after the pause is saved, then the final weights
    assert sorted(os.listdir(tmp_path)) == ["t-1_2", "t-1_4"]


def test_a_second_callback_with_the_same_prefix_takes_prefix_1(tmp_path):
    cfg = CheckpointConfig(save_checkpoint_steps=4, keep_checkpoint_max=1)
    _model(MLP()).train(1, _data(), callbacks=[ModelCheckpoint("a", str(tmp_path), cfg)])
    second = ModelCheckpoint("a", str(tmp_path), cfg)
    _model(MLP()).train(1, _data(), callbacks=[second])
    assert sorted(os.listdir(tmp_path)) == ["a-1_4", "a_1-1_4"]
    assert second.latest_ckpt_file_name == str(tmp_path / "a_1-1_4")


def test_a_sharded_run_saves_sets_that_load_whole(tmp_path):
    tessera.set_auto_parallel_context(device_num=8, parallel_mode="semi_auto_parallel")
    net = MLP(shard=True)
    model = _model(net)
    model.train(1, _data(), callbacks=[ModelCheckpoint("s", str(tmp_path),
                                                       CheckpointConfig(2, keep_checkpoint_max=2))])
    assert sorted(os.listdir(tmp_path)) == ["s-1_2", "s-1_4"]
    assert len([e for e in os.listdir(tmp_path / "s-1_4") if e.startswith("rank_")]) == 8
    final = _weights(load_checkpoint(str(tmp_path / "s-1_4")))
    for name, p in net.parameters_and_names():
        assert np.array_equal(final[name], p.asnumpy()), name


def test_load_checkpoint_filters(tmp_path):
    _model(MLP()).train(1, _data(), callbacks=[ModelCheckpoint("f", str(tmp_path),
                                                               CheckpointConfig(4))])
    path = str(tmp_path / "f-1_4")
    assert sorted(load_checkpoint(path, filter_prefix="moments.")) == \
        ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight", "global_step"]
    assert sorted(load_checkpoint(path, specify_prefix=["fc2", "moments.fc2"])) == \
        ["fc2.bias", "fc2.weight", "moments.fc2.bias", "moments.fc2.weight"]
    assert sorted(load_checkpoint(path, choice_func=lambda n: n.endswith("bias"))) == \
        ["fc1.bias", "fc2.bias", "moments.fc1.bias", "moments.fc2.bias"]
    loaded = tessera.load_checkpoint(path)
    assert loaded["global_step"].dtype == np.int32 and loaded["fc1.weight"].dtype == np.float32


def test_checkpoint_config_rules(tmp_path):
    assert CheckpointConfig()._recipe() == {"keep_checkpoint_max": 5, "save_checkpoint_steps": 1}
    # seconds apply only without steps, as in MindSpore
    assert CheckpointConfig(save_checkpoint_steps=3, save_checkpoint_seconds=10)._recipe() == \
        {"keep_checkpoint_max": 5, "save_checkpoint_steps": 3}
    assert CheckpointConfig(save_checkpoint_steps=None, save_checkpoint_seconds=10,
                            keep_checkpoint_max=2)._recipe() == \
        {"keep_checkpoint_max": 2, "save_checkpoint_seconds": 10}
    with pytest.raises(ValueError, match="both 0"):
        CheckpointConfig(save_checkpoint_steps=0, save_checkpoint_seconds=0)
    with pytest.raises(ValueError, match=r"\['enc_key', 'keep_checkpoint_per_n_minutes'\] are "
                                         "not supported"):
        CheckpointConfig(keep_checkpoint_per_n_minutes=5, enc_key=b"0" * 16)
    with pytest.raises(ValueError, match="'keep_checkpoint_max'.*positive int"):
        CheckpointConfig(keep_checkpoint_max=0)
    with pytest.raises(TypeError, match="'config'.*CheckpointConfig"):
        ModelCheckpoint(config={"save_checkpoint_steps": 1})
    model = _model(MLP())
    with pytest.raises(ValueError, match="2 ModelCheckpoint callbacks"):
        model.train(1, _data(), callbacks=[ModelCheckpoint("x", str(tmp_path)),
                                           ModelCheckpoint("y", str(tmp_path))])
    with pytest.raises(ValueError, match="not a Tessera checkpoint set"):
        load_checkpoint(str(tmp_path))


def test_save_checkpoint_writes_mindspores_formats(tmp_path):
    from conftest import read_ckpt, read_safetensors

    net = MLP()
    _model(net).train(1, _data())
    trained = {name: p.asnumpy() for name, p in net.parameters_and_names()}
    tessera.save_checkpoint(net, str(tmp_path / "net"), append_dict={"epoch_num": np.int32(1)})
    rows = read_ckpt(tmp_path / "net.ckpt")  # an independent reader of MindSpore's format
    assert [r[0] for r in rows] == [*trained, "epoch_num"]
    for name, dtype, dims, raw in rows[:-1]:
        assert dtype == "Float32" and dims == list(trained[name].shape)
        assert np.array_equal(np.frombuffer(raw, np.float32).reshape(dims), trained[name]), name
    assert rows[-1][1:3] == ("Int32", [1])
    tessera.save_checkpoint({"w": tessera.Tensor(np.eye(2)), "b": trained["fc2.bias"]},
                            str(tmp_path / "d.safetensors"), format="safetensors")
    tensors, _ = read_safetensors(tmp_path / "d.safetensors")
    assert sorted((t[0], t[1], t[2]) for t in tensors) == [("b", "Float32", [10]),
                                                          ("w", "Float64", [2, 2])]
    back = load_checkpoint(str(tmp_path / "net.ckpt"))
    for name, value in trained.items():
        assert np.array_equal(back[name].asnumpy(), value), name
    with pytest.raises(ValueError, match="tensor s: only float32, float64, int32 and int64"):
        tessera.save_checkpoint({"s": np.array(["x"])}, str(tmp_path / "bad"))


def test_a_loaded_set_starts_a_new_networks_training(tmp_path):
    first = MLP()
    _model(first).train(1, _data(), callbacks=[ModelCheckpoint("m", str(tmp_path),
                                                               CheckpointConfig(4))])
    second = MLP()
    param_not_load, ckpt_not_load = tessera.load_param_into_net(
        second, load_checkpoint(str(tmp_path / "m-1_4")))
    assert param_not_load == []
    assert sorted(ckpt_not_load) == ["global_step", "moments.fc1.bias", "moments.fc1.weight",
                                     "moments.fc2.bias", "moments.fc2.weight"]
    frozen = Model(second, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                   nn.SGD(second.trainable_params(), 0.0))
    frozen.train(1, _data())
    for (name, a), (_, b) in zip(first.parameters_and_names(), second.parameters_and_names()):
        assert np.array_equal(a.asnumpy(), b.asnumpy()), name
    third = MLP()
    load_checkpoint(str(tmp_path / "m-1_4"), net=third, specify_prefix="fc1")
    assert np.array_equal(third.fc1.weight.asnumpy(), first.fc1.weight.asnumpy())
    # strict_load=True loads exact names and returns what it left out, as MindSpore does
    part = load_checkpoint(str(tmp_path / "m-1_4"), specify_prefix="fc1")
    fourth = MLP()
    assert tessera.load_param_into_net(fourth, part, strict_load=True) == (
        ["fc2.weight", "fc2.bias"], [])
    assert np.array_equal(fourth.fc1.bias.asnumpy(), first.fc1.bias.asnumpy())


def test_a_set_that_cannot_be_published_leaves_nothing_behind(tmp_path, monkeypatch):
    from tessera.train import checkpoint

    real_copy = checkpoint._copy_set

    def out_of_space(source, staging, move):
        # another filesystem, nearly full: the commit marker is copied, then the data fails
        os.makedirs(staging)
        shutil.copyfile(os.path.join(source, "tessera_set.json"),
                        os.path.join(staging, "tessera_set.json"))
        raise shutil.Error([(os.path.join(source, "strategy.json"),
                             os.path.join(staging, "strategy.json"),
                             "[Errno 28] No space left on device")])

    monkeypatch.setattr(checkpoint, "_copy_set", out_of_space)
    net = MLP()
    with pytest.raises(tessera.CheckpointIOError, match="net-1_2") as err:
        _model(net).train(1, _data(), callbacks=[ModelCheckpoint("net", str(tmp_path),
                                                                 CheckpointConfig(2))])
    assert err.value.file == str(tmp_path / "net-1_2")
    assert "No space left on device" in err.value.rule
    assert os.listdir(tmp_path) == []  # no half-copied set, no staging directory
    with pytest.raises(ValueError, match="no value yet"):
        net.fc1.weight.asnumpy()  # the failed train changed nothing
    # copied (as across filesystems) rather than renamed, the sets are whole
    monkeypatch.setattr(checkpoint, "_copy_set",
                        lambda source, staging, move: real_copy(source, staging, False))
    _model(net).train(1, _data(), callbacks=[ModelCheckpoint("net", str(tmp_path),
                                                             CheckpointConfig(2))])
    assert sorted(os.listdir(tmp_path)) == ["net-1_2", "net-1_4"]
    final = _weights(load_checkpoint(str(tmp_path / "net-1_4")))
    for name, p in net.parameters_and_names():
        assert np.array_equal(final[name], p.asnumpy()), name
