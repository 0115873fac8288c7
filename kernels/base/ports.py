"""Rendezvous ports, chosen by the launcher before any rank starts (no torch here: the launcher of a notebook run
and the CLI's driver do not import it)."""

from __future__ import annotations

import socket

# Rendezvous ports come from 20000-31999: below Linux's default ephemeral range (32768-60999), from which the
# kernel hands out outgoing connections' ports (NCCL's and gloo's among them), so a listener cannot collide.
PORT_BASE, PORT_SPAN = 20000, 12000


def slurm_port(job_id: str) -> int:
    """Deterministic per job, so every rank agrees without talking: only for ranks that srun starts without the
    lab's launcher (which passes every rank a random MASTER_PORT), since anyone who sees the job id can predict it."""
    return PORT_BASE + int(job_id) % PORT_SPAN


def free_port() -> int:
    """A port that is free now on every interface (where rank 0's store will listen), drawn from the system's
    random source (another user cannot predict it), outside the ephemeral range (see PORT_BASE)."""
    import random

    for port in random.SystemRandom().sample(range(PORT_BASE, PORT_BASE + PORT_SPAN), 200):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORT_BASE}-{PORT_BASE + PORT_SPAN - 1} on this machine")
