"""The sharding contract, and the data sources that honour it.

Sharding (the DistributedSampler contract, made exact):
- every epoch has one permutation of the N training samples, drawn on the CPU from
  the run's seed and the epoch number, identical on all ranks and device types;
- an epoch has floor(N / B) steps for global batch B; the last N mod B samples
  of that epoch's permutation are dropped (a different remainder each epoch);
- at step s, global batch = perm[s*B : (s+1)*B], and rank r of W takes the
  contiguous slice [r*B/W, (r+1)*B/W) of it.
So the ranks together see every one of the epoch's floor(N/B)*B samples exactly
once, and a run on W ranks sees the same global batches as a run on one. A source
that cannot follow this exactly (streamed shards) documents its variant.

Random transforms (crop offsets, flips) are drawn once per epoch for the whole
epoch's global batches, on the device, from a generator seeded by (seed, epoch);
each rank slices its positions. They do not depend on the world size (for a given
device type: CPU and CUDA generators differ), and a resumed run draws the same.

A training source gives this rank's batches on the device:
    steps_per_epoch, num_samples, dropped_per_epoch
    batches(epoch, start_step=0)  -> (x, y) for steps start_step .. steps_per_epoch-1
    probe(n)                      -> (x, y): n transformed samples, for counting FLOPs
    describe()                    -> dict for the record; stats() -> I/O counters (may be empty)
    restore(stats), close()       -> resume the counters and position; end threads and files
(TrainSource below is this contract, with the defaults of a source that holds no I/O state.)
An evaluation source gives this rank's shard (samples r, r+W, ...; nothing dropped)
with batches(), so that sums over ranks cover the test set exactly once.

Sources here:
- TensorSource: the data set is resident on the device; indexing and transforms run
  there in batches. Host syncs per step: 0 (the permutation and the transform draws
  cross to the device once per epoch); nothing crosses PCIe per step.
- LoaderSource: the baseline: a torch DataLoader whose worker processes build each
  rank batch on the host with the same functions (identical values on a CPU),
  pinned memory, persistent workers, prefetching, then a non_blocking copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from kernels.base.errors import ConfigError


class TrainSource:
    """The contract of a training source (the module doc says what each member must honour).

    Required: steps_per_epoch, num_samples, dropped_per_epoch, batches(epoch, start_step), probe(n),
    describe(). The rest have defaults for a source that holds no I/O state: check_batch(batch), stats() (I/O
    counters for the
    record), restore(stats) (continue from a checkpoint's counters and position) and close() (end reader
    threads, close files). The loop calls only these.
    """

    steps_per_epoch: int
    num_samples: int
    dropped_per_epoch: int

    def batches(self, epoch: int, start_step: int = 0):
        raise NotImplementedError

    def probe(self, n: int = 2):
        raise NotImplementedError

    def describe(self) -> dict:
        raise NotImplementedError

    def check_batch(self, batch: int) -> None:
        if self.num_samples < batch:
            raise ConfigError(
                f"parameter 'batch': the training set has {self.num_samples} samples, fewer than one "
                f"global batch of {batch}; lower batch or raise train_samples"
            )

    def stats(self) -> dict:
        return {}

    def restore(self, stats: dict | None) -> None:
        pass

    def close(self) -> None:
        pass


def micro_batches(batch, n: int):
    """`n` micro-batches of a tensor, or of each tensor of a tuple/list (zipped back into tuples)."""
    if n == 1:
        return [batch]
    if isinstance(batch, (tuple, list)):
        return list(zip(*(t.chunk(n) for t in batch)))
    return list(batch.chunk(n))


@dataclass
class Split:
    """One split of a data set: inputs (uint8 images N,C,H,W, or float features) and targets."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return self.x.shape[0]

    def head(self, n: int) -> "Split":
        return self if n <= 0 or n >= len(self) else Split(self.x[:n], self.y[:n])


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


def steps_per_epoch(n: int, global_batch: int) -> int:
    return n // global_batch


def rank_slice(step: int, global_batch: int, rank: int, world: int) -> slice:
    b = global_batch // world
    start = step * global_batch + rank * b
    return slice(start, start + b)


def gather_rows(src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """src[idx] for a 1-D index along dim 0: index_select copies whole rows, where advanced indexing on a CPU
    moves element by element (5x slower for MNIST records)."""
    return torch.index_select(src, 0, idx)


def _epoch_generator(seed: int, epoch: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + epoch) * 1_000_033 + 17)


def crop_flip(
    x: torch.Tensor, pad: int, dy: torch.Tensor | None, dx: torch.Tensor | None, flip: torch.Tensor | None
) -> torch.Tensor:
    """Random crop with zero padding and horizontal flip of a uint8 batch (B,C,H,W), on x's device.

    No data-dependent branch: a flip mask is applied with torch.where whatever it holds,
    so nothing here waits for the device.
    """
    b, c, h, w = x.shape
    if pad:
        padded = F.pad(x, (pad, pad, pad, pad))
        rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
        cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
        x = padded[
            torch.arange(b, device=x.device)[:, None, None, None],
            torch.arange(c, device=x.device)[None, :, None, None],
            rows,
            cols,
        ]
    if flip is not None:
        x = torch.where(flip[:, None, None, None], x.flip(3), x)
    return x


@dataclass(frozen=True)
class ImageTransform:
    """Augmentation and normalisation of uint8 image batches, owned by the workload.

    pad/flip: the training-time random crop (with zero padding) and horizontal flip;
    mean/std normalise [0, 255] images channel-wise. Without pad and flip it only normalises.
    """

    mean: tuple[float, ...]
    std: tuple[float, ...]
    pad: int = 0
    flip: bool = False

    @property
    def random(self) -> bool:
        return bool(self.pad or self.flip)

    def epoch_draws(self, steps: int, global_batch: int, seed: int, epoch: int, device: torch.device):
        """(dy, dx, flip), each (steps, global_batch) on `device`, or None without random transforms."""
        if not self.random:
            return None
        g = _epoch_generator(seed, epoch, device)
        shape = (steps, global_batch)
        dy = torch.randint(0, 2 * self.pad + 1, shape, generator=g, device=device) if self.pad else None
        dx = torch.randint(0, 2 * self.pad + 1, shape, generator=g, device=device) if self.pad else None
        flip = torch.rand(shape, generator=g, device=device) < 0.5 if self.flip else None
        return dy, dx, flip

    def constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.tensor(self.mean, device=device).view(1, -1, 1, 1),
            torch.tensor(self.std, device=device).view(1, -1, 1, 1),
        )

    def apply(self, x: torch.Tensor, draws, consts) -> torch.Tensor:
        """Transform a uint8 batch: crop/flip with this batch's draws (or none), then normalise to float."""
        if draws is not None:
            dy, dx, flip = draws
            x = crop_flip(x, self.pad, dy, dx, flip)
        mean, std = consts
        # in place on one fresh float copy: the same three IEEE operations in the same order as
        # (x / 255 - mean) / std, so the same bits, without two more batch-sized allocations (on a CPU
        # each is a fresh mmap and its page faults, which cost more than the arithmetic)
        return x.to(torch.float32, copy=True).div_(255.0).sub_(mean).div_(std)


def _slice_draws(draws, step: int, pos: slice):
    return None if draws is None else tuple(None if d is None else d[step, pos] for d in draws)


class _Base(TrainSource):
    def __init__(
        self,
        train: Split,
        transform: ImageTransform | None,
        global_batch: int,
        rank: int,
        world: int,
        seed: int,
        device: torch.device,
        channels_last: bool,
    ):
        self.num_samples = len(train)
        self.transform, self.global_batch, self.rank, self.world = transform, global_batch, rank, world
        self.seed, self.device, self.channels_last = seed, device, channels_last
        self.steps_per_epoch = steps_per_epoch(self.num_samples, global_batch)
        self.dropped_per_epoch = self.num_samples % global_batch
        self.positions = rank_slice(0, global_batch, rank, world)  # this rank's positions in a global batch

    def _finish(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last and x.dim() == 4 else x

    def rank_batch(self, src_x, src_y, perm, draws, step: int, consts):
        """This rank's batch at `step`, computed where src_x lives."""
        idx = perm[rank_slice(step, self.global_batch, self.rank, self.world)]
        x = gather_rows(src_x, idx)
        if self.transform is not None:
            x = self.transform.apply(x, _slice_draws(draws, step, self.positions), consts)
        return x, gather_rows(src_y, idx)

    def describe(self) -> dict:
        return {
            "source": self.kind,
            "samples": self.num_samples,
            "steps_per_epoch": self.steps_per_epoch,
            "dropped_per_epoch": self.dropped_per_epoch,
            "transform": repr(self.transform),
        }


# On a GPU, the device-resident source transforms this many bytes of batches at once (about 40 CIFAR batches of
# 512): the ~20 small kernels of the gather, crop, flip and normalisation run once per chunk, not once per step,
# and the host has that much less to enqueue per step. A CPU gains nothing from it and keeps one step at a time.
CHUNK_BYTES_CUDA = 256 * 2**20


class TensorSource(_Base):
    """The training set resident on the device (see the module doc: 0 host syncs per step)."""

    kind = "device-resident"

    def __init__(
        self,
        train: Split,
        transform,
        global_batch,
        rank,
        world,
        seed,
        device,
        channels_last,
        chunk_bytes: int | None = None,
    ):
        super().__init__(train, transform, global_batch, rank, world, seed, device, channels_last)
        self.x = train.x.to(device)
        self.y = train.y.to(device)
        self.consts = transform.constants(device) if transform is not None else None
        if chunk_bytes is None:
            chunk_bytes = CHUNK_BYTES_CUDA if torch.device(device).type == "cuda" else 0
        step_bytes = 4 * self.x[0].numel() * (global_batch // world)  # one rank batch, float32
        self.chunk_steps = max(1, chunk_bytes // max(step_bytes, 1))

    def batches(self, epoch: int, start_step: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        perm = epoch_permutation(self.num_samples, self.seed, epoch).to(self.device)
        draws = (
            self.transform.epoch_draws(self.steps_per_epoch, self.global_batch, self.seed, epoch, self.device)
            if self.transform is not None
            else None
        )
        if self.chunk_steps == 1:
            for step in range(start_step, self.steps_per_epoch):
                x, y = self.rank_batch(self.x, self.y, perm, draws, step, self.consts)
                yield self._finish(x), y
            return
        b = self.global_batch // self.world
        for first in range(start_step, self.steps_per_epoch, self.chunk_steps):
            last = min(first + self.chunk_steps, self.steps_per_epoch)
            x, y = self.rank_chunk(perm, draws, first, last)
            for i in range(last - first):  # views: a channels_last chunk's batch slices stay channels_last
                yield x[i * b : (i + 1) * b], y[i * b : (i + 1) * b]

    def rank_chunk(self, perm, draws, first: int, last: int):
        """This rank's batches of steps first .. last-1, side by side: the same gather, crop, flip and
        normalisation as rank_batch, element for element (so the same values), in one pass over them all."""
        g = perm[: self.steps_per_epoch * self.global_batch].view(self.steps_per_epoch, self.global_batch)
        idx = g[first:last, self.positions].reshape(-1)
        x = gather_rows(self.x, idx)
        if self.transform is not None:
            d = (
                None
                if draws is None
                else tuple(None if t is None else t[first:last, self.positions].reshape(-1) for t in draws)
            )
            x = self.transform.apply(x, d, self.consts)
        return self._finish(x), gather_rows(self.y, idx)

    def probe(self, n: int = 2):
        x = self.x[:n]
        if self.transform is not None:
            x = self.transform.apply(x, None, self.consts)
        return self._finish(x), self.y[:n]


class _StepDataset(torch.utils.data.Dataset):
    """Item (epoch, step) = this rank's whole host-side batch; built in a worker process."""

    def __init__(self, source: "LoaderSource", train: Split):
        self.src, self.x, self.y = source, train.x, train.y
        self.consts = source.transform.constants(torch.device("cpu")) if source.transform is not None else None
        self._epoch, self._perm, self._draws = None, None, None

    def __len__(self):
        return self.src.steps_per_epoch

    def __getitem__(self, key):
        epoch, step = key
        if self._epoch != epoch:
            src = self.src
            self._perm = epoch_permutation(src.num_samples, src.seed, epoch)
            self._draws = (
                src.transform.epoch_draws(src.steps_per_epoch, src.global_batch, src.seed, epoch, torch.device("cpu"))
                if src.transform is not None
                else None
            )
            self._epoch = epoch
        return self.src.rank_batch(self.x, self.y, self._perm, self._draws, step, self.consts)


class _StepSampler(torch.utils.data.Sampler):
    def __init__(self, steps: int):
        self.steps, self.epoch, self.start = steps, 0, 0

    def __iter__(self):
        return iter([(self.epoch, s) for s in range(self.start, self.steps)])

    def __len__(self):
        return self.steps - self.start


class LoaderSource(_Base):
    """The DataLoader baseline: batches built by worker processes on the host, then copied."""

    kind = "dataloader"

    def __init__(
        self,
        train: Split,
        transform,
        global_batch,
        rank,
        world,
        seed,
        device,
        channels_last,
        num_workers: int = 4,
        prefetch_factor: int = 2,
    ):
        super().__init__(train, transform, global_batch, rank, world, seed, device, channels_last)
        self.train = train
        self.sampler = _StepSampler(self.steps_per_epoch)
        extra = {"persistent_workers": True, "prefetch_factor": prefetch_factor} if num_workers > 0 else {}
        self.loader = torch.utils.data.DataLoader(
            _StepDataset(self, train),
            batch_size=None,
            sampler=self.sampler,
            num_workers=num_workers,
            pin_memory=device.type == "cuda",
            **extra,
        )
        self.num_workers = num_workers

    def batches(self, epoch: int, start_step: int = 0):
        self.sampler.epoch, self.sampler.start = epoch, start_step
        for x, y in self.loader:
            x = x.to(self.device, non_blocking=True)
            yield self._finish(x), y.to(self.device, non_blocking=True)

    def probe(self, n: int = 2):
        x = self.train.x[:n]
        if self.transform is not None:
            x = self.transform.apply(x, None, self.transform.constants(torch.device("cpu")))
        return self._finish(x.to(self.device)), self.train.y[:n].to(self.device)

    def describe(self) -> dict:
        return {**super().describe(), "num_workers": self.num_workers}


class EvalSource:
    """This rank's shard of the test set (samples rank, rank+W, ...), resident on the device, transformed."""

    def __init__(
        self,
        test: Split,
        transform: ImageTransform | None,
        batch: int,
        rank: int,
        world: int,
        device: torch.device,
        channels_last: bool,
    ):
        self.x = test.x[rank::world].to(device)
        self.y = test.y[rank::world].to(device)
        self.num_samples = len(test)
        self.transform, self.batch, self.channels_last = transform, max(1, batch), channels_last
        self.consts = transform.constants(device) if transform is not None else None

    def batches(self):
        for i in range(0, len(self.y), self.batch):
            x = self.x[i : i + self.batch]
            if self.transform is not None:
                x = self.transform.apply(x, None, self.consts)
            if self.channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            yield x, self.y[i : i + self.batch]


def tensor_sources(
    cfg, train: Split, test: Split, transform: ImageTransform | None, rank: int, world: int, device: torch.device
):
    """(training source, eval source) for data held in memory, as cfg.pipeline asks."""
    train, test = train.head(cfg.train_samples), test.head(cfg.test_samples)
    if cfg.pipeline == "stream":
        raise ConfigError(
            f"parameter 'pipeline': stream reads a set of shards from disk; data set '{cfg.dataset}' "
            f"is held in memory: use pipeline=device or dataloader (or dataset=bigmnist)"
        )
    if cfg.pipeline == "device":
        src = TensorSource(train, transform, cfg.batch, rank, world, cfg.seed, device, cfg.channels_last)
    else:
        src = LoaderSource(
            train,
            transform,
            cfg.batch,
            rank,
            world,
            cfg.seed,
            device,
            cfg.channels_last,
            cfg.num_workers,
            cfg.prefetch_factor,
        )
    return src, EvalSource(test, transform, cfg.per_rank_eval_batch, rank, world, device, cfg.channels_last)
