/* MPI_Allreduce latency and bus bandwidth for one message size (the sweep example's program).
 *
 *   mpicc -O2 -o allreduce_latency allreduce_latency.c
 *   mpirun -np 4 ./allreduce_latency BYTES [ITERS] [WARMUP]
 *
 * Sums BYTES of floats (rank r contributes r+1 in every element) ITERS times after WARMUP
 * untimed calls, checks every element of the result (n(n+1)/2), and rank 0 prints one line:
 *   bytes ranks avg_us min_us max_us busbw_GBps wrong
 * avg/min/max: each rank's mean time per call, averaged and extremes over ranks; busbw as
 * nccl-tests defines it for all-reduce: bytes / avg time * 2(n-1)/n, GB = 1e9 bytes. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 2) {
        if (rank == 0) fprintf(stderr, "usage: %s BYTES [ITERS] [WARMUP]\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    long bytes = atol(argv[1]);
    int iters = argc > 2 ? atoi(argv[2]) : 100;
    int warmup = argc > 3 ? atoi(argv[3]) : 10;
    long count = bytes / (long)sizeof(float);
    if (count < 1 || iters < 1 || warmup < 0) {
        if (rank == 0) fprintf(stderr, "error: BYTES must be >= %zu, ITERS >= 1, WARMUP >= 0\n", sizeof(float));
        MPI_Finalize();
        return 2;
    }
    /* page-aligned, as the OSU benchmarks allocate theirs: Open MPI's shared-memory path moves a 64 KiB message
     * 2-3x faster between page-aligned buffers than between malloc's 16-byte-aligned ones (2-core VM) */
    float *send = NULL, *recv = NULL;
    long page = sysconf(_SC_PAGESIZE);
    if (posix_memalign((void **)&send, page, count * sizeof(float)) || posix_memalign((void **)&recv, page, count * sizeof(float))) {
        fprintf(stderr, "error: rank %d cannot allocate %ld bytes twice\n", rank, bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (long i = 0; i < count; i++) send[i] = (float)(rank + 1);

    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    long wrong = 0;
    float expect = (float)n * (float)(n + 1) / 2.0f;
    for (long i = 0; i < count; i++) wrong += recv[i] != expect;
    long wrong_all = 0;
    MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

    for (int i = 0; i < warmup; i++) MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double per = (MPI_Wtime() - t0) / iters, sum, lo, hi;
    MPI_Reduce(&per, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&per, &lo, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    MPI_Reduce(&per, &hi, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        double avg = sum / n;
        double busbw = n > 1 ? (double)(count * sizeof(float)) / avg / 1e9 * 2.0 * (n - 1) / n : 0.0;
        printf("# bytes ranks avg_us min_us max_us busbw_GBps wrong\n");
        printf("%ld %d %.3f %.3f %.3f %.4f %ld\n", count * (long)sizeof(float), n, avg * 1e6, lo * 1e6, hi * 1e6,
               busbw, wrong_all);
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return wrong_all ? 1 : 0;
}
