#!/usr/bin/env bash
# Training-step time of seed_mlp (784-512-512-10, batch 32, f32, Momentum) on one rank, next to
# PyTorch on one thread with the same shapes and optimizer, in the same run; then the 8-rank
# semi-auto run's steps/s on the local backend. Installs PyTorch (CPU) into a venv if absent.
#   scripts/bench-train-step.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-300}"
. scripts/bench-venv.sh
cargo build --release -p tessera-cli --quiet
echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$venv/bin/python" scripts/torch_train_step.py "$steps"
target/release/tessera bench train-step --steps "$steps" --devices 8
"$venv/bin/python" scripts/torch_train_step.py "$steps"
