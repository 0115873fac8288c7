"""torch DistributedDataParallel as the lab's default engine (engine=ddp)."""
from __future__ import annotations

import inspect

from torch.nn.parallel import DistributedDataParallel as DDP

from kernels.engines import Engine


class DDPEngine(Engine):
    name = "ddp"

    def __init__(self, cfg):
        self.cfg = cfg
        self.ddp = None

    def wrap_model(self, model, device):
        # No buffer sync before each forward: BatchNorm statistics are per rank (each normalises its own
        # batch); DDP's default would broadcast rank 0's before every forward, a collective per step for nothing.
        # Every rank's buffers go into the checkpoint and are loaded after this wrap, so a resumed run continues
        # each rank's own. torch >= 2.13 names the setting forward_sync_buffers (and warns on the old name).
        no_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
                   else {"broadcast_buffers": False})
        cfg = self.cfg
        self.ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                       bucket_cap_mb=cfg.bucket_cap_mb, gradient_as_bucket_view=cfg.gradient_as_bucket_view,
                       **no_sync)
        return self.ddp

    def no_sync(self, i: int, micro_batches: int):
        return self.ddp.no_sync() if i < micro_batches - 1 else super().no_sync(i, micro_batches)

    def zero_grad(self, optimizer) -> None:
        """With gradient_as_bucket_view the gradients ARE DDP's bucket memory: zero them in place (a memset)
        rather than free them, which would make the next backward allocate new gradients and DDP copy them into
        the buckets again. Without bucket views, set_to_none (no memset)."""
        optimizer.zero_grad(set_to_none=not self.cfg.gradient_as_bucket_view)


ENGINE = DDPEngine
