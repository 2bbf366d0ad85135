#!/usr/bin/env python3
"""Python overhead of a network built in Python (issue 34's target: a step within 3 % of the same
network built in Rust, callbacks included).

Both sides train the seed MLP (Flatten → MatMul 64×H → ReLU → MatMul H×H → ReLU → MatMul H×10,
sparse softmax cross entropy, Momentum) on the bundled digits, one device, batch 32, the same
steps, in this process, through the same native module:
  - rust:   ``tessera.train(config)`` with ``model.name = "seed_mlp"`` (the graph built in Rust);
  - python: ``tessera.train.Model`` on the same network written as a ``tessera.nn.Cell`` (traced
    once), with a ``LossMonitor(1)`` callback (Python runs at every step end).
Runs alternate (rust, python, rust, …); each run's wall time is divided by its steps. Prints the
CPU model, the median and spread (min–max) per step of each side and their ratio.

    python3 scripts/bench_python_network.py [REPS] [HIDDEN] [EPOCHS]     (defaults 7, 512, 4)
"""

import contextlib
import io
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

import tessera
from tessera import dataset as ds
from tessera import nn, ops
from tessera.common.initializer import HeUniform, initializer
from tessera.train import LossMonitor, Model

REPO = pathlib.Path(__file__).resolve().parent.parent
DIGITS = REPO / "data" / "digits"


class SeedMlp(nn.Cell):
    """``graph::models::seed_mlp`` written as a Cell: the same ops, names and shapes."""

    def __init__(self, hidden):
        super().__init__()
        init = HeUniform()  # seed_mlp draws fan_out; the timing does not depend on it
        self.fc1_weight = tessera.Parameter(initializer(init, (64, hidden)))
        self.fc2_weight = tessera.Parameter(initializer(init, (hidden, hidden)))
        self.fc3_weight = tessera.Parameter(initializer(init, (hidden, 10)))
        self.flatten = ops.Flatten()
        self.matmul1, self.relu1 = ops.MatMul(), ops.ReLU()
        self.matmul2, self.relu2 = ops.MatMul(), ops.ReLU()
        self.matmul3 = ops.MatMul()

    def construct(self, x):
        h = self.relu1(self.matmul1(self.flatten(x), self.fc1_weight))
        h = self.relu2(self.matmul2(h, self.fc2_weight))
        return self.matmul3(h, self.fc3_weight)


def cpu_model():
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def rust_run(hidden, epochs, out):
    config = {
        "model": {"name": "seed_mlp", "hidden": hidden, "classes": 10},
        "data": {"format": "idx", "dir": str(DIGITS), "batch_size": 32, "shuffle": True},
        "parallel": {"devices": 1, "mode": "stand_alone"},
        "train": {"epochs": epochs, "optimizer": "momentum", "learning_rate": 0.05,
                  "momentum": 0.9, "seed": 1, "eval": False},
        "output": {"dir": out},
    }
    start = time.perf_counter()
    metrics = tessera.train(config)
    return time.perf_counter() - start, len(metrics["losses"])


def python_run(hidden, epochs, data):
    net = SeedMlp(hidden)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.Momentum(net.trainable_params(), 0.05, 0.9))
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        model.train(epochs, data, callbacks=[LossMonitor(1)])
    return time.perf_counter() - start, len(model.losses)


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    data = ds.MnistDataset(str(DIGITS), usage="train").batch(32, drop_remainder=True)
    per_step = {"rust": [], "python": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            seconds, steps = rust_run(hidden, epochs, f"{tmp}/rust_{rep}")
            per_step["rust"].append(seconds / steps * 1e3)
            seconds, steps = python_run(hidden, epochs, data)
            per_step["python"].append(seconds / steps * 1e3)
    print(f"CPU: {cpu_model()}; seed MLP hidden {hidden}, batch 32, 1 device, {epochs} epochs, "
          f"{reps} runs each, alternating")
    med = {}
    for side, values in per_step.items():
        med[side] = statistics.median(values)
        print(f"{side:>6}: median {med[side]:.4f} ms/step (min {min(values):.4f}, "
              f"max {max(values):.4f})")
    print(f"python / rust: {med['python'] / med['rust']:.4f}")


if __name__ == "__main__":
    main()
