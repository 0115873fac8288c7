"""Data-parallel engines behind one small interface: the loop wraps, steps and syncs through it.

    ddp.py      torch DistributedDataParallel (engine=ddp, the default)
    horovod.py  Horovod's DistributedOptimizer (engine=horovod), its checks, horovodrun, its build

An engine is what differs between ways of averaging gradients; the loop in kernels/ddp_core.py
never names one. A new engine implements `Engine` and is added to `ENGINES` (and to the
choices of the `engine` parameter in kernels/base/params.py).
"""

from __future__ import annotations

import importlib
from contextlib import nullcontext

ENGINES = {"ddp": "kernels.engines.ddp", "horovod": "kernels.engines.horovod"}  # name -> module holding ENGINE


class Engine:
    """One rank's side of a data-parallel engine. The defaults are those of an engine that needs nothing at
    that point; ddp.py and horovod.py override what they need."""

    name = "?"

    def wrap_model(self, model, device):
        """The module the training step calls (DDP wraps it; Horovod leaves it as it is)."""
        return model

    def wrap_optimizer(self, model, optimizer, micro_batches: int):
        """The optimizer the loop steps (Horovod's DistributedOptimizer; DDP keeps the workload's)."""
        return optimizer

    def no_sync(self, i: int, micro_batches: int):
        """The context for micro-batch i of a step: gradients are averaged once per step, on the last."""
        return nullcontext()

    def zero_grad(self, optimizer) -> None:
        optimizer.zero_grad()

    def step(self, optimizer, scaler, phase, clip: tuple | None = None) -> None:
        """The optimizer step on the averaged gradients, through the GradScaler; `clip` = (parameters, max norm):
        the gradients are unscaled and clipped first."""
        with phase("optimizer"):
            if clip:
                from torch.nn.utils import clip_grad_norm_  # the driver imports this package, never torch

                scaler.unscale_(optimizer)
                clip_grad_norm_(*clip)
            scaler.step(optimizer)
            scaler.update()

    def broadcast_state(self, optimizer) -> None:
        """After a resume: make every rank's optimizer state rank 0's, where the engine does not."""

    def probe_note(self) -> str | None:
        """Why the comm probe (fwd+bwd with and without gradient sync) cannot run with this engine, or None."""
        return None

    def facts(self) -> dict:
        """What config.json's `derived` says about the engine."""
        return {"engine": self.name}

    def run_end_lines(self, step_ms: list[float], batch: int, world: int, device) -> list[str]:
        """Lines a complete run prints for scripts that grep this engine's usual output (step_ms: the timed
        steps' times, slowest rank)."""
        return []


def make_engine(cfg) -> Engine:
    """The engine of cfg.engine, set up for this rank (after the process group)."""
    return importlib.import_module(ENGINES[cfg.engine]).ENGINE(cfg)
