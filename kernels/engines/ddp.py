"""torch DistributedDataParallel as the lab's default engine (engine=ddp)."""

from __future__ import annotations

import inspect

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from kernels.engines import Engine


class DDPEngine(Engine):
    name = "ddp"

    def __init__(self, cfg):
        self.cfg = cfg
        self.ddp = None
        self.wrapped = dist.get_world_size() > 1

    def wrap_model(self, model, device):
        # One rank has no gradients to average: the module runs as it is. DDP around it would still hook every
        # parameter, fill its buckets and all-reduce them with itself: 5-7 % of a ResNet-18 step on a CPU in
        # paired step timings, a 1-rank baseline that no single-device script pays (benchmarks/bench_seed.py
        # sets the lab beside one).
        if not self.wrapped:
            return model
        # No buffer sync before each forward: BatchNorm statistics are per rank (each normalises its own
        # batch); DDP's default would broadcast rank 0's before every forward, a collective per step for nothing.
        # Every rank's buffers go into the checkpoint and are loaded after this wrap, so a resumed run continues
        # each rank's own. torch >= 2.13 names the setting forward_sync_buffers (and warns on the old name).
        no_sync = (
            {"forward_sync_buffers": False}
            if "forward_sync_buffers" in inspect.signature(DDP).parameters
            else {"broadcast_buffers": False}
        )
        cfg = self.cfg
        self.ddp = DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=cfg.bucket_cap_mb,
            gradient_as_bucket_view=cfg.gradient_as_bucket_view,
            **no_sync,
        )
        return self.ddp

    def no_sync(self, i: int, micro_batches: int):
        if self.wrapped and i < micro_batches - 1:
            return self.ddp.no_sync()
        return super().no_sync(i, micro_batches)

    def zero_grad(self, optimizer) -> None:
        """With gradient_as_bucket_view the gradients ARE DDP's bucket memory: zero them in place (a memset)
        rather than free them, which would make the next backward allocate new gradients and DDP copy them into
        the buckets again. Without bucket views, or without DDP (one rank), set_to_none (no memset)."""
        optimizer.zero_grad(set_to_none=not (self.wrapped and self.cfg.gradient_as_bucket_view))

    def facts(self) -> dict:
        return {"engine": self.name, "ddp_wrapped": self.wrapped}


ENGINE = DDPEngine
