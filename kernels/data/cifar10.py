"""CIFAR-10 in its official python format: download, verify, read.

Layout under the data root:
    cifar10/cifar-10-python.tar.gz          the official tarball (kept; md5-checked)
    cifar10/cifar-10-batches-py/            extracted: data_batch_1..5, test_batch, batches.meta

Each batch file is a pickle (written by Python 2) of a dict with b"data", a
uint8 array of shape (10000, 3072) holding the R, G and B planes of 32x32
images row-major, and b"labels", a list of ints 0-9.

Verification: fetch checks the tarball's md5 and each extracted file's
official md5. Before a run the files are checked against the official md5s in
this module, and nothing else: a checksum file in the data folder vouches for
nothing (anyone who can write the folder could write it too). The batches are
read by the data-only unpickler (kernels.base.safe_pickle), so even a file that got
past the check cannot run code.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from kernels.data.download import download, md5sum
from kernels.base import safe_pickle
from kernels.base.errors import ConfigError

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
TARBALL = "cifar-10-python.tar.gz"
TARBALL_MD5 = "c58f30108f718f92721af3b95e74349a"
BATCH_DIR = "cifar-10-batches-py"
TRAIN_FILES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5")
TEST_FILES = ("test_batch",)
META_FILE = "batches.meta"
OFFICIAL_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
    "batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
}
FETCH_CMD = "lab fetch cifar10"


def batch_dir(root: Path) -> Path:
    return Path(root) / "cifar10" / BATCH_DIR


def verify(root: Path, expected: dict[str, str] = OFFICIAL_MD5) -> Path:
    """Check the extracted files against `expected` (the official md5s; a test passes those of its own set);
    return their directory or raise ConfigError."""
    d = batch_dir(root)
    if not d.is_dir():
        raise ConfigError(
            f"dataset 'cifar10': {d} does not exist. Fetch it once with `{FETCH_CMD} --root {root}` "
            f"(needs network; or copy the official {TARBALL} into {d.parent} and run the same command), "
            f"or use dataset=digits (embedded) or dataset=synthetic"
        )
    for name in (*TRAIN_FILES, *TEST_FILES, META_FILE):
        path = d / name
        if not path.exists():
            raise ConfigError(f"dataset 'cifar10': {path} is missing; re-run `{FETCH_CMD} --root {root} --force`")
        got = md5sum(path)
        if got != expected.get(name):
            raise ConfigError(
                f"dataset 'cifar10': checksum mismatch for {path} (md5 {got}, expected {expected.get(name)}); "
                f"the file is corrupt or altered: re-run `{FETCH_CMD} --root {root} --force`"
            )
    return d


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        try:
            entry = safe_pickle.load(f, encoding="bytes")
        except safe_pickle.RefusedPickle as e:
            raise ConfigError(
                f"dataset 'cifar10': refused to read {path}: {e}. A CIFAR-10 batch holds arrays, "
                f"lists and strings only; re-run `{FETCH_CMD} --force`"
            ) from None
    if not isinstance(entry, dict) or b"data" not in entry or b"labels" not in entry:
        raise ConfigError(f"dataset 'cifar10': {path} is not a CIFAR-10 batch (no b'data' and b'labels')")
    data = np.asarray(entry[b"data"], dtype=np.uint8)
    labels = np.asarray(entry[b"labels"], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data):
        raise ConfigError(f"dataset 'cifar10': {path} is not a CIFAR-10 batch (data shape {data.shape})")
    return data.reshape(-1, 3, 32, 32), labels


def read(
    root: Path, check: bool = True, expected: dict[str, str] = OFFICIAL_MD5
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{'train': (x uint8 N,3,32,32, y int64 N), 'test': (...)} from the extracted batches."""
    d = verify(root, expected) if check else batch_dir(root)
    out = {}
    for split, files in (("train", TRAIN_FILES), ("test", TEST_FILES)):
        parts = [_read_batch(d / name) for name in files]
        out[split] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return out


def fetch(root: Path, url: str = URL, md5: str = TARBALL_MD5, force: bool = False) -> Path:
    """Download (unless the tarball is present), verify, extract. `md5` other than the official tarball's (a
    test's own set) checks that tarball only, and its files are then verified by the caller's own md5s."""
    root = Path(root)
    base = root / "cifar10"
    base.mkdir(parents=True, exist_ok=True)
    tarball = base / TARBALL
    if force and (base / BATCH_DIR).exists():
        shutil.rmtree(base / BATCH_DIR)
    official = md5 == TARBALL_MD5
    if not force and (base / BATCH_DIR).is_dir():
        return verify(root) if official else base / BATCH_DIR
    if not tarball.exists():
        download(
            url,
            tarball,
            what="dataset 'cifar10'",
            offline_hint=f"copy {TARBALL} (md5 {TARBALL_MD5}) into {base} and run `{FETCH_CMD}` again",
        )
    got = md5sum(tarball)
    if got != md5:
        raise ConfigError(
            f"dataset 'cifar10': checksum mismatch for {tarball} (md5 {got}, expected {md5}); "
            f"delete it and run `{FETCH_CMD}` again"
        )
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        with tarfile.open(tarball, "r:gz") as tf:
            tf.extractall(tmp, filter="data")
        extracted = Path(tmp) / BATCH_DIR
        if not extracted.is_dir():
            raise ConfigError(f"dataset 'cifar10': {tarball} has no {BATCH_DIR}/ directory; not the python version")
        for name in (*TRAIN_FILES, *TEST_FILES, META_FILE):
            path = extracted / name
            if not path.exists():
                raise ConfigError(f"dataset 'cifar10': {tarball} lacks {BATCH_DIR}/{name}")
            got = md5sum(path)
            if official and got != OFFICIAL_MD5[name]:
                raise ConfigError(
                    f"dataset 'cifar10': {name} in the official tarball has md5 {got}, expected {OFFICIAL_MD5[name]}"
                )
        extracted.replace(base / BATCH_DIR)
    return verify(root) if official else base / BATCH_DIR
