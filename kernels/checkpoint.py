"""Checkpoints: everything a run needs to continue as if never interrupted.

Model, optimizer, GradScaler, LR scheduler, position (epoch, step in epoch,
global step), every rank's RNG states, the config, and the record rows so far. Global
rank 0 writes it atomically (serialise to memory, temp file, rename), so a
crash mid-write leaves the previous checkpoint intact.
"""
from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import torch

from kernels.records import atomic_write_bytes

FILENAME = "checkpoint.pt"


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


def save(path: Path, rng: list[dict], **payload) -> None:
    """rng: every rank's RNG state, by global rank (each rank resumes its own dropout stream)."""
    buf = io.BytesIO()
    torch.save({**payload, "rng": rng}, buf)
    atomic_write_bytes(Path(path), buf.getvalue())


def load(path: Path) -> dict:
    # weights_only=False: the checkpoint holds RNG states and plain dicts we wrote ourselves.
    return torch.load(Path(path), map_location="cpu", weights_only=False)
