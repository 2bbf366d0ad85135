#!/usr/bin/env bash
# Calibration of the cost model on this machine: measures a device profile
# (`tessera bench profile`: matmul rates, memcpy, all-reduce α–β on 2 and 8 local ranks, the
# core count), then for the seed MLP and a small GPT under 1, 2 and 8 ranks and several
# strategies predicts the step time (`tessera plan --profile FILE --json`, predicted_step_ms)
# and measures it (`tessera train`, the median "ms" of the metrics log's steps after the
# first 5, so start-up and warm-up are excluded). Prints a Markdown table and the Spearman rank
# correlation of predicted against measured, beside the prediction of the same profile with
# its cores and local links removed (every rank its own device, as before issue 18's
# calibration work).
#   scripts/bench-calibration.sh [steps]      (default 30 steps per case)
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-30}"
if ! [[ "$steps" =~ ^[0-9]+$ ]] || (( steps < 10 )); then
    echo "steps must be a whole number ≥ 10 (got '$steps')" >&2
    exit 2
fi
cargo build --release -p tessera-cli --quiet
bin=target/release/tessera
work="$(mktemp -d /tmp/tessera-calibration.XXXXXX)"
trap 'rm -rf "$work"' EXIT
echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" bench profile --sustained --out "$work/cpu-local.toml"
profile="$work/cpu-local.toml"
# The same profile without `compute_slots` and the [[local_link]] tables.
flat="$work/cpu-flat.toml"
awk '/^compute_slots/ {next} /^\[\[local_link\]\]/ {skip=1; next} /^\[/ {skip=0} !skip' \
    "$profile" > "$flat"

mlp=examples/seed_data_parallel.toml
mlp_shards=examples/seed_semi_auto.toml
gpt=examples/gpt_kjv.toml
# The seed MLP as in the earlier table (hidden 512, batch 256, momentum); a 2-layer GPT.
mlp_sets="--set data.batch_size=256"
gpt_sets="--set model.layers=2 --set output.save_checkpoint=false"
dp="--set parallel.mode=semi_auto"

# name | config | ranks | extra --set flags
cases=(
    "MLP 1 rank|$mlp|1|$mlp_sets --set parallel.mode=stand_alone"
    "MLP 2 ranks data parallel|$mlp|2|$mlp_sets"
    "MLP 8 ranks data parallel|$mlp|8|$mlp_sets"
    "MLP 8 ranks semi_auto (seed shards)|$mlp_shards|8|$mlp_sets"
    "MLP 2 ranks dynamic programming|$mlp|2|$mlp_sets --set parallel.mode=dynamic_programming"
    "MLP 8 ranks dynamic programming|$mlp|8|$mlp_sets --set parallel.mode=dynamic_programming"
    "MLP 8 ranks recursive|$mlp|8|$mlp_sets --set parallel.mode=recursive_programming"
    "MLP 8 ranks propagation|$mlp|8|$mlp_sets --set parallel.mode=sharding_propagation"
    "GPT 1 rank|$gpt|1|$gpt_sets --set parallel.mode=stand_alone"
    "GPT 2 ranks data parallel|$gpt|2|$gpt_sets $dp --set parallel.data_parallel=2 --set parallel.model_parallel=1"
    "GPT 2 ranks model parallel|$gpt|2|$gpt_sets $dp --set parallel.data_parallel=1 --set parallel.model_parallel=2"
    "GPT 8 ranks data parallel|$gpt|8|$gpt_sets $dp --set parallel.data_parallel=8 --set parallel.model_parallel=1"
    "GPT 8 ranks dp 4 × mp 2|$gpt|8|$gpt_sets $dp --set parallel.data_parallel=4 --set parallel.model_parallel=2"
    "GPT 2 ranks dynamic programming|$gpt|2|$gpt_sets --set parallel.mode=dynamic_programming"
    "GPT 8 ranks dynamic programming|$gpt|8|$gpt_sets --set parallel.mode=dynamic_programming"
)

results="$work/results.tsv"
: > "$results"
i=0
for case in "${cases[@]}"; do
    IFS='|' read -r name config ranks sets <<< "$case"
    i=$((i + 1))
    dir="$work/case$i"
    mkdir -p "$dir"
    # shellcheck disable=SC2086 # $sets holds several flags
    "$bin" plan "$config" --devices "$ranks" --profile "$profile" --json \
        --set "output.dir=\"$dir/plan\"" $sets > "$dir/plan.json"
    # shellcheck disable=SC2086
    "$bin" plan "$config" --devices "$ranks" --profile "$flat" --json \
        --set "output.dir=\"$dir/flat\"" $sets > "$dir/flat.json"
    load=()
    if [[ "$sets" == *"_programming"* || "$sets" == *"sharding_propagation"* ]]; then
        # Train exactly the plan's strategies (no second search).
        load=(--set "parallel.load_operator_strategy_file=\"$dir/plan/operator_strategy.json\"")
    fi
    # shellcheck disable=SC2086
    "$bin" train "$config" --devices "$ranks" --log-json "$dir/metrics.jsonl" \
        --set "output.dir=\"$dir/run\"" --set "train.max_steps=$steps" \
        --set "parallel.device_profile=\"$profile\"" $sets "${load[@]}" > "$dir/train.log"
    printf '%s\t%s\t%s\t%s\n' "$name" "$dir/plan.json" "$dir/flat.json" "$dir/metrics.jsonl" \
        >> "$results"
    echo "   done: $name (load $(cut -d' ' -f1 /proc/loadavg))" >&2
done

echo "== load after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" <<'EOF'
import json
import statistics
import sys


def ranks(values):
    """Average ranks (1-based), ties sharing the mean of their positions."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs, ys):
    """Pearson correlation of the ranks."""
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy) if sx and sy else float("nan")


rows = []
for line in open(sys.argv[1]):
    name, plan, flat, metrics = line.rstrip("\n").split("\t")
    predicted = json.load(open(plan))["predicted_step_ms"]
    unaware = json.load(open(flat))["predicted_step_ms"]
    steps = [json.loads(l) for l in open(metrics)]
    ms = [s["ms"] for s in steps if "step" in s and "ms" in s]
    if len(ms) <= 5:
        sys.exit(f"{metrics}: only {len(ms)} steps logged")
    measured = statistics.median(ms[5:])
    rows.append((name, predicted, measured, unaware))

print("| case | predicted ms/step | measured ms/step | error | without cores: predicted | error |")
print("|---|---|---|---|---|---|")
for name, p, m, u in rows:
    print(
        f"| {name} | {p:.2f} | {m:.2f} | {100 * (p - m) / m:+.0f} % "
        f"| {u:.2f} | {100 * (u - m) / m:+.0f} % |"
    )
for label, subset in [
    ("all", rows),
    ("MLP", [r for r in rows if r[0].startswith("MLP")]),
    ("GPT", [r for r in rows if r[0].startswith("GPT")]),
]:
    for what, col in [("cores-aware", 1), ("without cores", 3)]:
        rho = spearman([r[col] for r in subset], [r[2] for r in subset])
        errors = sorted(abs(r[col] - r[2]) / r[2] for r in subset)
        print(
            f"Spearman rank correlation ({label}, {len(subset)} cases, {what}): {rho:.2f}; "
            f"median |error| {100 * statistics.median(errors):.0f} %, worst {100 * errors[-1]:.0f} %"
        )
EOF
