"""The benchmarks run and print their tables (tiny sizes here; `make bench` runs the real ones)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.system


def test_core_benchmark_prints_its_tables(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_core.py",
            "--batch",
            "32",
            "--steps",
            "2",
            "--repeats",
            "1",
            "--procs",
            "1",
            "--train_batch",
            "16",
            "--train_steps",
            "3",
            "--width",
            "4",
            "--warmup",
            "1",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    text = next(tmp_path.glob("*.md")).read_text()
    assert "| device-resident |" in text and "| DataLoader (4 workers) |" in text and re.search(r"\| 1 \| off \|", text)


def test_io_benchmark_prepares_its_input_and_compares_streamed_with_per_sample(fashion_root, tmp_path):
    """On a fresh clone (an empty data root) the benchmark fetches its source itself: Debian's Fashion-MNIST here
    (the fixture has checked the package is installed), as `make bench` runs it."""
    p = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_io.py",
            "--data",
            str(tmp_path / "data"),
            "--source-samples",
            "2000",
            "--shard-samples",
            "1000",
            "--batch",
            "64",
            "--repeats",
            "1",
            "--loader-steps",
            "5",
            "--workers",
            "1",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "copying Debian's Fashion-MNIST" in p.stdout and (tmp_path / "data" / "fashion-mnist").is_dir()
    text = next(tmp_path.glob("io-*.md")).read_text()
    for label in (
        "per-sample DataLoader (1 workers)",
        "streamed shards, warm",
        "streamed shards, cold",
        "streamed records, warm, no decoding",
        "streamed records, cold, no decoding",
        "fashion-mnist resident on the device",
    ):
        assert f"| {label} |" in text, label
    assert re.search(r"Streamed \(warm\) over per-sample DataLoader: \*\*[\d.]+x\*\*", text)
    for reads in ("page cache", "page cache, evicted", "O_DIRECT"):  # the disk's limit, every way, and its CPU cost
        assert re.search(rf"\| {reads} \| [\d,]+ \| [\d,]+ \| [\d.]+ \|", text), text
    assert "streamed shards, cold | " in text and "O_DIRECT |" in text.split("streamed shards, cold")[1].split("\n")[0]
    for cache in ("warm", "cold"):  # each kind of stream beside the sequential reads of its own rounds
        assert re.search(
            rf"\| {cache} \| [\d,]+ \| [\d,]+ \| \*\*\d+ %\*\* \(\d+-\d+\) \| [\d,]+ \| "
            rf"\*\*\d+ %\*\* \(\d+-\d+\) \|",
            text,
        ), text
    # the summary sets the stored figures beside the targets and names what this machine has not measured yet
    p = subprocess.run(
        [sys.executable, "benchmarks/bench_summary.py", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    summary = next(tmp_path.glob("summary-*.md")).read_text()
    cold = re.search(
        r"\| streamed records / sequential read, cold \| >= 80 % \| (\d+) % .*\| (met|\*\*missed\*\*) \|", summary
    )
    assert cold and (cold.group(1) == "80" or (cold.group(2) == "met") == (int(cold.group(1)) > 80)), summary
    assert (
        "Not measured on this machine yet: `python benchmarks/bench_notebook.py`, "
        "`python benchmarks/bench_seed.py`, `python benchmarks/bench_dcrnn.py`, `python benchmarks/bench_comm.py`."
        in summary
    )
    assert "All figures come from one commit" in summary


def test_dcrnn_benchmark_checks_both_models_agree_and_times_them(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_dcrnn.py",
            "--data_dir",
            str(tmp_path / "data"),
            "--time_steps",
            "600",
            "--units",
            "4",
            "--batch",
            "16",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    diff = float(re.search(r"forecasts differ by at most ([\d.e+-]+) mph", p.stdout).group(1))
    assert diff < 1e-3  # the same weights in both implementations give the same forecasts
    text = next(tmp_path.glob("dcrnn-*.md")).read_text()
    for label in ("public", "lab (auto: sparse supports)", "lab, dense supports"):
        assert f"| {label} |" in text, label
    record = json.loads(next(tmp_path.glob("dcrnn-*.json")).read_text())
    assert set(record["rows"]) == {"public", "lab", "lab, dense supports"} and record["rows"]["public"]["speedup"] == 1
    rows = ("public", "lab", "lab, dense supports")
    assert [record["rows"][r]["supports"] for r in rows] == [None, "sparse", "dense"]
    # the public pipeline holds every window twice over in float64; the lab the series once in float32
    assert record["rows"]["public"]["data_bytes"] > 10 * record["rows"]["lab"]["data_bytes"]


@pytest.mark.integration
def test_dcrnn_accuracy_trains_both_pipelines_from_the_same_weights(tmp_path):
    """Untrained, the two models forecast the same test windows with the same MAE (the weights are shared and
    both are scored by one metric code); after an epoch each in its own pipeline, the table sets them side by
    side per seed, the JSON holds the median gap the criterion reads, and the criterion judges it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import dcrnn_accuracy
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    tiny = ["--data_dir", str(tmp_path / "data"), "--time_steps", "300", "--units", "4", "--batch", "16"]
    assert dcrnn_accuracy.main([*tiny, "--epochs", "0", "--seeds", "0", "--out", str(tmp_path / "untrained")]) == 0
    rec = json.loads(next((tmp_path / "untrained").glob("dcrnn_accuracy-*.json")).read_text())
    assert abs(rec["worst_gap"]) < 1e-4 and all(v > 0 for v in rec["seeds"][0]["lab"].values()), rec["seeds"]
    p = subprocess.run(
        [sys.executable, "benchmarks/dcrnn_accuracy.py", *tiny, "--epochs", "1", "--seeds", "0", "1"]
        + ["--out", str(tmp_path / "bench")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(re.findall(r"seed \d: MAE lab [\d./]+, public [\d./]+ mph; gap 15min", p.stdout)) == 2, p.stdout
    text = next((tmp_path / "bench").glob("dcrnn_accuracy-*.md")).read_text()
    assert "| seed | public MAE | lab MAE | gap |" in text and "Median gap over seeds:" in text
    assert "Historical average on the same test windows" in text
    rec = json.loads(next((tmp_path / "bench").glob("dcrnn_accuracy-*.json")).read_text())
    gaps = [s["gap"]["60min"] for s in rec["seeds"]]
    assert rec["median_gap"]["60min"] == pytest.approx(sum(gaps) / 2)  # the median of two
    assert all(len(s["lab_losses"]) == len(s["public_losses"]) == 1 for s in rec["seeds"])


@pytest.mark.unit
def test_dcrnn_benchmark_sets_auto_beside_the_form_it_did_not_choose():
    """On a CPU supports=auto holds a road graph sparse, so the third row is dense; on a GPU auto holds it dense,
    so the third row is sparse: each device's table shows whether auto chose the faster form there."""
    import types

    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_dcrnn
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    rng = np.random.default_rng(0)
    adj = (rng.random((207, 207)) < 0.02).astype(np.float32)  # about METR-LA's density, 207 sensors
    np.fill_diagonal(adj, 1)
    road = types.SimpleNamespace(adj=adj)
    cpu, gpu = (bench_dcrnn.auto_form(road, torch.device(d)) for d in ("cpu", "cuda"))
    assert bench_dcrnn.variants(cpu) == ["public", "lab", "lab, dense supports"]
    assert bench_dcrnn.variants(gpu) == ["public", "lab", "lab, sparse supports"]


def test_seed_baseline_trains_and_the_ratio_prints(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_seed.py",
            "--batch",
            "32",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--workers",
            "1",
            "--width",
            "4",
            "--repeats",
            "1",
            "--ranks",
            "1",
            "2",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    for ranks in (1, 2):  # one process, and 2 ranks on this node (torchrun against the lab's own launcher)
        assert re.search(
            rf"{ranks} rank\(s\), repeat 1: seed-style [\d,.]+ samples/s, lab [\d,.]+ samples/s: "
            rf"[\d.]+x",
            p.stdout,
        ), p.stdout
    text = next(tmp_path.glob("seed-vs-lab-*.md")).read_text()
    ratios = re.search(
        r"Lab / seed-style: \*\*([\d.]+)x\*\* \(median of 1 paired ratios\); at 2 ranks "
        r"\*\*([\d.]+)x\*\*",
        text,
    )
    assert ratios and min(map(float, ratios.groups())) > 0 and "On a CPU this ratio measures the input pipeline" in text
    assert "pipeline device, channels_last false, compile false, DDP only with more than one rank" in text
    threads = os.environ.get("OMP_NUM_THREADS") or max(1, len(os.sched_getaffinity(0)) // 2)
    assert f"{threads} OMP threads at 2 ranks" in text  # a rank's cores, as Slurm's --cpus-per-task gives them


@pytest.mark.unit
def test_seed_baseline_is_the_usual_script():
    src = (ROOT / "benchmarks" / "seed_baseline.py").read_text()
    for part in (
        "Image.fromarray",
        "ImageOps.expand(img, border=4",
        "FLIP_LEFT_RIGHT",
        "pin_memory=cuda",
        "persistent_workers=args.workers > 0",
        "DistributedDataParallel(model, device_ids",
        "loss.item()",
    ):
        assert part in src, part
    body = src.split('"""', 2)[2]
    assert "torch.compile" not in body
    # channels_last only behind --channels_last, the one-line change such a script can make
    assert body.count("torch.channels_last") == 1 and "torch.channels_last if args.channels_last else" in body


def test_gpu_validation_harness_runs_its_plan_on_a_cpu(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu_validation.py",
            "--device",
            "cpu",
            "--tiny",
            "--repeats",
            "1",
            "--out",
            str(tmp_path / "bench"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    text = (tmp_path / "bench" / "gpu-validation-cpu-check.md").read_text()
    assert text.startswith("# GPU validation harness, CPU check (no GPU figures)")
    for row in (
        "| resnet18-fp32 | 1 |",
        "| resnet18-bf16 | 1 |",
        "| resnet18-fp32-nocompile (= resnet18-fp32 on a CPU) |",
        "| resnet18-fp32-nchw (= resnet18-fp32 on a CPU) |",
        "| resnet18-fp32-x2 | 2 |",
        "| cnn-x2 |",
        "| dcrnn-x2 |",
    ):
        assert row in text, row
    assert "failed" not in text
    assert re.search(r"\| median \| [\d,]+ \| - \| [\d,]+ \| \*\*[\d.]+x\*\*", text)  # seed-style vs lab
    assert "No channels_last column: on a CPU below width 16" in text  # oneDNN's fault: the seed-style cl run refused
    assert "| convolution |" in text and "host timeline" in text  # the profiled run
    assert "gloo, 2 ranks, fp32" in text and "| 65,536 |" in text  # the all_reduce sweep
    assert text.count("**pass**") == 2 and "DDP pair (2 gloo ranks" in text  # the GPU paths' checks
    assert "bf16 stopped at step 3 and resumed" in text
    assert "## Nsight Systems and Nsight Compute, read back" in text and "nsys (Nsight Systems) is not on PATH" in text
    # the proposal's pilot job: its record (no checkpoints) beside the tables, read as the documents read it
    from kernels.report.evidence import committed_pilots

    assert "whose request it prices (the same GPU model): none, no system" in text
    assert "## The proposal's pilot job" in text and "| `" + str(tmp_path / "pilot" / "runs" / "pilot-cpu") in text
    kept = sorted(f.name for f in (tmp_path / "pilot" / "runs" / "pilot-cpu").iterdir())
    assert "config.json" in kept and "summary.json" in kept and not any(k.endswith(".pt") for k in kept), kept
    pilots = committed_pilots(tmp_path / "pilot")
    assert list(pilots["run_id"]) == ["pilot-cpu"] and list(pilots["dataset"]) == ["synthetic"], pilots


def test_bench_gpu_refuses_without_a_gpu():
    p = subprocess.run(
        ["bash", "benchmarks/gpu_validation.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert p.returncode == 2 and "no NVIDIA GPU here" in p.stderr
    p = subprocess.run([sys.executable, "benchmarks/gpu_validation.py"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and "no GPU visible" in p.stderr and "--device cpu --tiny" in p.stderr


def test_gpu_validation_refuses_without_pytables_before_any_run(tmp_path):
    """A GPU image's own Python can lack PyTables; the DCRNN rows need it, so the validation says so and how to
    get it before its first run, rather than failing a row minutes in."""
    hide = (
        "import runpy, sys; sys.modules['tables'] = None; sys.argv = sys.argv[1:]; "
        "sys.path.insert(0, 'benchmarks'); runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            hide,
            "benchmarks/gpu_validation.py",
            "--device",
            "cpu",
            "--tiny",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stdout + p.stderr
    assert "PyTables" in p.stderr and "make setup" in p.stderr and "DCRNN" in p.stderr
    assert "+ " not in p.stdout and not list(tmp_path.iterdir())


def test_bench_notebook_prints_the_overhead_and_where_it_goes(tmp_path):
    """One pair: `lab train` and `lab run notebooks/01_train.ipynb` with the same run, the overhead and the
    notebook's phases from Papermill's cell timestamps."""
    p = subprocess.run(
        [sys.executable, "benchmarks/bench_notebook.py", "--repeats", "1", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    (table,) = tmp_path.glob("notebook-*.md")
    text = table.read_text()
    assert "| median |" in text and "overhead (s)" in text
    for phase in ("kernel start", "cell: launch: the ranks", "cell: plots", "kernel stop, filing, HTML"):
        assert phase in text, text


@pytest.mark.skipif(
    not (shutil.which("mpirun") and shutil.which("mpicc")),
    reason="needs Open MPI and its mpicc (apt-get install openmpi-bin libopenmpi-dev)",
)
def test_bench_comm_sets_the_lab_beside_the_c_loop(tmp_path):
    """One round at 8 B: the C reference around the lab's benchmark (C loop) and the lab with a Python loop, the
    ratios and the target in one table, and its JSON twin."""
    p = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_comm.py",
            "--sizes",
            "8",
            "--rounds",
            "1",
            "--iters",
            "2000",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    (table,) = tmp_path.glob("comm-mpi-*.md")
    text = table.read_text()
    assert "| 8 |" in text and "<= 1.50x" in text and "C loop (mpi_loop.c" in text, text
    rec = json.loads(table.with_suffix(".json").read_text())
    (row,) = rec["rows"]
    assert row["bytes"] == 8 and len(row["c_us"]) == 3 and min(row["c_us"]) > 0  # C, lab, C, Python loop, C
    assert len(row["lab_us"]) == len(row["python_loop_us"]) == 1 and row["python_loop_us"][0] > 0
    assert 1 <= row["fast_runs"]["c"] <= 3 and row["fast_runs"]["lab"] == 1 and row["lab_over_c"] > 0
    assert rec["timed_by"]["python"].startswith("python loop")


@pytest.mark.unit
def test_bench_comm_compares_the_runs_in_the_fast_placement():
    """The host moves the VM's cores between placements about 2x apart: the ratio sets each side's runs in the
    fast placement against the C runs there, and a side slower than that gap in every run keeps all its runs."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_comm
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    args = bench_comm.argparse.Namespace(ranks=2, rounds=2, sizes=[65536])
    c = [23.0, 45.0, 24.0, 46.0, 25.0]
    lines, rec = bench_comm.table(
        args,
        {(65536, "c"): c, (65536, "lab"): [26.0, 47.0], (65536, "python"): [110.0, 130.0]},
        {"lab": "C loop", "python": "python loop"},
    )
    (row,) = rec["rows"]
    assert row["lab_over_c"] == pytest.approx(26 / 24) and row["fast_runs"] == {"c": 3, "lab": 1, "python": 2}
    assert row["python_loop_over_c"] == pytest.approx(120 / 24) and "<= 1.05x: **missed**" in lines[-1]
