#!/usr/bin/env bash
# Tessera's MPI backend all-reduce against the plain OpenMPI program, run after run: RUNS
# alternations of `tessera bench collectives --backend mpi` and scripts/mpi_allreduce_bench.c
# on NP ranks, then per size the medians and spreads of both, the median (and range) of the
# per-run ratios Tessera / OpenMPI, and the median of the in-process paired ratio that the
# Tessera benchmark prints itself. Single runs of either program move by ±15-30 % on a shared
# machine; the median over alternating runs is the comparison to quote.
#
# Usage: scripts/bench-mpi-vs-openmpi.sh [NP] [RUNS] [MAX_MIB]      (default: 2 5 16)
#        OUT=DIR keeps the raw outputs there; TABLE_ONLY=1 OUT=DIR only re-prints their table.
# Needs OpenMPI (apt-get install -y libopenmpi-dev openmpi-bin libclang-dev).
set -euo pipefail
cd "$(dirname "$0")/.."

NP=${1:-2}
RUNS=${2:-5}
MAX_MIB=${3:-16}
TARGET=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np "$NP")

cargo build --release -q -p tessera-cli --features mpi
mpicc -O2 -o "$TARGET/mpi_allreduce_bench" scripts/mpi_allreduce_bench.c

# TABLE_ONLY=1 OUT=DIR re-prints the table of an earlier run's outputs.
for run in $(seq 1 "$RUNS"); do
    [ -n "${TABLE_ONLY:-}" ] && break
    "${MPIRUN[@]}" "$TARGET/release/tessera" bench collectives --backend mpi \
        --max-mib "$MAX_MIB" --reps 9 > "$OUT/tessera-$run.txt"
    "${MPIRUN[@]}" "$TARGET/mpi_allreduce_bench" "$MAX_MIB" 9 > "$OUT/openmpi-$run.txt"
done

echo "## all-reduce, $NP ranks: $RUNS alternating runs (bus GB/s, median [min-max] over runs)"
echo
echo "| size | tessera mpi (polled) | OpenMPI | tessera / OpenMPI, per run: median [min-max] | in-process paired ratio, median |"
echo "|---:|---:|---:|---:|---:|"
# Data lines: "<n> <unit> <median> [..] ..."; the Tessera file's 11th field is the paired ratio.
awk '
    function median(list, n,   sorted, i, j, t) {
        for (i = 1; i <= n; i++) sorted[i] = list[i]
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
            if (sorted[j] < sorted[i]) { t = sorted[i]; sorted[i] = sorted[j]; sorted[j] = t }
        return n % 2 ? sorted[(n + 1) / 2] : (sorted[n / 2] + sorted[n / 2 + 1]) / 2
    }
    FNR == 1 { tessera = FILENAME ~ /tessera-[0-9]+\.txt$/; n = split(FILENAME, parts, "-"); run = parts[n] + 0 }
    $2 ~ /^[KMG]iB$/ {
        size = $1 " " $2
        if (!(size in seen)) { seen[size] = 1; order[++rows] = size }
        if (tessera) { t[size, run] = $3; paired[size, run] = $11 + 0 }
        else c[size, run] = $3
        runs = run > runs ? run : runs
    }
    END {
        for (i = 1; i <= rows; i++) {
            s = order[i]
            tmin = cmin = rmin = 1e9; tmax = cmax = rmax = 0
            for (r = 1; r <= runs; r++) {
                tv[r] = t[s, r]; cv[r] = c[s, r]; rv[r] = t[s, r] / c[s, r]; pv[r] = paired[s, r]
                if (tv[r] < tmin) tmin = tv[r]; if (tv[r] > tmax) tmax = tv[r]
                if (cv[r] < cmin) cmin = cv[r]; if (cv[r] > cmax) cmax = cv[r]
                if (rv[r] < rmin) rmin = rv[r]; if (rv[r] > rmax) rmax = rv[r]
            }
            printf "| %s | %.2f [%.2f-%.2f] | %.2f [%.2f-%.2f] | %.0f %% [%.0f-%.0f] | %.0f %% |\n", s,
                median(tv, runs), tmin, tmax, median(cv, runs), cmin, cmax,
                100 * median(rv, runs), 100 * rmin, 100 * rmax, median(pv, runs)
        }
    }' $(for run in $(seq 1 "$RUNS"); do echo "$OUT/tessera-$run.txt" "$OUT/openmpi-$run.txt"; done)
echo
echo "raw outputs: $OUT"
