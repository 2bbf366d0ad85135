#!/usr/bin/env bash
# Peak RSS and wall time of planning at 1024, 8192 and 65536 ranks (issue 13): `tessera train
# --explain` (seed_semi_auto's op strategies, data parallel over every rank, global batch = ranks),
# `tessera layout` (one dim split over every rank) and `tessera reshard` (replicated -> split; and
# at 1024 ranks only, split -> replicated, an all-gather whose plan lists ranks x (ranks - 1) pieces).
# Each case runs RUNS times under /usr/bin/time -v; prints the median and the spread (min..max).
# A run is capped by `ulimit -v CAP_KB` and `timeout CAP_S` and then reported as aborted.
#   scripts/bench-planning-memory.sh [BIN] [RUNS] [RANKS...]
#   e.g. scripts/bench-planning-memory.sh target/release/tessera 3 1024 8192 65536
# Needs /usr/bin/time (apt-get install -y time) and python3 (to write a synthetic IDX data set
# with as many samples as ranks, since a global batch may not exceed the training set).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/tessera}"
runs="${2:-3}"
shift $(( $# >= 2 ? 2 : $# ))
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(1024 8192 65536)
cap_kb="${CAP_KB:-8388608}"   # 8 GiB of address space
cap_s="${CAP_S:-300}"
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (apt-get install -y time)" >&2; exit 1; }
[ -x "$bin" ] || { echo "no binary at $bin (cargo build --release -p tessera-cli)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# A synthetic 8x8-pixel IDX data set of n training samples (and 10 test samples).
make_data() {
  python3 - "$1" "$2" <<'EOF'
import os, struct, sys
n, out = int(sys.argv[1]), sys.argv[2]
os.makedirs(out, exist_ok=True)
def write(name, magic, dims, payload):
    with open(os.path.join(out, name), "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload)
for prefix, m in (("train", n), ("t10k", 10)):
    write(f"{prefix}-images-idx3-ubyte", 0x803, (m, 8, 8), bytes((i * 7) % 17 for i in range(m * 64)))
    write(f"{prefix}-labels-idx1-ubyte", 0x801, (m,), bytes(i % 10 for i in range(m)))
EOF
}

# One measurement: "<peak RSS KiB> <seconds>", or "aborted".
measure() {
  local log="$work/time.log"
  if ( ulimit -v "$cap_kb"; timeout "$cap_s" /usr/bin/time -v -o "$log" "$@" >/dev/null 2>"$work/err" ); then
    local rss secs
    rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
    secs=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log" |
      awk -F: '{ if (NF == 3) print $1*3600 + $2*60 + $3; else print $1*60 + $2 }')
    echo "$rss $secs"
  else
    echo "aborted"
  fi
}

# Runs a case RUNS times and prints one table row.
bench_case() {
  local name="$1" n="$2"
  shift 2
  local rss_list=() secs_list=() aborted=0
  for _ in $(seq "$runs"); do
    local m
    m=$(measure "$@")
    if [ "$m" = aborted ]; then aborted=1; break; fi
    rss_list+=("${m% *}")
    secs_list+=("${m#* }")
  done
  if [ "$aborted" = 1 ]; then
    printf '| %-22s | %7s | > %d MiB or > %d s: aborted | |\n' "$name" "$n" $((cap_kb / 1024)) "$cap_s"
    return
  fi
  python3 - "$name" "$n" "${rss_list[*]}" "${secs_list[*]}" <<'EOF'
import statistics, sys
name, n, rss, secs = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split()], [float(x) for x in sys.argv[4].split()]
mib = [r / 1024 for r in rss]
print(f"| {name:<22} | {n:>7} | {statistics.median(mib):9.1f} MiB ({min(mib):.1f}..{max(mib):.1f}) | "
      f"{statistics.median(secs):7.2f} s ({min(secs):.2f}..{max(secs):.2f}) |")
EOF
}

echo "== $bin, $runs run(s) per case, cap $((cap_kb / 1024)) MiB / ${cap_s} s; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| case                   |   ranks | peak RSS, median (min..max) | time, median (min..max) |"
echo "|---|---|---|---|"
for n in "${ranks[@]}"; do
  make_data "$n" "$work/data-$n"
  bench_case "train --explain" "$n" "$bin" train examples/seed_semi_auto.toml --devices "$n" \
    --set "data.dir=\"$work/data-$n\"" --set "data.batch_size=$n" --explain
  bench_case "layout" "$n" "$bin" layout --mesh "dp=$n" --map dp --shape "$n"
  bench_case "reshard replicate->split" "$n" "$bin" reshard --shape "$n" --from-mesh "dp=$n" \
    --from None --to dp
  # The all-gather's plan and its printout are ranks x (ranks - 1) pieces by nature.
  if [ "$n" -le 1024 ]; then
    bench_case "reshard all-gather" "$n" "$bin" reshard --shape "$n" --from-mesh "dp=$n" \
      --from dp --to None
  fi
  rm -rf "$work/data-$n"
done
