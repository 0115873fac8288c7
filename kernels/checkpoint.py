"""Checkpoints: everything a run needs to continue as if never interrupted.

Model, optimizer, GradScaler, LR scheduler, position (epoch, step in epoch,
global step), every rank's RNG states, the config, and the record rows so far.
Global rank 0 writes it atomically (serialise to memory, temp file, rename) with
its sha256 beside it (checkpoint.pt.sha256), after keeping the previous one as
checkpoint.prev.pt. Loading verifies the checksum; a damaged or truncated
checkpoint falls back to the previous one (the run says so) and, when both are
unusable, is a clear error naming the files and the fix.
"""
from __future__ import annotations

import hashlib
import io
import os
import random
from pathlib import Path

import numpy as np
import torch

from kernels.files import atomic_write_bytes

FILENAME = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"


def seed_everything(seed: int) -> None:
    """Python's, numpy's and torch's generators from one seed (a run's start; resume restores rng_state())."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def serialise(rng: list[dict], **payload) -> bytes:
    """The checkpoint's bytes. rng: every rank's RNG state, by global rank (each resumes its own stream)."""
    buf = io.BytesIO()
    torch.save({**payload, "rng": rng}, buf)
    return buf.getvalue()


def write(run_dir: Path, data: bytes) -> None:
    """Keep the current checkpoint as the previous one, then write `data` and its checksum atomically."""
    run_dir = Path(run_dir)
    cur, prev = run_dir / FILENAME, run_dir / PREVIOUS
    if cur.exists():
        os.replace(cur, prev)
        if _sidecar(cur).exists():
            os.replace(_sidecar(cur), _sidecar(prev))
    atomic_write_bytes(cur, data)
    atomic_write_bytes(_sidecar(cur), (hashlib.sha256(data).hexdigest() + "\n").encode())


def exists(run_dir: Path) -> bool:
    return (Path(run_dir) / FILENAME).exists() or (Path(run_dir) / PREVIOUS).exists()


def _problem(path: Path) -> str | None:
    side = _sidecar(path)
    if not side.exists():
        return None  # no checksum to compare (an interrupted save): torch.load decides
    want = side.read_text().strip()
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    return None if got == want else f"checksum mismatch (sha256 {got[:12]}..., {side.name} says {want[:12]}...)"


def load(run_dir: Path) -> tuple[dict, Path, list[str]]:
    """(state, the file it came from, notes on files that were unusable). Raises ConfigError when none is."""
    from kernels.errors import ConfigError

    run_dir, notes = Path(run_dir), []
    for name in (FILENAME, PREVIOUS):
        path = run_dir / name
        if not path.exists():
            continue
        problem = _problem(path)
        if problem is None:
            try:
                # weights_only=False: the checkpoint holds RNG states and plain dicts we wrote ourselves.
                return torch.load(path, map_location="cpu", weights_only=False), path, notes
            except Exception as e:  # truncated or not a checkpoint at all
                problem = f"cannot be loaded ({type(e).__name__}: {str(e)[:120]})"
        notes.append(f"{path} is unusable: {problem}")
    raise ConfigError(f"no usable checkpoint in {run_dir}: {'; '.join(notes) or 'none found'}. To start the run "
                      f"over, remove {run_dir} (or pass another run_id)")
