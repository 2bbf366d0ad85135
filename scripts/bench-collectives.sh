#!/usr/bin/env bash
# Collectives benchmark, one table per rank count: single-thread memcpy, Tessera's local backend,
# Tessera's MPI backend (which also times the MPI library's own calls run for run in the same
# process, and prints the paired ratio) and plain OpenMPI (scripts/mpi_allreduce_bench.c), run
# one after another on the same machine. Figures are bus bandwidth in GB/s (nccl-tests'
# definition), medians of REPS runs; the full median [min-max] outputs are kept in $OUT.
#
# Usage: scripts/bench-collectives.sh [RANKS...]        (default: 2 4)
#        MAX_MIB=256 REPS=9 OUT=/tmp/bench-collectives scripts/bench-collectives.sh 2 4
# Needs OpenMPI (apt-get install -y libopenmpi-dev openmpi-bin libclang-dev).
set -euo pipefail
cd "$(dirname "$0")/.."

RANK_COUNTS=("$@")
[ ${#RANK_COUNTS[@]} -eq 0 ] && RANK_COUNTS=(2 4)
MAX_MIB=${MAX_MIB:-256}
REPS=${REPS:-9}
TARGET=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe)

cargo build --release -q -p tessera-cli --features mpi
mpicc -O2 -o "$TARGET/mpi_allreduce_bench" scripts/mpi_allreduce_bench.c
TESSERA="$TARGET/release/tessera"

"$TESSERA" bench memcpy --max-mib "$MAX_MIB" --reps "$REPS" > "$OUT/memcpy.txt"
for n in "${RANK_COUNTS[@]}"; do
    "$TESSERA" bench collectives --backend local --ranks "$n" --max-mib "$MAX_MIB" \
        --reps "$REPS" > "$OUT/local-$n.txt"
    "${MPIRUN[@]}" -np "$n" "$TESSERA" bench collectives --backend mpi --max-mib "$MAX_MIB" \
        --reps "$REPS" > "$OUT/mpi-$n.txt"
    "${MPIRUN[@]}" -np "$n" "$TESSERA" bench collectives --backend mpi --mpi-watchdog \
        --max-mib "$MAX_MIB" --reps "$REPS" > "$OUT/mpi-watchdog-$n.txt"
    "${MPIRUN[@]}" -np "$n" "$TARGET/mpi_allreduce_bench" "$MAX_MIB" "$REPS" > "$OUT/openmpi-$n.txt"

    echo
    echo "## $n ranks: bus bandwidth, GB/s (median of $REPS runs)"
    echo
    # Data lines start with "<number> <unit>"; the third field is the median, the fifth the
    # second operation's median.
    # Data lines start with "<number> <unit>"; then median [min-max] pairs: the third field is
    # the first operation's median, the fifth the second's. The MPI runs add the library's own
    # calls (fields 7 and 9) and the paired ratios (fields 11 and 12).
    awk -v ranks="$n" '
        FNR == 1 { file++ }
        $2 ~ /^[KMG]iB$/ {
            size = $1 " " $2
            if (file == 1) { order[++rows] = size; memcpy[size] = $3 }
            if (file == 2) { local_ar[size] = $3; local_ag[size] = $5 }
            if (file == 3) { mpi_ar[size] = $3; mpi_ag[size] = $5; pair_ar[size] = $11; pair_ag[size] = $12 }
            if (file == 4) { wd_ar[size] = $3; wd_ag[size] = $5 }
            if (file == 5) { ompi_ar[size] = $3; ompi_ag[size] = $5 }
        }
        END {
            print "| size | memcpy | all-reduce: local | all-reduce: tessera mpi (polled) | all-reduce: tessera mpi (watchdog) | all-reduce: OpenMPI | all-reduce: polled vs in-process MPI_Allreduce | all-gather: local | all-gather: tessera mpi (polled) | all-gather: tessera mpi (watchdog) | all-gather: OpenMPI | all-gather: polled vs in-process MPI_Allgather |"
            print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            for (i = 1; i <= rows; i++) {
                s = order[i]
                if (!(s in local_ar)) continue
                printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s, memcpy[s],
                    local_ar[s], mpi_ar[s], wd_ar[s], ompi_ar[s], pair_ar[s], local_ag[s],
                    mpi_ag[s], wd_ag[s], ompi_ag[s], pair_ag[s]
            }
        }' "$OUT/memcpy.txt" "$OUT/local-$n.txt" "$OUT/mpi-$n.txt" \
        "$OUT/mpi-watchdog-$n.txt" "$OUT/openmpi-$n.txt"
done
echo
echo "raw outputs (median [min-max]): $OUT"
