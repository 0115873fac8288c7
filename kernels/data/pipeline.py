"""Input pipelines and the sharding contract they share.

Sharding (the DistributedSampler contract, made exact):
- every epoch has one permutation of the N training samples, drawn from the
  run's seed and the epoch number, identical on all ranks;
- an epoch has floor(N / B) steps for global batch B; the last N mod B samples
  of that epoch's permutation are dropped (a different remainder each epoch);
- at step s, global batch = perm[s*B : (s+1)*B], and rank r of W takes the
  contiguous slice [r*B/W, (r+1)*B/W) of it.
So the ranks together see every one of the epoch's floor(N/B)*B samples exactly
once, and a run on W ranks sees the same global batches as a run on one.

Augmentation draws (crop offsets, flips) are made for the whole global batch
from a generator seeded by (seed, epoch, step) and sliced per rank, so they
too do not depend on the world size, and a resumed run draws the same ones.

Two pipelines with one interface (`steps_per_epoch`, `batches(epoch, start)`):
- DevicePipeline: the uint8 data set lives on the device; indexing, crop,
  flip and normalisation run there in batches. Nothing crosses PCIe per step.
- LoaderPipeline: the baseline: a torch DataLoader whose worker processes
  build each rank batch on the host (same functions, so identical values),
  pinned memory, persistent workers, prefetching, then a copy to the device.
"""
from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F

from kernels.workloads.base import Augment, Split


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


def steps_per_epoch(n: int, global_batch: int) -> int:
    return n // global_batch


def rank_slice(step: int, global_batch: int, rank: int, world: int) -> slice:
    b = global_batch // world
    start = step * global_batch + rank * b
    return slice(start, start + b)


def augment_draws(aug: Augment, global_batch: int, seed: int, epoch: int, step: int):
    """(dy, dx, flip) for every position of the global batch; CPU tensors."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 1_000_033 + step)
    dy = torch.randint(0, 2 * aug.pad + 1, (global_batch,), generator=g)
    dx = torch.randint(0, 2 * aug.pad + 1, (global_batch,), generator=g)
    flip = torch.rand(global_batch, generator=g) < 0.5 if aug.flip else torch.zeros(global_batch, dtype=torch.bool)
    return dy, dx, flip


def crop_flip(x: torch.Tensor, pad: int, dy: torch.Tensor, dx: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """Random crop with zero padding and horizontal flip of a uint8 batch (B,C,H,W), on x's device."""
    b, c, h, w = x.shape
    if pad:
        padded = F.pad(x, (pad, pad, pad, pad))
        rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
        cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
        x = padded[torch.arange(b, device=x.device)[:, None, None, None],
                   torch.arange(c, device=x.device)[None, :, None, None], rows, cols]
    if flip.any():
        x = torch.where(flip[:, None, None, None], x.flip(3), x)
    return x


def normalize(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return (x.float().div_(255.0) - mean) / std


class _Base:
    def __init__(self, train: Split, aug: Augment, global_batch: int, rank: int, world: int,
                 seed: int, device: torch.device, channels_last: bool):
        self.n = len(train)
        self.aug, self.global_batch, self.rank, self.world = aug, global_batch, rank, world
        self.seed, self.device, self.channels_last = seed, device, channels_last
        self.steps_per_epoch = steps_per_epoch(self.n, global_batch)

    def _finish(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def rank_batch(self, src_x, src_y, perm, epoch: int, step: int, mean, std):
        """This rank's augmented, normalised batch at (epoch, step), computed where src_x lives."""
        sl = rank_slice(step, self.global_batch, self.rank, self.world)
        idx = perm[sl].to(src_x.device)
        pos = rank_slice(0, self.global_batch, self.rank, self.world)  # positions within the global batch
        dy, dx, flip = (t[pos].to(src_x.device) for t in augment_draws(self.aug, self.global_batch,
                                                                       self.seed, epoch, step))
        x = crop_flip(src_x[idx], self.aug.pad, dy, dx, flip)
        return normalize(x, mean, std), src_y[idx]


class DevicePipeline(_Base):
    def __init__(self, train: Split, aug: Augment, global_batch, rank, world, seed, device, channels_last):
        super().__init__(train, aug, global_batch, rank, world, seed, device, channels_last)
        self.x = train.x.to(device)
        self.y = train.y.to(device)
        self.mean = torch.tensor(aug.mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(aug.std, device=device).view(1, -1, 1, 1)

    def batches(self, epoch: int, start_step: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        perm = epoch_permutation(self.n, self.seed, epoch).to(self.device)
        for step in range(start_step, self.steps_per_epoch):
            x, y = self.rank_batch(self.x, self.y, perm, epoch, step, self.mean, self.std)
            yield self._finish(x), y


class _StepDataset(torch.utils.data.Dataset):
    """Item (epoch, step) = this rank's whole host-side batch; built in a worker process."""

    def __init__(self, pipe: "LoaderPipeline", train: Split):
        self.pipe, self.x, self.y = pipe, train.x, train.y
        self.mean = torch.tensor(pipe.aug.mean).view(1, -1, 1, 1)
        self.std = torch.tensor(pipe.aug.std).view(1, -1, 1, 1)
        self._perm_epoch, self._perm = None, None

    def __len__(self):
        return self.pipe.steps_per_epoch

    def __getitem__(self, key):
        epoch, step = key
        if self._perm_epoch != epoch:
            self._perm, self._perm_epoch = epoch_permutation(self.pipe.n, self.pipe.seed, epoch), epoch
        return self.pipe.rank_batch(self.x, self.y, self._perm, epoch, step, self.mean, self.std)


class _StepSampler(torch.utils.data.Sampler):
    def __init__(self, steps: int):
        self.steps, self.epoch, self.start = steps, 0, 0

    def __iter__(self):
        return iter([(self.epoch, s) for s in range(self.start, self.steps)])

    def __len__(self):
        return self.steps - self.start


class LoaderPipeline(_Base):
    def __init__(self, train: Split, aug: Augment, global_batch, rank, world, seed, device, channels_last,
                 num_workers: int = 4, prefetch_factor: int = 2):
        super().__init__(train, aug, global_batch, rank, world, seed, device, channels_last)
        self.sampler = _StepSampler(self.steps_per_epoch)
        extra = {"persistent_workers": True, "prefetch_factor": prefetch_factor} if num_workers > 0 else {}
        self.loader = torch.utils.data.DataLoader(
            _StepDataset(self, train), batch_size=None, sampler=self.sampler, num_workers=num_workers,
            pin_memory=device.type == "cuda", **extra)

    def batches(self, epoch: int, start_step: int = 0):
        self.sampler.epoch, self.sampler.start = epoch, start_step
        for x, y in self.loader:
            x = x.to(self.device, non_blocking=True)
            yield self._finish(x), y.to(self.device, non_blocking=True)


def make_pipeline(kind: str, train: Split, aug: Augment, global_batch: int, rank: int, world: int, seed: int,
                  device: torch.device, channels_last: bool, num_workers: int = 4, prefetch_factor: int = 2):
    if kind == "device":
        return DevicePipeline(train, aug, global_batch, rank, world, seed, device, channels_last)
    return LoaderPipeline(train, aug, global_batch, rank, world, seed, device, channels_last,
                          num_workers, prefetch_factor)


def eval_batches(test: Split, aug: Augment, batch: int, rank: int, world: int, device: torch.device,
                 channels_last: bool):
    """This rank's shard (samples rank, rank+W, ...) of the test set, normalised, no augmentation.

    Nothing is dropped: summed over ranks, every test sample is counted once.
    """
    x, y = test.x[rank::world], test.y[rank::world]
    mean = torch.tensor(aug.mean, device=device).view(1, -1, 1, 1)
    std = torch.tensor(aug.std, device=device).view(1, -1, 1, 1)
    for i in range(0, len(y), batch):
        xb = normalize(x[i:i + batch].to(device, non_blocking=True), mean, std)
        if channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)
        yield xb, y[i:i + batch].to(device, non_blocking=True)
