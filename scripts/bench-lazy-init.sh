#!/usr/bin/env bash
# Peak memory of starting a resumed run, eager against lazy parameter initialisation
# (`train.lazy_init`, issue 19's no_init_parameters): the example GPT widened to 512 (4 layers,
# about 12.9 M parameters, Adam) on one device trains 2 steps and saves; the resumed run then
# stops at once (max_steps = 2), so its peak resident set is the start's: the parameters
# initialised (eager only) and the checkpoint loaded (both). Median and min–max of N runs each
# (GNU time's maximum resident set size).
#   scripts/bench-lazy-init.sh [runs] [hidden]
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-5}"
hidden="${2:-512}"
cargo build --release -p tessera-cli --quiet
bin=target/release/tessera
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(--devices 1 --set parallel.data_parallel=1 --set parallel.model_parallel=1
        --set model.hidden=$hidden --set train.eval=false --set train.optimizer=\"adam\")
"$bin" train examples/gpt_kjv.toml "${common[@]}" --set train.max_steps=2 \
  --set "output.dir=\"$out/first\"" > /dev/null
echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== hidden $hidden"
printf '| train.lazy_init | peak RSS at start, median (MiB) | min–max (MiB) |\n|---|---|---|\n'
for lazy in false true; do
  for i in $(seq "$runs"); do
    /usr/bin/time -f "%M" -o "$out/rss" "$bin" train examples/gpt_kjv.toml "${common[@]}" \
      --set train.max_steps=2 --set "train.lazy_init=$lazy" \
      --set "output.resume_from=\"$out/first\"" --set output.save_checkpoint=false \
      --set "output.dir=\"$out/resumed\"" > /dev/null
    cat "$out/rss"
  done | sort -n | awk -v lazy="$lazy" '{ v[NR] = $1 / 1024 } END {
    printf "| %s | %.1f | %.1f–%.1f |\n", lazy, v[int((NR + 1) / 2)], v[1], v[NR] }'
done
