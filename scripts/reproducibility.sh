#!/usr/bin/env bash
# How close the seed run's numbers are across device counts and parallel modes, and whether a
# run repeats bit for bit (the figures of README.md, "Reproducibility").
#
# Runs the three example configurations to the end (3 epochs, 138 steps) on 1, 2, 4 and 8
# devices (stand_alone on 1 only; semi_auto with a strategy per device count), each twice, and
# compares every run's per-step losses (the JSON metrics log, full f32 precision) and final test
# accuracy against the 1-device stand_alone run: max absolute and max relative loss difference,
# the number of steps whose loss differs at all, and whether the repeat was bitwise identical.
#
# Usage: scripts/reproducibility.sh    (OUT=/tmp/dir keeps the logs; TESSERA=path skips the
#        build and runs that binary; needs python3)
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
if [ -z "${TESSERA:-}" ]; then
    cargo build --release -q -p tessera-cli
    TESSERA="$TARGET/release/tessera"
fi

# The semi_auto strategies per device count (8 is the file's own).
declare -A SHARD=(
    [1]='{}'
    [2]='{ matmul1 = [[1, 2], [2, 1]], relu1 = [[2, 1]], matmul2 = [[2, 1], [1, 1]], relu2 = [[2, 1]] }'
    [4]='{ matmul1 = [[2, 2], [2, 1]], relu1 = [[4, 1]], matmul2 = [[1, 4], [4, 1]], relu2 = [[4, 1]] }'
)

# run NAME CONFIG DEVICES [--set ...]: two runs, logs $OUT/NAME.{a,b}.jsonl
run() {
    local name=$1 config=$2 devices=$3
    shift 3
    for copy in a b; do
        "$TESSERA" train "$config" --devices "$devices" "$@" \
            --set "output.dir=\"$OUT/$name.$copy\"" --set output.save_checkpoint=false \
            --log-json "$OUT/$name.$copy.jsonl" > /dev/null
    done
    echo "$name" >> "$OUT/runs.txt"
}

rm -f "$OUT/runs.txt"
run stand_alone-1 examples/seed_stand_alone.toml 1
for n in 1 2 4 8; do
    run "data_parallel-$n" examples/seed_data_parallel.toml "$n"
    if [ "$n" = 8 ]; then
        run "semi_auto-$n" examples/seed_semi_auto.toml "$n"
    else
        run "semi_auto-$n" examples/seed_semi_auto.toml "$n" --set "parallel.shard=${SHARD[$n]}"
    fi
done

python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]

def read(name):
    losses, acc = [], None
    for line in open(f"{out}/{name}.jsonl"):
        v = json.loads(line)
        if "loss" in v:
            losses.append(v["loss"])
        if "eval_accuracy" in v:
            acc = v["eval_accuracy"]
    return losses, acc

ref, ref_acc = read("stand_alone-1.a")
print(f"reference: stand_alone on 1 device, {len(ref)} steps, final accuracy {ref_acc:.4%}")
print(f"{'run':<18}{'repeat bitwise':>15}{'steps differing':>17}{'max abs diff':>14}"
      f"{'max rel diff':>14}{'final accuracy':>16}")
for name in open(f"{out}/runs.txt").read().split():
    a, acc_a = read(f"{name}.a")
    b, acc_b = read(f"{name}.b")
    assert len(a) == len(ref), name
    repeat = "yes" if (a, acc_a) == (b, acc_b) else "NO"
    diffs = [abs(x - y) for x, y in zip(a, ref)]
    rels = [abs(x - y) / abs(y) for x, y in zip(a, ref)]
    differing = sum(d != 0 for d in diffs)
    print(f"{name:<18}{repeat:>15}{differing:>12}/{len(a):<4}{max(diffs):>14.3e}"
          f"{max(rels):>14.3e}{acc_a:>16.4%}")
EOF
echo "logs: $OUT"
