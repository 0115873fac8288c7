/* The timed loop of `lab comm bench --backend mpi`: ITERS back-to-back calls of one collective on buffers the
 * caller allocated and filled, timed inside C as nccl-tests and the OSU benchmarks time theirs, so that no Python
 * runs between two calls. kernels/comm/native.py builds it with the MPI library's own mpicc on first use and calls
 * it through ctypes; handles arrive as Fortran integers (MPI_Comm_f2c and friends work the same on Open MPI and
 * MPICH, whose C handles differ in type).
 *
 * The arguments are what MpiRunner._bind in kernels/comm/collectives.py passes: SEND is NULL for the in-place form
 * (MPI_IN_PLACE), RECV is NULL where the rank receives nothing (reduce off the root), COUNT is what MPI calls the
 * count of the call: the whole buffer for all_reduce, broadcast, reduce and send_recv, one rank's share for
 * all_gather, reduce_scatter, gather and scatter, one peer's share for all_to_all; a NULL buffer of gather (RECV)
 * or scatter (SEND) off the root is what MPI ignores there. Returns the loop's seconds (MPI_Wtime), or -1 for
 * an unknown OP. */
#include <mpi.h>
#include <stddef.h>

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, ALL_TO_ALL, SEND_RECV, GATHER, SCATTER };

double lab_timed_loop(int op, MPI_Fint fcomm, void *send, void *recv, int count, MPI_Fint ftype, MPI_Fint fop,
                      int root, long iters) {
    MPI_Comm comm = MPI_Comm_f2c(fcomm);
    MPI_Datatype type = MPI_Type_f2c(ftype);
    MPI_Op redop = MPI_Op_f2c(fop);
    int rank, n;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &n);
    const void *sb = send ? send : MPI_IN_PLACE;
    int next = (rank + 1) % n, prev = (rank - 1 + n) % n;
    double t0 = MPI_Wtime();
    switch (op) {
    case ALL_REDUCE:
        for (long i = 0; i < iters; i++) MPI_Allreduce(sb, recv, count, type, redop, comm);
        break;
    case ALL_GATHER:
        for (long i = 0; i < iters; i++) MPI_Allgather(sb, count, type, recv, count, type, comm);
        break;
    case REDUCE_SCATTER:
        for (long i = 0; i < iters; i++) MPI_Reduce_scatter_block(sb, recv, count, type, redop, comm);
        break;
    case BROADCAST:
        for (long i = 0; i < iters; i++) MPI_Bcast(send, count, type, root, comm);
        break;
    case REDUCE:
        for (long i = 0; i < iters; i++) MPI_Reduce(sb, recv, count, type, redop, root, comm);
        break;
    case ALL_TO_ALL:
        for (long i = 0; i < iters; i++) MPI_Alltoall(sb, count, type, recv, count, type, comm);
        break;
    case SEND_RECV:
        for (long i = 0; i < iters; i++)
            MPI_Sendrecv(send, count, type, next, 0, recv, count, type, prev, 0, comm, MPI_STATUS_IGNORE);
        break;
    case GATHER:
        for (long i = 0; i < iters; i++) MPI_Gather(send, count, type, recv, count, type, root, comm);
        break;
    case SCATTER:
        for (long i = 0; i < iters; i++) MPI_Scatter(send, count, type, recv, count, type, root, comm);
        break;
    default:
        return -1.0;
    }
    return MPI_Wtime() - t0;
}
