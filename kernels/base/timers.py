"""Per-step timers that measure the device, not the host's launch queue.

On CUDA each step records three events (start, batch ready, step done) on the
current stream; they are read once per epoch after a synchronize, so timing
adds no per-step host-device sync. On CPU the work is synchronous and
perf_counter is exact.

What "data wait" (start -> batch ready) means, exactly, so that pipelines compare:
- CUDA, device-resident source (pipeline=device): the stream time of the batch's
  on-device gather and augmentation kernels.
- CUDA, DataLoader (pipeline=dataloader) or streamed shards: the stream time between
  the two marks, i.e. the time the GPU had nothing else to do while the host waited
  for a worker's batch, plus the host-to-device copy. Host waiting that overlaps GPU
  work still queued from the previous step costs the step nothing and counts nothing.
- CPU (any source): the wall time of fetching the batch (next() on the source).
In every case it is the time the step's compute could not start for want of input,
on the timeline that bounds the step; compute = step - data wait.
"""

from __future__ import annotations

import time

import torch


class StepTimer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._marks: list[tuple] = []

    def _mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self):
        self._cur = [self._mark()]

    def data_ready(self):
        self._cur.append(self._mark())

    def done(self, timed: bool):
        self._cur.append(self._mark())
        if timed:
            self._marks.append(tuple(self._cur))

    def collect(self) -> tuple[list[float], list[float]]:
        """(data_wait_ms, compute_ms) per timed step since the last collect."""
        if self.cuda:
            torch.cuda.synchronize()
            wait = [a.elapsed_time(b) for a, b, _ in self._marks]
            comp = [b.elapsed_time(c) for _, b, c in self._marks]
        else:
            wait = [(b - a) * 1e3 for a, b, _ in self._marks]
            comp = [(c - b) * 1e3 for _, b, c in self._marks]
        self._marks = []
        return wait, comp


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
