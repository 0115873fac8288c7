"""Index-batched time series: the series is held once on the device; a batch is gathered from window starts.

The public DCRNN pipelines materialise every (input, target) window in float64 on the
host, 24 copies of each time step, and copy each batch to the device. Here the normalised
series (T, nodes, features) and the raw target channel (T, nodes) are put on the device once
(float32); the inputs of a batch are series[start + offsets] and its targets raw[start + 12 +
offsets], gathered on the device from a vector of window starts. Nothing crosses PCIe per
step and no window is stored twice.

Sharding is the lab's contract (kernels/data/pipeline.py) over the training windows: one
permutation per epoch from (seed, epoch), floor(N / B) steps, rank r of W takes the r-th
contiguous slice of each global batch. Under graph parallelism the "rank" here is the
data-parallel index: every rank of a graph-parallel group takes the same windows, each for
its own nodes.

A batch is (x, (y, norm)): x (b, seq_len, nodes, 2) normalised; y (b, horizon, nodes) raw
speeds, 0 = missing; norm (b,) the mean number of non-missing targets per window of the
whole GLOBAL batch over the whole graph, divided by the graph-parallel group size. A rank's
masked loss, sum |error| over its non-missing targets / sum(norm), then averages (as DDP and
micro-batching average) to the masked mean of the global batch over the whole graph: the
same loss and gradient on any number of ranks, graph-parallel groups or micro-batches.
(Evaluation batches use each window's own count: only their sums of errors are reported.)
"""

from __future__ import annotations

import numpy as np
import torch

from kernels.data.pipeline import TrainSource, epoch_permutation, rank_slice, steps_per_epoch


class SeriesStore:
    """The series on the device, once, shared by the training and evaluation sources."""

    def __init__(
        self,
        inputs: np.ndarray,
        raw: np.ndarray,
        norm: np.ndarray,
        device: torch.device,
        seq_len: int,
        horizon: int,
        context: int = 12,
    ):
        self.series = torch.from_numpy(np.ascontiguousarray(inputs)).to(device)
        self.raw = torch.from_numpy(np.ascontiguousarray(raw)).to(device)
        self.norm = torch.from_numpy(np.ascontiguousarray(norm, dtype=np.float32)).to(device)
        self.device = device
        self.x_off = torch.arange(context - seq_len, context, device=device)
        self.y_off = torch.arange(context, context + horizon, device=device)

    def counts(self, starts: torch.Tensor) -> torch.Tensor:
        """Non-missing targets of each window over the whole graph, over the graph-parallel group size."""
        return self.norm[starts[:, None] + self.y_off].sum(1)

    def gather(self, starts: torch.Tensor, norm: torch.Tensor | None = None):
        x = self.series[starts[:, None] + self.x_off]  # (b, seq_len, nodes, F)
        y = self.raw[starts[:, None] + self.y_off]  # (b, horizon, nodes)
        return x, (y, self.counts(starts) if norm is None else norm)

    def resident_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.series, self.raw, self.norm))


class WindowSource(TrainSource):
    """Training windows [first, first + count) of the series (see the module doc)."""

    kind = "index-batched series"

    def __init__(self, store: SeriesStore, starts: range, global_batch: int, rank: int, world: int, seed: int):
        self.store, self.device, self.gather = store, store.device, store.gather
        self.first, self.num_samples = starts.start, len(starts)
        self.global_batch, self.rank, self.world, self.seed = global_batch, rank, world, seed
        self.steps_per_epoch = steps_per_epoch(self.num_samples, global_batch)
        self.dropped_per_epoch = self.num_samples % global_batch

    def batches(self, epoch: int, start_step: int = 0):
        perm = epoch_permutation(self.num_samples, self.seed, epoch).to(self.device) + self.first
        b = self.global_batch
        for step in range(start_step, self.steps_per_epoch):
            mine = perm[rank_slice(step, b, self.rank, self.world)]
            per_window = self.store.counts(perm[step * b : (step + 1) * b]).mean()  # over the global batch
            yield self.gather(mine, per_window.expand(len(mine)))

    def probe(self, n: int = 2):
        starts = torch.arange(self.first, self.first + n, device=self.device)
        return self.gather(starts, self.store.counts(starts).mean().expand(n))

    def describe(self) -> dict:
        return {
            "source": self.kind,
            "samples": self.num_samples,
            "steps_per_epoch": self.steps_per_epoch,
            "dropped_per_epoch": self.dropped_per_epoch,
            "resident_bytes": self.store.resident_bytes(),
            "series_shape": list(self.store.series.shape),
        }


class WindowEvalSource:
    """Evaluation windows: this (data-parallel) rank takes starts rank, rank + W, ...; nothing dropped."""

    def __init__(self, store: SeriesStore, starts: range, batch: int, rank: int, world: int):
        self.gather = store.gather
        self.starts = torch.arange(starts.start, starts.stop, device=store.device)[rank::world]
        self.num_samples, self.batch = len(starts), max(1, batch)

    def batches(self):
        for i in range(0, len(self.starts), self.batch):
            yield self.gather(self.starts[i : i + self.batch])
