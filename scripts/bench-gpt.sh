#!/usr/bin/env bash
# Training tokens/s of the GPT (4 layers, 4 heads, width 256, 128 tokens, batch 16, f32, AdamW):
# Tessera on 1 rank and on 2 ranks (data parallel; model parallel 2) with rank 0's profile, next
# to PyTorch on one thread and DDP on 2 processes, in the same run. Installs PyTorch into a venv
# if absent.
#   scripts/bench-gpt.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-20}"
. scripts/bench-venv.sh
cargo build --release -p tessera-cli --quiet
echo "== $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg) (the CPU: the machine line below)"
"$venv/bin/python" scripts/torch_gpt_step.py "$steps"
"${CARGO_TARGET_DIR:-target}/release/tessera" bench gpt-step --steps "$steps" --profile
"$venv/bin/python" scripts/torch_gpt_step.py "$steps"
