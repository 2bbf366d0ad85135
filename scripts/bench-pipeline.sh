#!/usr/bin/env bash
# Pipeline parallelism on this machine (issue 15's benchmark): an 8-layer GPT (width 128, 64
# tokens, batch 64 by default, so micro-batches of 8 sequences) on 2 ranks as 2 stages with 8
# micro-batches, for each scheduler: tokens/s, the measured bubble next to the predicted one
# (the schedule's, from --explain) and the one the simulator predicts from the run's own pass
# times per stage, and the micro-batches each rank held at once; then the same model without a
# pipeline on 1 rank and with data parallel 2, in the same run.
#   scripts/bench-pipeline.sh [steps] [batch]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-20}"
batch="${2:-64}"
cargo build --release -p tessera-cli --quiet
bin=target/release/tessera
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); batch $batch, $steps steps"
common=(--set model.layers=8 --set model.hidden=128 --set model.seq_len=64 --set "data.batch_size=$batch"
        --set train.eval=false --set "train.max_steps=$steps" --set output.save_checkpoint=false)
run() {
  local name="$1"; shift
  local log
  log="$("$bin" train examples/gpt_kjv.toml "${common[@]}" --set "output.dir=\"$out/$name\"" "$@" 2>&1)"
  local secs
  # "trained N steps on D device(s) in S s": the summary's steps/s has one decimal only.
  secs="$(grep -o 'device(s) in [0-9.]* s' <<<"$log" | cut -d' ' -f3)"
  printf '%-26s %8.0f tokens/s' "$name" "$(echo "$steps * $batch * 64 / $secs" | bc -l)"
  grep -o 'bubble (measured[^:]*: [0-9.]* %' <<<"$log" | sed 's/.*: /  measured bubble /' | tr -d '\n' || true
  grep -o 'bubble (predicted from[^:]*: [0-9.]* %' <<<"$log" | sed 's/.*: /  (from its pass times: /;s/$/)/' | tr -d '\n' || true
  grep -o 'per rank: .*' <<<"$log" | sed 's/per rank:/  held at once:/' | tr -d '\n' || true
  echo
}
for scheduler in gpipe 1f1b zero_bubble; do
  pipe=(--set parallel.mode=\"semi_auto\" --set parallel.devices=2 --set parallel.model_parallel=1
        --set "parallel.pipeline={ stages = 2, micro_batches = 8, scheduler = \"$scheduler\" }")
  predicted="$("$bin" train examples/gpt_kjv.toml "${common[@]}" "${pipe[@]}" --explain | grep -o 'predicted bubble [0-9.]* %')"
  echo "   ($scheduler: $predicted)"
  run "pipeline 2 × 8, $scheduler" "${pipe[@]}"
done
run "no pipeline, 1 rank" --set parallel.mode=\"stand_alone\" --set parallel.devices=1
run "data parallel 2" --set parallel.mode=\"semi_auto\" --set parallel.devices=2 --set parallel.model_parallel=1
echo
echo "== peak memory per stage (MiB; 3 steps): predicted (--explain --json) / measured (metrics log)"
printf '| scheduler | stage 0 activations | stage 1 activations | stage 0 peak | stage 1 peak |\n|---|---|---|---|---|\n'
for scheduler in gpipe 1f1b zero_bubble; do
  pipe=(--set parallel.mode=\"semi_auto\" --set parallel.devices=2 --set parallel.model_parallel=1
        --set "parallel.pipeline={ stages = 2, micro_batches = 8, scheduler = \"$scheduler\" }"
        --set train.max_steps=3)
  name="mem-$scheduler"
  "$bin" train examples/gpt_kjv.toml "${common[@]}" "${pipe[@]}" --set "output.dir=\"$out/$name\"" \
    --explain --json > "$out/$name.plan.json"
  "$bin" train examples/gpt_kjv.toml "${common[@]}" "${pipe[@]}" --set "output.dir=\"$out/$name\"" \
    --log-json "$out/$name.jsonl" > /dev/null
  python3 - "$scheduler" "$out/$name.plan.json" "$out/$name.jsonl" <<'PY'
import json, sys
scheduler, plan_path, log_path = sys.argv[1:]
predicted = {}
for line in open(plan_path):
    line = line.strip()
    if line.startswith("{"):
        obj = json.loads(line)
        if obj.get("memory"):
            predicted[obj["memory"]["rank"]] = obj["memory"]
measured = {}
for line in open(log_path):
    obj = json.loads(line)
    if "memory" in obj:
        measured[obj["memory"]["rank"]] = obj["memory"]
mib = lambda b: b / (1 << 20)
cell = lambda r, k: f"{mib(predicted[r][k]):.2f} / {mib(measured[r][k]):.2f}"
print(f"| {scheduler} | {cell(0, 'activations')} | {cell(1, 'activations')} | {cell(0, 'peak')} | {cell(1, 'peak')} |")
PY
done
