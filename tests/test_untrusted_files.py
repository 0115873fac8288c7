"""Files in shared folders are read as data: none of them runs code, and no write follows a planted link.

Each case builds the attack from the real format (a pickle laid out as adj_mx.pkl, a pandas HDF5 file as
metr-la.h5, the CIFAR-10 python folder, the lab's own checkpoint) and plants, where the original holds data,
an object whose unpickling would call os.mkdir. The case passes when the lab refuses the file with a one-line
message naming it and what it asked for, and the directory was never made.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels.records import checkpoint_file as ckpt
from kernels.base import safe_pickle
from kernels.data import cifar10, traffic
from kernels.base.errors import ConfigError
from kernels.base.files import PROJECT_ROOT

from conftest import record_fault, write_cifar_tarball

pytestmark = [pytest.mark.unit, pytest.mark.faults]


class Planted:
    """Unpickled, it makes the directory `marker`: the proof that a file ran code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def refused(call, *match: str) -> str:
    """Run `call`, which must raise ConfigError whose one-line message holds each of `match`; the message."""
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg and all(m in msg for m in match), msg
    refused.took = time.monotonic() - t0
    return msg


def test_a_pickle_naming_a_function_is_refused_before_the_call(tmp_path):
    marker = tmp_path / "ran"
    data = pickle.dumps([Planted(marker), {"a": 1}, np.eye(2, dtype=np.float32)], protocol=2)
    with pytest.raises(safe_pickle.RefusedPickle, match="posix.mkdir"):
        safe_pickle.loads(data)
    assert not marker.exists()
    # what the formats hold is still read: lists, dicts, bytes, numpy arrays, numpy scalars, sets
    ok = [
        ["773869", b"767541"],
        {"x": (1, 2.5, None)},
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.float64(1.5),
        {1, 2},
        b"\x00\xff",
    ]
    for proto in (2, 4, 5):
        back = safe_pickle.loads(pickle.dumps(ok, protocol=proto))
        assert back[0] == ok[0] and back[1] == ok[1] and np.array_equal(back[2], ok[2]) and back[3:] == ok[3:]


def _real_graph(tmp_path):
    """A small synthetic set in the originals' two formats: speeds.h5 (pandas) and adj_mx.pkl (pickle, protocol 2)."""
    d = traffic.write_synthetic(tmp_path / "set", 288, 6, progress=lambda m: None)
    return d / "speeds.h5", d / "adj_mx.pkl"


def test_adj_mx_with_a_planted_call_is_refused(tmp_path):
    _, pkl = _real_graph(tmp_path)
    ids, to_ind, adj = traffic.read_adjacency(pkl)
    marker = tmp_path / "ran"
    ids[0] = Planted(marker)  # the first sensor id replaced by a call, the rest as published
    with open(pkl, "wb") as f:
        pickle.dump([ids, to_ind, adj], f, protocol=2)
    refused(lambda: traffic.read_adjacency(pkl), str(pkl), "refused", "posix.mkdir", "fetch the original")
    record_fault("adj_mx.pkl with a call planted in its sensor ids", 5, refused.took, 2, "refused, nothing ran")
    assert not marker.exists()


def test_speeds_h5_with_an_object_column_or_a_pickled_attribute_is_refused(tmp_path):
    import pandas as pd
    import tables

    h5, _ = _real_graph(tmp_path)
    marker = tmp_path / "ran"
    df = pd.read_hdf(h5, "df")
    bad = df.astype(object)
    bad.iloc[0, 0] = Planted(marker)  # an object column: PyTables pickles each row, and unpickles it on read
    bad.to_hdf(tmp_path / "objects.h5", key="df")
    refused(lambda: traffic.read_speeds(tmp_path / "objects.h5", "df"), "objects.h5", "object-typed array")
    record_fault("speeds.h5 with an object-typed column", 5, refused.took, 2, "refused, nothing ran")
    assert not marker.exists()

    with tables.open_file(h5, "a") as f:  # an attribute PyTables pickles (as pandas does the index's freq)
        f.get_node("/df/axis1")._v_attrs.freq = Planted(marker)
    assert not marker.exists()
    refused(lambda: traffic.read_speeds(h5, "df"), "speeds.h5", "refused", "posix.mkdir")
    record_fault("speeds.h5 with a call pickled into an HDF5 attribute", 5, refused.took, 2, "refused, nothing ran")
    assert not marker.exists()


def test_a_genuine_speeds_file_still_reads_with_its_frequency(tmp_path):
    h5, pkl = _real_graph(tmp_path)
    values, index, ids = traffic.read_speeds(h5, "df")
    assert values.shape == (288, 6) and str(index.freq) == "<5 * Minutes>" and len(ids) == 6
    assert len(traffic.read_adjacency(pkl)[0]) == 6


def test_cifar_checksum_file_in_the_folder_vouches_for_nothing(tmp_path):
    """A fake batch with a planted call, and an MD5SUMS beside it that vouches for it: the official md5s refuse
    it before it is opened, and the unpickler would refuse it even unchecked."""
    import hashlib
    import tarfile

    src, _ = write_cifar_tarball(tmp_path / "src", per_batch=4)
    with tarfile.open(src) as tf:
        tf.extractall(tmp_path / "data" / "cifar10", filter="data")
    d = cifar10.batch_dir(tmp_path / "data")
    marker = tmp_path / "ran"
    (d / "data_batch_1").write_bytes(pickle.dumps({b"data": Planted(marker), b"labels": [1]}, protocol=2))
    sums = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in d.iterdir() if p.is_file()}
    (d / "MD5SUMS").write_text("".join(f"{v}  {k}\n" for k, v in sums.items()))
    refused(
        lambda: cifar10.read(tmp_path / "data"),
        "data_batch_1",
        "checksum mismatch",
        cifar10.OFFICIAL_MD5["data_batch_1"],
    )
    record_fault(
        "CIFAR-10 batch with a planted call, vouched for by an MD5SUMS in its folder",
        5,
        refused.took,
        2,
        "refused (official md5s only), nothing ran",
    )
    refused(lambda: cifar10.read(tmp_path / "data", check=False), "data_batch_1", "refused", "posix.mkdir")
    assert not marker.exists()


# ------------------------------------------------------------------ checkpoints
def _state(step: int = 1) -> dict:
    return {"global_step": step, "model": {"w": torch.arange(4.0)}, "config": {"params": {"lr": 0.1}}}


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_a_checkpoint_is_checked_before_it_is_unpickled_and_read_as_data(tmp_path):
    marker = tmp_path / "ran"
    run = tmp_path / "run"
    run.mkdir()
    ckpt.write(run, ckpt.serialise([ckpt.rng_state()], **_state(1)))
    state, _, notes = ckpt.load(run)
    assert state["global_step"] == 1 and not notes and isinstance(state["rng"][0]["numpy"][1], np.ndarray)
    good = (run / ckpt.FILENAME).read_bytes()
    assert good.startswith(ckpt.MAGIC)

    # a planted call with a correct checksum line (anyone can compute a sha256): refused as not data
    body = _torch_bytes({**_state(2), "rng": [Planted(marker)]})
    import hashlib

    (run / ckpt.FILENAME).write_bytes(ckpt.MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        ckpt.load(run)
    record_fault(
        "checkpoint.pt with a planted call and a correct checksum", 5, time.monotonic() - t0, 2, "refused, nothing ran"
    )
    assert "holds something other than data" in str(e.value) and "mkdir" in str(e.value), e.value
    assert not marker.exists()

    # one byte changed: found by the checksum, before torch.load sees the file
    damaged = bytearray(good)
    damaged[-100] ^= 1
    (run / ckpt.FILENAME).write_bytes(bytes(damaged))
    assert "checksum mismatch" in ckpt.read_state(run / ckpt.FILENAME)[1]


def test_a_checkpoint_without_a_checksum_needs_resume_unverified(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ckpt.FILENAME).write_bytes(_torch_bytes({**_state(3), "rng": []}))  # torch.save, no checksum
    with pytest.raises(ConfigError, match="carries no checksum.*resume_unverified=true"):
        ckpt.load(run)
    assert ckpt.load(run, allow_unverified=True)[0]["global_step"] == 3
    marker = tmp_path / "ran"
    (run / ckpt.FILENAME).write_bytes(_torch_bytes({**_state(3), "rng": [Planted(marker)]}))
    with pytest.raises(ConfigError, match="holds something other than data"):
        ckpt.load(run, allow_unverified=True)  # the flag vouches for the bytes, never for code
    assert not marker.exists()


def test_a_link_planted_at_the_next_checkpoint_is_replaced_not_written_through(tmp_path):
    run, victim = tmp_path / "run", tmp_path / "someone-elses-file"
    run.mkdir()
    victim.write_bytes(b"precious")
    ckpt.write(run, ckpt.serialise([ckpt.rng_state()], **_state(1)))
    (run / ckpt.NEXT).symlink_to(victim)  # planted in a stopped run's folder
    t0 = time.monotonic()
    ckpt.write(run, ckpt.serialise([ckpt.rng_state()], **_state(2)))
    record_fault(
        "a link planted at checkpoint.next.pt",
        5,
        time.monotonic() - t0,
        0,
        "link removed, the file it pointed to untouched",
    )
    assert victim.read_bytes() == b"precious"
    assert not any(p.is_symlink() for p in run.iterdir())
    assert ckpt.load(run)[0]["global_step"] == 2
    # a link where the checkpoint should be is passed over, never read
    (run / ckpt.FILENAME).unlink()
    (run / ckpt.FILENAME).symlink_to(victim)
    state, used, notes = ckpt.load(run)
    assert used.name == ckpt.PREVIOUS and "is a symbolic link" in notes[0], notes


# ------------------------------------------------------------------ run directories
TINY_RUN = [
    "--dataset",
    "digits",
    "--width",
    "4",
    "--batch",
    "32",
    "--epochs",
    "1",
    "--train_samples",
    "64",
    "--test_samples",
    "32",
    "--log_every",
    "0",
    "--precision",
    "fp32",
]


def test_a_run_directory_that_is_a_link_or_another_users_is_refused(tmp_path, capsys, monkeypatch):
    from conftest import cli_in_process

    runs, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    runs.mkdir()
    elsewhere.mkdir()
    (runs / "r").symlink_to(elsewhere)  # planted where a run will write
    t0 = time.monotonic()
    rc, _, err = cli_in_process(capsys, monkeypatch, *TINY_RUN, "--results_dir", runs, "--run_id", "r")
    record_fault("run directory planted as a link", 20, time.monotonic() - t0, rc, "refused, nothing written")
    assert rc == 2 and "parameter 'run_id'" in err and "is a symbolic link" in err, err
    assert len(err.strip().splitlines()) == 1 and not list(elsewhere.iterdir())

    if os.getuid() == 0:  # another user's directory: root can make one to test with
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        rc, _, err = cli_in_process(capsys, monkeypatch, *TINY_RUN, "--results_dir", theirs, "--run_id", "r")
        assert rc == 2 and "parameter 'results_dir'" in err and "belongs to another user" in err, err
        assert not list(theirs.iterdir())
    # the user's own link to a results folder elsewhere (scratch) is fine
    from kernels.base.files import foreign

    (tmp_path / "mine").symlink_to(elsewhere)
    assert foreign(tmp_path / "mine", own_link_ok=True) is None and foreign(tmp_path / "mine") is not None


def _grown(path):
    from kernels.base.files import create

    with create(path) as f:
        f.write("t,cpu\n")


def _bench_table(path: Path) -> None:
    """A benchmark's table and the record beside it (benchmarks/benchtable.py), named as `path` and its .json."""
    sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
    try:
        import benchtable
    finally:
        sys.path.remove(str(PROJECT_ROOT / "benchmarks"))
    assert benchtable.write(["| a |"], path.parent, "x", prefix="bench-", echo=False, record={"a": 1}) == path
    benchtable.headline(path.parent, "bench", "x", path, {"a": 1})


def _mnist_like(n: int):
    return np.zeros((n, 28, 28), np.uint8), np.arange(n, dtype=np.uint8)


def test_files_written_whole_or_as_they_grow_never_follow_a_planted_link(tmp_path):
    """Each writer, with a link planted at its file's name and at the temporary names it uses or used to use (any
    name that can be guessed): the file the links point to is untouched, and the writer's file is a plain file."""
    from kernels.analysis.tex import write_if_changed
    from kernels.base.files import atomic_write_text, copy_file
    from kernels.data.bigmnist import write_records

    victim = tmp_path / "victim"
    victim.write_text("precious")
    pid, ids, ones, eye = os.getpid(), ["a", "b"], np.ones((3, 2), np.float32), np.eye(2, dtype=np.float32)
    writers = (
        (["monitor.csv"], _grown),
        (["commbench.txt"], lambda p: atomic_write_text(p, "table\n")),
        (["bench-x.md", "bench-x.json", f"headlines-{_cpu_slug()}.json"], _bench_table),
        (["table.tex", ".table.tex.tmp"], lambda p: write_if_changed(p, "x\n")),  # the analysis' outputs
        (["adj.csv", ".adj.csv.part"], lambda p: copy_file(victim.with_name("source"), p)),  # lab fetch --from
        (["speeds.h5", f"speeds.h5.tmp{pid}"], lambda p: traffic.write_speeds(p, "df", ones, "2012-03-01", ids)),
        (["shard.npy", f".shard.npy.tmp-{pid}"], lambda p: write_records(p, *_mnist_like(2))),
        (["graph.pkl", ".graph.pkl.tmp", f"graph.pkl.tmp{pid}"], lambda p: traffic.write_adjacency(p, ids, eye)),
    )
    victim.with_name("source").write_text("from the source")
    t0 = time.monotonic()
    for names, write in writers:
        paths = [tmp_path / name for name in names]
        for path in paths:
            path.symlink_to(victim)
        write(paths[0])
        assert victim.read_text() == "precious", names
        assert paths[0].is_file() and not paths[0].is_symlink() and paths[0].stat().st_size, names
    record_fault(
        f"links planted at {len(writers)} writers' files and their guessable temporary names (data, analysis, "
        "benchmarks)",
        5,
        time.monotonic() - t0,
        0,
        "links replaced, the files they pointed to untouched",
    )


def _cpu_slug() -> str:
    from kernels.base import sysinfo

    return re.sub(r"[^A-Za-z0-9]+", "-", sysinfo.cpu_device_name()).strip("-").lower()


# ------------------------------------------------------------------ the rendezvous
def test_a_squatted_rendezvous_port_is_one_line_naming_it(tmp_path):
    import socket

    from kernels.base.dist import RankEnv, rendezvous_store
    from kernels.base.ports import PORT_BASE, PORT_SPAN, free_port

    with socket.socket() as squatter:  # another user's process on the port rank 0 must serve
        squatter.bind(("", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(ConfigError) as e:
            rendezvous_store(RankEnv(0, 2, 0, "127.0.0.1", port, "torchrun"), 0.1)
        record_fault(
            "the rendezvous port is taken by another process", 10, time.monotonic() - t0, 2, "refused, naming the port"
        )
    msg = str(e.value)
    assert "\n" not in msg and f"MASTER_PORT={port}" in msg and "taken by another process" in msg, msg
    # the launchers' ports: drawn at random from the system's source, not derived from anything others see
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 15 and all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)


# ------------------------------------------------------------------ sweeps
@pytest.mark.parametrize(
    "change,needle",
    [
        ({"grid": {"n": [1, "2\nrm -rf ~"]}}, "key 'grid.n'"),  # data that would become a command
        ({"name": "../../x"}, "key 'name'"),  # a folder outside results/sweeps
        ({"env": {"A": "1,LD_PRELOAD=/tmp/evil.so"}}, "key 'env.A'"),  # another --export entry
        ({"command": "echo {n}\nrm -rf ~"}, "key 'command'"),
    ],
    ids=["newline-in-a-grid-value", "name-with-dot-dot", "comma-in-an-env-value", "newline-in-the-command"],
)
def test_sweep_values_that_would_inject_are_refused(tmp_path, change, needle):
    import yaml

    from kernels.slurm import sweep

    spec = {"name": "s", "command": "echo {n}", "grid": {"n": [1, 2]}, **change}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    msg = refused(lambda: sweep.load(path), str(path), needle)
    assert not (tmp_path / "x").exists(), msg


# ------------------------------------------------------------------ one line, not a traceback
def test_unreadable_inputs_are_one_line_errors(tmp_path, capsys, monkeypatch):
    from conftest import ROOT, cli_in_process
    from kernels.notebook import papermill_args
    from kernels.slurm import study, sweep

    binary, listed = tmp_path / "binary.yaml", tmp_path / "list.yaml"
    binary.write_bytes(bytes(range(256)))
    listed.write_text("- batch\n- 64\n")
    truncated = tmp_path / "cut.ipynb"
    truncated.write_text((ROOT / "notebooks" / "01_train.ipynb").read_text()[:500])
    refused(lambda: papermill_args.defaults(binary), "binary.yaml", "not a Jupyter notebook")
    refused(lambda: papermill_args.defaults(truncated), "cut.ipynb", "not a Jupyter notebook")
    refused(lambda: papermill_args.injected(["-f", str(listed)]), "-f", "list.yaml", "not a mapping")
    refused(
        lambda: papermill_args.injected(["-p", "batch", "64", "-p", "batch", "1e3"]),
        "parameter 'batch' is given twice",
        "-p batch 1e3",
    )
    refused(lambda: study.load(binary), "study file", "binary.yaml", "not a text file")
    refused(lambda: sweep.load(binary), "sweep file", "binary.yaml", "not a text file")
    rc, _, err = cli_in_process(capsys, monkeypatch, *TINY_RUN, "--seed", "-1", "--results_dir", tmp_path / "r")
    assert rc == 2 and err.strip() == "error: parameter 'seed': must be in 0 .. 2**32 - 1 (numpy's seeds), got -1"
    assert not (tmp_path / "r").exists()


@pytest.mark.integration  # chattr is a process
def test_an_immutable_run_directory_is_one_line_and_the_record_keeps_its_status(tmp_path, capsys, monkeypatch):
    import json
    import shutil
    import subprocess

    from conftest import cli_in_process

    run = tmp_path / "runs" / "r"
    args = [
        *TINY_RUN[: TINY_RUN.index("--epochs")],
        *TINY_RUN[TINY_RUN.index("--epochs") + 2 :],
        "--epochs",
        "2",
        "--results_dir",
        tmp_path / "runs",
        "--run_id",
        "r",
    ]
    rc, _, err = cli_in_process(capsys, monkeypatch, *args, "--stop_after_steps", "1")
    assert rc == 0 and json.loads((run / "summary.json").read_text())["status"] == "stopped", err
    chattr = shutil.which("chattr")
    if not chattr or subprocess.run([chattr, "+i", str(run)], capture_output=True).returncode != 0:
        pytest.skip("needs chattr +i (root, on a file system with immutable files)")
    try:
        rc, _, err = cli_in_process(capsys, monkeypatch, *args)
    finally:
        subprocess.run([chattr, "-i", str(run)], check=True)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "cannot write in" in err and "immutable" in err and "free space" not in err, err
    assert json.loads((run / "summary.json").read_text())["status"] == "stopped"


# ------------------------------------------------------------------ memory
def test_a_model_that_cannot_fit_is_refused_before_it_is_built(tmp_path, capsys, monkeypatch):
    """--width 4096 grew to 23.5 GB resident before the kernel killed it; now the estimate (on the meta device)
    refuses it in one line, naming the figures, before the model exists."""
    import resource

    from conftest import cli_in_process
    from kernels.launch.config import resolve
    from kernels.run import memory
    from kernels.train import parse_args
    from kernels.workloads import get_workload

    t0 = time.monotonic()
    wide = [a if a != "4" else "4096" for a in TINY_RUN]  # --width 4 -> --width 4096
    rc, _, err = cli_in_process(capsys, monkeypatch, *wide, "--results_dir", tmp_path / "r")
    record_fault(
        "--width 4096 (a model that cannot fit in memory)",
        30,
        time.monotonic() - t0,
        rc,
        "refused before the model is built",
    )
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "parameter 'width'" in err and "GiB of memory per rank" in err and "available" in err, err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 * 2**20  # KiB: never near the model's size
    assert not (tmp_path / "r").exists()
    # the weights part is exact: 4 x the parameters' bytes (weights, gradients, two moments)
    cfg = resolve(parse_args(["--workload", "cnn", "--dataset", "digits", "--batch", "64", "--precision", "fp32"]))
    wl = get_workload("cnn")
    src, _, info = wl.make_data(cfg, 0, 1, torch.device("cpu"))
    est = memory.estimate(wl, cfg, info, *src.probe(2))
    model, _ = wl.build_model(cfg, info)
    assert est["params"] == sum(p.numel() * 4 for p in model.parameters()) and 0 < est["activations"] < 2**30
    assert memory.check(est, torch.device("cpu"), 2, cfg) is None
