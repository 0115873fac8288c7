"""Streaming a sharded data set of fixed-size records from storage (bigMNIST), and its per-sample baseline.

The order contract of the streamed source (a variant of the one in pipeline.py):
- epoch e concatenates the K shards in a permuted order (seeded by seed and e) into
  one stream of N samples;
- with global batch B over W ranks (b = B / W per rank), an epoch has S = floor(N / B)
  steps; rank r owns the contiguous range [r S b, (r+1) S b) of the stream, and the last
  N - W S b samples of the stream are dropped (the tail of the epoch's last shard(s),
  so a different part of the set each epoch);
- a rank cuts its range into windows of about window_mb (a multiple of b samples),
  visits its windows in a permuted order (seeded by seed, e, r) and the samples inside
  each window in a permuted order (seeded by seed, e, r and the window);
- step s gives rank r the next b samples of that order.
So over an epoch the ranks together see every sample of the stream's first W S b exactly
once; each byte of those is read from storage once per epoch, in sequential reads of
read_mb (>= 1 MiB); nothing is read twice or per sample. The order is deterministic for
a given world size and seed, and a run resumed at step s reads from the window that holds
step s on. It differs from the device-resident contract in two ways, both the price of
never reading 72 M samples at random: the permutation is two-level (shards, then windows
of ~85,000 samples, then samples inside a window) rather than one uniform permutation of
N, and the samples a rank sees depend on the world size (its range does), so runs on 1
and on W ranks see different batches. For a set several times larger than a window the
windows mix labels well; bigMNIST's shards are themselves a uniform shuffle of the set.

Overlap: `io_threads` background threads read the next windows into host buffers
(pinned on CUDA) while the current window trains; a window crosses to the device in one
non_blocking copy and batches are gathered there, so the source adds no per-step host
sync. With cache=cold the reads bypass the page cache (O_DIRECT): the storage writes
straight into the window buffer, so every epoch measures the storage and not RAM, and
the CPU copies nothing (on this project's 2-core VM, 0.1 ms of CPU per MB read against
0.6 ms through the page cache, which on two cores is CPU the training loop loses). Direct
reads start and end on 4 KiB boundaries, so each piece of a window lands at an aligned
place in the buffer with up to 4 KiB of its neighbours' bytes around it, and batches are
gathered by byte offset (up to 8 KiB per piece are read beyond the samples). Where the
file system refuses O_DIRECT, cold reads go through the page cache and evict every byte
range before and after it is read (posix_fadvise DONTNEED); `describe()` names which.
A set smaller than the node's RAM read with cache=warm is served from memory after the
first epoch. A cold measurement on a node-local disk needs this or a set several times
the node's RAM; on a parallel file system the client cache may also hold data the node
itself evicted.

The baseline (`pipeline=dataloader`) is the seed study's way: a torch Dataset with one
__getitem__ per image over memory-mapped shards, a PIL image and per-sample conversion
and normalisation, DataLoader worker processes, pin_memory, and a DistributedSampler-
style shuffle (one permutation of N per epoch, rank r takes every W-th sample).
"""

from __future__ import annotations

import bisect
import errno
import os
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from kernels.data import bigmnist
from kernels.data.pipeline import ImageTransform, Split, TrainSource, gather_rows, steps_per_epoch
from kernels.base.errors import ConfigError

MIB = 2**20
ALIGN = 4096  # O_DIRECT's unit: buffer address, file offset and length in multiples of a logical block (512 or 4 KiB)


class ShardSet:
    """A built, checked set: shard paths, record counts and data offsets; the test split in memory on demand."""

    def __init__(self, data_dir: Path):
        self.dir, self.manifest, self.offsets = bigmnist.check(data_dir)  # sizes and headers checked there
        self.paths = [self.dir / meta["name"] for meta in self.manifest["shards"]]
        self.counts = [meta["samples"] for meta in self.manifest["shards"]]
        self.num_samples = sum(self.counts)
        self.record = self.manifest["record_bytes"]
        self.data_bytes = self.num_samples * self.record
        self.starts = np.concatenate([[0], np.cumsum(self.counts)]).tolist()

    def test_split(self) -> Split:
        rec = np.load(self.dir / self.manifest["test"]["name"])
        return Split(torch.from_numpy(rec["image"][:, None].copy()), torch.from_numpy(rec["label"].astype(np.int64)))

    def records(self, shard: int, start: int, n: int) -> np.ndarray:
        """n records of one shard as an (n, record) uint8 array (small reads only: probes and tests)."""
        with open(self.paths[shard], "rb") as f:
            f.seek(self.offsets[shard] + start * self.record)
            return np.frombuffer(f.read(n * self.record), dtype=np.uint8).reshape(n, self.record)


def _gen(*key: int) -> torch.Generator:
    s = 0
    for k in key:
        s = (s * 1_000_003 + int(k) + 1) % (2**61 - 1)
    return torch.Generator().manual_seed(s)


def _by_offset(flat: torch.Tensor, record: int) -> torch.Tensor:
    """An overlapping (bytes, record) view of a flat uint8 buffer whose row i is the record starting at byte i, so
    that index_select with byte offsets gathers whole records (as fast as rows of a dense (n, record) tensor)."""
    return flat.as_strided((flat.numel() - record + 1, record), (1, 1))


def _window_batches(raw: torch.Tensor, where: torch.Tensor, record: int):
    """(images by offset, labels in `where`'s order) of one window: a batch is then one gather of contiguous
    784-byte images and a slice of the labels. Cutting gathered 785-byte records into a strided image view and
    a label column cost more than the gather (256-record batches: 2.7 M against 4.7 M samples/s, one thread)."""
    image = record - 1
    return _by_offset(raw, image), gather_rows(raw, where + image).long()


def _split_records(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x uint8 n,1,28,28, y int64 n) from records (n, 785), wherever raw lives."""
    n = raw.shape[0]
    return raw[:, :784].reshape(n, 1, 28, 28), raw[:, 784].long()


class StreamSource(TrainSource):
    """Rank r's batches streamed from the shards (see the module doc for the order and the I/O rules)."""

    kind = "streamed-shards"

    def __init__(
        self,
        shards: ShardSet,
        transform: ImageTransform | None,
        global_batch: int,
        rank: int,
        world: int,
        seed: int,
        device: torch.device,
        channels_last: bool = False,
        cache: str = "warm",
        window_mb: float = 64.0,
        read_mb: float = 8.0,
        io_threads: int = 2,
    ):
        if cache not in ("warm", "cold"):
            raise ConfigError(f"parameter 'cache': warm or cold, got {cache!r}")
        if read_mb < 1:
            raise ConfigError(f"parameter 'read_mb': reads of at least 1 MiB, got {read_mb}")
        self.shards, self.transform, self.global_batch = shards, transform, global_batch
        self.rank, self.world, self.seed, self.device, self.channels_last = rank, world, seed, device, channels_last
        self.cache, self.read_bytes = cache, int(read_mb * MIB) // ALIGN * ALIGN
        self.direct = cache == "cold" and hasattr(os, "O_DIRECT")
        self.cold_reads = "O_DIRECT" if self.direct else "posix_fadvise DONTNEED" if cache == "cold" else None
        self.num_samples = shards.num_samples
        self.steps_per_epoch = steps_per_epoch(self.num_samples, global_batch)
        self.dropped_per_epoch = self.num_samples - self.steps_per_epoch * global_batch
        self.b = global_batch // world
        self.rank_len = self.steps_per_epoch * self.b
        per_window = max(1, int(window_mb * MIB) // shards.record // self.b)
        self.window = per_window * self.b
        pieces = self.window // max(1, min(shards.counts)) + 2  # the most shard pieces a window can span
        self._slack = pieces * 2 * ALIGN  # room for the aligned start and end of each piece (O_DIRECT)
        self.io_threads = max(1, io_threads)
        self.depth = self.io_threads + 1  # windows read ahead of the one being trained on
        self.consts = transform.constants(device) if transform is not None else None
        self.pinned = device.type == "cuda"
        self._buffers: list = []
        self._free: deque = deque()
        self._fds: dict[int, int] = {}
        self._stale: list[int] = []
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.counters = {
            "bytes_read": 0,
            "read_calls": 0,
            "read_s": 0.0,
            "windows": 0,
            "samples": 0,
            "bytes_by_epoch": {},
        }

    # ------------------------------------------------------------ order
    def epoch_windows(self, epoch: int) -> list[tuple[int, int]]:
        """This rank's windows for `epoch` in visiting order: (start in the epoch stream, samples)."""
        start = self.rank * self.rank_len
        wins = [(start + o, min(self.window, self.rank_len - o)) for o in range(0, self.rank_len, self.window)]
        order = torch.randperm(len(wins), generator=_gen(self.seed, epoch, self.rank, 1)).tolist()
        return [wins[i] for i in order]

    def shard_order(self, epoch: int) -> list[int]:
        return torch.randperm(len(self.shards.counts), generator=_gen(self.seed, epoch, 0)).tolist()

    def _stream_bounds(self, epoch: int) -> tuple[list[int], list[int]]:
        """The epoch's shard order, and where each of those shards starts in the epoch stream (and the end)."""
        order = self.shard_order(epoch)
        return order, np.concatenate([[0], np.cumsum([self.shards.counts[s] for s in order])]).tolist()

    def segments(self, epoch: int, start: int, n: int) -> list[tuple[int, int, int]]:
        """The stream range [start, start+n) of `epoch` as (shard, first record, records) pieces."""
        order, bounds = self._stream_bounds(epoch)
        out, pos, end = [], start, start + n
        k = bisect.bisect_right(bounds, pos) - 1
        while pos < end:
            take = min(end, bounds[k + 1]) - pos
            out.append((order[k], pos - bounds[k], take))
            pos += take
            k += 1
        return out

    def window_perm(self, epoch: int, start: int, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=_gen(self.seed, epoch, self.rank, 2, start))

    def indices(self, epoch: int) -> np.ndarray:
        """The epoch-stream positions this rank visits, in order (for tests: small sets only)."""
        out = [start + self.window_perm(epoch, start, n).numpy() for start, n in self.epoch_windows(epoch)]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def stream_to_sample(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Set-wide sample ids (shard start + record) of epoch-stream positions."""
        order, bounds = self._stream_bounds(epoch)
        bounds = np.array(bounds)
        k = np.searchsorted(bounds, positions, side="right") - 1
        starts = np.array(self.shards.starts[:-1])[np.array(order)]
        return starts[k] + (positions - bounds[k])

    # ------------------------------------------------------------ I/O
    def _fd(self, shard: int) -> int:
        with self._lock:
            if shard not in self._fds:
                path = self.shards.paths[shard]
                try:
                    self._fds[shard] = os.open(path, os.O_RDONLY | (os.O_DIRECT if self.direct else 0))
                except OSError as e:
                    if not (self.direct and e.errno == errno.EINVAL):
                        raise
                    self._no_direct(f"{path}'s file system refused O_DIRECT")
                    self._fds[shard] = os.open(path, os.O_RDONLY)
            return self._fds[shard]

    def _no_direct(self, why: str) -> None:
        """From now on, cold reads through the page cache with eviction (called holding the lock)."""
        self.direct = False
        self.cold_reads = f"posix_fadvise DONTNEED ({why})"
        self._stale += self._fds.values()  # another reader may be inside a read on one: closed by close()
        self._fds.clear()

    def _new_buffer(self):
        n = self.window * self.shards.record + self._slack
        t = torch.empty(n + ALIGN, dtype=torch.uint8, pin_memory=self.pinned)
        shift = (-t.data_ptr()) % ALIGN
        t = t[shift : shift + n]  # starts on a 4 KiB boundary, as direct reads need
        return {"t": t, "np": t.numpy(), "event": None, "offsets": None, "used": 0}

    def _read_piece(self, shard: int, mv: memoryview, pos: int, off: int, length: int) -> tuple[int, int, int, int]:
        """File bytes [off, off + length) of `shard` into mv from pos on, in reads of read_mb; a direct read starts
        `lead` bytes early and ends on an aligned byte. Returns (lead, bytes of mv the piece takes, bytes read, read
        calls)."""
        fd, direct = self._fd(shard), self.direct
        lead = off % ALIGN if direct else 0
        need = lead + length
        span = -(-need // ALIGN) * ALIGN if direct else need
        if self.cache == "cold" and not direct:
            os.posix_fadvise(fd, off, length, os.POSIX_FADV_DONTNEED)
        got = calls = 0
        while got < need:
            k = os.preadv(fd, [mv[pos + got : pos + min(span, got + self.read_bytes)]], off - lead + got)
            if k <= 0:
                raise OSError(
                    f"short read of {self.shards.paths[shard]} at byte {off - lead + got}: the shard "
                    f"changed under the run; check it with `lab bigmnist verify {self.shards.dir}`"
                )
            got += k
            calls += 1
        if self.cache == "cold" and not direct:
            os.posix_fadvise(fd, off, length, os.POSIX_FADV_DONTNEED)
        return lead, span, got, calls

    def _fill(self, buf: dict, epoch: int, start: int, n: int) -> tuple[int, int]:
        """Read stream samples [start, start+n) of `epoch` into `buf`, piece by piece, and set the byte offset of
        each sample there. Returns (bytes read, read calls)."""
        mv = memoryview(buf["np"]).cast("B")
        rec, pos, done_bytes, calls, offsets = self.shards.record, 0, 0, 0, []
        for shard, first, count in self.segments(epoch, start, n):
            lead, span, got, k = self._read_piece(shard, mv, pos, self.shards.offsets[shard] + first * rec, count * rec)
            offsets.append(pos + lead + rec * np.arange(count, dtype=np.int64))
            pos += span  # a direct read's end is aligned, where the next piece's read may start
            done_bytes += got
            calls += k
        buf["offsets"], buf["used"] = torch.from_numpy(np.concatenate(offsets)), pos
        return done_bytes, calls

    def _read_window(self, buf: dict, epoch: int, start: int, n: int) -> int:
        """Fill `buf` with stream samples [start, start+n) of `epoch`: sequential reads of read_mb per shard piece."""
        if buf["event"] is not None:
            buf["event"].synchronize()  # the last copy out of this pinned buffer has finished
            buf["event"] = None
        t0 = time.perf_counter()
        try:
            done_bytes, calls = self._fill(buf, epoch, start, n)
        except OSError as e:
            if e.errno != errno.EINVAL or self.cache != "cold":
                raise
            # a file system that opens with O_DIRECT but refuses the reads: the page cache, again (the other reader
            # may have switched first, between this one's taking a direct descriptor and reading it)
            with self._lock:
                if self.direct:
                    self._no_direct(f"direct reads of {self.shards.dir} failed: {e.strerror}")
            done_bytes, calls = self._fill(buf, epoch, start, n)
        dt = time.perf_counter() - t0
        with self._lock:
            c = self.counters
            c["bytes_read"] += done_bytes
            c["read_calls"] += calls
            c["read_s"] += dt
            c["windows"] += 1
            key = str(epoch)
            c["bytes_by_epoch"][key] = c["bytes_by_epoch"].get(key, 0) + done_bytes
        return n

    def _get_buffer(self) -> dict:
        if self._free:
            return self._free.popleft()
        buf = self._new_buffer()
        self._buffers.append(buf)
        return buf

    def batches(self, epoch: int, start_step: int = 0):
        wins = self.epoch_windows(epoch)
        pos, k0 = start_step * self.b, 0
        while k0 < len(wins) and pos >= wins[k0][1]:
            pos -= wins[k0][1]
            k0 += 1
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.io_threads, thread_name_prefix="lab-reader")
        pending: deque = deque()
        nxt = k0

        def submit():
            nonlocal nxt
            while nxt < len(wins) and len(pending) < self.depth:
                buf = self._get_buffer()
                s, n = wins[nxt]
                pending.append((self._pool.submit(self._read_window, buf, epoch, s, n), buf, s, n))
                nxt += 1

        submit()
        current = None
        try:
            first = True
            while pending:
                fut, buf, s, n = pending.popleft()
                current = buf
                fut.result()  # waiting here is the data wait the step timer sees
                raw = buf["t"][: buf["used"]]
                where = buf["offsets"][self.window_perm(epoch, s, n)]  # byte offsets, in this window's order
                if self.device.type == "cuda":
                    raw = raw.to(self.device, non_blocking=True)
                    where = where.to(self.device, non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record()
                    buf["event"] = ev
                    self._free.append(buf)  # the reader waits for the event before refilling it
                    current = None
                submit()
                images, labels = _window_batches(raw, where, self.shards.record)
                lo = pos if first else 0
                first = False
                for i in range(lo, n, self.b):
                    x = gather_rows(images, where[i : i + self.b]).view(-1, 1, 28, 28)  # a copy, never a view of buf
                    y = labels[i : i + self.b]
                    if self.transform is not None:
                        x = self.transform.apply(x, None, self.consts)
                    with self._lock:
                        self.counters["samples"] += x.shape[0]
                    yield self._finish(x), y
                if self.device.type != "cuda":
                    self._free.append(buf)
                    current = None
                    submit()
        finally:
            if current is not None:
                self._free.append(current)
            for fut, buf, *_ in pending:
                fut.cancel()
                try:
                    fut.result()
                except Exception:  # noqa: BLE001 - an abandoned read-ahead; its error no longer matters
                    pass
                self._free.append(buf)

    def _finish(self, x):
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def probe(self, n: int = 2):
        raw = torch.from_numpy(self.shards.records(0, 0, n).copy())
        x, y = _split_records(raw)
        x = x.to(self.device)
        if self.transform is not None:
            x = self.transform.apply(x, None, self.consts)
        return self._finish(x), y.to(self.device)

    def describe(self) -> dict:
        return {
            "source": self.kind,
            "samples": self.num_samples,
            "steps_per_epoch": self.steps_per_epoch,
            "dropped_per_epoch": self.dropped_per_epoch,
            "transform": repr(self.transform),
            "shards": len(self.shards.counts),
            "data_dir": str(self.shards.dir),
            "cache": self.cache,
            "window_samples": self.window,
            "read_mb": self.read_bytes / MIB,
            "io_threads": self.io_threads,
            "cold_reads": self.cold_reads,
            "data_bytes": self.shards.data_bytes,
        }

    def stats(self) -> dict:
        with self._lock:
            c = dict(self.counters)
            c["bytes_by_epoch"] = dict(c["bytes_by_epoch"])
        return {"source": self.kind, "cache": self.cache, "data_bytes": self.shards.data_bytes, **c}

    def restore(self, stats: dict | None) -> None:
        """Counters of the attempts before a resume (from the checkpoint), so the record covers the whole run."""
        if stats:
            for k in self.counters:
                if k in stats:
                    self.counters[k] = dict(stats[k]) if k == "bytes_by_epoch" else stats[k]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for fd in [*self._fds.values(), *self._stale]:
            os.close(fd)
        self._fds.clear()
        self._stale.clear()


# ------------------------------------------------------------------ the per-sample baseline
class _PerSample(torch.utils.data.Dataset):
    """One __getitem__ per image over memory-mapped shards, PIL-style conversion per sample."""

    def __init__(self, shards: ShardSet, mean: float, std: float):
        self.paths, self.starts, self.mean, self.std = shards.paths, shards.starts, mean, std
        self._maps: dict[int, np.ndarray] = {}

    def __len__(self):
        return self.starts[-1]

    def __getitem__(self, i: int):
        from PIL import Image

        k = bisect.bisect_right(self.starts, i) - 1
        if k not in self._maps:  # opened lazily, in the worker process that reads it
            self._maps[k] = np.load(self.paths[k], mmap_mode="r")
        rec = self._maps[k][i - self.starts[k]]
        img = Image.fromarray(np.asarray(rec["image"]), mode="L")
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0)[None]  # ToTensor
        return (x - self.mean) / self.std, int(rec["label"])  # Normalize


class _RankSampler(torch.utils.data.Sampler):
    """DistributedSampler-style: a permutation of N per epoch, rank r takes every W-th of its first W S b."""

    def __init__(self, n: int, rank: int, world: int, per_rank: int, seed: int):
        self.n, self.rank, self.world, self.per_rank, self.seed = n, rank, world, per_rank, seed
        self.epoch, self.start = 0, 0

    def __iter__(self):
        perm = torch.randperm(self.n, generator=_gen(self.seed, self.epoch, 3))
        mine = perm[: self.per_rank * self.world][self.rank :: self.world]
        return iter(mine[self.start :].tolist())

    def __len__(self):
        return self.per_rank - self.start


class PerSampleSource(TrainSource):
    kind = "dataloader-per-sample"

    def __init__(
        self,
        shards: ShardSet,
        mean: float,
        std: float,
        global_batch: int,
        rank: int,
        world: int,
        seed: int,
        device: torch.device,
        channels_last: bool,
        num_workers: int,
        prefetch_factor: int,
    ):
        self.shards, self.device, self.channels_last = shards, device, channels_last
        self.num_samples = shards.num_samples
        self.steps_per_epoch = steps_per_epoch(self.num_samples, global_batch)
        self.dropped_per_epoch = self.num_samples - self.steps_per_epoch * global_batch
        self.b = global_batch // world
        self.sampler = _RankSampler(self.num_samples, rank, world, self.steps_per_epoch * self.b, seed)
        self.dataset = _PerSample(shards, mean, std)
        extra = {"persistent_workers": True, "prefetch_factor": prefetch_factor} if num_workers > 0 else {}
        self.loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_size=self.b,
            sampler=self.sampler,
            num_workers=num_workers,
            drop_last=True,
            pin_memory=device.type == "cuda",
            **extra,
        )
        self.num_workers = num_workers
        self.samples = 0

    def batches(self, epoch: int, start_step: int = 0):
        self.sampler.epoch, self.sampler.start = epoch, start_step * self.b
        for x, y in self.loader:
            self.samples += x.shape[0]
            x = x.to(self.device, non_blocking=True)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            yield x, y.to(self.device, non_blocking=True)

    def probe(self, n: int = 2):
        xs, ys = zip(*(self.dataset[i] for i in range(n)))
        return torch.stack(xs).to(self.device), torch.tensor(ys, device=self.device)

    def describe(self) -> dict:
        return {
            "source": self.kind,
            "samples": self.num_samples,
            "steps_per_epoch": self.steps_per_epoch,
            "dropped_per_epoch": self.dropped_per_epoch,
            "num_workers": self.num_workers,
            "shards": len(self.shards.counts),
            "data_dir": str(self.shards.dir),
            "data_bytes": self.shards.data_bytes,
        }

    def stats(self) -> dict:
        # per-sample reads go through the page cache 4 KiB at a time; the bytes the workers asked for are
        # known, the bytes the storage delivered are not (they depend on readahead): none is claimed
        return {
            "source": self.kind,
            "cache": "page cache",
            "data_bytes": self.shards.data_bytes,
            "samples": self.samples,
            "bytes_requested": self.samples * self.shards.record,
            "bytes_read": None,
            "read_s": None,
        }

    def restore(self, stats: dict | None) -> None:
        if stats and stats.get("samples") is not None:
            self.samples = stats["samples"]

    def close(self) -> None:
        """End the persistent workers and drop this process's maps: memory-mapped shards pin their pages in the
        page cache, so a cold read of the same files afterwards would read memory."""
        it, self.loader._iterator = self.loader._iterator, None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.dataset._maps.clear()
