"""MNIST and Fashion-MNIST in their official IDX files: fetch (or copy), verify, read.

Layout under the data root, with the official names, compressed or not:
    mnist/train-images-idx3-ubyte[.gz]  train-labels-idx1-ubyte[.gz]
    mnist/t10k-images-idx3-ubyte[.gz]   t10k-labels-idx1-ubyte[.gz]
    fashion-mnist/...                   (the same four names)

Verification is of the content, not of one compression of it: the sha256 of each
decompressed IDX file must be the data set's. For MNIST a .gz whose md5 is the
official archive's is accepted at once (the published md5s); any other .gz (for
instance recompressed by a distribution, as Debian's `dataset-fashion-mnist` is) is
decompressed and checked by sha256. Fashion-MNIST's sha256s were computed from its
real files (Debian's package, from the zalandoresearch/fashion-mnist repository).

`lab fetch mnist|fashion-mnist` downloads from the official mirrors, or with
`--from DIR` copies the four files (either form) from a directory, and verifies them.
Files placed by hand are verified before every run, with no extra step.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kernels.data import idx
from kernels.data.download import download, md5sum
from kernels.base.errors import ConfigError
from kernels.base import files

FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@dataclass(frozen=True)
class Spec:
    name: str
    directory: str
    mirrors: tuple[str, ...]  # base URLs holding the four .gz files
    sha256: dict[str, str]  # decompressed file -> sha256
    gz_md5: dict[str, str]  # official .gz -> md5 (empty when not published for the content here)


SPECS = {
    "mnist": Spec(
        "mnist",
        "mnist",
        (
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
            "http://yann.lecun.com/exdb/mnist/",
        ),
        {
            "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        },
        {
            "train-images-idx3-ubyte": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "train-labels-idx1-ubyte": "d53e105ee54ea40749a09fcbcd1e9432",
            "t10k-images-idx3-ubyte": "9fb629c4189551a2d022fa330f9573f3",
            "t10k-labels-idx1-ubyte": "ec29112dd5afa0611ce80d1b7f02629c",
        },
    ),
    "fashion-mnist": Spec(
        "fashion-mnist",
        "fashion-mnist",
        (
            "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
            "https://github.com/zalandoresearch/fashion-mnist/raw/master/data/fashion/",
        ),
        {
            "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
            "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
            "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
            "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        },
        {},
    ),
}


def _spec(name: str) -> Spec:
    if name not in SPECS:
        raise ConfigError(f"unknown IDX data set '{name}'; choose one of {', '.join(SPECS)}")
    return SPECS[name]


def data_dir(name: str, root: Path) -> Path:
    return Path(root) / _spec(name).directory


def find(name: str, directory: Path, stem: str) -> Path | None:
    """The file `stem` in `directory`, compressed or not (the uncompressed one first)."""
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def verify_file(name: str, path: Path, stem: str) -> None:
    """The file's content is the data set's (see the module doc); ConfigError naming the file otherwise."""
    spec = _spec(name)
    if path.suffix == ".gz" and spec.gz_md5.get(stem) and md5sum(path) == spec.gz_md5[stem]:
        return
    got = hashlib.sha256(idx.read_bytes(path)).hexdigest()
    if got != spec.sha256[stem]:
        raise ConfigError(
            f"dataset '{name}': checksum mismatch for {path} (sha256 of the content {got[:16]}..., "
            f"expected {spec.sha256[stem][:16]}...); the file is corrupt or not {name}'s. Fetch it "
            f"again with `lab fetch {name} --force` (or --from a directory with the official files)"
        )


def verify(name: str, root: Path) -> Path:
    """Check the four files under <root>/<name>/; return that directory or raise ConfigError with the fix."""
    d = data_dir(name, root)
    missing = [stem for stem in FILES if find(name, d, stem) is None]
    if missing:
        raise ConfigError(
            f"dataset '{name}': {', '.join(missing)} (or .gz) missing in {d}. Fetch it with "
            f"`lab fetch {name}` (network), or `lab fetch {name} --from DIR` from a directory "
            f"holding the four official files"
        )
    for stem in FILES:
        verify_file(name, find(name, d, stem), stem)
    return d


def read(name: str, root: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{'train': (x uint8 N,1,28,28, y int64 N), 'test': ...}; counts of images and labels must agree."""
    d = data_dir(name, root)
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        img_path, lab_path = find(name, d, f"{prefix}-images-idx3-ubyte"), find(name, d, f"{prefix}-labels-idx1-ubyte")
        if img_path is None or lab_path is None:
            verify(name, root)  # raises with the fix
        x, y = idx.read_images(img_path), idx.read_labels(lab_path)
        if len(x) != len(y):
            raise ConfigError(f"dataset '{name}': {img_path} holds {len(x)} images but {lab_path} {len(y)} labels")
        out[split] = (x[:, None].copy(), y.astype(np.int64))
    return out


def fetch(name: str, root: Path, from_dir: Path | None = None, force: bool = False) -> Path:
    """Download (or copy from `from_dir`) the four files into <root>/<name>/ and verify them."""
    spec = _spec(name)
    d = data_dir(name, root)
    if force:
        for stem in FILES:
            for f in (d / stem, d / f"{stem}.gz"):
                f.unlink(missing_ok=True)
    elif all(find(name, d, stem) for stem in FILES):
        return verify(name, root)
    d.mkdir(parents=True, exist_ok=True)
    if from_dir is not None:
        from_dir = Path(from_dir)
        missing = [stem for stem in FILES if find(name, from_dir, stem) is None]
        if missing:
            raise ConfigError(
                f"--from {from_dir}: {', '.join(missing)} (or .gz) not found there; the directory "
                f"must hold the four official {name} files"
            )
        for stem in FILES:
            src = find(name, from_dir, stem)
            verify_file(name, src, stem)  # before copying: a bad source leaves nothing behind
            files.copy_file(src, d / src.name, "--root")
    else:
        for stem in FILES:
            if find(name, d, stem):
                continue
            download(
                [m + f"{stem}.gz" for m in spec.mirrors],
                d / f"{stem}.gz",
                what=f"dataset '{name}'",
                offline_hint=f"copy the four files into {d} (or use `lab fetch {name} --from DIR`)",
            )
    return verify(name, root)


__all__ = ["FILES", "SPECS", "fetch", "find", "read", "verify"]
