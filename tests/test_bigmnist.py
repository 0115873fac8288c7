"""bigMNIST: the builder, the streamed source and its baseline, on small sets built from the real Fashion-MNIST."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels.data import bigmnist
from kernels.data.stream import PerSampleSource, ShardSet, StreamSource
from kernels.base.params import ConfigError

from conftest import ROOT, merge_args, run_cli

pytestmark = pytest.mark.integration

# 1,500 real images x 2 versions x 2 replicas = 6,000 samples in 6 shards of 1,000 (4.7 MB)
SMALL = [
    "--source",
    "fashion-mnist",
    "--source-samples",
    "1500",
    "--versions",
    "2",
    "--replicas",
    "2",
    "--shard-samples",
    "1000",
    "--seed",
    "3",
]


def build(out: Path, root: Path, *extra, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kernels.slurm.bigmnist_jobs",
            "build",
            "--out",
            str(out),
            "--data-dir",
            str(root),
            *SMALL,
            *map(str, extra),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.glob("*.npy"))}


@pytest.fixture(scope="module")
def small_set(fashion_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("bigmnist") / "set"
    p = build(out, fashion_root)
    assert p.returncode == 0, p.stdout + p.stderr
    return out


def test_build_is_deterministic_whatever_the_task_count_and_has_its_manifest(small_set, fashion_root, tmp_path):
    out = tmp_path / "three"
    for task in range(3):
        p = build(out, fashion_root, "--task", task, "--tasks", 3)
        assert p.returncode == 0, p.stderr
        # only the last task to finish sees every shard done and writes the manifest
        assert ("manifest written" in p.stdout) == (task == 2), p.stdout
    assert digests(out) == digests(small_set)
    m = json.loads((small_set / "manifest.json").read_text())
    assert m["samples"] == 6000 and len(m["shards"]) == 6 and m["record_bytes"] == 785
    assert m["test"]["samples"] == 10_000 and m["spec"]["source"] == "fashion-mnist"
    assert all(s["sha256"] == digests(small_set)[s["name"]] for s in m["shards"])
    # every shard is a plain .npy of 785-byte records: numpy reads it without the lab
    rec = np.load(small_set / "shard-00000.npy")
    assert rec.dtype.itemsize == 785 and rec["image"].shape == (1000, 28, 28)
    # the test split is the untouched source test set
    from kernels.data import mnist

    test = mnist.read("fashion-mnist", fashion_root)["test"]
    t = np.load(small_set / "test.npy")
    assert (t["image"] == test[0][:, 0]).all() and (t["label"] == test[1]).all()
    # 2 versions x 1,500 images, each replicated twice: every augmented image appears exactly twice
    allrec = np.concatenate([np.load(small_set / s["name"]) for s in m["shards"]])
    _, counts = np.unique(allrec["image"].reshape(6000, -1), axis=0, return_counts=True)
    assert set(counts.tolist()) == {2} and len(counts) == 3000
    # the mean and std in the manifest are the set's own
    assert abs(m["mean"] - allrec["image"].mean() / 255) < 1e-6


def test_a_killed_build_resumes_and_leaves_no_complete_looking_shard(small_set, fashion_root, tmp_path):
    out = tmp_path / "killed"
    # slow the writes down so the build is caught mid-shard: 60 shards of 100
    args = [
        sys.executable,
        "-m",
        "kernels.slurm.bigmnist_jobs",
        "build",
        "--out",
        str(out),
        "--data-dir",
        str(fashion_root),
        *SMALL,
    ]
    args[args.index("--shard-samples") + 1] = "100"
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not (out / "shard-00003.done").exists() and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(out.glob("*.done"))
    assert 3 < len(done) < 60, "the build ended before it could be killed"
    for d in done:  # what has a sidecar is complete and correct
        meta = json.loads(d.read_text())
        assert hashlib.sha256((out / meta["name"]).read_bytes()).hexdigest() == meta["sha256"]
    assert not (out / "manifest.json").exists()
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert f"{len(done)} verified and skipped" in p.stdout and "manifest written" in p.stdout
    assert not list(out.glob(".*tmp-*"))
    # and the result is the uninterrupted build's, shard for shard (60 shards of 100 = the same 6,000 records)
    joined = np.concatenate([np.load(out / f"shard-{i:05d}.npy") for i in range(60)])
    ref = np.concatenate([np.load(small_set / f"shard-{i:05d}.npy") for i in range(6)])
    assert (joined == ref).all()


def test_verify_finds_a_flipped_byte_and_the_build_repairs_it(small_set, fashion_root, tmp_path):
    import shutil

    d = tmp_path / "set"
    shutil.copytree(small_set, d)
    p = subprocess.run(
        [sys.executable, "-m", "kernels.cli", "bigmnist", "verify", str(d)], cwd=ROOT, capture_output=True, text=True
    )
    assert p.returncode == 0 and "every shard matches" in p.stdout
    shard = d / "shard-00004.npy"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    p = subprocess.run(
        [sys.executable, "-m", "kernels.cli", "bigmnist", "verify", str(d)], cwd=ROOT, capture_output=True, text=True
    )
    assert p.returncode == 1 and "shard-00004.npy" in p.stderr and "rebuilds exactly those shards" in p.stderr
    p = build(d, fashion_root)
    assert p.returncode == 0 and "1 to build, 5 verified and skipped" in p.stdout, p.stdout
    assert digests(d) == digests(small_set)


def test_the_elastic_field_has_simards_magnitude_and_one_field_per_image():
    sigma, alpha = 4.0, 34.0
    g = torch.Generator().manual_seed(0)
    noise = torch.rand((64, 2, 28, 28), generator=g) * 2 - 1
    d = bigmnist.displacement_fields(noise, sigma, alpha)
    interior = d[:, :, 10:18, 10:18]  # away from the reflecting border
    rms = interior.pow(2).mean().sqrt().item()
    expect = bigmnist.expected_rms_displacement(sigma, alpha)
    assert 1.0 < expect < 2.0  # about 1.4 px: alpha 34 times the smoothed noise's std
    assert abs(rms - expect) / expect < 0.15, (rms, expect)
    # a different field for every image of the batch
    flat = d.reshape(64, -1)
    assert torch.cdist(flat, flat).add(torch.eye(64) * 1e9).min() > 1.0
    # applied: with every other transform off, pixels move by about that much
    spec = bigmnist.Spec(flip=False, rotate_deg=0, shear_deg=0, scale_min=1, scale_max=1)
    img = torch.zeros(2, 28, 28, dtype=torch.uint8)
    img[:, 4:24, 13:15] = 255  # a vertical bar
    out = bigmnist.augment(img, spec, torch.Generator().manual_seed(1)).float()
    assert not torch.equal(out[0], out[1])  # the two copies got different fields
    cols = torch.arange(28).float()
    centre = (out[:, 6:22] * cols).sum(-1) / out[:, 6:22].sum(-1).clamp(min=1)
    shift = (centre - 13.5).abs()
    assert 0.2 < shift.mean() < 4 * expect


def _stream_epoch(shards, cache: str, epoch: int = 1, labels: list | None = None):
    """Both ranks' batches of one epoch (window 0.2 MiB, reads of 1 MiB) and the sources, closed; the batches'
    labels are appended to `labels`."""
    srcs = [
        StreamSource(shards, None, 96, r, 2, 7, torch.device("cpu"), cache=cache, window_mb=0.2, read_mb=1)
        for r in range(2)
    ]
    xs = []
    for src in srcs:
        for x, y in src.batches(epoch):
            xs.append(x.reshape(x.shape[0], -1).numpy())
            if labels is not None:
                labels.append(y.numpy())
        src.close()
    return np.concatenate(xs), srcs


def test_streamed_epoch_covers_every_sample_once_over_two_ranks(small_set):
    shards = ShardSet(small_set)
    allrec = np.concatenate([np.load(p) for p in shards.paths])
    labels = []
    xs, srcs = _stream_epoch(shards, "warm", labels=labels)
    ids = np.concatenate([src.stream_to_sample(1, src.indices(1)) for src in srcs])
    steps = 6000 // 96
    assert len(ids) == steps * 96 == len(set(ids.tolist()))  # each sample at most once; 6000 - 62*96 dropped
    assert (xs == allrec["image"].reshape(6000, -1)[ids]).all()  # the bytes are those samples'
    assert (np.concatenate(labels) == allrec["label"][ids]).all()  # and so are the labels, as int64
    assert labels[0].dtype == np.int64 and all(len(y) == 48 for y in labels)  # 96 over two ranks
    # each byte of the kept samples was read once, in reads of at least 1 MiB or whole pieces
    read = sum(s.counters["bytes_read"] for s in srcs)
    assert read == len(ids) * 785 and read / shards.data_bytes <= 1.05
    # another epoch: another order, the same rule
    other = np.concatenate([s.stream_to_sample(2, s.indices(2)) for s in srcs])
    assert len(set(other.tolist())) == len(other) and not np.array_equal(other, ids)
    # cold reads bypass the page cache (O_DIRECT, whose reads start and end on 4 KiB boundaries) and deliver the
    # same batches in the same order; the bytes read are the samples' and at most 8 KiB more per shard piece
    cold, csrcs = _stream_epoch(shards, "cold")
    assert np.array_equal(cold, xs)
    assert all(s.describe()["cold_reads"] == "O_DIRECT" for s in csrcs)  # /tmp's ext4 takes direct reads
    pieces = sum(len(s.segments(1, start, n)) for s in csrcs for start, n in s.epoch_windows(1))
    read = sum(s.counters["bytes_read"] for s in csrcs)
    assert len(ids) * 785 < read <= len(ids) * 785 + pieces * 8192


@pytest.mark.parametrize("refuses", ["open", "read"])
def test_cold_stream_reads_through_the_page_cache_where_direct_reads_are_refused(small_set, monkeypatch, refuses):
    """A file system that refuses O_DIRECT (as some network and FUSE ones do), when a file is opened or only when
    it is read, gets the page cache with eviction, the same batches, and a record that says so; both reader
    threads of a rank meet the refusal, and whichever switches first, neither fails."""
    from kernels.data import stream

    shards = ShardSet(small_set)
    direct, _ = _stream_epoch(shards, "cold")
    real_open, real_preadv, direct_fds = os.open, os.preadv, set()

    def fake_open(path, flags, *a):
        if flags & os.O_DIRECT and refuses == "open":
            raise OSError(22, "Invalid argument", str(path))
        fd = real_open(path, flags, *a)
        (direct_fds.add if flags & os.O_DIRECT else direct_fds.discard)(fd)
        return fd

    def fake_preadv(fd, buffers, offset):
        if fd in direct_fds:
            raise OSError(22, "Invalid argument")
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(stream.os, "open", fake_open)
    monkeypatch.setattr(stream.os, "preadv", fake_preadv)
    evicted, srcs = _stream_epoch(shards, "cold")
    assert np.array_equal(evicted, direct)
    why = (
        rf"{re.escape(str(small_set))}/shard-\d+\.npy's file system refused O_DIRECT"
        if refuses == "open"
        else rf"direct reads of {re.escape(str(small_set))} failed: Invalid argument"
    )
    for s in srcs:
        assert re.fullmatch(rf"posix_fadvise DONTNEED \({why}\)", s.describe()["cold_reads"]), s.describe()
    assert sum(s.counters["bytes_read"] for s in srcs) == (6000 // 96) * 96 * 785  # no alignment: the samples only


def test_per_sample_baseline_reads_the_same_records(small_set):
    shards = ShardSet(small_set)
    m = shards.manifest
    src = PerSampleSource(shards, m["mean"], m["std"], 64, 1, 2, 0, torch.device("cpu"), False, 0, 2)
    x, y = next(src.batches(0))
    assert x.shape == (32, 1, 28, 28) and x.dtype == torch.float32
    i = next(iter(src.sampler))
    rec = np.load(shards.paths[i // 1000])[i % 1000]
    assert torch.allclose(x[0, 0], (torch.from_numpy(rec["image"].astype(np.float32)) / 255 - m["mean"]) / m["std"])
    assert y[0].item() == rec["label"]


def _metrics(run: Path) -> list[dict]:
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))


STREAM = [
    "--workload",
    "cnn",
    "--dataset",
    "bigmnist",
    "--gpus",
    "2",
    "--batch",
    "64",
    "--epochs",
    "2",
    "--log_every",
    "0",
    "--timing_warmup_steps",
    "2",
    "--comm_probe_steps",
    "0",
    "--window_mb",
    "0.3",
    "--sync_check_steps",
    "1",
    "--test_samples",
    "500",
]  # 500 of the 10,000 test images


def test_two_rank_streamed_run_records_io_and_resumes_mid_epoch_identically(small_set, tmp_path):
    runs = tmp_path / "runs"
    p = run_cli(*STREAM, "--data_dir", small_set, "--results_dir", runs, "--run_id", "whole", "--cache", "cold")
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads((runs / "whole" / "summary.json").read_text())
    io = s["io"]
    assert io["source"] == "streamed-shards" and io["cache"] == "cold" and io["data_bytes"] == 6000 * 785
    assert 0.95 <= io["read_ratio_max_epoch"] <= 1.05  # the source's own counters: each byte once per epoch
    assert len(io["ranks"]) == 2 and all(r["bytes_read"] and r["read_mb_s"] and r["device_name"] for r in io["ranks"])
    assert io["bytes_read"] == sum(r["bytes_read"] for r in io["ranks"])
    assert all(set(r["bytes_by_epoch"]) == {"0", "1"} for r in io["ranks"])
    assert io["read_mb_s"] > 0 and 0 <= io["data_wait_frac_max"] < 1
    cfg = json.loads((runs / "whole" / "config.json").read_text())
    assert cfg["params"]["pipeline"] == "stream" and cfg["derived"]["data_source"]["shards"] == 6

    # stopped mid-epoch 1 (93 steps per epoch), then resumed: the same losses as the uninterrupted run
    p = run_cli(
        *STREAM,
        "--data_dir",
        small_set,
        "--results_dir",
        runs,
        "--run_id",
        "split",
        "--cache",
        "cold",
        "--stop_after_steps",
        "40",
    )
    assert p.returncode == 0, p.stderr
    assert json.loads((runs / "split" / "summary.json").read_text())["status"] == "stopped"
    p = run_cli(*STREAM, "--data_dir", small_set, "--results_dir", runs, "--run_id", "split", "--cache", "cold")
    assert p.returncode == 0, p.stderr
    a, b = _metrics(runs / "whole"), _metrics(runs / "split")
    for col in ("train_loss", "eval_loss", "eval_acc"):
        assert [r[col] for r in a] == [r[col] for r in b], col
    s2 = json.loads((runs / "split" / "summary.json").read_text())
    # the I/O counters survive the resume: the record covers both attempts. The stopped attempt had read
    # ahead (io_threads + 1 windows) and the resumed one reads the interrupted window again: no more than that
    window = cfg["derived"]["data_source"]["window_samples"] * 785
    extra = s2["io"]["bytes_read"] - io["bytes_read"]
    assert 0 <= extra <= 2 * (2 + 1 + 1) * window, (extra, window)


def test_dataloader_baseline_trains_on_the_shards(small_set, tmp_path):
    p = run_cli(
        *merge_args(
            *STREAM,
            "--data_dir",
            small_set,
            "--results_dir",
            tmp_path,
            "--run_id",
            "dl",
            "--epochs",
            "1",
            "--pipeline",
            "dataloader",
            "--num_workers",
            "1",
        )
    )
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads((tmp_path / "dl" / "summary.json").read_text())
    assert s["io"]["source"] == "dataloader-per-sample" and s["io"]["bytes_read"] is None
    assert s["io"]["ranks"][0]["samples"] == 93 * 32


def test_bad_sets_and_parameters_are_refused_before_work(small_set, fashion_root, tmp_path):
    import shutil

    # not a built set
    p = run_cli(*STREAM, "--data_dir", tmp_path, "--results_dir", tmp_path / "r")
    assert p.returncode == 2 and "is not a built bigMNIST set" in p.stderr and "lab bigmnist build" in p.stderr
    # a truncated shard: caught by the cheap size check, naming the file
    d = tmp_path / "set"
    shutil.copytree(small_set, d)
    with open(d / "shard-00002.npy", "r+b") as f:
        f.truncate(5000)
    p = run_cli(*STREAM, "--data_dir", d, "--results_dir", tmp_path / "r")
    assert p.returncode == 2 and "shard-00002.npy has 5,000 bytes" in p.stderr and "verify" in p.stderr
    assert not (tmp_path / "r").exists()
    # a manifest of another shape, or one that names a file outside the set (it was read as a path, and a list
    # or a manifest without its shards was an AttributeError or KeyError traceback)
    from kernels.data import bigmnist

    good = json.loads((d / "manifest.json").read_text())
    outside = {**good, "shards": [{**good["shards"][0], "name": "../../secret"}, *good["shards"][1:]]}
    for bad, why in (
        ([1], "holds a JSON list, not a manifest"),
        ({"format": good["format"]}, "lacks spec, mean"),
        (outside, "names a file '../../secret' that is not a plain name in the set's folder"),
    ):
        (d / "manifest.json").write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match=re.escape(f"{d / 'manifest.json'} {why}")):
            bigmnist.check(d)
    (d / "manifest.json").write_text(json.dumps(good))
    # more ranks than shards
    with pytest.raises(ConfigError, match="7 ranks but the bigMNIST set .* has 6 shards"):
        from kernels.launch.config import resolve

        resolve({"workload": "cnn", "dataset": "bigmnist", "data_dir": str(small_set), "gpus": 7, "batch": 70})
    # the resident pipeline cannot hold a streamed set, and the stream needs shards
    p = run_cli(*STREAM, "--data_dir", small_set, "--pipeline", "device")
    assert p.returncode == 2 and "use pipeline=stream" in p.stderr
    p = run_cli("--workload", "cnn", "--dataset", "digits", "--pipeline", "stream")
    assert p.returncode == 2 and "stream reads a set of shards" in p.stderr
    # a disk without room for the requested build: refused up front with the size it needs
    p = build(tmp_path / "huge", fashion_root, "--replicas", "200000")
    assert p.returncode == 2 and re.search(r"--out: .* free but this build needs [\d.]+ GiB", p.stderr), p.stderr
    assert not list((tmp_path / "huge").glob("shard-*"))
    # a set built with other parameters is not silently mixed
    p = build(tmp_path / "set", fashion_root, "--seed", "4")
    assert p.returncode == 2 and "built with other parameters (seed 3 vs 4)" in p.stderr


@pytest.mark.system
def test_job_array_build_then_two_node_streamed_notebook_run(slurm, small_set, fashion_root, tmp_path):
    """The done-when of the I/O issue: built by a job array on Slurm, trained on by a 2-node sbatch run."""
    from test_slurm import sbatch

    env = {**os.environ, "SLURM_CONF": slurm["SLURM_CONF"], "LAB_RESULTS": str(tmp_path)}
    out = tmp_path / "array-set"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernels.cli",
            "bigmnist",
            "submit",
            "--out",
            str(out),
            "--data-dir",
            str(fashion_root),
            *SMALL,
            "--tasks",
            "3",
            "--cluster",
            "local",
            "--time",
            "00:10:00",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    job = re.search(r"submitted job array (\d+)", p.stdout).group(1)
    deadline = time.time() + 300
    while subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True).stdout.strip():
        assert time.time() < deadline, "the build array did not finish"
        time.sleep(0.5)
    logs = "".join(f.read_text() for f in (tmp_path / "sweeps").rglob("stdout.txt"))
    assert logs.count("bigmnist: task ") >= 3 and "manifest written" in logs, logs
    assert digests(out) == digests(small_set)  # 3 array tasks on 2 nodes = one task here, byte for byte

    res = tmp_path / "runs"
    job, rc, log = sbatch(
        slurm,
        tmp_path,
        ["--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=1"],
        [
            "notebooks/01_train.ipynb",
            "-p",
            "gpus",
            "2",
            "-p",
            "workload",
            "cnn",
            "-p",
            "dataset",
            "bigmnist",
            "-p",
            "data_dir",
            out,
            "-p",
            "batch",
            "64",
            "-p",
            "epochs",
            "1",
            "-p",
            "timing_warmup_steps",
            "2",
            "-p",
            "comm_probe_steps",
            "0",
            "-p",
            "log_every",
            "0",
            "-p",
            "results_dir",
            res,
        ],
    )
    assert rc == 0, log
    run = res / f"cnn-bigmnist-g2-j{job}"
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "complete" and s["io"]["source"] == "streamed-shards"
    assert len(s["io"]["ranks"]) == 2 and all(r["bytes_read"] for r in s["io"]["ranks"])
    assert 0.95 <= s["io"]["read_ratio_max_epoch"] <= 1.05
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["nodes"] == ["n1", "n2"] and cfg["params"]["pipeline"] == "stream"
