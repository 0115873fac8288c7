"""Checkpointing a run: every rank's part gathered, rank 0's snapshot and (asynchronous) write, and resume.

The files and their checks are kernels/records/checkpoint_file.py's; this component decides what goes in
(model, optimizer, scaler, scheduler, position, record rows, timing, config, and every rank's
RNG states, I/O counters, partial sums and buffers: BatchNorm statistics are per rank), times
the snapshot and the write, and puts a checkpoint's state back into a rank's parts.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from statistics import median

import torch
import torch.distributed as dist

from kernels.records import checkpoint_file as ckpt
from kernels.base.dist import all_gather_object
from kernels.run.metrics import zero_timing

POSITION = ("epoch", "step_in_epoch", "global_step", "rows", "timing", "started_utc")


@dataclass
class LoopState:
    """Where the loop is and what the record holds so far. A checkpoint keeps the POSITION fields (and every
    rank's partial_sums); a resumed run starts from them."""

    started_utc: str
    epoch: int = 0  # the epoch under way (0-based); epochs done = len(rows)
    step_in_epoch: int = 0  # steps done in that epoch: nonzero only for a run stopped mid-epoch
    global_step: int = 0  # optimizer steps done, over all attempts
    rows: list[dict] = field(default_factory=list)  # metrics.csv's rows so far
    timing: dict = field(default_factory=zero_timing)  # the timed steps' times over all epochs (metrics.py)
    resumed_from_step: int = 0  # this attempt started at this global step (0: a fresh run)
    partial_sums: list[float] | None = None  # an interrupted epoch's loss and metric sums on this rank

    def position(self) -> dict:
        """The fields a checkpoint keeps."""
        return {k: getattr(self, k) for k in POSITION}

    @classmethod
    def resumed(cls, saved: dict, partial_sums: list[float] | None) -> "LoopState":
        """The state a checkpoint (`saved`, with its POSITION keys) and this rank's own partial sums give."""
        return cls(**{k: saved[k] for k in POSITION}, partial_sums=partial_sums, resumed_from_step=saved["global_step"])


class Checkpointer:
    """Rank 0 copies the state to host memory (the snapshot, timed) and writes it, in a background thread when
    checkpoint_async (the next save, a stop or the end of the run waits for that write; its time is recorded)."""

    def __init__(self, cfg, record, beat):
        self.cfg, self.record, self.beat = cfg, record, beat
        self.is_rank0 = record.is_rank0
        self.costs: list[dict] = []  # rank 0: snapshot and write time of each checkpoint of this attempt
        self.writer, self.error = None, None

    def save(self, st: LoopState, parts, io_state: dict) -> None:
        """st: the loop's position and record state; parts: model, optimizer, scaler, scheduler."""
        self.beat()
        rng = all_gather_object(ckpt.rng_state())  # every rank's, so each resumes its own stream
        io = all_gather_object(io_state)  # every rank's I/O counters, so the record covers all attempts
        partial = all_gather_object(st.partial_sums)  # every rank's sums of an interrupted epoch
        buffers = all_gather_object({k: v.detach().cpu() for k, v in parts.model.named_buffers()})
        if self.is_rank0:
            self.wait()  # the previous write, if still going: one write at a time
            t0 = time.perf_counter()
            data = ckpt.serialise(
                rng,
                io=io,
                partial_sums=partial if partial[0] is not None else None,
                model=parts.model.state_dict(),
                rank_buffers=buffers,
                optimizer=parts.opt.state_dict(),
                scaler=parts.scaler.state_dict(),
                scheduler=parts.sched.state_dict(),
                **st.position(),
                config=self.cfg.to_dict(),
            )
            cost = {
                "epoch": st.epoch,
                "global_step": st.global_step,
                "bytes": len(data),
                "snapshot_ms": round((time.perf_counter() - t0) * 1e3, 3),
                "write_ms": None,
                "async": self.cfg.checkpoint_async,
            }
            self.costs.append(cost)
            if self.cfg.checkpoint_async:
                self.writer = threading.Thread(
                    target=self._write, args=(data, cost), daemon=True, name="lab-checkpoint"
                )
                self.writer.start()
            else:
                self._write(data, cost)
                self.wait()  # raises the write's error now
        if not self.cfg.checkpoint_async:
            dist.barrier()
        self.beat()

    @property
    def run_dir(self):
        return self.record.run_dir  # known once the record is open

    def _write(self, data: bytes, cost: dict) -> None:
        t0 = time.perf_counter()
        try:
            ckpt.write(self.run_dir, data)
        except BaseException as e:  # seen by the next wait(), on the training thread
            self.error = e
        cost["write_ms"] = round((time.perf_counter() - t0) * 1e3, 3)

    def wait(self) -> None:
        """Rank 0: the background write of the last checkpoint is finished (or its error raised)."""
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.join()
        err, self.error = self.error, None
        if err is not None:
            raise RuntimeError(f"writing the checkpoint in {self.run_dir} failed: {type(err).__name__}: {err}") from err

    def join(self) -> None:
        """Let a write in progress finish, without raising its error (the run is already ending)."""
        if self.writer is not None:
            self.writer.join()

    def summary(self) -> dict | None:
        return checkpoint_summary(self.costs)


def restore(state: dict, parts, engine, rank: int) -> dict:
    """Put a checkpoint's state into this rank's parts; returns this rank's own entries (partial sums, I/O)."""
    parts.model.load_state_dict(state["model"])
    mine_buffers = (state.get("rank_buffers") or [None] * (rank + 1))[rank]
    if mine_buffers:  # this rank's own BatchNorm statistics (DDP does not broadcast buffers)
        with torch.no_grad():
            for k, v in parts.model.named_buffers():
                v.copy_(mine_buffers[k])
    parts.opt.load_state_dict(state["optimizer"])
    engine.broadcast_state(parts.opt)
    parts.scaler.load_state_dict(state["scaler"])
    parts.sched.load_state_dict(state["scheduler"])
    ckpt.set_rng_state(state["rng"][rank])
    partial = state.get("partial_sums")  # one list of sums per rank: each rank resumes its own
    io = state.get("io")
    return {"partial_sums": partial[rank] if partial else None, "io": io[rank] if io else None}


def checkpoint_summary(costs: list[dict]) -> dict | None:
    """summary.json's `checkpoints`: how many this attempt wrote, and what they cost the training loop
    (the snapshot, always on the training thread) and the disk (the write, in the background when async)."""
    if not costs:
        return None
    snaps = [c["snapshot_ms"] for c in costs]
    writes = [c["write_ms"] for c in costs if c["write_ms"] is not None]
    return {
        "count": len(costs),
        "async": costs[-1]["async"],
        "bytes": costs[-1]["bytes"],
        "snapshot_ms_median": round(median(snaps), 3),
        "snapshot_ms_max": round(max(snaps), 3),
        "write_ms_median": round(median(writes), 3) if writes else None,
        "write_ms_max": round(max(writes), 3) if writes else None,
    }
