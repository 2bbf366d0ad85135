"""tessera.train and tessera.plan: the runtime driven from Python, results as data."""

import json
import math
import os

import pytest

import tessera

from conftest import REPO

SEED = REPO / "examples" / "seed_semi_auto.toml"


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # the examples name data/digits relative to the repository


def _config(tmp_path, devices, mode="data_parallel"):
    return {
        "model": {"name": "seed_mlp", "hidden": 64, "classes": 10},
        "data": {"format": "idx", "dir": "data/digits", "batch_size": 32, "shuffle": True},
        "parallel": {"devices": devices, "mode": mode},
        "train": {"epochs": 1, "max_steps": 6, "optimizer": "momentum", "learning_rate": 0.05,
                  "momentum": 0.9, "seed": 1},
        "output": {"dir": str(tmp_path / f"run{devices}")},
    }


def test_plan_is_the_explain_output_as_data():
    plan = tessera.plan(str(SEED))
    assert plan["mode"] == "semi_auto" and plan["devices"] == 8
    assert plan["explain"].startswith("mode semi_auto on 8 device(s)")
    assert plan["reshards"] == sum(s["kind"] == "reshard" for s in plan["steps"]) > 0
    assert plan["bytes_per_step"] == sum(s["bytes"] for s in plan["steps"] if s["kind"] == "reshard")
    names = [p["name"] for p in plan["params"]]
    assert names and all(n in plan["explain"] for n in names)
    for p in plan["params"]:
        assert len(p["slice_shape"]) == len(p["shape"])
    kernels = [s["name"] for s in plan["steps"] if s["kind"] == "kernel"]
    assert "matmul1" in kernels and "matmul2" in kernels
    for s in plan["steps"]:
        if s["kind"] == "reshard":
            assert s["reason"] and s["communication"] and s["bytes"] >= 0


def test_plan_with_overrides_and_a_bad_device_count():
    dp = tessera.plan(str(SEED), devices=2, overrides={"parallel.mode": "data_parallel"})
    assert dp["devices"] == 2 and dp["mode"] == "data_parallel"
    with pytest.raises(tessera.ConfigError) as err:
        tessera.plan(str(SEED), devices=3)
    assert "not divisible by 3" in err.value.rule
    with pytest.raises(tessera.ConfigError) as err:
        tessera.plan(str(SEED), overrides={"train.epochs": 0})
    assert err.value.tensor == "train.epochs"
    assert "out of range" in err.value.rule
    with pytest.raises(ValueError):
        tessera.plan(str(SEED), devices=0)


def test_train_returns_the_metrics_and_agrees_across_device_counts(tmp_path):
    runs = {}
    for devices in (1, 2):
        log = tmp_path / f"metrics{devices}.jsonl"
        runs[devices] = tessera.train(_config(tmp_path, devices), devices=devices, log_json=str(log))
        m = runs[devices]
        assert m["devices"] == devices and m["steps"] == 6 and len(m["losses"]) == 6
        assert all(math.isfinite(x) for x in m["losses"])
        logged = [json.loads(line) for line in log.read_text().splitlines()]
        steps = [r["loss"] for r in logged if "loss" in r]
        assert steps == pytest.approx(m["losses"], rel=1e-6)
        assert m["output_dir"] == str(tmp_path / f"run{devices}")
    for a, b in zip(runs[1]["losses"], runs[2]["losses"]):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(a))
    assert runs[1]["losses"][-1] < runs[1]["losses"][0]


def test_train_rejects_a_bad_config(tmp_path):
    config = _config(tmp_path, 2)
    config["data"]["batch_size"] = 0
    with pytest.raises(tessera.ConfigError) as err:
        tessera.train(config)
    assert err.value.tensor == "data.batch_size"
    config = _config(tmp_path, 2)
    config["train"]["optimiser"] = "sgd"
    with pytest.raises(tessera.ConfigError, match="optimiser"):
        tessera.train(config)


def test_an_unreadable_config_file_is_an_os_error_about_the_config(tmp_path):
    # It was a CheckpointIOError, though the file is a config, not a checkpoint.
    missing = tmp_path / "nonexistent.toml"
    for call in (tessera.train, tessera.plan):
        with pytest.raises(FileNotFoundError) as err:
            call(str(missing))
        assert not isinstance(err.value, tessera.CheckpointIOError)
        assert err.value.filename == str(missing) and "training config" in str(err.value)
    with pytest.raises(IsADirectoryError) as err:
        tessera.train(str(tmp_path))
    assert err.value.filename == str(tmp_path)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe not text")
    with pytest.raises(tessera.ConfigError) as err:
        tessera.train(str(binary))
    assert err.value.file == str(binary)


def test_train_refuses_a_timeout_it_cannot_wait(tmp_path):
    # Zero, negative, not finite, or beyond a week (which would overflow the wait): a
    # ValueError naming the timeout, before any rank starts.
    for timeout in [0.0, -1.0, float("nan"), float("inf"), 1e300]:
        with pytest.raises(ValueError, match="timeout"):
            tessera.train(_config(tmp_path, 2), timeout=timeout)


def test_strings_beyond_the_bmp_and_escapes_reach_the_config_as_written(tmp_path):
    # An emoji (beyond U+FFFF), a quote and a backslash, in a config dict and as an override:
    # the outputs land in exactly that directory.
    odd = str(tmp_path / 'x_\U0001F600 "q" \\q')
    config = _config(tmp_path, 1)
    config["output"]["dir"] = odd
    assert tessera.train(config)["output_dir"] == odd
    assert os.listdir(odd)
    other = odd + "_override"
    assert tessera.train(_config(tmp_path, 1), overrides={"output.dir": other})["output_dir"] == other
    assert os.listdir(other)
    # A lone surrogate cannot be written as TOML (UTF-8): refused, naming the key.
    config["output"]["dir"] = "/tmp/\udc80"
    with pytest.raises(ValueError, match="output.dir.*lone surrogate"):
        tessera.train(config)
    with pytest.raises(ValueError, match="output.dir.*lone surrogate"):
        tessera.train(_config(tmp_path, 1), overrides={"output.dir": "/tmp/\ud83d"})
