"""Data sets that need no download: the embedded digits and synthetic images.

digits: the 1,797 handwritten 8x8 digits (UCI, 0-16 grey levels) that ship
inside scikit-learn's wheel. They are read straight from the package's
digits.csv.gz (so the core does not import scikit-learn), upsampled
bilinearly to the workload's size (32x32 for ResNet-18, 28x28 for the MNIST
CNN), scaled to 0-255 and replicated to its channels, giving uint8 images of the
shape the model expects. A fixed split (seed 0, independent of the run's seed):
1,437 train, 360 test.

synthetic: uniform random uint8 images and labels of the workload's shape
(50,000 train, 10,000 test at most), generated from a fixed seed; for throughput runs.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

from kernels.base.errors import ConfigError

DIGITS_TEST = 360
SPLIT_SEED = 0


def digits_csv() -> Path:
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "dataset 'digits': scikit-learn (which carries the embedded digits) is not installed; "
            "run `make setup` or `pip install scikit-learn`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
    if not path.exists():
        raise ConfigError(f"dataset 'digits': {path} not found in the installed scikit-learn")
    return path


def load_digits(size: int = 32, channels: int = 3) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The digits, bilinearly upsampled to size x size and replicated to `channels` channels."""
    with gzip.open(digits_csv(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    pixels, labels = table[:, :64], table[:, 64].astype(np.int64)
    import torch
    import torch.nn.functional as F

    img = torch.from_numpy(pixels).reshape(-1, 1, 8, 8)
    img = F.interpolate(img, size=(size, size), mode="bilinear", align_corners=False)
    img = (img * (255.0 / 16.0)).round().clamp(0, 255).to(torch.uint8).expand(-1, channels, -1, -1)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED)).numpy()
    x, y = img.numpy()[order], labels[order]
    n_train = len(y) - DIGITS_TEST
    return {"train": (x[:n_train].copy(), y[:n_train]), "test": (x[n_train:].copy(), y[n_train:])}


def make_synthetic(n_train: int = 50_000, n_test: int = 10_000, shape=(3, 32, 32), classes: int = 10):
    import torch

    g = torch.Generator().manual_seed(SPLIT_SEED)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8)
        y = torch.randint(0, classes, (n,), generator=g)
        out[split] = (x.numpy(), y.numpy())
    return out
