"""The comm probe: how much of a step's gradient communication backward did not hide.

Runs after training and after the last checkpoint, on one fixed batch of this rank's size:
fwd+bwd with and without the gradient all-reduce, in pairs; gradients are discarded and no
optimizer step is taken. A negative number is never reported: an interval that holds zero
is "below noise", with its bound.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from statistics import median

import torch.distributed as dist

from kernels.base.dist import all_reduce
from kernels.base.stats import median_ci
from kernels.base.timers import synchronize


def run_probe(cfg, world: int, engine, ddp, train_model, wl, autocast, opt, src, device, log) -> dict:
    """The probe for a finished run, through its engine (which may say why it cannot run)."""
    note = engine.probe_note()
    if note and world > 1 and cfg.comm_probe_steps:
        log(f"comm probe: {note}")
        return {}

    def fwd_bwd(x, y):
        with autocast:
            loss = wl.loss(wl.forward(train_model, x, y, 0, True), y)
        loss.backward()

    # a fixed batch that does not go through the training stream (a streamed source would read its first
    # windows again, and count them)
    return comm_probe(
        cfg.comm_probe_steps,
        world,
        ddp,
        fwd_bwd,
        lambda: engine.zero_grad(opt),
        lambda: src.probe(cfg.per_rank_batch),
        device,
        log,
    )


def comm_probe(n: int, world: int, ddp, fwd_bwd, zero_grad, make_batch, device, log) -> dict:
    """Fwd+bwd with and without gradient all-reduce on one fixed batch, in pairs.

    The difference is the communication that backward did not hide. Each timed
    iteration starts after a barrier (no rank carries another's lateness into it);
    the two variants alternate in order, pair by pair, so drift (clocks, the page
    cache, a neighbour) falls on both; each pair's difference is averaged over the
    ranks. The result is the median difference with a distribution-free 90 %
    confidence interval of that median: when the interval holds zero (or lies
    below it) the exposed communication is "below noise", recorded as such with
    its upper bound, never as a negative number. Runs after training and after the
    last checkpoint; gradients are discarded, no optimizer step is taken.
    """
    if world == 1 or n == 0:
        return {}
    x, y = make_batch()
    ddp.train()

    def once(sync: bool) -> float:
        zero_grad()
        synchronize(device)
        dist.barrier()
        t0 = time.perf_counter()
        with nullcontext() if sync else ddp.no_sync():
            fwd_bwd(x, y)
        synchronize(device)
        return (time.perf_counter() - t0) * 1e3

    pairs = []
    for i in range(n + 2):  # two warm-up pairs
        first_sync = i % 2 == 1
        a = once(first_sync)
        b = once(not first_sync)
        if i >= 2:
            pairs.append((a, b) if first_sync else (b, a))
    zero_grad()
    sums = all_reduce([v for p in pairs for v in p], device)
    mean = [v / world for v in sums]
    sync_ms, nosync_ms = mean[0::2], mean[1::2]
    out = probe_result(sync_ms, nosync_ms)
    ci = out["exposed_comm_ci_ms"]
    log(
        f"comm probe: fwd+bwd {out['comm_probe_sync_ms']:.2f} ms with all-reduce, "
        f"{out['comm_probe_nosync_ms']:.2f} ms without (medians of {len(pairs)} pairs): "
        + (
            f"{out['exposed_comm_ms']:.2f} ms exposed communication per step (90 % CI {ci[0]:.2f} to {ci[1]:.2f})"
            if out["exposed_comm_status"] == "measured"
            else f"exposed communication not distinguishable from zero (90 % CI {ci[0]:.2f} to {ci[1]:.2f} ms)"
        )
    )
    return out


def probe_result(sync_ms: list[float], nosync_ms: list[float]) -> dict:
    """The comm probe's record: medians, the paired differences' median and its 90 % CI, and whether it is
    distinguishable from zero (the CI's lower end above zero)."""
    diffs = [a - b for a, b in zip(sync_ms, nosync_ms)]
    ci = median_ci(diffs, level=0.90)  # the sign test's order-statistic interval (the full range when too few pairs)
    d = ci["median"]
    lo, hi = (ci["ci_lo"], ci["ci_hi"]) if ci["ci_lo"] is not None else (d, d)
    resolved = lo > 0
    return {
        "comm_probe_sync_ms": round(median(sync_ms), 4),
        "comm_probe_nosync_ms": round(median(nosync_ms), 4),
        "comm_probe_pairs": len(diffs),
        "exposed_comm_ms": round(d, 4) if resolved else None,
        "exposed_comm_status": "measured" if resolved else "below noise",
        "exposed_comm_ci_ms": [round(lo, 4), round(hi, 4)],
    }
