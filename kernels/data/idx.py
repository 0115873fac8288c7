"""The IDX format of MNIST and Fashion-MNIST (LeCun et al.), read strictly.

A file is a big-endian header, then an uint8 payload:
    magic (uint32): 2051 for images (3 dimensions), 2049 for labels (1 dimension)
    dims  (uint32 each): N, then rows and columns for images
    payload: N*rows*cols (or N) bytes
Files may be gzip-compressed (`.gz`) or not. A wrong magic, a short or long
payload, or an image/label count mismatch is a ConfigError naming the file.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from kernels.base.errors import ConfigError

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049


def read_bytes(path: Path) -> bytes:
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        why = f"{type(e).__name__}: {e}"
        raise ConfigError(f"{path}: cannot be read ({why}); the file is truncated or not gzip") from None


def parse(data: bytes, path: Path, magic: int) -> np.ndarray:
    ndim = 3 if magic == IMAGES_MAGIC else 1
    what = "images" if magic == IMAGES_MAGIC else "labels"
    if len(data) < 4 + 4 * ndim:
        raise ConfigError(f"{path}: {len(data)} bytes, too short for an IDX {what} header")
    got = struct.unpack(">I", data[:4])[0]
    if got != magic:
        raise ConfigError(f"{path}: magic number {got}, expected {magic} (IDX {what}); not an IDX {what} file")
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    need = int(np.prod(dims))
    payload = data[4 + 4 * ndim :]
    if len(payload) != need:
        raise ConfigError(
            f"{path}: payload of {len(payload)} bytes, but the header says {' x '.join(map(str, dims))} "
            f"= {need}; the file is truncated or corrupt"
        )
    return np.frombuffer(payload, dtype=np.uint8).reshape(dims)


def read_images(path: Path) -> np.ndarray:
    return parse(read_bytes(path), Path(path), IMAGES_MAGIC)


def read_labels(path: Path) -> np.ndarray:
    return parse(read_bytes(path), Path(path), LABELS_MAGIC)
