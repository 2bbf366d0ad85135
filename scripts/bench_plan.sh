#!/usr/bin/env bash
# Search time, peak memory and predicted step time of `tessera plan` for every search mode and
# the hand-written Megatron dp × mp strategy, on GPTs of 12, 48 and 96 layers at 8, 64, 1024
# and 8192 devices (profile h100-nvlink-ib). Prints one CSV line per run.
#   scripts/bench_plan.sh [path/to/tessera] > plan_bench.csv
set -euo pipefail
bin=${1:-target/release/tessera}
root=$(cd "$(dirname "$0")/.." && pwd)
cfg=$(mktemp --suffix .toml)
out=$(mktemp -d)
trap 'rm -rf "$cfg" "$out"' EXIT
cat > "$cfg" <<TOML
[model]
name = "gpt"
layers = 12
heads = 16
hidden = 256
seq_len = 64
[data]
format = "text"
path = "$root/data/kjv/kjv.txt.gz"
batch_size = 1024
steps_per_epoch = 1
[parallel]
devices = 8
mode = "dynamic_programming"
[train]
epochs = 1
optimizer = "adamw"
learning_rate = 0.001
[output]
dir = "$out"
TOML
echo "layers,devices,mode,search_ms,wall_s,peak_rss_mib,predicted_step_ms,compute_ms,comm_ms,memory_mib,gap"
for layers in 12 48 96; do
  for devices in 8 64 1024 8192; do
    mp=$(( devices < 8 ? devices : 8 ))
    for mode in sharding_propagation recursive_programming dynamic_programming megatron; do
      if [ "$mode" = megatron ]; then
        sets=(--set parallel.mode='"semi_auto"' --set parallel.model_parallel=$mp)
      else
        sets=(--set parallel.mode="\"$mode\"")
      fi
      json=$(/usr/bin/time -f "%e %M" -o "$out/time" "$bin" plan "$cfg" --devices "$devices" \
        --set model.layers=$layers "${sets[@]}" --json)
      read -r wall rss < "$out/time"
      python3 - "$layers" "$devices" "$mode" "$wall" "$rss" <<PY
import json, sys
r = json.loads('''$json''')
l, d, m, wall, rss = sys.argv[1:]
gap = "" if r["gap"] is None else f'{100 * r["gap"]:.1f}%'
print(f'{l},{d},{m},{r["search_ms"]:.0f},{wall},{int(rss) / 1024:.0f},{r["predicted_step_ms"]:.2f},'
      f'{r["compute_ms"]:.2f},{r["comm_ms"]:.2f},{r["peak_memory_bytes"] / 2**20:.0f},{gap}')
PY
    done
  done
done
