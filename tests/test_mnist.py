"""IDX files (MNIST, Fashion-MNIST): the reader, fetch --from and verification, bad files, and the CNN learning.

The real Fashion-MNIST comes from Debian's dataset-fashion-mnist package (.ci/run installs
it). IDX files with chosen contents are written here, independently of kernels/.
"""

from __future__ import annotations

import gzip
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from kernels.data import idx, mnist
from kernels.base.params import ConfigError

from conftest import cli_in_process, run_cli

pytestmark = pytest.mark.unit


def write_idx(path: Path, array: np.ndarray, magic: int | None = None, extra: bytes = b"") -> Path:
    """An IDX file as the format defines it: big-endian magic and dims, uint8 payload; .gz compresses."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    magic = magic if magic is not None else (2051 if array.ndim == 3 else 2049)
    data = struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.tobytes() + extra
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_reader_on_files_written_here(tmp_path, suffix):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 5, dtype=np.uint8)
    np.testing.assert_array_equal(idx.read_images(write_idx(tmp_path / f"i{suffix}", images)), images)
    np.testing.assert_array_equal(idx.read_labels(write_idx(tmp_path / f"l{suffix}", labels)), labels)


@pytest.mark.parametrize(
    "case,needle",
    [
        ("magic", "magic number 2049, expected 2051"),
        ("short", "payload of 780 bytes, but the header says 1 x 28 x 28 = 784"),
        ("long", "payload of 788 bytes"),
        ("header", "too short for an IDX images header"),
        ("gzip", "cannot be read"),
    ],
)
def test_corrupt_idx_files_are_clear_errors_naming_the_file(tmp_path, case, needle):
    img = np.zeros((1, 28, 28), dtype=np.uint8)
    path = tmp_path / "train-images-idx3-ubyte"
    if case == "magic":
        write_idx(path, img, magic=2049)
    elif case == "short":
        write_idx(path, img)
        path.write_bytes(path.read_bytes()[:-4])
    elif case == "long":
        write_idx(path, img, extra=b"\0" * 4)
    elif case == "header":
        path.write_bytes(b"\0\0\x08\x03\0\0")
    else:
        path = tmp_path / "train-images-idx3-ubyte.gz"
        write_idx(path, img)
        path.write_bytes(path.read_bytes()[:30])
    with pytest.raises(ConfigError, match=needle) as e:
        idx.read_images(path)
    assert str(path) in str(e.value)


def test_real_fashion_mnist_is_fetched_verified_and_read(fashion_root):
    arrays = mnist.read("fashion-mnist", fashion_root)
    (xtr, ytr), (xte, yte) = arrays["train"], arrays["test"]
    assert xtr.shape == (60_000, 1, 28, 28) and xte.shape == (10_000, 1, 28, 28) and xtr.dtype == np.uint8
    assert ytr.shape == (60_000,) and set(np.unique(ytr)) == set(range(10))
    assert np.bincount(yte).tolist() == [1000] * 10  # Fashion-MNIST's test set is balanced
    assert abs(xtr.mean() / 255 - 0.2860) < 1e-3  # the normalisation the workload uses


def test_placed_by_hand_uncompressed_is_verified_and_used(fashion_root, tmp_path):
    d = tmp_path / "fashion-mnist"
    d.mkdir()
    for stem in mnist.FILES:  # the decompressed form, as a user might place it
        (d / stem).write_bytes(gzip.decompress((fashion_root / "fashion-mnist" / f"{stem}.gz").read_bytes()))
    assert mnist.verify("fashion-mnist", tmp_path) == d
    labels = d / "t10k-labels-idx1-ubyte"
    data = bytearray(labels.read_bytes())
    data[100] ^= 1
    labels.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"checksum mismatch for .*t10k-labels-idx1-ubyte.*lab fetch fashion-mnist"):
        mnist.verify("fashion-mnist", tmp_path)


def test_fetch_from_a_directory_missing_a_file(tmp_path, fashion_root):
    src = tmp_path / "src"
    src.mkdir()
    for stem in mnist.FILES[:3]:
        shutil.copy(fashion_root / "fashion-mnist" / f"{stem}.gz", src)
    with pytest.raises(ConfigError, match=r"--from .*src: t10k-labels-idx1-ubyte \(or .gz\) not found"):
        mnist.fetch("fashion-mnist", tmp_path / "data", from_dir=src)
    assert not any((tmp_path / "data" / "fashion-mnist").glob("*"))  # nothing half-copied


def test_mnist_files_that_are_not_mnist_are_refused(tmp_path):
    """Files in the right format but with other content: the checksum names the file and the fix."""
    rng = np.random.default_rng(1)
    d = tmp_path / "mnist"
    for stem in mnist.FILES:
        arr = rng.integers(0, 256, (3, 28, 28) if "images" in stem else 3, dtype=np.uint8)
        write_idx(d / f"{stem}.gz", arr)
    with pytest.raises(ConfigError, match=r"dataset 'mnist': checksum mismatch for .*train-images-idx3-ubyte.gz"):
        mnist.verify("mnist", tmp_path)
    with pytest.raises(ConfigError, match="lab fetch mnist"):
        mnist.verify("mnist", tmp_path / "nowhere")


def test_training_on_missing_or_corrupt_data_fails_before_any_record(tmp_path, fashion_root, capsys, monkeypatch):
    res = tmp_path / "runs"
    rc, _, err = cli_in_process(
        capsys,
        monkeypatch,
        "--workload",
        "cnn",
        "--dataset",
        "mnist",
        "--data_dir",
        tmp_path / "empty",
        "--results_dir",
        res,
    )
    assert rc == 2 and "lab fetch mnist" in err and not res.exists()
    bad = tmp_path / "bad"
    shutil.copytree(fashion_root / "fashion-mnist", bad / "fashion-mnist")
    f = bad / "fashion-mnist" / "train-labels-idx1-ubyte.gz"
    f.write_bytes(f.read_bytes()[:-100])
    rc, _, err = cli_in_process(
        capsys, monkeypatch, "--workload", "cnn", "--dataset", "fashion-mnist", "--data_dir", bad, "--results_dir", res
    )
    assert rc == 2 and "train-labels-idx1-ubyte.gz" in err and not res.exists()


@pytest.mark.integration
def test_cnn_learns_fashion_mnist_with_two_ranks(tmp_path, fashion_root):
    """A subset of the real Fashion-MNIST, 2 gloo ranks, the workload's own recipe: well above chance."""
    p = run_cli(
        "--workload",
        "cnn",
        "--dataset",
        "fashion-mnist",
        "--data_dir",
        fashion_root,
        "--gpus",
        "2",
        "--train_samples",
        "4096",
        "--test_samples",
        "2000",
        "--epochs",
        "2",
        "--log_every",
        "0",
        "--timing_warmup_steps",
        "2",
        "--comm_probe_steps",
        "2",
        "--results_dir",
        tmp_path,
        "--run_id",
        "f",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((tmp_path / "f" / "summary.json").read_text())
    cfg = json.loads((tmp_path / "f" / "config.json").read_text())
    assert summary["status"] == "complete" and summary["final_eval_acc"] > 0.70, summary["final_eval_acc"]
    assert cfg["derived"]["model_variant"] == "mnist-cnn-pytorch-examples"
    assert cfg["params"]["lr"] == 1.0 and cfg["params"]["batch"] == 64  # the recipe's defaults
    # FLOPs counted from the model: 26*26*32*9 + 24*24*64*32*9 + 9216*128 + 128*10 = 12.0 M multiply-adds
    assert summary["fwd_flops_per_sample"] == 2 * (26 * 26 * 32 * 9 + 24 * 24 * 64 * 32 * 9 + 9216 * 128 + 128 * 10)
