/* OpenMPI baseline for `tessera bench collectives`: MPI_Allreduce (in place, float sum),
 * MPI_Allgather and MPI_Iallreduce+MPI_Wait, measured exactly as the Rust benchmark measures
 * (same sizes, inner repetitions, slowest rank, median [min-max] of reps), printed in the same
 * format: bus bandwidth in GB/s.
 *
 * Build and run:  mpicc -O2 -o mpi_allreduce_bench scripts/mpi_allreduce_bench.c
 *                 mpirun --allow-run-as-root --oversubscribe -np 2 ./mpi_allreduce_bench [MAX_MIB] [REPS]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum op { ALLREDUCE, ALLGATHER, IALLREDUCE };

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Seconds per call: median, min, max over reps (each the slowest rank's). */
static void measure(enum op op, size_t size, int reps, double out[3]) {
    int n;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t count = size / 4;
    size_t send_count = count / (size_t)n;
    float *buf = malloc(size > 0 ? size : 4);
    float *send = malloc(send_count > 0 ? send_count * 4 : 4);
    float *recv = malloc(send_count * (size_t)n > 0 ? send_count * (size_t)n * 4 : 4);
    for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
    for (size_t i = 0; i < send_count; i++) send[i] = 1.0f;
    size_t inner = ((size_t)16 << 20) / size;
    if (inner < 1) inner = 1;
    if (inner > 2000) inner = 2000;
    double *times = malloc(sizeof(double) * (size_t)reps);
    double start = 0.0;
    for (int rep = 0; rep <= reps; rep++) {
        /* One untimed call first, as the Rust benchmark does. */
        for (size_t k = 0; k <= inner; k++) {
            if (k == 1) {
                MPI_Barrier(MPI_COMM_WORLD);
                start = MPI_Wtime();
            }
            if (op == ALLREDUCE) {
                MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            } else if (op == ALLGATHER) {
                MPI_Allgather(send, (int)send_count, MPI_FLOAT, recv, (int)send_count, MPI_FLOAT,
                              MPI_COMM_WORLD);
            } else {
                MPI_Request req;
                MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                               &req);
                MPI_Wait(&req, MPI_STATUS_IGNORE);
            }
        }
        double per_call = (MPI_Wtime() - start) / (double)inner, slowest;
        MPI_Allreduce(&per_call, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (rep > 0) times[rep - 1] = slowest;
    }
    qsort(times, (size_t)reps, sizeof(double), cmp_double);
    out[0] = times[reps / 2];
    out[1] = times[0];
    out[2] = times[reps - 1];
    free(times);
    free(buf);
    free(send);
    free(recv);
}

static void human(size_t bytes, char *out) {
    if (bytes >= (1u << 20)) sprintf(out, "%zu MiB", bytes >> 20);
    else sprintf(out, "%zu KiB", bytes >> 10);
}

/* median [min-max] of bus bandwidth: the fastest time gives the max bandwidth. */
static void print_bw(size_t size, const double t[3], double factor) {
    printf("  %7.2f [%.2f-%.2f]", size / t[0] / 1e9 * factor, size / t[2] / 1e9 * factor,
           size / t[1] / 1e9 * factor);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t max_mib = argc > 1 ? (size_t)atol(argv[1]) : 256;
    int reps = argc > 2 ? atoi(argv[2]) : 9;
    if (reps < 1) reps = 1;
    if (rank == 0) {
        printf("# OpenMPI C baseline, %d ranks: bus bandwidth in GB/s, median [min-max] over %d runs\n",
               n, reps);
        printf("#     size   MPI_Allreduce          MPI_Allgather          MPI_Iallreduce\n");
    }
    for (size_t size = 1024; size <= (max_mib << 20); size *= 4) {
        double ar[3], ag[3], iar[3];
        measure(ALLREDUCE, size, reps, ar);
        measure(ALLGATHER, size, reps, ag);
        measure(IALLREDUCE, size, reps, iar);
        if (rank == 0) {
            char label[32];
            human(size, label);
            printf("%10s", label);
            print_bw(size, ar, 2.0 * (n - 1) / n);
            print_bw(size, ag, (double)(n - 1) / n);
            print_bw(size, iar, 2.0 * (n - 1) / n);
            printf("\n");
            fflush(stdout);
        }
    }
    MPI_Finalize();
    return 0;
}
