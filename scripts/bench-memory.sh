#!/usr/bin/env bash
# Memory and overlap on this machine (issue 16's benchmark), all in one run:
#  1. the GPT of `tessera bench gpt-step` on 2 ranks, data parallel: step time with the
#     gradients fused into buckets and reduced on a progress thread, against without;
#  2. per-rank memory of the example GPT (4 layers, width 128, dp 2, Adam) for hsdp level 0/1/2/3
#     × recompute off/on: predicted (`--explain --json`), measured (the run's metrics log) and
#     ZeRO's formula for parameters + gradients + optimizer state;
#  3. bf16 against f32 step time of the example GPT on one rank (median and p10–p90 of the steps).
#   scripts/bench-memory.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-20}"
cargo build --release -p tessera-cli --quiet
bin=target/release/tessera
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== 1. fusion and overlap (tessera bench gpt-step --fusion --steps $steps)"
"$bin" bench gpt-step --fusion --profile --steps "$steps" | grep -E 'tokens/s|the plain throughput|reshards|= kernels'
echo
echo "== 2. memory per rank (rank 0; MiB): predicted / measured; ZeRO's formula for parameters + gradients + optimizer"
common=(--set parallel.devices=2 --set parallel.data_parallel=2 --set parallel.model_parallel=1
        --set train.eval=false --set train.max_steps=3 --set output.save_checkpoint=false
        --set train.optimizer=\"adam\")
printf '| level | recompute | parameters | gradients | optimizer | activations | peak | P+G+O measured | ZeRO formula |\n|---|---|---|---|---|---|---|---|---|\n'
psi=""
for level in 0 1 2 3; do
  for recompute in off on; do
    sets=("${common[@]}")
    if [ "$level" != 0 ]; then
      # ZeRO's stages: 1 and 2 keep weights whole (zero1, zero2); 3 is MindSpore's level3.
      stage=("" zero1 zero2 level3)
      sets+=(--set "parallel.hsdp={ optimizer_level = \"${stage[$level]}\", threshold = 0 }")
    fi
    if [ "$recompute" = on ]; then
      sets+=(--set 'parallel.recompute.cells=["blocks.*"]')
    fi
    name="l$level-$recompute"
    predicted="$("$bin" train examples/gpt_kjv.toml "${sets[@]}" --set "output.dir=\"$out/$name\"" --explain --json | head -1)"
    "$bin" train examples/gpt_kjv.toml "${sets[@]}" --set "output.dir=\"$out/$name\"" --log-json "$out/$name.jsonl" > /dev/null
    measured="$(grep -m1 '"memory":{.*"rank":0' "$out/$name.jsonl")"
    python3 - "$predicted" "$measured" "$level" "$recompute" "${psi:-0}" <<'PY' > "$out/row"
import json, sys
pred = json.loads(sys.argv[1])["memory"]
meas = json.loads(sys.argv[2])["memory"]
level, recompute, psi = int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
mib = lambda b: f"{b / 2**20:.2f}"
cell = lambda k: f"{mib(pred[k])} / {mib(meas[k])}"
pgo = meas["parameters"] + meas["gradients"] + meas["optimizer"]
if level == 0:
    psi = meas["parameters"]
n = 2
# ZeRO's accounting in f32 with Adam (no master copy): Ψ parameters, Ψ gradients, 2Ψ state.
formula = {0: 4 * psi, 1: 2 * psi + 2 * psi / n, 2: psi + psi / n + 2 * psi / n, 3: 4 * psi / n}[level]
print(f"| {level} | {recompute} | {cell('parameters')} | {cell('gradients')} | {cell('optimizer')} | {cell('activations')} | {cell('peak')} | {mib(pgo)} | {mib(formula)} |")
PY
    psi="$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['memory']['parameters'])" "$(grep -m1 '"memory":{.*"rank":0' "$out/l0-off.jsonl")")"
    cat "$out/row"
  done
done
echo
echo "== 3. bf16 against f32 on one rank (example GPT, $steps steps)"
for precision in f32 bf16; do
  "$bin" train examples/gpt_kjv.toml --set parallel.mode=\"stand_alone\" --set train.eval=false \
    --set "train.max_steps=$steps" --set output.save_checkpoint=false --set "train.precision=\"$precision\"" \
    --set "output.dir=\"$out/$precision\"" --log-json "$out/$precision.jsonl" > /dev/null
  python3 - "$out/$precision.jsonl" "$precision" <<'PY'
import json, statistics, sys
ms = [json.loads(l)["ms"] for l in open(sys.argv[1]) if '"ms"' in l][1:]
ms.sort()
q = lambda p: ms[min(len(ms) - 1, int(p * len(ms)))]
print(f"{sys.argv[2]:>5}: {statistics.median(ms):.1f} ms/step median [p10 {q(0.1):.1f} - p90 {q(0.9):.1f}]")
PY
done
