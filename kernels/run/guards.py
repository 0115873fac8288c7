"""Guards of a rank: stop signals, the hang watchdog, and the ranks' agreement to stop or fail.

- StopSignals: USR1 (Slurm's warning before a time limit or preemption), TERM (scancel, a time
  limit) and INT (Ctrl-C) ask the run to stop; the ranks agree at the next check, checkpoint and record
  'preempted' (a second Ctrl-C stops at once).
- Watchdog: a rank that makes no progress for too long dumps its stacks and ends the process.
- agree(): one small all-reduce in which every rank learns whether any was asked to stop or saw a
  non-finite loss.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

EXIT_HUNG = 70
INTERRUPTED = False  # this process got SIGINT (StopSignals): its stop exits with EXIT_INTERRUPTED (launch/launchers)


class Terminated(Exception):
    """SIGTERM arrived and no step boundary came within term_grace_s: stopped without a checkpoint."""


class NonFiniteLoss(Exception):
    """The training loss became NaN or infinite."""


def peer_left(exc: BaseException) -> str | None:
    """gloo's words when another rank left during a collective (that rank's own output says why), else None."""
    import re

    peer = r"Connection (?:closed|reset) by peer(?: \[[^\]]*\]:\d+)?"
    m = re.search(peer, str(exc)) if isinstance(exc, RuntimeError) else None
    return m.group(0) if m else None


class StopSignals:
    """USR1 and TERM ask the run to stop; the ranks agree at the next check (every sync_check_steps steps),
    checkpoint, and record 'preempted'. TERM also arms an alarm: if no boundary comes within term_grace_s
    (a rank is stuck), the rank stops anyway and records 'failed'."""

    def __init__(self, term_grace_s: float):
        self.request: str | None = None
        self.grace = max(1, int(term_grace_s))
        # the batch script leaves this file when its warning came before the ranks could be signalled
        self.stop_file = os.environ.get("LAB_STOP_FILE")
        signal.signal(signal.SIGUSR1, self._on_usr1)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_int)
        signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_usr1(self, signum, frame):
        self.request = self.request or "SIGUSR1 (the scheduler's warning before the time limit or a preemption)"

    def _on_term(self, signum, frame):
        # TERM overrides a USR1 warning (and arms the deadline), but not a Ctrl-C: after Ctrl-C to a process
        # group the launcher's TERM reaches the ranks too, and the record must name what the user did
        if self.request is None or not self.request.startswith(("SIGTERM", "SIGINT")):
            self.request = "SIGTERM (a time limit, scancel, or the launcher stopping the ranks)"
            signal.alarm(self.grace)

    def _on_int(self, signum, frame):
        """Ctrl-C: the first asks for a checkpoint at the next agreed step, as TERM does; a second stops at once
        (the last complete checkpoint stays; the record says failed, with this reason)."""
        global INTERRUPTED
        if INTERRUPTED:
            raise Terminated("interrupted twice (Ctrl-C): stopped at once, without a new checkpoint")
        INTERRUPTED = True
        self.request = "SIGINT (Ctrl-C; a second one stops at once)"
        signal.alarm(self.grace)

    def pending(self) -> str | None:
        if self.request is None and self.stop_file and os.path.exists(self.stop_file):
            self.request = "the batch script's stop file (SIGUSR1 came before the ranks could get it)"
        return self.request

    def _on_alarm(self, signum, frame):
        raise Terminated(
            f"terminated by signal {signal.SIGTERM.value} and no step boundary within "
            f"term_grace_s={self.grace} s: stopped without a checkpoint"
        )

    @staticmethod
    def checkpointed() -> None:
        """The stop's checkpoint is written: a pending SIGTERM deadline no longer applies."""
        signal.alarm(0)


class Watchdog(threading.Thread):
    """A rank that makes no progress (no step, evaluation batch or checkpoint) for too long is hung:
    `on_hang` dumps the stacks, records the failure and ends the process, so that its launcher or srun
    ends the run. Before the first step the startup limit applies."""

    def __init__(self, startup_s: float, hang_s: float, on_hang):
        super().__init__(daemon=True, name="lab-watchdog")
        self.startup_s, self.hang_s, self.on_hang = startup_s, hang_s, on_hang
        self.last, self.started, self.stopped = time.monotonic(), False, False

    def beat(self, step: bool = False) -> None:
        self.last = time.monotonic()
        self.started = self.started or step

    def run(self) -> None:
        while not self.stopped:
            limit = self.hang_s if self.started else self.startup_s
            idle = time.monotonic() - self.last
            if idle > limit:
                what = "no step, evaluation batch or checkpoint" if self.started else "no first step"
                self.on_hang(
                    f"{what} for {idle:.0f} s (limit {limit:.0f} s, "
                    f"{'hang' if self.started else 'startup'}_timeout_min): the rank is hung"
                )
                return
            time.sleep(min(5.0, max(0.2, limit / 20)))


def agree(stops: StopSignals, loss_sum: torch.Tensor, device: torch.device, where: str) -> str | None:
    """All ranks agree, in one small all-reduce, whether any was asked to stop or saw a non-finite loss.

    Called every sync_check_steps steps and at each epoch's end: the only host sync it adds is that one
    read of the result. Returns the stop request in words (any rank's), or None; raises NonFiniteLoss.
    """
    flags = torch.stack(
        [
            torch.ones((), dtype=torch.float64, device=device) * (stops.pending() is not None),
            (~torch.isfinite(loss_sum)).double(),
        ]
    )
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    stop, nonfinite = flags.tolist()
    if nonfinite:
        raise NonFiniteLoss(f"the training loss became non-finite by {where}; lower lr, check the data, or use fp32")
    if stop:
        return stops.request or "another rank's stop request"
    return None


def stop_note(why: str, global_step: int) -> str:
    return (
        f"stopped by {why} at global step {global_step} after a checkpoint; the same run_id resumes it "
        f"(a requeued Slurm job does so by itself)"
    )


def die_hung(rank: int, why: str, record_failure) -> None:
    """A hung rank: every thread's Python stack to stderr, the failure recorded (record_failure, rank 0), exit."""
    print(f"rank {rank}: {why}; Python stacks of every thread follow", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    if record_failure is not None:
        try:
            record_failure()
        except Exception as e:  # the record is best effort here; the exit status is not
            print(f"could not record the hang: {e}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_HUNG)
