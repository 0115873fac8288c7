"""The collectives: their size conventions, bus-bandwidth factors, expected results, and how each backend runs them.

Definitions follow nccl-tests (doc/PERFORMANCE.md there):
- `size` is bytes: the buffer of one rank for all_reduce, broadcast, reduce and send_recv;
  per-rank count x ranks for all_gather (the gathered output), reduce_scatter (the input
  that is scattered), all_to_all (what one rank sends in all), gather (what the root
  receives) and scatter (what the root sends);
- algbw = size / time (GB = 1e9 bytes); busbw = algbw x factor, the factor making the
  figure comparable with the link's bandwidth: 2(n-1)/n for all_reduce; (n-1)/n for
  all_gather, reduce_scatter, all_to_all, gather and scatter (the root's link carries all
  but its own share); 1 for broadcast, reduce and send_recv.
- Rooted collectives (broadcast, reduce, gather, scatter) use the root given (`root`).
- The alpha-beta cost model of a ring (used by kernels/comm/predict.py): `steps(n)`
  latency terms and `factor(n) x size / busbw` bytes on the slowest link.

Two ways to run them: torch.distributed (nccl on GPUs, gloo on CPUs) and MPI through
mpi4py (numpy buffers; MPI has no standard 16-bit float type, so MPI runs fp32 only and
records bf16/fp16 as unsupported). Every collective fills its inputs with small integers
that depend on rank and position, so sums are exact in every dtype and the result can be
checked element by element (#wrong).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from itertools import repeat

import numpy as np

DTYPES = {"fp32": ("float", 4), "bf16": ("bfloat16", 2), "fp16": ("half", 2)}  # name -> (nccl-tests' name, bytes)


@dataclass(frozen=True)
class Op:
    name: str
    per_rank_split: bool  # size = per-rank count x n (all_gather, reduce_scatter, all_to_all)
    reduces: bool  # has a reduction operator (redop column)
    rooted: bool  # has a root (root column)
    title: str  # OSU-style test name

    def factor(self, n: int) -> float:
        """busbw / algbw at n ranks (nccl-tests)."""
        if self.name == "all_reduce":
            return 2 * (n - 1) / n
        if self.per_rank_split:
            return (n - 1) / n
        return 1.0

    def steps(self, n: int) -> int:
        """Latency terms of the ring algorithm at n ranks (alpha-beta model)."""
        if n <= 1:
            return 0
        if self.name == "all_reduce":
            return 2 * (n - 1)
        if self.name == "send_recv":
            return 1
        return n - 1

    def counts(self, size: int, n: int, itemsize: int) -> tuple[int, int]:
        """(count in elements per rank as nccl-tests prints it, bytes actually moved as `size`); 0 when too small."""
        if self.per_rank_split:
            per_rank = size // (itemsize * n)
            return per_rank, per_rank * n * itemsize
        count = size // itemsize
        return count, count * itemsize


OPS = {
    o.name: o
    for o in (
        Op("all_reduce", False, True, False, "Allreduce"),
        Op("all_gather", True, False, False, "Allgather"),
        Op("reduce_scatter", True, True, False, "Reduce_scatter"),
        Op("broadcast", False, False, True, "Bcast"),
        Op("reduce", False, True, True, "Reduce"),
        Op("all_to_all", True, False, False, "Alltoall"),
        Op("send_recv", False, False, False, "Sendrecv"),
        Op("gather", True, False, True, "Gather"),
        Op("scatter", True, False, True, "Scatter"),
    )
}
# Forms each API has: torch.distributed has no out-of-place all_reduce/broadcast/reduce (they work in
# place), and no in-place all_to_all, send/recv, gather or scatter; MPI has IN_PLACE for all but broadcast (in
# place by nature) and send/recv; the lab runs MPI's gather and scatter out of place, as torch's.
FORMS = {
    "torch": {
        "all_reduce": ("in",),
        "all_gather": ("out", "in"),
        "reduce_scatter": ("out", "in"),
        "broadcast": ("in",),
        "reduce": ("in",),
        "all_to_all": ("out",),
        "send_recv": ("out",),
        "gather": ("out",),
        "scatter": ("out",),
    },
    "mpi": {
        "all_reduce": ("out", "in"),
        "all_gather": ("out", "in"),
        "reduce_scatter": ("out", "in"),
        "broadcast": ("in",),
        "reduce": ("out", "in"),
        "all_to_all": ("out", "in"),
        "send_recv": ("out",),
        "gather": ("out",),
        "scatter": ("out",),
    },
}


def values(rank: int, n_elems: int) -> np.ndarray:
    """Rank `rank`'s input: small integers in {-1, 0, 1, 2}, exact in every dtype and in any sum over <= 64 ranks."""
    return ((np.arange(n_elems, dtype=np.int64) + rank) % 4 - 1).astype(np.float64)


def input_elems(op: Op, count: int, n: int) -> int:
    """Elements of one rank's input buffer."""
    return count * n if op.name in ("reduce_scatter", "all_to_all", "scatter") else count


def expected(op: Op, count: int, n: int, rank: int, root: int) -> np.ndarray | None:
    """What rank `rank` must hold after the collective (None: nothing to check on this rank)."""
    if op.name == "all_reduce":
        return sum(values(r, count) for r in range(n))
    if op.name == "all_gather":
        return np.concatenate([values(r, count) for r in range(n)])
    if op.name == "reduce_scatter":
        return sum(values(r, count * n)[rank * count : (rank + 1) * count] for r in range(n))
    if op.name == "broadcast":
        return values(root, count)
    if op.name == "reduce":
        return sum(values(r, count) for r in range(n)) if rank == root else None
    if op.name == "all_to_all":
        return np.concatenate([values(r, count * n)[rank * count : (rank + 1) * count] for r in range(n)])
    if op.name == "send_recv":
        return values((rank - 1) % n, count)
    if op.name == "gather":
        return np.concatenate([values(r, count) for r in range(n)]) if rank == root else None
    if op.name == "scatter":
        return values(root, count * n)[rank * count : (rank + 1) * count]
    raise KeyError(op.name)


# ------------------------------------------------------------------ torch.distributed
class TorchRunner:
    """One collective in one form on torch tensors. `prepare` allocates and fills; `run` is what is timed."""

    api = "torch"
    loop = "python loop (on a GPU the launches are asynchronous; the device is synchronised once per loop)"

    def __init__(self, device, rank: int, n: int):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.device, self.rank, self.n = torch, dist, device, rank, n
        self.dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        # torch 2.13 renamed the single-tensor forms; older releases have the _tensor names
        self.ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def prepare(self, op: Op, form: str, count: int, dtype: str, root: int) -> None:
        t, n, r = self.torch, self.n, self.rank
        dt = self.dtypes[dtype]
        src = t.from_numpy(values(r, input_elems(op, count, n))).to(self.device, dt)
        self.op, self.form, self.root, self.count = op, form, root, count
        name = op.name
        if name == "all_gather":
            self.out = t.empty(count * n, dtype=dt, device=self.device)
            if form == "in":
                self.out[r * count : (r + 1) * count] = src
                self.inp = self.out[r * count : (r + 1) * count]
            else:
                self.inp = src
        elif name == "reduce_scatter":
            if form == "in":
                self.inp = src
                self.out = src[r * count : (r + 1) * count]
            else:
                self.inp, self.out = src, t.empty(count, dtype=dt, device=self.device)
        elif name in ("all_to_all", "send_recv"):
            self.inp, self.out = src, t.empty_like(src)
        elif name == "gather":  # the root receives every rank's share into the views of one buffer
            self.inp, self.out = src, t.empty(count * n, dtype=dt, device=self.device)
        elif name == "scatter":  # the root sends the views of its buffer, one share per rank
            self.inp, self.out = src, t.empty(count, dtype=dt, device=self.device)
        else:  # all_reduce, broadcast, reduce: in place
            self.inp = self.out = src

        self.call = self._bind()

    def _bind(self):
        """The collective with its arguments bound once, so the timed loop does no per-call Python work."""
        d, name = self.dist, self.op.name
        if name == "all_reduce":
            return partial(d.all_reduce, self.inp)
        if name == "all_gather":
            return partial(self.ag, self.out, self.inp)
        if name == "reduce_scatter":
            return partial(self.rs, self.out, self.inp)
        if name == "broadcast":
            return partial(d.broadcast, self.inp, self.root)
        if name == "reduce":
            return partial(d.reduce, self.inp, self.root)
        if name == "all_to_all":
            return partial(d.all_to_all_single, self.out, self.inp)
        at_root = self.rank == self.root
        if name == "gather":
            into = list(self.out.chunk(self.n)) if at_root else None
            return partial(d.gather, self.inp, into, dst=self.root)
        if name == "scatter":
            parts = list(self.inp.chunk(self.n)) if at_root else None
            return partial(d.scatter, self.out, parts, src=self.root)
        ops = [
            d.P2POp(d.isend, self.inp, (self.rank + 1) % self.n),  # send_recv: a ring shift
            d.P2POp(d.irecv, self.out, (self.rank - 1) % self.n),
        ]
        return lambda: [req.wait() for req in d.batch_isend_irecv(ops)]

    def run(self) -> None:
        self.call()

    def timed(self, iters: int) -> float:
        """Seconds of `iters` back-to-back calls, device-synchronised at the end (nccl-tests' timed loop)."""
        call = self.call
        t0 = time.perf_counter()
        for _ in repeat(None, iters):
            call()
        self.sync()
        return time.perf_counter() - t0

    def result(self) -> np.ndarray:
        return self.out.detach().to("cpu", self.torch.float64).numpy()

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        self.dist.barrier()

    def reduce_times(self, x: float) -> tuple[float, float, float]:
        """(mean, min, max) of x over the ranks."""
        t, d = self.torch, self.dist
        s, lo, hi = (t.tensor([x], dtype=t.float64, device=self.device) for _ in range(3))
        d.all_reduce(s)
        d.all_reduce(lo, op=d.ReduceOp.MIN)
        d.all_reduce(hi, op=d.ReduceOp.MAX)
        return s.item() / self.n, lo.item(), hi.item()

    def sum_int(self, x: int) -> int:
        v = self.torch.tensor([x], dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(v)
        return int(v.item())

    def gather_object(self, obj) -> list:
        out = [None] * self.n
        self.dist.all_gather_object(out, obj)
        return out


# ------------------------------------------------------------------------------ MPI
class MpiRunner:
    """The same collectives through mpi4py on numpy buffers (fp32 only: MPI has no standard 16-bit float)."""

    api = "mpi"

    def __init__(self, comm):
        from mpi4py import MPI

        from kernels.comm import native

        self.MPI, self.comm = MPI, comm
        self.rank, self.n = comm.Get_rank(), comm.Get_size()
        self.dtypes = {"fp32": np.float32}
        self.mpi_types = {"fp32": MPI.FLOAT}
        self.lib, self.loop = native.load(MPI.Get_library_version())

    def prepare(self, op: Op, form: str, count: int, dtype: str, root: int) -> None:
        if dtype not in self.dtypes:
            raise NotImplementedError(f"MPI has no standard {dtype} datatype (fp32 only)")
        n, r = self.n, self.rank
        dt = self.dtypes[dtype]
        src = page_aligned(values(r, input_elems(op, count, n)), dt)
        self.op, self.form, self.root, self.count = op, form, root, count
        name = op.name
        if name == "all_gather":
            self.out = page_aligned(np.zeros(count * n), dt)
            if form == "in":
                self.out[r * count : (r + 1) * count] = src
            self.inp = src
        elif name == "reduce_scatter":
            self.inp = src
            self.out = src if form == "in" else page_aligned(np.zeros(count), dt)
        elif name in ("all_to_all", "send_recv"):
            self.inp = src
            self.out = src if form == "in" else page_aligned(np.zeros(src.size), dt)
        elif name == "gather":
            self.inp, self.out = src, page_aligned(np.zeros(count * n), dt)
        elif name == "scatter":
            self.inp, self.out = src, page_aligned(np.zeros(count), dt)
        elif form == "in":  # all_reduce, broadcast, reduce
            self.inp = self.out = src
        else:
            self.inp, self.out = src, page_aligned(np.zeros(src.size), dt)

        self.call, self.c_args = self._bind(dtype)

    def _bind(self, dtype: str):
        """(mpi4py's call with its arguments bound, the C loop's arguments): the same collective either way."""
        from kernels.comm.native import OP_CODES

        c, MPI, name, n = self.comm, self.MPI, self.op.name, self.n
        inplace, at_root = self.form == "in", self.rank == self.root
        send = None if inplace and (name != "reduce" or at_root) else self.inp  # None: MPI_IN_PLACE
        recv, count = self.out, self.out.size
        t = self.mpi_types[dtype]
        spec = [send, t] if send is not None else MPI.IN_PLACE
        if name == "all_reduce":
            call = partial(c.Allreduce, spec, [recv, t], MPI.SUM)
        elif name == "all_gather":
            call, count = partial(c.Allgather, spec, [recv, t]), self.count
        elif name == "reduce_scatter":
            call, count = partial(c.Reduce_scatter_block, spec, [recv, t], MPI.SUM), self.count
        elif name == "broadcast":
            call, send, recv, count = partial(c.Bcast, [self.inp, t], self.root), self.inp, None, self.inp.size
        elif name == "reduce":  # the receive buffer matters at the root only
            recv, count = (recv if at_root else None), self.inp.size
            call = partial(c.Reduce, spec, [recv, t] if at_root else None, MPI.SUM, self.root)
        elif name == "all_to_all":
            call, count = partial(c.Alltoall, spec, [recv, t]), self.inp.size // n
        elif name == "gather":  # the receive buffer matters at the root only
            recv, count = (recv if at_root else None), self.count
            call = partial(c.Gather, [self.inp, t], [recv, t] if at_root else None, self.root)
        elif name == "scatter":  # the send buffer matters at the root only
            send, count = (self.inp if at_root else None), self.count
            call = partial(c.Scatter, [self.inp, t] if at_root else None, [recv, t], self.root)
        else:  # send_recv: a ring shift
            call = partial(c.Sendrecv, [self.inp, t], (self.rank + 1) % n, 0, [recv, t], (self.rank - 1) % n, 0)
        c_args = (
            OP_CODES[name],
            c.py2f(),
            None if send is None else send.ctypes.data,
            None if recv is None else recv.ctypes.data,
            count,
            t.py2f(),
            MPI.SUM.py2f(),
            self.root,
        )
        return call, c_args

    def run(self) -> None:
        if self.lib is None:
            self.call()
        else:
            self.timed(1)  # the checked call goes through the loop that is timed

    def timed(self, iters: int) -> float:
        """Seconds of `iters` back-to-back calls: inside C when the loop was built, else a Python loop."""
        if self.lib is not None:
            seconds = self.lib.lab_timed_loop(*self.c_args, iters)
            if seconds < 0:
                raise RuntimeError(f"kernels/comm/mpi_loop.c has no collective {self.op.name}")
            return seconds
        call = self.call
        t0 = time.perf_counter()
        for _ in repeat(None, iters):
            call()
        return time.perf_counter() - t0

    def result(self) -> np.ndarray:
        if self.op.name == "reduce_scatter" and self.form == "in":
            return self.out[: self.count].astype(np.float64)  # MPI leaves the result at the start of the buffer
        return self.out.astype(np.float64)

    def sync(self) -> None:
        pass

    def barrier(self) -> None:
        self.comm.Barrier()

    def reduce_times(self, x: float) -> tuple[float, float, float]:
        MPI = self.MPI
        return (
            self.comm.allreduce(x, op=MPI.SUM) / self.n,
            self.comm.allreduce(x, op=MPI.MIN),
            self.comm.allreduce(x, op=MPI.MAX),
        )

    def sum_int(self, x: int) -> int:
        return int(self.comm.allreduce(int(x), op=self.MPI.SUM))

    def gather_object(self, obj) -> list:
        return self.comm.allgather(obj)


PAGE = 4096


def page_aligned(a: np.ndarray, dtype) -> np.ndarray:
    """A copy of `a` as `dtype` starting on a page boundary, as the OSU benchmarks allocate their buffers: Open MPI's
    shared-memory path moves a 64 KiB message 2-3x faster between page-aligned buffers (2-core VM)."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.empty(a.size * itemsize + PAGE, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE
    out = raw[start : start + a.size * itemsize].view(dtype)
    out[:] = a
    return out


def count_wrong(runner, op: Op, count: int, root: int) -> int:
    """Elements of this rank's result that differ from what the collective must produce."""
    want = expected(op, count, runner.n, runner.rank, root)
    if want is None:
        return 0
    got = runner.result()
    if got.shape != want.shape:
        return int(want.size)
    return int(np.count_nonzero(got != want))
