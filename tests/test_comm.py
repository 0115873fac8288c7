"""Collective microbenchmarks (real gloo ranks, real Open MPI under mpirun, the real local Slurm),
the alpha-beta fit and the data-parallel step model."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from kernels.base import sysinfo
from kernels.comm import bench, predict
from kernels.comm.collectives import OPS
from kernels.base.params import ConfigError

pytestmark = pytest.mark.unit

SMALL = ["--max_bytes", "4K", "--iters", "3", "--warmup", "1", "--repeats", "1"]


def comm(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernels.comm", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def only_record(root) -> bench.Path:
    dirs = [d for d in root.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


# ------------------------------------------------------------------ definitions
def test_bandwidths_follow_the_nccl_tests_definitions():
    mib, t = 1024 * 1024, 100e-6
    algbw = mib / t / 1e9
    assert bench.bandwidths(OPS["all_reduce"], mib, t, 4) == pytest.approx((algbw, algbw * 2 * 3 / 4))
    for op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        assert bench.bandwidths(OPS[op], mib, t, 8) == pytest.approx((algbw, algbw * 7 / 8))
    for op in ("broadcast", "reduce", "send_recv"):
        assert bench.bandwidths(OPS[op], mib, t, 8) == pytest.approx((algbw, algbw))
    # sizes of the split collectives are per-rank count x ranks, rounded down to whole elements per rank
    assert OPS["all_gather"].counts(1000, 3, 4) == (83, 83 * 3 * 4)
    assert OPS["all_reduce"].counts(1000, 3, 2) == (500, 1000)
    assert OPS["all_to_all"].counts(8, 4, 4) == (0, 0)  # too small for 4 ranks: skipped, not printed as 8 B


def test_sizes_and_parameters_are_checked_before_anything_runs():
    assert bench.resolve({"min_bytes": "8", "max_bytes": "64", "factor": 2}).sizes == [8, 16, 32, 64]
    assert bench.resolve({"min_bytes": "1K", "max_bytes": "1M", "factor": 32}).sizes == [1024, 32768, 1048576]
    for raw, words in (
        ({"ops": "allreduce"}, "unknown op 'allreduce'"),
        ({"backend": "infiniband"}, "parameter 'backend'"),
        ({"min_bytes": "1M", "max_bytes": "8K"}, "sizes out of order"),
        ({"max_bytes": "lots"}, "parameter 'max_bytes'"),
        ({"factor": 1}, "parameter 'factor'"),
        ({"dtypes": "fp64"}, "unknown dtype 'fp64'"),
        ({"backend": "mpi", "dtypes": "fp32,bf16"}, "MPI has no standard bf16"),
        ({"root": 2, "gpus": 2}, "parameter 'root'"),
        ({"bogus": 1}, "unknown parameter 'bogus'"),
    ):
        with pytest.raises(ConfigError, match=words):
            bench.resolve(raw)


def test_the_mpich_abi_link_is_made_once_and_never_over_a_foreign_file(tmp_path, monkeypatch):
    """Debian's MPICH lacks the libmpi.so.12 name mpi4py's MPICH module needs: the lab links it in its own cache,
    atomically, and refuses a file there that is not its link (a planted library would run in every rank)."""
    from kernels.base.errors import ConfigError
    from kernels.comm import mpi_library

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = mpi_library.abi_folder()
    link = folder / "libmpi.so.12"
    assert os.readlink(link) == str(mpi_library.DEBIAN_MPICH) and folder.stat().st_mode & 0o077 == 0
    assert mpi_library.abi_folder() == folder and [p.name for p in folder.iterdir()] == ["libmpi.so.12"]
    link.unlink()
    link.write_bytes(b"\x7fELF planted")
    with pytest.raises(ConfigError, match="is not the lab's link"):
        mpi_library.abi_folder()
    assert mpi_library.rank_env("auto") == {}  # auto: the environment as the cluster's modules set it
    # a cache others may write to is not trusted: a library put beside the link would load in every rank
    link.unlink()
    folder.chmod(0o777)
    with pytest.raises(ConfigError, match=r"mpich-abi is writable by others \(mode 777\); remove it"):
        mpi_library.abi_folder()


def test_the_c_loop_is_not_loaded_from_a_cache_others_can_write(tmp_path, monkeypatch):
    """The comm bench's C loop (kernels/comm/native.py) is a shared library in the user's cache: from a folder
    others may write to, or a file that is not the user's, the bench times in Python instead and says why."""
    from kernels.comm import native

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("LAB_MPICC", "/nonexistent/mpicc")  # never run: the check comes before any build
    monkeypatch.delenv("LAB_MPI_LOOP", raising=False)
    native.cache_dir().mkdir(mode=0o700)
    native.cache_dir().chmod(0o777)
    lib, how = native.load("Open MPI v4.1.4")
    assert lib is None and "scaling-lab is writable by others (mode 777)" in how and how.startswith("python loop")
    native.cache_dir().chmod(0o700)
    import hashlib

    key = hashlib.sha256(native.SOURCE.read_bytes() + b"Open MPI v4.1.4" + b"/nonexistent/mpicc").hexdigest()[:16]
    planted = native.cache_dir() / f"mpi_loop-{key}.so"  # where the built loop goes, a link planted there
    planted.symlink_to(tmp_path / "elsewhere.so")
    lib, how = native.load("Open MPI v4.1.4")
    assert lib is None and f"{planted} is a symbolic link" in how, how


@pytest.mark.integration
def test_a_library_that_the_mpirun_on_path_is_not_is_refused_with_its_packages(tmp_path, monkeypatch):
    """Only Open MPI's mpirun on PATH (no mpirun.mpich): mpi_library=mpich names the packages that bring it."""
    from kernels.base.errors import ConfigError
    from kernels.comm import mpi_library

    openmpi = shutil.which("mpirun.openmpi")
    if not openmpi:
        pytest.skip("needs Debian's mpirun.openmpi (apt-get install openmpi-bin)")
    (tmp_path / "mpirun").symlink_to(openmpi)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert mpi_library.mpirun_path("auto") == mpi_library.mpirun_path("openmpi") == "mpirun"
    with pytest.raises(ConfigError, match=r"mpirun is openmpi's\); install it \(Debian: apt-get install mpich lib"):
        mpi_library.mpirun_path("mpich")


@pytest.mark.parametrize(
    "args,words",
    [
        (["--backend", "nccl"], "nccl needs GPUs"),
        (["--ops", "all_reduce,alltoall"], "did you mean"),
        (["--launcher", "srun"], "srun needs a Slurm allocation"),
        (["--backend", "gloo", "--launcher", "mpirun"], "mpirun starts MPI ranks"),
        (["--backend", "mpi", "--launcher", "local"], "MPI ranks start with launcher=mpirun"),
        (["--backend", "mpi", "--loop-env", "fast"], "LAB_MPI_LOOP='fast': use auto"),
        (["--backend", "gloo", "--mpi_library", "mpich"], "'mpi_library': mpich serves backend=mpi only"),
    ],
)
def test_bad_input_exits_2_and_leaves_no_record(tmp_path, capsys, monkeypatch, args, words):
    """In-process, so each case costs no interpreter start; the words come before any MPI library is loaded,
    so they are the same where none is installed."""
    import torch

    from kernels.comm.__main__ import main

    if args == ["--backend", "nccl"] and torch.cuda.is_available():  # pragma: no cover - a GPU machine
        pytest.skip("a GPU is visible")
    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(k)
    monkeypatch.delenv("LAB_MPI_LOOP", raising=False)
    if "--loop-env" in args:
        monkeypatch.setenv("LAB_MPI_LOOP", args[-1])
        args = args[:-2]
    rc = main(["bench", *args, "--results_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and words in err, (args, err)
    assert not any(tmp_path.iterdir())


@pytest.mark.integration
def test_an_mpi_library_that_does_not_load_is_one_line_that_leads_with_the_fix(tmp_path):
    """mpi4py pointed at a library that is not there (as on a machine with pip's mpi4py and no MPI): one line,
    the fix first, mpi4py's own words after it, and no record."""
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernels.comm",
            "bench",
            "--backend",
            "mpi",
            "--gpus",
            "2",
            "--results_dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MPI4PY_LIBMPI": str(tmp_path / "libmpi.so")},
    )
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stdout + p.stderr
    assert p.stderr.startswith("error: parameter 'backend': mpi needs an MPI library that loads: install one")
    assert "mpi4py is installed and said: cannot load MPI library" in p.stderr and not any(tmp_path.iterdir())


@pytest.mark.integration
def test_the_process_exits_2_on_bad_input(tmp_path):
    """The cases above in-process; this one is the real `python -m kernels.comm` and its exit status."""
    p = subprocess.run(
        [sys.executable, "-m", "kernels.comm", "bench", "--ops", "all_reduce,alltoall", "--results_dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "did you mean" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------ real runs
@pytest.mark.integration
def test_gloo_commbench_two_ranks_all_collectives_and_dtypes(tmp_path):
    p = comm("bench", "--backend", "gloo", "--gpus", 2, "--dtypes", "fp32,bf16,fp16", *SMALL, "--results_dir", tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    run = only_record(tmp_path)
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "complete" and s["wrong"] == 0 and s["unsupported"] == {}
    assert s["ranks"] == 2 and s["placement"] == "intra-node"
    rows = bench.read_record(run)["rows"]
    sizes = bench.resolve({"max_bytes": "4K"}).sizes
    for dt in ("fp32", "bf16", "fp16"):
        for op in OPS:
            sel = [r for r in rows if r["op"] == op and r["dtype"] == dt]
            assert len(sel) == sum(1 for s_ in sizes if OPS[op].counts(s_, 2, bench.DTYPES[dt][1])[0]), (op, dt)
            for r in sel:
                for f in ("out", "in"):
                    if r[f"time_us_{f}"] is not None:
                        assert r[f"wrong_{f}"] == 0
                        assert r[f"time_us_min_{f}"] <= r[f"time_us_{f}"] <= r[f"time_us_max_{f}"]
                        assert r[f"busbw_{f}"] == pytest.approx(r[f"algbw_{f}"] * OPS[op].factor(2), rel=1e-3)
    text = (run / "commbench.txt").read_text()
    assert "#       size         count      type   redop    root     time   algbw   busbw #wrong" in text
    assert "#        (B)    (elements)" in text and text.count("# Avg bus bandwidth") == 3 * len(OPS)
    assert "# Out of bounds values : 0 OK" in text
    osu = (run / "osu.txt").read_text()
    assert "# OSU-style Allreduce Latency Test" in osu and "# OSU-style Gather Latency Test" in osu
    # the rooted collectives were checked element by element: at the root for gather, on every rank for scatter
    assert {r["op"] for r in rows if r["root"] == 0} == {"broadcast", "reduce", "gather", "scatter"}
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["versions"]["torch"] and len(cfg["rank_list"]) == 2 and cfg["params"]["backend"] == "gloo"
    # this real record damaged two ways: `lab comm fit` fitted nothing from it without a word; now each is named
    results = (run / "results.csv").read_text()
    for name, cut in (("results.csv", results[:50]), ("summary.json", (run / "summary.json").read_text()[:50])):
        damaged = tmp_path / "damaged" / run.name
        shutil.copytree(run, damaged, dirs_exist_ok=True)
        (damaged / name).write_text(cut)  # the header cut mid-line leaves no row; the JSON, no object
        p = comm("fit", "--comm", damaged.parent)
        assert p.returncode == 2 and p.stderr.startswith(f"warning: comm/{run.name} left out: {damaged / name}"), (
            p.stderr
        )
        assert "(1 unreadable, named above)" in p.stderr.splitlines()[-1], p.stderr


@pytest.mark.system
@pytest.mark.skipif(not shutil.which("mpirun"), reason="needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)")
@pytest.mark.parametrize("loop,library", [("auto", "auto"), ("python", "auto"), ("auto", "mpich")])
def test_mpi_commbench_under_mpirun(tmp_path, loop, library):
    """Every collective in both forms, checked element by element through the loop that is timed: the C loop, built
    from scratch into an empty cache on first use (mpicc comes with libopenmpi-dev), or mpi4py in a Python loop;
    and with MPICH beside Open MPI (Debian's mpirun.mpich), its own C loop and mpi4py's MPICH module."""
    if library == "mpich" and not shutil.which("mpirun.mpich"):
        why = "needs MPICH beside Open MPI (apt-get install mpich libmpich-dev; .ci/run installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the test {why}")
        pytest.skip(why)
    records = tmp_path / "records"
    p = comm(
        "bench",
        "--backend",
        "mpi",
        "--mpi_library",
        library,
        "--gpus",
        2,
        *SMALL,
        "--results_dir",
        records,
        env={"LAB_MPI_LOOP": loop, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"launcher: mpirun{'.mpich' if library == 'mpich' else ''} -np 2" in p.stdout
    # neither the driver nor a rank imports torch (seconds per process on a small CPU); the ranks' import
    # timings reach us through mpirun, so the check sees them all
    imported = {
        ln.rsplit("|", 1)[1].strip() for ln in (p.stdout + p.stderr).splitlines() if ln.startswith("import time:")
    }
    assert "mpi4py.MPI" in imported and "torch" not in imported
    run = only_record(records)
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "complete" and s["wrong"] == 0 and s["backend"] == "mpi"
    want = "C loop" if loop == "auto" and shutil.which("mpicc") else "python loop"
    assert s["timed_by"].startswith(want) and f"timed by: {want}" in p.stdout, s["timed_by"]
    assert (loop == "auto") == bool(list((tmp_path / "cache").rglob("mpi_loop-*.so"))) or not shutil.which("mpicc")
    cfg = json.loads((run / "config.json").read_text())
    lib = cfg["versions"]["mpi_library"]
    assert ("Open MPI" in lib or "MPICH" in lib) and "\x00" not in lib
    if library == "mpich":
        assert lib.startswith("MPICH") and "mpicc.mpich" in s["timed_by"], (lib, s["timed_by"])
    assert cfg["versions"]["torch"] and {r["device"] for r in cfg["rank_list"]} == {sysinfo.cpu_device_name()}
    rows = bench.read_record(run)["rows"]
    # MPI has the in-place forms torch.distributed lacks: all_reduce both ways, checked
    ar = [r for r in rows if r["op"] == "all_reduce"]
    assert ar and all(r["wrong_out"] == 0 and r["wrong_in"] == 0 for r in ar)


@pytest.mark.integration
def test_a_failing_rank_leaves_a_failed_record_not_a_running_one(tmp_path):
    """A rank killed mid-benchmark: the launcher ends the other and marks the record failed."""
    import time

    import psutil

    log = open(tmp_path / "log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernels.comm",
            "bench",
            "--backend",
            "gloo",
            "--gpus",
            "2",
            "--max_bytes",
            "64M",
            "--iters",
            "50",
            "--results_dir",
            str(tmp_path / "c"),
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while not list((tmp_path / "c").glob("*/summary.json")):
        assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "log").read_text()
        time.sleep(0.2)
    psutil.Process(proc.pid).children()[1].kill()
    assert proc.wait(timeout=60) != 0
    s = json.loads(next((tmp_path / "c").glob("*/summary.json")).read_text())
    # rank 0 records what it saw (its peer gone), or the launcher does (a rank killed): never 'running'
    assert s["status"] == "failed" and s["error"] and s["finished_utc"], s


@pytest.mark.system
@pytest.mark.parametrize("ranks", [4])  # 2 ranks on two nodes: test_predictor_validation_on_the_local_slurm
def test_commbench_notebook_on_two_slurm_nodes(slurm, tmp_path, ranks):
    from test_slurm import sbatch

    job, rc, log = sbatch(
        slurm,
        tmp_path,
        ["--nodes=2", f"--ntasks-per-node={ranks // 2}", "--gpus-per-node=0"],
        [
            "notebooks/03_commbench.ipynb",
            "-p",
            "backend",
            "gloo",
            "-p",
            "gpus",
            ranks,
            "-p",
            "ops",
            "all_reduce,all_gather,reduce_scatter,send_recv",
            "-p",
            "max_bytes",
            "64K",
            "-p",
            "iters",
            "3",
            "-p",
            "warmup",
            "1",
        ],
    )
    assert rc == 0, log
    run = only_record(tmp_path / "comm")
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "complete" and s["wrong"] == 0 and s["nodes"] == 2 and s["placement"] == "inter-node"
    assert f"-j{job}" in run.name and "launcher: srun" in log
    assert "# Avg bus bandwidth" in log and "# Out of bounds values : 0 OK" in log
    assert list(run.glob("03_commbench-*.html")), "the executed notebook is filed with the record"


# ------------------------------------------------------------------ the model
def test_alpha_beta_fit_recovers_known_parameters_from_noisy_timings():
    rng = np.random.default_rng(3)
    alpha, bw = 25e-6, 3.2e9
    pts = []
    for n in (2, 4, 8):
        for k in range(3, 27, 2):
            s = 2**k
            t = OPS["all_reduce"].steps(n) * alpha + OPS["all_reduce"].factor(n) * s / bw
            pts.append((n, s, t * (1 + rng.normal(0, 0.03))))
    f = predict.fit_points("all_reduce", pts)
    assert f["alpha_s"] == pytest.approx(alpha, rel=0.08)
    assert f["busbw_Bps"] == pytest.approx(bw, rel=0.05)
    assert f["rms_rel_err"] < 0.06


def test_a_fit_that_cannot_resolve_a_quantity_says_so_and_is_never_used():
    """Two noisy sizes (the reduce_scatter case that once printed 1e21 GB/s), a latency-bound series and a poor
    fit are 'unresolved' with their reason and no number for what they could not resolve; fits() hands only
    resolved fits to the predictor and the proposal, and lists the others only when asked (the tables)."""
    alpha, bw = 25e-6, 3.2e9
    good = [
        (2, 2**k, OPS["all_reduce"].steps(2) * alpha + OPS["all_reduce"].factor(2) * 2**k / bw) for k in range(3, 21, 3)
    ]
    assert predict.fit_points("all_reduce", good)["status"] == "resolved"
    two = predict.fit_points("reduce_scatter", [(2, 1024, 2.0e-4), (2, 1 << 20, 1.9e-4)])  # noisy: no growth
    assert two["status"].startswith("unresolved") and two["busbw_Bps"] is None and "fewer than 3" in two["status"]
    flat = predict.fit_points("all_reduce", [(2, 2**k, 1e-4 * (1 + 0.01 * (k % 2))) for k in range(3, 21, 3)])
    assert flat["busbw_Bps"] is None and "no bandwidth term" in flat["status"] and flat["alpha_s"] > 0
    rng = np.random.default_rng(1)  # timings unrelated to the model: log-normal spread around it
    wild = predict.fit_points("all_reduce", [(n, s, t * rng.lognormal(0, 3)) for n, s, t in good])
    assert wild["status"].startswith("unresolved") and "rms error" in wild["status"] and wild["busbw_Bps"] is None
    two_pts = [(2, 1024, 2.0e-4), (2, 1 << 20, 1.9e-4)]
    rows = [
        {
            "backend": "gloo",
            "op": op,
            "dtype": "fp32",
            "placement": "intra-node",
            "ranks": n,
            "size_bytes": s,
            "time_us_out": t * 1e6,
        }
        for op, pts in (("all_reduce", good), ("reduce_scatter", two_pts))
        for n, s, t in pts
    ]
    rec = {"config": {"params": {"label": "x"}, "hosts": ["h"]}, "rows": rows}
    used = predict.fits([rec], by="label")
    listed = predict.fits([rec], by="label", unresolved=True)
    assert [k[1] for k in used] == ["all_reduce"] and sorted(k[1] for k in listed) == ["all_reduce", "reduce_scatter"]
    table = {r["op"]: r for r in predict.fit_table(listed)}
    assert table["reduce_scatter"]["busbw_GBps"] is None and table["reduce_scatter"]["status"].startswith("unres")
    assert table["all_reduce"]["busbw_GBps"] == pytest.approx(3.2, rel=1e-6)


def test_a_point_the_fits_cannot_predict_keeps_its_row_with_the_reason(tmp_path):
    """Weak scaling at 1, 2 and 8 ranks (8 on two nodes) with a resolved intra-node fit and an inter-node one that
    found no bandwidth term: the 8-rank point stays in the validation, measured only, its algorithm column and
    the paper's sentence say why, and the largest error is taken over the predicted points alone (the 4-rank
    point of the local validation once vanished from the table this way)."""
    import pandas as pd

    from kernels.analysis.runs import load_runs
    from kernels.records import schema as records
    from kernels.report import comm as section
    from test_paper import write_record

    for n in (1, 2, 8):
        write_record(tmp_path, f"w{n}", gpus=n, batch=64 * n, x=640.0 * n * (0.9 if n > 1 else 1.0))
        summary = tmp_path / f"w{n}" / "summary.json"
        records.write_json(summary, {**records.read_json(summary), "grad_param_bytes": [1 << 20] * 4})
    runs, problems, _ = load_runs(tmp_path)
    assert problems.empty and sorted(runs["nodes"]) == [1, 1, 2]
    alpha, bw = 20e-6, 10e9
    intra = [(2, 1 << k, 2 * alpha + (1 << k) / bw) for k in range(16, 25, 2)]
    flat = [(8, 1 << k, 5e-4) for k in range(16, 25, 2)]  # the time does not grow: once fitted at 1e18 GB/s
    rows = [
        {"backend": "nccl", "op": "all_reduce", "dtype": "fp32", "placement": pl, "ranks": n, "size_bytes": b,
         "time_us_out": t * 1e6}
        for pl, pts in (("intra-node", intra), ("inter-node", flat))
        for n, b, t in pts
    ]  # fmt: skip
    recs = [{"config": {"params": {"label": "x", "backend": "nccl"}, "hosts": ["h0"]}, "rows": rows}]
    v = predict.validation(runs, recs)
    assert list(v["gpus"]) == [1, 2, 8], v
    two, eight = v.iloc[1], v.iloc[2]
    assert two["error"] == pytest.approx(two["predicted_step_ms"] / two["measured_step_ms"] - 1)
    assert pd.isna(eight["predicted_step_ms"]) and pd.isna(eight["error"]) and eight["measured_step_ms"] > 0
    assert eight["algorithm"].startswith("no prediction: no inter-node all_reduce fit (unresolved: no bandwidth")
    fits = pd.DataFrame(predict.fit_table(predict.fits(recs, unresolved=True)))
    text = section.text(recs, fits, v, pd.DataFrame())
    assert r"No prediction at 8 ranks on 2 nodes (no inter-node all\_reduce fit (unresolved: no bandwidth" in text
    assert f"the largest error is {100 * two['error']:+.1f}" in text and "1 of 1 multi-rank point" in text


def test_predict_takes_mode_threads_and_backend_from_the_records(tmp_path):
    """`lab comm predict` starts from what the 1-rank run used (its threads per rank and backend) and from the runs
    it is compared with: multi-rank runs of its label that keep the global batch make it strong scaling, ones
    whose batch grows with the ranks weak; with none beside it, strong (the global batch kept), and it says so."""
    from kernels.records import schema as records

    def record(name, gpus, batch, label="L", threads=2):
        d = tmp_path / "runs" / name
        records.write_json(
            d / "config.json",
            {
                "params": {"gpus": gpus, "batch": batch, "label": label, "bucket_cap_mb": 25.0},
                "derived": {"backend": "gloo"},
                "ranks": [{"threads": threads}] * gpus,
                "hosts": ["h"],
            },
        )
        records.write_json(
            d / "summary.json",
            {
                "status": "complete",
                "world_size": gpus,
                "grad_param_bytes": [4096],
                "step_ms_p50": 100.0,
                "step_ms_p90": 110.0,
                "device_name": "CPU",
            },
        )
        return d

    with pytest.raises(ConfigError, match=r"no run record there \(no summary.json\); pass a run directory"):
        predict.run_inputs(tmp_path / "runs" / "one")  # said "not a complete run record (status None)"
    one = record("one", 1, 64)
    run = predict.run_inputs(one)
    assert (run["threads"], run["backend"], run["label"]) == (2, "gloo", "L")
    mode, why = predict.scaling_mode(one, run)
    assert mode == "strong" and "no multi-rank run" in why
    record("other-label", 2, 128, label="M")  # another series: not a comparison
    (tmp_path / "runs" / "damaged").mkdir()
    (tmp_path / "runs" / "damaged" / "config.json").write_text('{"params": {"gpus": 2, "lab')  # cut mid-write
    assert "no multi-rank run" in predict.scaling_mode(one, run)[1]
    record("two", 2, 128)
    mode, why = predict.scaling_mode(one, run)
    assert mode == "weak" and "two (2 ranks, global batch 128 against 64" in why
    (tmp_path / "runs" / "two" / "config.json").unlink()
    record("two", 2, 64)
    assert predict.scaling_mode(one, run)[0] == "strong"


def test_predict_without_a_fit_for_a_placement_says_which_record_is_missing():
    """`lab comm predict --run R --gpus 1,2,4` with commbench records from one node only: 4 ranks at 2 per node
    span two nodes, and the error names the missing inter-node fit and the command that measures it (it died
    with `ValueError: no inter-node all_reduce fit` deep in the step model)."""
    from kernels.base.errors import ConfigError

    run = {
        "device": "CPU",
        "param_bytes": [4096],
        "bucket_cap_mb": 25.0,
        "t1_s": 0.1,
        "p90_s": 0.11,
        "data_s": 0.0,
        "batch": 64,
    }
    fit = {"alpha_s": 1e-5, "busbw_Bps": 1e9}
    intra_only = {("gloo", "all_reduce", "fp32", "intra-node", "h"): fit}
    with pytest.raises(ConfigError) as e:
        predict.predict(run, [1, 2, 4], 2, intra_only, "gloo", "strong", 2, system="h")
    msg = str(e.value)
    assert "--gpus 4" in msg and "no inter-node all_reduce fit" in msg and "sbatch --nodes=2" in msg
    assert "\n" not in msg and "--gpus_per_node 4" in msg
    assert len(predict.predict(run, [1, 2, 4], 4, intra_only, "gloo", "strong", 2, system="h")) == 3
    inter_only = {("gloo", "all_reduce", "fp32", "inter-node", "h"): fit}
    with pytest.raises(ConfigError, match="no intra-node all_reduce fit.*lab comm bench --backend gloo"):
        predict.predict(run, [2], 2, inter_only, "gloo", "strong", 2, system="h")
    assert len(predict.predict(run, [1, 2, 4], 1, inter_only, "gloo", "strong", 2, system="h")) == 3


def test_buckets_follow_ddp_first_bucket_then_cap():
    mib = 1024 * 1024
    params = [4 * mib] * 10 + [mib // 4] * 4  # backward meets the small ones first
    assert predict.buckets(params, 25.0) == [mib, 28 * mib, 12 * mib]
    assert sum(predict.buckets(params, 1.0)) == sum(params)


def test_step_model_overlap_and_core_sharing():
    fit = {"alpha_s": 0.0, "busbw_Bps": 1e9}
    mib = 1024 * 1024
    one = predict.predict_step(0.3, [mib] * 4, 1, 1, fit, None)
    assert one["step_s"] == pytest.approx(0.3) and one["exposed_comm_s"] == 0
    # 4 MiB at 2 ranks: 4 x 1 MiB x (2-1)/2*2 / 1 GB/s = 4.19 ms of reduction, hidden but for the last bucket
    two = predict.predict_step(0.3, [mib] * 4, 2, 1, fit, None)
    assert two["comm_s"] == pytest.approx(4 * mib / 1e9)
    assert two["exposed_comm_s"] == pytest.approx(mib / 1e9)
    serial = predict.predict_step(0.3, [mib] * 4, 2, 1, fit, None, overlap=False)
    assert serial["exposed_comm_s"] == pytest.approx(two["comm_s"])
    assert predict.cpu_share(4, 1, 2, on_gpu=False) == 2 and predict.cpu_share(8, 1, 2, on_gpu=True) == 1
    strong = predict.predict_step(0.3, [mib], 4, 2, fit, fit, mode="strong")
    assert strong["compute_s"] == pytest.approx(0.3 / 4) and strong["algorithm"] in ("ring (flat)", "hierarchical")


def test_all_reduce_algorithm_is_the_cheaper_under_the_fits():
    """Across nodes the model takes the cheaper of a flat ring and the hierarchical form. With one fit for both
    it is hierarchical (same bytes per rank, 4 latency steps instead of 6 at 4 ranks on 2 nodes); a slow network
    makes it more so; an intra-node fit slower than the network makes the flat ring win."""
    mib = 1024 * 1024
    net = {"alpha_s": 1e-4, "busbw_Bps": 1e9}
    t, algo = predict.allreduce_time(mib, 4, 2, net, net)
    assert algo == "hierarchical" and t == pytest.approx(4 * 1e-4 + 1.5 * mib / 1e9)
    assert predict.allreduce_time(mib, 4, 2, {"alpha_s": 1e-6, "busbw_Bps": 1e11}, net)[1] == "hierarchical"
    t, algo = predict.allreduce_time(mib, 4, 2, {"alpha_s": 1e-3, "busbw_Bps": 1e8}, net)
    assert algo == "ring (flat)" and t == pytest.approx(6 * 1e-4 + 1.5 * mib / 1e9)
    assert predict.allreduce_time(mib, 4, 1, net, None) == (
        pytest.approx(6 * 1e-4 + 1.5 * mib / 1e9),
        "ring (intra-node)",
    )
    assert predict.allreduce_time(mib, 1, 1, None, None) == (0.0, "none")


def test_topology_algorithms_ring_tree_and_hierarchical():
    """The three all_reduce algorithms under one fit (alpha 100 us, 1 GB/s). A tree has 2 ceil(log2 n) latency
    steps and moves 2 S, a ring 2(n-1) steps and 2(n-1)/n S: at 8 ranks in a node a small message goes faster by
    the tree, a large one by the ring; at 2 ranks the ring is never slower. Across 4 nodes of 2 ranks the tree
    is a chain in each node then a tree over the nodes. NCCL chooses among all three; gloo runs a ring (or the
    two-level form); forcing one algorithm gives its cost; one that does not apply is refused."""
    fit = {"alpha_s": 1e-4, "busbw_Bps": 1e9}
    small, large = 1024, 64 * 1024 * 1024
    c = predict.allreduce_costs(small, 8, 1, fit, None)
    assert c["tree"] == pytest.approx(6e-4 + 2 * small / 1e9) and c["ring"] == pytest.approx(14e-4 + 1.75 * small / 1e9)
    assert predict.allreduce_time(small, 8, 1, fit, None, predict.CHOICES["nccl"])[1] == "tree (intra-node)"
    assert predict.allreduce_time(large, 8, 1, fit, None, predict.CHOICES["nccl"])[1] == "ring (intra-node)"
    assert predict.allreduce_time(small, 8, 1, fit, None)[1] == "ring (intra-node)"  # gloo: no tree
    two = predict.allreduce_costs(small, 2, 1, fit, None)
    assert two["ring"] <= two["tree"]
    across = predict.allreduce_costs(large, 8, 4, fit, fit)
    assert set(across) == {"ring", "tree", "hierarchical"}
    assert across["tree"] == pytest.approx((2e-4 + 2 * large / 1e9) + (4e-4 + 2 * large / 1e9))
    assert across["hierarchical"] == pytest.approx((2e-4 + large / 1e9) + (6e-4 + 1.5 * large / 2 / 1e9))
    assert predict.allreduce_time(large, 8, 4, fit, fit, ("tree",)) == (pytest.approx(across["tree"]), "tree")
    assert set(predict.allreduce_costs(large, 4, 4, None, fit)) == {"ring", "tree"}  # one rank per node
    with pytest.raises(ValueError, match="none of hierarchical applies"):
        predict.allreduce_time(large, 4, 1, fit, None, ("hierarchical",))


# ------------------------------------------------------------------ validation on the local Slurm
@pytest.mark.system
def test_predictor_validation_on_the_local_slurm(slurm, tmp_path, monkeypatch):
    """The two studies of the validation, shrunk (fewer sizes and steps, one repeat), through `lab study` on the
    local two-node Slurm: commbench all_reduce at 2 ranks on one node, 2 on two nodes and 4 on two nodes; weak
    scaling of a narrow ResNet-18 at 1, 2 and 4 gloo ranks; then the predicted-against-measured table. Its
    errors must be computed for every multi-rank point and stay inside a generous bound (the measured ones, on
    the full studies, are in the paper's communication section)."""
    import pandas as pd
    import yaml

    from kernels.analysis.runs import load_runs
    from test_study import cli, wait_for

    env = {**os.environ, "SLURM_CONF": slurm["SLURM_CONF"], "LAB_RESULTS": str(tmp_path)}
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path))
    specs = []
    for name in ("commbench_local", "predictor_local"):
        spec = yaml.safe_load((ROOT / "studies" / f"{name}.yaml").read_text())
        if name == "commbench_local":
            # 256K to 16M: on a 2-core machine shared with the other test worker, 4 ranks wait on the scheduler
            # for milliseconds a call; below a few MB that wait, not the bytes, sets the time, and the inter-node
            # fit once found no bandwidth term at 64K-4M (rms error 125 %: no 4-rank prediction). At 4M and 16M
            # the bytes take longer than the wait.
            spec["fixed"].update(min_bytes="256K", max_bytes="16M", iters=10)
        else:
            spec["repeats"] = 1
            spec["fixed"].update(
                width=8, train_samples=512, test_samples=64, timing_warmup_steps=2, batch_per_gpu=16, comm_probe_steps=0
            )
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        specs.append(path)
    # one study after the other: the predictor starts from the 1-rank point's step time and its
    # spread, which commbench jobs sharing the machine's two cores would inflate
    for path in specs:
        p = cli("kernels.slurm.study", "submit", path, env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        wait_for(__import__("re").findall(r"submitted job array (\d+)", p.stdout), env, timeout=900)
    recs = predict.load_comm_records(tmp_path / "comm")
    assert sorted((r["summary"]["ranks"], r["summary"]["nodes"]) for r in recs) == [(2, 1), (2, 2), (4, 2)]
    for r in recs:
        assert r["summary"]["wrong"] == 0
        assert "#       size         count" in (bench.Path(r["dir"]) / "commbench.txt").read_text()
    runs, problems, _ = load_runs(tmp_path / "runs")
    assert problems.empty and sorted(runs["gpus"]) == [1, 2, 4], problems
    table = predict.validation(runs, recs)
    print(pd.DataFrame(predict.fit_table(predict.fits(recs, unresolved=True))).to_string())
    print(table.to_string())
    assert list(table["gpus"]) == [1, 2, 4] and set(table["system"]) == {"lab"}
    multi = table[table["gpus"] > 1]
    assert multi["error"].notna().all()
    ratio = multi["predicted_step_ms"] / multi["measured_step_ms"]
    assert np.allclose(multi["error"], ratio - 1)
    # what the model knows of the geometry: the emulated nodes are one 2-core host, so 4 ranks share it 2 to a core;
    # a ring inside one node; across the two emulated nodes (loopback both ways) the measured fits are close, so
    # which of the flat ring and the hierarchical form is cheaper is the fits' noise (the choice itself is
    # test_all_reduce_algorithm_is_the_cheaper_under_the_fits)
    assert list(table["cpu_share"]) == [1.0, 1.0, 2.0], table
    assert list(table["algorithm"][:2]) == ["none", "ring (intra-node)"], table
    assert table["algorithm"].iloc[2] in ("ring (flat)", "hierarchical"), table
    # the topology comparison: each algorithm forced, the closest to the measured step named
    four = table.iloc[2]
    assert all(four[f"{a}_ms"] > 0 for a in predict.ALGORITHMS) and four["closest"] in predict.ALGORITHMS, table
    assert pd.isna(table.iloc[0]["closest"]) and pd.isna(table.iloc[0]["ring_ms"])  # one rank: nothing to reduce
    # only gross errors here (a unit slip, a lost term): on a shared 2-core VM one disturbed point can be off by 4x
    # (seen: a 2-rank step 7x the 1-rank one while the host stole CPU). The accuracy is the full studies' result,
    # results/bench/predictor-local-slurm.md
    assert ratio.between(0.1, 10).all(), table
    p = comm("validate", "--runs", tmp_path / "runs", "--comm", tmp_path / "comm", env=env)
    assert p.returncode == 0 and "lab/gloo" in p.stdout and "%" in p.stdout, p.stdout + p.stderr

    # the same records feed the paper's communication section: its tables, sentence and the predictor figure
    from kernels import report

    plan = yaml.safe_load((ROOT / "paper" / "plan.yaml").read_text())
    systems = yaml.safe_load((ROOT / "paper" / "systems.yaml").read_text())
    res = report.build(
        tmp_path / "runs", tmp_path / "report", plan, systems, select={"labels": ["predictor_local", "commbench_local"]}
    )
    assert len(res["predictor"]) == 3 and len(res["comm_compare"]) == 3
    tables = tmp_path / "report" / "tables"
    assert "Gap" not in (tables / "predictor_table.tex").read_text()
    comm_text = (tables / "comm_text.tex").read_text()
    assert "all-reduce fits are gloo inter-node on lab" in comm_text
    # the topology comparison: at the 2-node point, each algorithm's prediction beside the measured step
    assert re.search(
        r"at 4 ranks on 2 nodes the measured [\d.,]+\\,ms is closest to the (ring|tree|hierarchical) "
        r"prediction \(ring [\d.,]+, tree [\d.,]+, hierarchical [\d.,]+\\,ms\)",
        comm_text,
    ), comm_text
    assert (tmp_path / "report" / "figures" / "predictor.pdf").exists()
    assert "includegraphics" in (tables / "fig_predictor.tex").read_text()


def test_straggler_factor_and_published_fits():
    # lognormal through p50=100, p90=130: the median of the slowest of 2 is the 0.707 quantile
    f2 = predict.straggler_factor(100.0, 130.0, 2)
    assert f2 == pytest.approx(np.exp(np.log(1.3) / 1.2815516 * 0.5448), rel=1e-3)
    assert 1 < f2 < predict.straggler_factor(100.0, 130.0, 8) < 1.3**2
    assert predict.straggler_factor(100.0, 130.0, 1) == 1.0 and predict.straggler_factor(100.0, None, 4) == 1.0
    pub = predict.published_fits({"intranode_GBps": 450, "internode_GBps": 100, "internode_latency_us": 6})
    assert pub["intra-node"]["busbw_Bps"] == 450e9 and pub["inter-node"]["alpha_s"] == pytest.approx(6e-6)
    assert pub["intra-node"]["alpha_s"] == 0.0 and pub["inter-node"]["source"] == "published"
    assert predict.published_fits({}) == {}


def test_node_hours_prefer_a_prediction_to_the_assumed_efficiency():
    from kernels.analysis.runs import node_hours

    import pandas as pd

    plan = {
        "points": pd.DataFrame({"gpus": [1, 2, 4, 8], "epochs": [1, 1, 1, 1]}),
        "gpus_per_node": 4,
        "assumed_efficiency": 0.5,
        "profiling_overhead": 0.0,
    }
    table, _ = node_hours(plan, {1: 3600.0}, {4: (1200.0, "predicted (fitted)")})
    src = dict(zip(table["gpus"], table["source"]))
    assert src == {1: "measured", 2: "from N=1 at E=0.5", 4: "predicted (fitted)", 8: "from N=1 at E=0.5"}
    assert dict(zip(table["gpus"], table["epoch_s"]))[4] == 1200.0
