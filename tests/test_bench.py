"""The benchmarks run and print their tables (tiny sizes here; `make bench` runs the real ones)."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


def test_core_benchmark_prints_its_tables(tmp_path):
    p = subprocess.run([sys.executable, "benchmarks/bench_core.py", "--batch", "32", "--steps", "2", "--repeats", "1",
                        "--procs", "1", "--train_batch", "16", "--train_steps", "3", "--width", "4", "--warmup", "1",
                        "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    text = next(tmp_path.glob("*.md")).read_text()
    assert "| device-resident |" in text and "| DataLoader (2 workers) |" in text and re.search(r"\| 1 \| off \|", text)


def test_io_benchmark_compares_streamed_with_per_sample(fashion_root, tmp_path):
    p = subprocess.run([sys.executable, "benchmarks/bench_io.py", "--data", str(fashion_root), "--source-samples",
                        "2000", "--shard-samples", "1000", "--batch", "64", "--repeats", "1", "--loader-steps", "5",
                        "--workers", "1", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    text = next(tmp_path.glob("io-*.md")).read_text()
    for label in ("per-sample DataLoader (1 workers)", "streamed shards, warm", "streamed shards, cold",
                  "fashion-mnist resident on the device"):
        assert f"| {label} |" in text, label
    assert re.search(r"Streamed \(warm\) over per-sample DataLoader: \*\*[\d.]+x\*\*", text)


def test_dcrnn_benchmark_checks_both_models_agree_and_times_them(tmp_path):
    p = subprocess.run([sys.executable, "benchmarks/bench_dcrnn.py", "--data_dir", str(tmp_path / "data"),
                        "--time_steps", "600", "--units", "4", "--batch", "16", "--steps", "2", "--warmup", "1",
                        "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    diff = float(re.search(r"forecasts differ by at most ([\d.e+-]+) mph", p.stdout).group(1))
    assert diff < 1e-3  # the same weights in both implementations give the same forecasts
    text = next(tmp_path.glob("dcrnn-*.md")).read_text()
    for label in ("public", "lab", "lab, dense supports"):
        assert f"| {label} |" in text, label
    record = json.loads(next(tmp_path.glob("dcrnn-*.json")).read_text())
    assert set(record["rows"]) == {"public", "lab", "lab, dense supports"} and record["rows"]["public"]["speedup"] == 1
    # the public pipeline holds every window twice over in float64; the lab the series once in float32
    assert record["rows"]["public"]["data_bytes"] > 10 * record["rows"]["lab"]["data_bytes"]
