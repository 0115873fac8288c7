"""From records to documents: formulas, odd data, and `make paper` with real LaTeX."""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from kernels import records, report
from kernels.params import resolve

from conftest import ROOT

SYSTEMS = yaml.safe_load((ROOT / "paper" / "systems.yaml").read_text())
PLAN = yaml.safe_load((ROOT / "paper" / "plan.yaml").read_text())


def write_record(runs: Path, run_id: str, *, gpus: int, batch: int, x: float, acc: float = 0.9,
                 status: str = "complete", torch_version: str = "2.13.0", device: str = "NVIDIA H100 80GB HBM3",
                 steps_per_epoch: int = 100, **params):
    """A run record in the real schema (as kernels/ddp_core.py writes it), with chosen numbers."""
    cfg = resolve({"gpus": gpus, "batch": batch, "dataset": "synthetic", "label": "t", "precision": "fp32", **params})
    d = runs / run_id
    cols = records.metric_columns(("acc",))
    records.write_json(d / "config.json", {
        "schema_version": records.SCHEMA_VERSION, "run_id": run_id, "params": cfg.to_dict(),
        "derived": {"world_size": gpus, "per_rank_batch": batch // gpus, "steps_per_epoch": steps_per_epoch,
                    "nodes": max(1, gpus // 4), "backend": "nccl", "model_variant": "resnet18-cifar-stem-width64"},
        "git": {"commit": "abc1234def", "dirty": False},
        "versions": {"torch": torch_version, "cuda": "12.8", "nccl": "2.27.3", "python": "3.11.7"},
        "hosts": ["h"], "nodes": ["h"], "devices": [device], "ranks": [], "slurm": {}, "lab": {}})
    rows = [{c: None for c in cols} | {"epoch": e, "eval_acc": acc * (e + 1) / 2, "samples_per_s": x}
            for e in range(2)]
    records.write_metrics(d / "metrics.csv", rows, cols)
    records.write_json(d / "summary.json", {
        "run_id": run_id, "status": status, "error": None if status == "complete" else "RuntimeError: boom",
        "device_name": device, "samples_per_s": x, "samples_per_s_per_device": x / gpus,
        "step_ms": 1e3 * batch / x, "epoch_s_median": steps_per_epoch * batch / x, "data_wait_frac": 0.05,
        "final_eval_acc": acc, "mfu": 0.4, "exposed_comm_ms": 1.5 if gpus > 1 else None, "peak_mem_gib": 3.0,
        "train_flops_per_sample": 3.33e9, "started_utc": "2026-01-01T00:00:00+00:00"})


@pytest.fixture
def study(tmp_path):
    """Strong series (B=512) at 1, 2 (three repeats), 4, 8 ranks; weak series (b=64/rank); an AMP pair; a failed run."""
    runs = tmp_path / "runs"
    strong = {1: [1000.0], 2: [1800.0, 1900.0, 2000.0], 4: [3200.0], 8: [5600.0]}
    for n, xs in strong.items():
        for i, x in enumerate(xs):
            write_record(runs, f"s{n}_{i}", gpus=n, batch=512, x=x, acc=0.93 - 0.003 * n)
    for n, x in {1: 980.0, 2: 1900.0, 4: 3600.0}.items():  # weak: 64 per rank, B = 64, 128, 256
        write_record(runs, f"w{n}", gpus=n, batch=64 * n, x=x, acc=0.92)
    write_record(runs, "amp", gpus=1, batch=512, x=1710.0, precision="bf16", acc=0.93)
    write_record(runs, "failed", gpus=8, batch=512, x=1.0, status="failed")
    return runs


def test_efficiencies_and_speedups_equal_the_formulas(study, tmp_path):
    out = tmp_path / "out"
    res = report.build(study, out, PLAN, SYSTEMS)
    scal = res["scaling"]
    # independent computation: medians over repeats, then E_s = T1/(N*TN) with T = time per epoch
    strong = {1: 1000.0, 2: 1900.0, 4: 3200.0, 8: 5600.0}
    spe = 100  # steps per epoch, global batch 512
    t1 = spe * 512 / strong[1]
    for n, x in strong.items():
        tn = spe * 512 / x
        row = scal[(scal["mode"] == "strong") & (scal["gpus"] == n) & (scal["batch"] == 512)
                   & (scal["series"].str.contains("fp32"))].iloc[0]
        assert math.isclose(row["efficiency"], t1 / (n * tn), rel_tol=1e-12)
        assert math.isclose(row["speedup"], t1 / tn, rel_tol=1e-12)
        assert row["repeats"] == (3 if n == 2 else 1)
    # weak: E_w = T1/TN with T the time per step of the same per-rank work
    weak = {1: (64, 980.0), 2: (128, 1900.0), 4: (256, 3600.0)}
    t1w = weak[1][0] / weak[1][1]
    for n, (b, x) in weak.items():
        row = scal[(scal["mode"] == "weak") & (scal["gpus"] == n)].iloc[0]
        assert math.isclose(row["efficiency"], t1w / (b / x), rel_tol=1e-12)
    # the generated table prints those numbers
    table = (out / "tables" / "scaling_table.tex").read_text()
    assert f"{1.0 * 5600 / 8 / 1000:.2f}" in table and f"{5600 / 1000:.2f}" in table
    macros = (out / "tables" / "numbers.tex").read_text()
    assert r"\newcommand{\labEffMax}{%.0f}" % (100 * 5600 / 8 / 1000) in macros
    assert r"\newcommand{\labSpeedupMax}{%.2f}" % (5600 / 1000) in macros
    assert r"\newcommand{\ampSpeedup}{%.2f}" % (1710 / 1000) in macros
    assert r"\newcommand{\labAccGapMax}{%.1f}" % (100 * 0.003 * 7) in macros  # acc(8) - acc(1)
    # the failed run is left out and named, not averaged in
    assert res["problems"]["run_id"].tolist() == ["failed"]
    assert "failed" in (out / "tables" / "data_notes.tex").read_text()


def test_node_hours_equal_the_computation(study, tmp_path):
    res = report.build(study, tmp_path / "out", PLAN, SYSTEMS)
    gpn = SYSTEMS[PLAN["system"]]["gpus_per_node"]
    epoch = {1: 100 * 512 / 1000.0, 2: 100 * 512 / 1900.0, 4: 100 * 512 / 3200.0, 8: 100 * 512 / 5600.0}
    total = 0.0
    for n in PLAN["gpus"]:
        if n in epoch:
            t = epoch[n]
        else:
            n0 = max(m for m in epoch if m < n)
            t = epoch[n0] * n0 / (n * PLAN["assumed_efficiency"])
        total += math.ceil(n / gpn) * PLAN["epochs"] * t / 3600 * PLAN["runs_per_point"] * PLAN["repeats"]
    total *= 1 + PLAN["profiling_overhead"]
    assert math.isclose(res["node_hours_total"], total, rel_tol=1e-12)
    assert r"\newcommand{\labNodeHours}{%s}" % report.fmt_num(total, 4) in \
        (tmp_path / "out" / "tables" / "numbers.tex").read_text()


def test_mixed_versions_are_flagged(tmp_path):
    runs = tmp_path / "runs"
    write_record(runs, "a", gpus=1, batch=64, x=100.0, torch_version="2.13.0")
    write_record(runs, "b", gpus=2, batch=64, x=180.0, torch_version="2.12.1")
    res = report.build(runs, tmp_path / "out", PLAN, SYSTEMS)
    assert res["versions"] == {"torch": ["2.12.1", "2.13.0"]}
    notes = (tmp_path / "out" / "tables" / "data_notes.tex").read_text()
    assert "not directly comparable" in notes and "2.12.1" in notes


def test_no_records_at_all_gives_marked_gaps_not_tracebacks(tmp_path):
    res = report.build(tmp_path / "nothing", tmp_path / "out", PLAN, SYSTEMS)
    assert res["runs"].empty and res["node_hours_total"] is None
    tables = tmp_path / "out" / "tables"
    for name in ("scaling_table.tex", "fig_throughput.tex", "nodehours_table.tex", "setup.tex"):
        assert "Gap:" in (tables / name).read_text(), name
    assert r"\newcommand{\labNodeHours}{n/a}" in (tables / "numbers.tex").read_text()


def test_unchanged_outputs_are_not_rewritten(study, tmp_path):
    out = tmp_path / "out"
    report.build(study, out, PLAN, SYSTEMS)
    res = report.build(study, out, PLAN, SYSTEMS)
    assert not any(res["written"].values())


# ---------------------------------------------------------------- make paper
def _need_tex():
    missing = [t for t in ("latexmk", "pdflatex", "pdftotext", "pdftoppm") if not shutil.which(t)]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but TeX/poppler missing: {missing}")
        pytest.skip(f"needs TeX Live and poppler-utils ({', '.join(missing)} missing; .ci/run installs them)")


def make_paper(res: Path, *extra) -> subprocess.CompletedProcess:
    p = subprocess.run(["make", "paper", f"RESULTS={res}", f"PAPER_OUT={res}/pdf", f"SLIDES_OUT={res}/pdf",
                        *extra], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return p


def pdf_text(path: Path) -> str:
    return subprocess.run(["pdftotext", "-layout", str(path), "-"], capture_output=True, text=True,
                          check=True).stdout


def pages(path: Path) -> int:
    out = subprocess.run(["pdfinfo", str(path)], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"Pages:\s+(\d+)", out).group(1))


def assert_not_blank(pdf: Path, tmp: Path):
    """Render page 1 and check that it carries ink: a broken build tends to give a blank page."""
    subprocess.run(["pdftoppm", "-r", "40", "-gray", "-f", "1", "-l", "1", str(pdf), str(tmp / pdf.stem)],
                   check=True)
    (png,) = tmp.glob(f"{pdf.stem}*.pgm")
    raw = png.read_bytes()
    header_end = raw.index(b"255\n") + 4  # binary PGM: P5 w h 255\n
    pixels = np.frombuffer(raw[header_end:], dtype=np.uint8)
    dark = (pixels < 128).mean()
    assert 0.005 < dark < 0.5, f"{pdf.name}: {100 * dark:.2f}% dark pixels"


@pytest.mark.slow
def test_make_paper_builds_three_documents_from_the_records(study, tmp_path):
    _need_tex()
    res = tmp_path / "res"
    shutil.copytree(study, res / "runs")
    make_paper(res)
    pdfs = {n: res / "pdf" / f"{n}.pdf" for n in ("paper", "proposal", "pitch")}
    for pdf in pdfs.values():
        assert pdf.exists()
        assert_not_blank(pdf, tmp_path)
    assert 4 <= pages(pdfs["paper"]) <= 6
    assert 6 <= pages(pdfs["proposal"]) <= 8
    assert pages(pdfs["pitch"]) == 5
    paper = pdf_text(pdfs["paper"])
    # a throughput from the records, as the macros print it (1000 samples/s at 1 rank, 5600 at 8)
    assert "5,600" in paper or "5600" in paper.replace(",", "")
    assert "NVIDIA H100 80GB HBM3" in paper
    assert "measured on GPUs" in paper and "CPU processes on one machine" not in paper
    # the proposal's node-hours are the computation
    total = report.build(res / "runs", tmp_path / "check", PLAN, SYSTEMS)["node_hours_total"]
    proposal = pdf_text(pdfs["proposal"])
    assert f"{report.fmt_num(total, 4).replace('{,}', ',')} node-hours" in proposal
    assert SYSTEMS[PLAN["system"]]["name"].split(" (")[0] in proposal
    assert f"{report.fmt_num(total, 4).replace('{,}', ',')} node-hours" in pdf_text(pdfs["pitch"])

    # nothing rebuilds needlessly ...
    mtimes = {n: p.stat().st_mtime_ns for n, p in pdfs.items()}
    make_paper(res)
    assert {n: p.stat().st_mtime_ns for n, p in pdfs.items()} == mtimes
    # ... and a changed record rebuilds what uses it
    summary = res / "runs" / "s8_0" / "summary.json"
    summary.write_text(summary.read_text().replace('"samples_per_s": 5600.0', '"samples_per_s": 6400.0'))
    make_paper(res)
    assert pdfs["paper"].stat().st_mtime_ns != mtimes["paper"]
    assert "6,400" in pdf_text(pdfs["paper"]) or "6400" in pdf_text(pdfs["paper"]).replace(",", "")


@pytest.mark.slow
def test_make_paper_with_no_records_still_builds_and_says_so(tmp_path):
    _need_tex()
    res = tmp_path / "res"
    (res / "runs").mkdir(parents=True)
    make_paper(res, "SYSTEM=leonardo-booster")
    paper = pdf_text(res / "pdf" / "paper.pdf")
    assert "Gap:" in paper and "no measurements yet" in paper
    assert "Leonardo Booster" in pdf_text(res / "pdf" / "proposal.pdf")
