#!/usr/bin/env bash
# parallel.micro_batch_interleave (MindSpore's MicroBatchInterleaved) on this machine: the GPT
# (4 layers, width 256, 128 tokens, batch 16) on 2 ranks of the local backend with model
# parallel 2 (every block all-reduces its activations twice forward and twice backward), step
# time without interleaving, with 2 parts run at once (`micro_batch_interleave = 2`), and with
# the same 2 halves run one after the other (`grad_accumulation_steps = 2` of batch 8), which
# is the interleaved run's arithmetic without the overlap. Runs alternate, `rounds` times each;
# prints every run's median step and the median and spread (min–max) of those medians.
#   scripts/bench-interleave.sh [steps] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-20}"
rounds="${2:-5}"
cargo build --release -p tessera-cli --quiet
bin=target/release/tessera
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
common=(--set model.layers=4 --set model.hidden=256 --set model.heads=4 --set model.seq_len=128
        --set data.batch_size=16 --set train.eval=false --set "train.max_steps=$steps"
        --set output.save_checkpoint=false --set parallel.devices=2 --set parallel.data_parallel=1
        --set parallel.model_parallel=2)
declare -A medians
run() {
  local name="$1" round="$2"; shift 2
  local dir="$out/$name-$round"
  "$bin" train examples/gpt_kjv.toml "${common[@]}" --set "output.dir=\"$dir\"" "$@" >/dev/null 2>&1
  # The median step (ms) of the run, the first 3 steps (warm-up) left out.
  local m
  m="$(python3 -c '
import json, statistics, sys
ms = [json.loads(l)["ms"] for l in open(sys.argv[1]) if "\"ms\"" in l][3:]
print(f"{statistics.median(ms):.1f}")' "$dir/metrics.jsonl")"
  medians[$name]+="$m "
}
for round in $(seq 1 "$rounds"); do
  run plain "$round"
  run interleave2 "$round" --set parallel.micro_batch_interleave=2
  run halves_in_turn "$round" --set data.batch_size=8 --set train.grad_accumulation_steps=2
done
for name in plain interleave2 halves_in_turn; do
  python3 -c '
import statistics, sys
xs = [float(x) for x in sys.argv[2].split()]
print(f"{sys.argv[1]:<16} median {statistics.median(xs):7.1f} ms/step  spread {min(xs):.1f}–{max(xs):.1f}  runs {xs}")' "$name" "${medians[$name]}"
done
