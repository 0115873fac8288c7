"""make demo's re-runs (kernels/notebook/demo.py): a contended training run is run again, a bounded number of times.

The notebook runner is replaced here by one that writes a record in the real schema, contended or not as the
test says; the demo test in tests/test_docs.py runs the real notebooks (with DEMO_RERUNS=0: in the suite the
other worker's tests make every re-run contended too).
"""

from __future__ import annotations

import io

import pytest

from kernels.notebook import demo
from kernels.records import schema as records
from test_paper import write_record

pytestmark = pytest.mark.unit


def runner(runs_dir, contended: list[bool], calls: list, rc: int = 0):
    """A stand-in for kernels.notebook.runner.run: each call leaves one record, contended as the next entry says."""

    def run(notebook, args):
        gpus = int(args[args.index("gpus") + 1])
        n = len(calls)
        calls.append((notebook.stem, gpus))
        busy = contended[n] if n < len(contended) else False
        write_record(runs_dir, f"r{n}-g{gpus}", gpus=gpus, batch=64, x=100.0, contended=busy, label="demo")
        return rc

    return run


@pytest.mark.parametrize(
    "contended,reruns,tries,last",
    [
        ([True, False], 1, 2, "running it again after the other scales (1 of 1)"),
        ([True, True, True], 1, 2, "in all 2 tries; the analysis sets the point aside"),
        ([True, True, False], 2, 3, "running it again after the other scales (2 of 2)"),
        ([True], 0, 1, "cores); the analysis sets the point aside"),
        ([False], 3, 1, None),
    ],
)
def test_a_contended_run_is_run_again_at_most_reruns_times(tmp_path, monkeypatch, contended, reruns, tries, last):
    calls, out = [], io.StringIO()
    runs = tmp_path / "runs"
    monkeypatch.setattr(demo.notebooks, "run", runner(runs, contended, calls))
    assert demo.run_scales([("01_train", 1, ["-p", "label", "demo"])], reruns, runs, out) == 0
    assert calls == [("01_train", 1)] * tries
    lines = out.getvalue().splitlines()
    assert len(lines) == sum(contended[:tries]) and (last is None or last in lines[-1]), lines
    assert all("foreign processes used 0.90 of the 2 cores" in line for line in lines)  # the record's evidence


def test_the_demo_runs_each_scale_and_reruns_only_the_training_runs(tmp_path, monkeypatch):
    """A contended scale runs again after the other scales (1, 2, then 1 again), and the profiled run never."""
    calls = []
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path))
    # 1 rank contended; 2 ranks quiet; 1 rank again, quiet; the profiled run contended, and not run again
    monkeypatch.setattr(demo.notebooks, "run", runner(tmp_path / "runs", [True, False, False, True], calls))
    assert demo.main(["--reruns", "1", "-p", "label", "demo"]) == 0
    assert calls == [("01_train", 1), ("01_train", 2), ("01_train", 1), ("02_profile", 2)]
    assert len(list((tmp_path / "runs").iterdir())) == 4
    assert records.read_json(tmp_path / "runs" / "r0-g1" / "summary.json")["contention"]["contended"]


def test_a_failed_run_stops_the_demo_and_a_negative_count_is_refused(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path))
    monkeypatch.setattr(demo.notebooks, "run", runner(tmp_path / "runs", [], calls, rc=1))
    assert demo.main(["-p", "label", "demo"]) == 1 and calls == [("01_train", 1)]
    assert demo.main(["--reruns", "-1"]) == 2 and "--reruns -1: give 0 or more" in capsys.readouterr().err
