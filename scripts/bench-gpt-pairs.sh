#!/usr/bin/env bash
# Tessera's 1 rank against PyTorch's single thread on the GPT benchmark model (4 layers, 4 heads,
# width 256, 128 tokens, batch 16, f32, AdamW), as PAIRS back-to-back pairs whose order
# alternates (PyTorch first in odd pairs): each pair's ratio of tokens/s, then their median and
# range. On a machine whose speed drifts between minutes, a ratio within a pair is the figure to
# trust; a single before/after run (scripts/bench-gpt.sh) is not. Installs PyTorch into a venv
# if absent; prints the cores and load first, and the CPU (Tessera's machine line) in the first pair.
#   scripts/bench-gpt-pairs.sh [pairs] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
pairs="${1:-5}"
steps="${2:-10}"
. scripts/bench-venv.sh
cargo build --release -p tessera-cli --quiet
echo "== $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
torch_rate() {
  "$venv/bin/python" scripts/torch_gpt_step.py "$steps" --one-thread 2>/dev/null \
    | sed -n 's/.*1 thread: \([0-9]*\) tokens\/s.*/\1/p'
}
bin="${CARGO_TARGET_DIR:-target}/release/tessera"
# The rate of one run; the first run also prints Tessera's own machine line (the CPU's model,
# family and model numbers, vector unit and L2) to stderr.
tessera_rate() {
  local out
  out=$("$bin" bench gpt-step --steps "$steps" --one-rank)
  if [ "$1" = 1 ]; then sed -n 's/^machine: /== /p' <<<"$out" >&2; fi
  sed -n 's/^tessera, 1 rank: \([0-9]*\) tokens\/s.*/\1/p' <<<"$out"
}
ratios=()
for pair in $(seq 1 "$pairs"); do
  if [ $((pair % 2)) -eq 1 ]; then
    t=$(torch_rate); s=$(tessera_rate "$pair")
  else
    s=$(tessera_rate "$pair"); t=$(torch_rate)
  fi
  if [ -z "$t" ] || [ -z "$s" ]; then
    echo "pair $pair: a run printed no tokens/s (pytorch '$t', tessera '$s')" >&2
    exit 1
  fi
  ratio=$(python3 -c "print(f'{$s / $t:.3f}')")
  ratios+=("$ratio")
  echo "pair $pair: pytorch 1 thread $t tokens/s, tessera 1 rank $s tokens/s: ${ratio}x"
done
python3 - "${ratios[@]}" <<'PY'
import statistics, sys
r = sorted(float(x) for x in sys.argv[1:])
print(f"tessera 1 rank / pytorch 1 thread: {statistics.median(r):.2f}x "
      f"(median of {len(r)} pairs, {r[0]:.2f}-{r[-1]:.2f})")
PY
