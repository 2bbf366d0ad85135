#!/usr/bin/env bash
# Fused gradient buckets reduced while the backward pass computes, under MPI (issue 16): the
# example GPT (4 layers, width 128) on `mpirun -np 2`, data parallel 2, 1 MB buckets, with
# `grad_computation_allreduce_overlap` off and on, in the same run; the median and min–max of
# the steps' times (the first 2 steps left out) from the metrics log.
#   scripts/bench-mpi-overlap.sh [steps] [repetitions] [hsdp level: 0 | 2 | 3]
# Level 0 (the default) reduces the buckets by all-reduce; level 2 by reduce-scatter (hsdp
# level 2, threshold 0, 1 MB reduce-scatter buckets); level 3 also keeps the weights sharded
# and, with overlap on, gathers each one a gather ahead (`computation_allgather_overlap`).
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-30}"
reps="${2:-3}"
level="${3:-0}"
cargo build --release -p tessera-cli --features mpi --quiet
bin=target/release/tessera
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
common=(--backend mpi --set parallel.devices=2 --set parallel.data_parallel=2
        --set parallel.model_parallel=1 --set train.eval=false --set "train.max_steps=$steps"
        --set output.save_checkpoint=false
        --set 'parallel.comm_fusion={ allreduce = { mode = "size", config = 1 }, reducescatter = { mode = "size", config = 1 } }')
case "$level" in
  0) ;;
  2) common+=(--set "parallel.hsdp={ optimizer_level = \"zero2\", threshold = 0 }") ;;
  3) common+=(--set "parallel.hsdp={ optimizer_level = \"level3\", threshold = 0 }") ;;
  *) echo "hsdp level must be 0, 2 or 3, not $level" >&2; exit 2 ;;
esac
echo "== hsdp level $level"
for rep in $(seq "$reps"); do
  for overlap in false true; do
    mpirun --allow-run-as-root --oversubscribe -np 2 "$bin" train examples/gpt_kjv.toml "${common[@]}" \
      --set "parallel.overlap.grad_computation_allreduce_overlap=$overlap" \
      --set "parallel.overlap.computation_allgather_overlap=$([ "$level" = 3 ] && echo "$overlap" || echo false)" \
      --set "output.dir=\"$out/run-$overlap-$rep\"" --log-json "$out/$overlap-$rep.jsonl" > /dev/null
  done
done
python3 - "$out" "$reps" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
for overlap in ("false", "true"):
    ms = []
    for rep in range(1, reps + 1):
        steps = [json.loads(l) for l in open(f"{out}/{overlap}-{rep}.jsonl") if '"step"' in l and '"ms"' in l]
        ms += [s["ms"] for s in steps[2:]]
    print(f"overlap {overlap:5}: step median {statistics.median(ms):7.2f} ms, min {min(ms):7.2f}, max {max(ms):7.2f} ({len(ms)} steps)")
PY
