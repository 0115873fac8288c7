"""Fault injection: each way a run dies or hangs, on the local launcher and on the real local Slurm.

Every case injects the fault for real (a signal to a rank or to the launcher, USR1 from
Slurm, a time limit, scancel, an unresolvable host, a truncated file, a concurrent run,
a full file system, a NaN loss) and asserts the time to the end of the run against its
bound, the exit status, the record's status, and, where the run can continue, that a
later run completes with the same final metrics and weights as an uninterrupted one.
Each case adds a row (case, bound, measured time, outcome) to the reliability table
that `make reliability` writes into docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from conftest import ROOT, load_checkpoint, record_fault

pytestmark = [pytest.mark.integration, pytest.mark.faults]

BASE = [
    "--dataset",
    "digits",
    "--width",
    "4",
    "--batch",
    "32",
    "--precision",
    "fp32",
    "--train_samples",
    "512",
    "--test_samples",
    "64",
    "--log_every",
    "0",
    "--timing_warmup_steps",
    "1",
    "--comm_probe_steps",
    "0",
    "--sync_check_steps",
    "1",
    "--seed",
    "11",
]
EPOCHS = ["--epochs", "6"]


def lab(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernels.train", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def again(tmp_path: Path) -> subprocess.CompletedProcess:
    """The two-rank run "r" of these tests, started again (it resumes, or is refused)."""
    return lab(*BASE, *EPOCHS, "--gpus", "2", "--results_dir", tmp_path, "--run_id", "r")


def resume_matches(run: Path, tmp_path: Path, reference: Path) -> subprocess.CompletedProcess:
    """Resume the interrupted run: it must succeed and end exactly where the uninterrupted one does."""
    p = again(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert_same_result(run, reference)
    return p


def start(*args, log: Path, env=None) -> subprocess.Popen:
    f = open(log, "w")
    return subprocess.Popen(
        [sys.executable, "-m", "kernels.train", *map(str, args)],
        cwd=ROOT,
        stdout=f,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def wait_for(cond, timeout=120, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def epochs_done(run_dir: Path) -> int:
    """Epochs finished AND checkpointed: metrics.csv gets its row before the checkpoint is written, so a
    fault injected on the row alone may land before there is anything to resume from."""
    p = run_dir / "metrics.csv"
    if not (run_dir / "checkpoint.pt").exists():  # appears by a rename once the checkpoint is whole
        return 0
    return max(0, len(p.read_text().splitlines()) - 1) if p.exists() else 0


def ranks_of(launcher: subprocess.Popen) -> list[psutil.Process]:
    kids = psutil.Process(launcher.pid).children()
    return sorted(kids, key=lambda p: int(p.environ().get("RANK", 0)))


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def weights(run_dir: Path) -> torch.Tensor:
    state = load_checkpoint(run_dir / "checkpoint.pt")
    return torch.cat([v.flatten().double() for v in state["model"].values()])


def assert_same_result(run_dir: Path, reference: Path):
    """The resumed run ends exactly where the uninterrupted one does."""
    a, b = summary(run_dir), summary(reference)
    assert a["status"] == b["status"] == "complete", (a["status"], a.get("error"))
    assert a["final_eval_loss"] == pytest.approx(b["final_eval_loss"], rel=1e-6, abs=1e-9)
    assert a["final_eval_acc"] == b["final_eval_acc"] and a["steps_done"] == b["steps_done"]
    assert torch.allclose(weights(run_dir), weights(reference), rtol=1e-6, atol=1e-8)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run every recovered run is compared with."""
    res = tmp_path_factory.mktemp("reference")
    p = lab(*BASE, *EPOCHS, "--gpus", "2", "--results_dir", res, "--run_id", "ref")
    assert p.returncode == 0, p.stdout + p.stderr
    return res / "ref"


# ----------------------------------------------------------- the local launcher
def test_rank0_killed(tmp_path, reference):
    run = tmp_path / "r"
    launcher = start(*BASE, *EPOCHS, "--gpus", "2", "--results_dir", tmp_path, "--run_id", "r", log=tmp_path / "log")
    wait_for(lambda: epochs_done(run) >= 1, what="the first epoch")
    rank0 = ranks_of(launcher)[0]
    t0 = time.monotonic()
    rank0.kill()
    rc = launcher.wait(timeout=120)
    took = time.monotonic() - t0
    record_fault("rank 0 killed (SIGKILL), local launcher", 30, took, rc, summary(run)["status"])
    assert rc == 128 + 9 and took < 30
    s = summary(run)
    assert s["status"] == "failed" and "killed by signal SIGKILL" in s["error"], s  # not left 'running'
    assert "resuming r" in resume_matches(run, tmp_path, reference).stdout
    assert [a["status"] for a in summary(run)["attempts"]] == ["failed", "complete"]


def test_rank_stopped_with_sigstop(tmp_path, reference):
    """A stopped rank hangs the others in a collective: the watchdog ends them, the launcher kills it."""
    run = tmp_path / "r"
    launcher = start(
        *BASE,
        *EPOCHS,
        "--gpus",
        "2",
        "--hang_timeout_min",
        "0.25",
        "--results_dir",
        tmp_path,
        "--run_id",
        "r",
        log=tmp_path / "log",
    )
    wait_for(lambda: epochs_done(run) >= 1, what="the first epoch")
    ranks = ranks_of(launcher)
    t0 = time.monotonic()
    ranks[1].suspend()
    rc = launcher.wait(timeout=180)
    took = time.monotonic() - t0
    record_fault(
        "rank 1 stopped (SIGSTOP), local launcher, hang_timeout_min=0.25", 15 + 60, took, rc, summary(run)["status"]
    )
    assert rc != 0 and took < 15 + 60, took
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks)  # nobody left behind
    s = summary(run)
    assert s["status"] == "failed" and "hung" in s["error"], s
    assert "Python stacks of every thread follow" in (tmp_path / "log").read_text()
    resume_matches(run, tmp_path, reference)


def test_ctrl_c_checkpoints_like_sigterm_and_a_second_stops_at_once(tmp_path, reference):
    """Ctrl-C (SIGINT to the launcher's process group, as a terminal sends it) recorded 'failed' with
    KeyboardInterrupt, wrote no checkpoint and printed about 100 traceback lines per rank. Now the ranks checkpoint
    at the next agreed step, the record says preempted, one line per rank, exit 130, and the run resumes to the
    uninterrupted result. A second Ctrl-C stops at once: a failed record saying why, the last checkpoint intact."""

    def launch(run_id: str, **changes) -> subprocess.Popen:
        args = [*BASE, *EPOCHS, "--gpus", "2", "--results_dir", tmp_path, "--run_id", run_id]
        for name, value in changes.items():
            args[args.index(f"--{name}") + 1] = value
        f = open(tmp_path / f"{run_id}.log", "w")
        return subprocess.Popen(
            [sys.executable, "-m", "kernels.train", *map(str, args)],
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )  # its own process group, as a shell gives a job

    run = tmp_path / "r"
    launcher = launch("r")
    wait_for(lambda: epochs_done(run) >= 1, what="the first epoch")
    t0 = time.monotonic()
    os.killpg(launcher.pid, signal.SIGINT)
    rc = launcher.wait(timeout=120)
    took = time.monotonic() - t0
    record_fault("Ctrl-C (SIGINT to the process group), local launcher", 30, took, rc, summary(run)["status"])
    log = (tmp_path / "r.log").read_text()
    assert rc == 130 and took < 30, log[-3000:]
    s = summary(run)
    assert s["status"] == "preempted" and "SIGINT (Ctrl-C" in s["error"] and s["steps_done"] > 0, s
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]
    assert len([x for x in log[log.index("launcher: got SIGINT") :].splitlines() if x.strip()]) <= 4, log[-1500:]
    resume_matches(run, tmp_path, reference)

    # a second Ctrl-C before the agreed step (long epochs, checks 1000 steps apart): at once, the record says why
    run2 = tmp_path / "r2"
    launcher = launch("r2", train_samples=8192, sync_check_steps=1000)
    wait_for(lambda: epochs_done(run2) >= 1, what="the first epoch of r2")
    kept = (run2 / "checkpoint.pt").read_bytes()
    os.killpg(launcher.pid, signal.SIGINT)
    time.sleep(0.3)  # two at once would be one pending signal
    t0 = time.monotonic()
    os.killpg(launcher.pid, signal.SIGINT)
    rc = launcher.wait(timeout=60)
    took = time.monotonic() - t0
    record_fault("Ctrl-C twice, local launcher", 10, took, rc, summary(run2)["status"])
    log = (tmp_path / "r2.log").read_text()
    s = summary(run2)
    assert rc == 130 and took < 10, (rc, log[-3000:])
    assert s["status"] == "failed" and "interrupted twice (Ctrl-C)" in s["error"], s
    assert "Traceback" not in log and (run2 / "checkpoint.pt").read_bytes() == kept


def test_launcher_terminated_checkpoints_and_leaves_no_orphans(tmp_path, reference):
    run = tmp_path / "r"
    launcher = start(*BASE, *EPOCHS, "--gpus", "2", "--results_dir", tmp_path, "--run_id", "r", log=tmp_path / "log")
    wait_for(lambda: epochs_done(run) >= 1, what="the first epoch")
    ranks = ranks_of(launcher)
    t0 = time.monotonic()
    launcher.terminate()
    rc = launcher.wait(timeout=120)
    took = time.monotonic() - t0
    record_fault("local launcher terminated (SIGTERM)", 30, took, rc, summary(run)["status"])
    assert rc == 75 and took < 30  # the ranks checkpointed: resumable
    wait_for(lambda: not any(p.is_running() for p in ranks), timeout=10, what="the ranks to leave")
    s = summary(run)
    assert s["status"] == "preempted" and "SIGTERM" in s["error"], s
    resume_matches(run, tmp_path, reference)


def test_launcher_killed_takes_its_ranks_along(tmp_path, reference):
    run = tmp_path / "r"
    launcher = start(*BASE, *EPOCHS, "--gpus", "2", "--results_dir", tmp_path, "--run_id", "r", log=tmp_path / "log")
    wait_for(lambda: epochs_done(run) >= 1, what="the first epoch")
    ranks = ranks_of(launcher)
    t0 = time.monotonic()
    launcher.kill()
    launcher.wait()
    wait_for(
        lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks),
        timeout=15,
        what="the ranks to die with their launcher",
    )
    took = time.monotonic() - t0
    record_fault(
        "local launcher killed (SIGKILL)",
        15,
        took,
        137,
        "ranks died with it; 'running' until the next attempt records 'died'",
    )
    assert summary(run)["status"] == "running"  # nobody could say otherwise ...
    p = again(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "the previous attempt of r ended without recording why" in p.stdout
    attempts = summary(run)["attempts"]  # ... until the next attempt, which says so
    assert [a["status"] for a in attempts] == ["died", "complete"]
    assert_same_result(run, reference)


def test_unresolvable_master_addr_fails_fast(tmp_path):
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "no-such-host.invalid",
        "MASTER_PORT": "29511",
    }
    t0 = time.monotonic()
    p = lab(*BASE, "--gpus", "2", "--launcher", "none", "--results_dir", tmp_path, env=env)
    took = time.monotonic() - t0
    record_fault("MASTER_ADDR does not resolve", 20, took, p.returncode, "no record")
    assert p.returncode == 2 and took < 20
    assert "MASTER_ADDR 'no-such-host.invalid'" in p.stderr and "does not resolve" in p.stderr
    assert not list(tmp_path.iterdir())


def test_nobody_serves_the_rendezvous(tmp_path):
    from kernels.base.ports import free_port

    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    t0 = time.monotonic()
    p = lab(
        *BASE, "--gpus", "2", "--launcher", "none", "--startup_timeout_min", "0.1", "--results_dir", tmp_path, env=env
    )
    took = time.monotonic() - t0
    record_fault("rank 0 never arrives (startup_timeout_min=0.1)", 6 + 20, took, p.returncode, "no record")
    assert p.returncode == 2 and took < 6 + 20, (took, p.stderr)
    assert "could not reach the rendezvous at MASTER_ADDR=127.0.0.1 MASTER_PORT=" in p.stderr


def test_a_second_run_on_the_same_directory_fails_fast_naming_the_first(tmp_path):
    run = tmp_path / "r"
    first = start(*BASE, *EPOCHS, "--gpus", "2", "--results_dir", tmp_path, "--run_id", "r", log=tmp_path / "log")
    wait_for(lambda: (run / ".lock").exists(), what="the first run's lock")
    t0 = time.monotonic()
    p = again(tmp_path)
    took = time.monotonic() - t0
    record_fault("second run on the same run_id", 20, took, p.returncode, "first unaffected")
    assert p.returncode == 2 and took < 20
    owner = json.loads((run / ".lock").read_text())
    assert f"pid {owner['pid']}" in p.stderr and "is in use by another run" in p.stderr
    assert first.wait(timeout=300) == 0
    cfg, s = json.loads((run / "config.json").read_text()), summary(run)
    assert s["status"] == "complete" and cfg["params"]["epochs"] == 6 and len(s["attempts"]) == 1
    assert not (run / ".lock").exists()


def _damage_tensor_bytes(path: Path) -> None:
    """Flip bytes inside the largest tensor of a checkpoint, leaving its zip whole: torch.load alone loads it."""
    from kernels.records import checkpoint_file as ckpt

    import struct
    import zipfile

    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        entry = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    name_len, extra_len = struct.unpack("<HH", data[entry.header_offset + 26 : entry.header_offset + 30])
    first = entry.header_offset + 30 + name_len + extra_len
    for i in range(first, first + entry.file_size, max(1, entry.file_size // 8)):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    ckpt.load_bytes(bytes(data).split(b"\n", 1)[1], path.name)  # still a loadable zip: only its content is wrong


def test_a_damaged_checkpoint_falls_back_to_the_previous_one(tmp_path, reference):
    """A checkpoint carries the checksum of its bytes: tensor bytes damaged inside an intact zip (which
    torch.load accepts, and a checksum rewritten beside it would have blessed) are found, and the run resumes
    from the previous checkpoint to the same end. When neither verifies it is a clear error naming both."""
    import shutil

    run = tmp_path / "r"
    p = lab(*BASE, *EPOCHS, "--gpus", "2", "--stop_after_steps", "24", "--results_dir", tmp_path, "--run_id", "r")
    assert p.returncode == 0 and summary(run)["status"] == "stopped", p.stdout + p.stderr
    shutil.copytree(run, tmp_path / "r2")
    ck = tmp_path / "r2" / "checkpoint.pt"  # both unusable: cut short, and damaged inside
    ck.write_bytes(ck.read_bytes()[: ck.stat().st_size // 2])
    _damage_tensor_bytes(tmp_path / "r2" / "checkpoint.prev.pt")
    p = lab(*BASE, *EPOCHS, "--gpus", "2", "--results_dir", tmp_path, "--run_id", "r2")
    out = p.stdout + p.stderr  # the ranks' messages come through the launcher's output
    # the sha256 on each file's first line finds both before torch.load reads a byte of either
    assert p.returncode == 2 and "no usable checkpoint" in out and "checkpoint.pt is unusable: checksum mismatch" in out
    assert "checkpoint.prev.pt is unusable: checksum mismatch" in out, out
    assert summary(tmp_path / "r2")["status"] == "stopped"
    _damage_tensor_bytes(run / "checkpoint.pt")
    t0 = time.monotonic()
    p = again(tmp_path)
    record_fault(
        "checkpoint.pt damaged inside (falls back to checkpoint.prev.pt)",
        120,
        time.monotonic() - t0,
        p.returncode,
        summary(run)["status"],
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "checkpoint.pt is unusable: checksum mismatch" in p.stdout
    assert "resuming from the previous checkpoint, checkpoint.prev.pt" in p.stdout
    assert_same_result(run, reference)


def _state(step: int) -> bytes:
    from kernels.records import checkpoint_file as ckpt

    return ckpt.serialise([{"torch": torch.get_rng_state()}], global_step=step, model={"w": torch.full((1000,), step)})


def _kill_the_writer_at(point: str, run: Path) -> None:
    """Write the next checkpoint (step 2) in a forked writer that the injection point kills with SIGKILL."""
    from kernels.records import checkpoint_file as ckpt

    data = _state(2)
    pid = os.fork()
    if pid == 0:  # the writer: it dies at the point, or reports that it did not
        try:
            os.environ[ckpt.FAULT_ENV] = f"{point}@{ckpt._writes + 1}"
            ckpt.write(run, data)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (point, status)


@pytest.mark.integration  # a forked writer
@pytest.mark.parametrize("point", ["start", "prev-removed", "next-half-written", "next-written", "rotated", "done"])
def test_a_writer_killed_anywhere_in_the_checkpoint_write_leaves_one_that_verifies(tmp_path, point):
    """checkpoint.pt and checkpoint.prev.pt were renamed one after the other, their checksums beside them after
    that: a crash between left a good checkpoint with another's checksum, and resume refused it. Now the file
    carries its checksum, and the writer is killed (SIGKILL) at each point of the write in turn: resume takes
    the newest checkpoint that is whole (the new one from the moment it is fsynced), and the write after works."""
    from kernels.records import checkpoint_file as ckpt

    assert ckpt.POINTS == ("start", "prev-removed", "next-half-written", "next-written", "rotated", "done")
    run = tmp_path / "r"
    run.mkdir()
    ckpt.write(run, _state(0))
    ckpt.write(run, _state(1))
    _kill_the_writer_at(point, run)
    t0 = time.monotonic()
    state, used, notes = ckpt.load(run)
    took = time.monotonic() - t0
    newest = 2 if ckpt.POINTS.index(point) >= ckpt.POINTS.index("next-written") else 1
    assert state["global_step"] == newest and used.name == "checkpoint.pt", (point, used, notes)
    record_fault(
        f"checkpoint writer killed (SIGKILL) at '{point}'",
        5,
        took,
        128 + 9,
        f"loads {'the new checkpoint' if newest == 2 else 'the one before the write'}",
    )
    assert bool(notes) == (point in ("next-half-written", "next-written", "rotated")), notes
    assert float(state["model"]["w"][0]) == newest
    ckpt.write(run, _state(3))  # the next write after the crash
    assert {f.name for f in run.iterdir()} == {"checkpoint.pt", "checkpoint.prev.pt"}
    assert [ckpt.load(run)[0]["global_step"], load_checkpoint(run / "checkpoint.prev.pt")["global_step"]] == [3, newest]


def test_rank0_killed_mid_checkpoint_resumes_from_the_newest_whole_one(tmp_path, reference):
    """The real run: rank 0 is killed in the second checkpoint's write between its two renames (only
    checkpoint.prev.pt and checkpoint.next.pt on disk); the next attempt resumes from the new one and ends
    identical to an uninterrupted run."""
    run = tmp_path / "r"
    t0 = time.monotonic()
    p = lab(
        *BASE,
        *EPOCHS,
        "--gpus",
        "2",
        "--results_dir",
        tmp_path,
        "--run_id",
        "r",
        env={"LAB_CHECKPOINT_FAULT": "rotated@2"},
    )
    took = time.monotonic() - t0
    assert p.returncode == 128 + 9, p.stdout + p.stderr
    assert {f.name for f in run.glob("checkpoint*")} == {"checkpoint.prev.pt", "checkpoint.next.pt"}
    status, rc = summary(run)["status"], p.returncode
    out = resume_matches(run, tmp_path, reference).stdout
    assert "a checkpoint write was interrupted after checkpoint.next.pt was complete" in out
    assert "resuming r from epoch 3 step 0" in out, out
    record_fault(
        "rank 0 killed between a checkpoint's renames",
        60,
        took,
        rc,
        f"{status}; resumed from the new checkpoint to the same end",
    )


def test_a_key_given_twice_in_any_yaml_is_an_error_naming_both_lines(tmp_path):
    """A study with `gpus: [1, 2]` and later `gpus: [4]` lost two points silently (the last key won). Every YAML the
    lab reads refuses a repeated key, naming both lines, before anything is submitted or built."""
    from kernels.base import yamlfile
    from kernels.base.errors import ConfigError

    study = (ROOT / "studies" / "predictor_local.yaml").read_text()
    assert study.count("\ngpus: [1, 2, 4]\n") == 1
    twice = tmp_path / "twice.yaml"
    twice.write_text(study.replace("\ngpus: [1, 2, 4]\n", "\ngpus: [1, 2]\nrepeats: 1\ngpus: [4]\n"))
    first = twice.read_text().splitlines().index("gpus: [1, 2]") + 1
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "kernels.slurm.study", "submit", str(twice), "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    record_fault("study file with a key given twice", 20, time.monotonic() - t0, p.returncode, "refused")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert f"study file {twice}:{first + 2}: key 'gpus' is given twice, on lines {first} and {first + 2}" in p.stderr
    # nested mappings too, and the other files: cluster profiles, sweeps, paper/plan.yaml, paper/systems.yaml
    for name, what in (
        ("clusters/local.yaml", "cluster profile"),
        ("sweeps/allreduce_latency.yaml", "sweep file"),
        ("paper/plan.yaml", "plan"),
        ("paper/systems.yaml", "systems file"),
    ):
        lines = (ROOT / name).read_text().splitlines()
        i, line = next((i, x) for i, x in enumerate(lines) if re.match(r"\s*\w+:", x) and i > 0)
        f = tmp_path / Path(name).name
        f.write_text("\n".join(lines[: i + 1] + [line] + lines[i + 1 :]) + "\n")
        key = line.split(":")[0].strip()
        with pytest.raises(
            ConfigError,
            match=rf"{what} .*:{i + 2}: key '{key}' is given twice, on lines {i + 1} "
            rf"and {i + 2}",
        ):
            yamlfile.read(f, what)
        assert yamlfile.read(ROOT / name, what)  # the files as shipped have no repeated key
    with pytest.raises(ConfigError, match="key 'b' is given twice, on lines 2 and 4"):
        yamlfile.loads("a:\n  b: 1\n  c: 2\n  b: 3\n")
    assert yamlfile.loads("a: &x {b: 1}\nc:\n  <<: *x\n  d: 2\n") == {"a": {"b": 1}, "c": {"b": 1, "d": 2}}


def test_truncated_summary_is_a_clear_error(tmp_path):
    from kernels.analysis import runs as analysis

    p = lab(*BASE, "--epochs", "1", "--gpus", "1", "--results_dir", tmp_path, "--run_id", "r")
    assert p.returncode == 0
    f = tmp_path / "r" / "summary.json"
    f.write_text(f.read_text()[:40])
    t0 = time.monotonic()
    p = lab(*BASE, "--epochs", "1", "--gpus", "1", "--results_dir", tmp_path, "--run_id", "r")
    record_fault("truncated summary.json", 20, time.monotonic() - t0, p.returncode, "refused")
    assert p.returncode == 2 and "summary.json is not valid JSON" in p.stderr and "Traceback" not in p.stderr
    runs, problems, _ = analysis.load_runs(tmp_path)
    assert runs.empty and problems.iloc[0]["status"] == "unreadable"


def test_resume_refuses_a_changed_parameter_unless_allowed(tmp_path):
    run = tmp_path / "r"
    p = lab(*BASE, *EPOCHS, "--gpus", "1", "--stop_after_steps", "5", "--results_dir", tmp_path, "--run_id", "r")
    assert p.returncode == 0
    p = lab(*BASE, *EPOCHS, "--gpus", "1", "--lr", "0.05", "--results_dir", tmp_path, "--run_id", "r")
    assert p.returncode == 2 and "lr (0.2 in the checkpoint, 0.05 now)" in p.stderr
    assert "allow_config_change=true" in p.stderr and summary(run)["status"] == "stopped"
    p = lab(
        *BASE,
        *EPOCHS,
        "--gpus",
        "1",
        "--lr",
        "0.05",
        "--allow_config_change",
        "--results_dir",
        tmp_path,
        "--run_id",
        "r",
    )
    assert p.returncode == 0 and "lr changed from 0.2 to 0.05" in p.stdout
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["config_changes"] == [{"parameter": "lr", "checkpoint": 0.2, "now": 0.05}]


def test_non_finite_loss_stops_the_run(tmp_path):
    t0 = time.monotonic()
    p = lab(
        *BASE,
        "--epochs",
        "2",
        "--gpus",
        "2",
        "--lr",
        "1e12",
        "--lr_warmup_epochs",
        "0",
        "--results_dir",
        tmp_path,
        "--run_id",
        "r",
    )
    took = time.monotonic() - t0
    s = summary(tmp_path / "r")
    record_fault("non-finite loss (lr 1e12)", 60, took, p.returncode, s["status"])
    assert p.returncode != 0 and s["status"] == "failed"
    assert re.search(r"NonFiniteLoss: the training loss became non-finite by global step \d+", s["error"]), s["error"]


def _tmpfs(where: Path, size: str) -> Path:
    where.mkdir()
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if p.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but a tmpfs cannot be mounted: {p.stderr}")
        pytest.skip(f"mounting a small tmpfs needs root: {p.stderr.strip()}")
    return where


@pytest.fixture
def small_disk(tmp_path):
    """A file system of its own, small enough to fill: 20 MiB of tmpfs (unmounted after the test)."""
    mnt = _tmpfs(tmp_path / "small", "20m")
    yield mnt
    subprocess.run(["umount", str(mnt)])


def fill(path: Path) -> None:
    """Write zeros into `path` until the file system has no room left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, bytes(1 << 16))
    except OSError as e:
        assert e.errno == 28, e
    finally:
        os.close(fd)


def test_a_data_set_copied_onto_a_full_disk_is_one_line_naming_the_file_and_the_option(small_disk, capsys):
    """`lab fetch fashion-mnist --from DIR` onto a disk that fills mid-copy: a traceback from shutil before (the
    write error had no file name); now one line naming the file and --root, exit 2, and no partial file."""
    from conftest import DEBIAN
    from kernels import cli

    if not DEBIAN.is_dir():
        pytest.skip("needs Debian's dataset-fashion-mnist")
    t0 = time.monotonic()  # the first file, 26 MB of training images, does not fit in the 20 MiB
    rc = cli.main(["fetch", "fashion-mnist", "--from", str(DEBIAN), "--root", str(small_disk / "data")])
    err = capsys.readouterr().err
    record_fault("`lab fetch --from` onto a disk that fills mid-copy", 10, time.monotonic() - t0, rc, "one line")
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert re.fullmatch(
        rf"error: cannot write {small_disk}/data/fashion-mnist/train-images-idx3-ubyte.gz \([\d,]+ bytes\): No space "
        r"left on device; free space there or choose another --root\n",
        err,
    ), err
    assert not [p for p in (small_disk / "data").rglob("*") if p.is_file()]  # the copy's temporary is gone too


def test_commands_that_write_beside_a_run_refuse_a_full_disk_in_one_line_before_any_work(small_disk, tmp_path):
    """The executed notebook (lab run), the analysis' outputs (lab paper) and a commbench record (lab comm bench) on
    a full disk: a traceback from the HTML renderer after the notebook had run, the analysis' failure pointing at
    a cell, and the other rank's gloo error, before; now one line each naming the folder and its free space, exit
    2, before Papermill, the analysis or a rank starts, and no folder made."""
    fill(small_disk / "fill")
    env = {**os.environ, "LAB_RESULTS": str(small_disk / "results")}
    cases = [
        (
            ["run", "notebooks/01_train.ipynb", "-p", "dataset", "digits"],
            "set LAB_RESULTS to a results folder with room",
        ),
        (["paper", "--results", str(small_disk / "paper")], "--results: "),
        (["comm", "bench", "--gpus", "2", "--results_dir", str(small_disk / "comm")], "parameter 'results_dir': "),
    ]
    for args, needle in cases:
        t0 = time.monotonic()
        p = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "lab"), *args], cwd=ROOT, env=env, capture_output=True, text=True
        )
        record_fault(
            f"`lab {' '.join(args[:2])}` onto a full disk", 30, time.monotonic() - t0, p.returncode, "one line"
        )
        last = p.stderr.strip().splitlines()[-1]
        assert p.returncode == 2 and "Traceback" not in p.stderr and needle in last, p.stdout + p.stderr
        assert re.search(r"has [\d,]+ KiB free[;,] .* need(s)? about [\d,]+ KiB", last), last
    assert sorted(q.name for q in small_disk.iterdir()) == ["fill"]


def test_full_file_system(small_disk):
    mnt = small_disk
    fill(mnt / "fill")
    t0 = time.monotonic()
    p = lab(*BASE, "--epochs", "1", "--gpus", "1", "--results_dir", mnt / "runs", "--run_id", "r")
    record_fault(
        "results_dir on a full file system (20 MiB tmpfs, full)", 20, time.monotonic() - t0, p.returncode, "no record"
    )
    assert p.returncode == 2 and str(mnt) in p.stderr, p.stderr
    # the two sizes in one unit, precise enough to show why, and what takes the space
    has, needs = re.search(
        r"has ([\d,]+) KiB free, this run needs about ([\d,]+) KiB: two checkpoints", p.stderr
    ).groups()
    assert int(has.replace(",", "")) < int(needs.replace(",", "")) and "for the record" in p.stderr
    assert not (mnt / "runs" / "r").exists()  # no empty run directory left behind
    from kernels.records.schema import RecordError, atomic_write_bytes

    with pytest.raises(RecordError, match=rf"cannot write {re.escape(str(mnt))}/big.*No space left"):
        atomic_write_bytes(mnt / "big", b"\0" * (8 << 20))
    assert not list(mnt.glob(".big*"))  # no temporary file left either


def test_a_disk_that_fills_mid_run_fails_the_run_saying_so(small_disk, tmp_path, reference):
    """A disk that filled mid-run left the record 'running' with a traceback, and the next attempt blamed a kill,
    memory or a node. The run now ends 'failed: disk full at <path>' in one line, the record says so (written in
    space reserved at the start), a retry on the still-full disk is refused naming that cause, and once there is
    room the run resumes to the same end as an uninterrupted one."""
    run = small_disk / "runs" / "r"
    args = [*BASE, *EPOCHS, "--gpus", "2", "--results_dir", small_disk / "runs", "--run_id", "r"]
    launcher = start(*args, log=tmp_path / "log")
    wait_for(lambda: epochs_done(run) >= 1, what="the first epoch")
    ranks = ranks_of(launcher)
    for r in ranks:
        r.suspend()
    fill(small_disk / "fill")
    t0 = time.monotonic()
    for r in ranks:
        r.resume()
    rc = launcher.wait(timeout=120)
    took = time.monotonic() - t0
    record_fault("the disk fills mid-run (20 MiB tmpfs)", 30, took, rc, summary(run)["status"])
    log, s = (tmp_path / "log").read_text(), summary(run)
    assert rc == 1 and s["status"] == "failed" and s["error"].startswith(f"disk full at {run}/"), (log, s)
    assert s["error"].endswith("(No space left on device)") and s["attempts"][-1]["cause"] == s["error"]
    assert f"failed: disk full at {run}/" in log and "Traceback" not in log, log
    # gloo says "closed" or "reset" depending on when the peer's socket went; the lab's classification is the point
    left = r"\[rank 1\] failed: another rank left during a collective \(Connection (closed|reset) by peer"
    assert re.search(left, log), log
    assert not (run / ".reserve").exists() and not (run / "failure.txt").exists()  # the summary says it
    p = lab(*args)
    out = p.stdout + p.stderr  # the ranks' output comes through the launcher's
    assert p.returncode == 2 and out.count("error:") == 1, out  # rank 0 says it, not every rank
    assert f"(the previous attempt failed: disk full at {run}/" in out, out
    (small_disk / "fill").unlink()
    p = lab(*args)
    assert p.returncode == 0 and f"note: the previous attempt of r failed: disk full at {run}/" in p.stdout
    assert_same_result(run, reference)


def test_when_even_the_summary_cannot_be_written_the_reserved_space_says_why(small_disk):
    """The last line of defence on a full disk: the cause written in place into the reserved space needs no
    new room, the launcher's mark and the next attempt read it there."""
    from kernels.base import files
    from kernels.records import schema as records

    d = small_disk / "runs" / "r"
    d.mkdir(parents=True)
    records.write_json(d / "summary.json", {"status": "running", "attempts": [{"status": "running"}]})
    files.reserve_space(d)
    fill(small_disk / "fill")
    try:
        records.write_json(d / "x.json", {"x": "y" * 4096})
        raise AssertionError("the disk is not full")
    except records.RecordError as e:
        cause = files.failure_text(e)
    assert cause == f"disk full at {d}/x.json (No space left on device)"
    assert files.record_failure(d, cause) and files.failure_cause(d) == cause
    fill(small_disk / "fill")  # the reserve's freed space taken too: no summary can be written
    assert not records.mark_failed(d, "a rank exited with status 1") and files.failure_cause(d) == cause
    assert records.read_json(d / "summary.json")["status"] == "running"
    (small_disk / "fill").unlink()
    assert records.mark_failed(d, "a rank exited with status 1")
    s = records.read_json(d / "summary.json")
    assert s["status"] == "failed" and s["error"] == cause == s["attempts"][-1]["cause"]
    assert files.failure_cause(d) is None and not list(d.glob(".reserve")) and not (d / "failure.txt").exists()


# ------------------------------------------------------------------ the real Slurm
SLURM_P = [
    "-p",
    "dataset",
    "digits",
    "-p",
    "width",
    "4",
    "-p",
    "batch",
    "32",
    "-p",
    "precision",
    "fp32",
    "-p",
    "train_samples",
    "512",
    "-p",
    "test_samples",
    "64",
    "-p",
    "log_every",
    "0",
    "-p",
    "timing_warmup_steps",
    "1",
    "-p",
    "comm_probe_steps",
    "0",
    "-p",
    "sync_check_steps",
    "1",
    "-p",
    "seed",
    "11",
]


def _slurm_env(slurm, tmp_path) -> dict:
    return {**os.environ, "SLURM_CONF": slurm["SLURM_CONF"], "MASTER_ADDR": "127.0.0.1", "LAB_RESULTS": str(tmp_path)}


def _submit(slurm, tmp_path, *opts, epochs=6, extra_p=()) -> str:
    p = subprocess.run(
        [
            "sbatch",
            f"--output={tmp_path}/job-%j.out",
            "--cpus-per-task=1",
            "--nodes=1",
            "--ntasks-per-node=2",
            "--gpus-per-node=2",
            *opts,
            "slurm/papermill_run.sbatch",
            "notebooks/01_train.ipynb",
            "-p",
            "gpus",
            "2",
            "-p",
            "epochs",
            str(epochs),
            *SLURM_P,
            *extra_p,
            "-p",
            "results_dir",
            str(tmp_path / "runs"),
        ],
        cwd=ROOT,
        env=_slurm_env(slurm, tmp_path),
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    return re.search(r"Submitted batch job (\d+)", p.stdout).group(1)


def _wait_job(slurm, tmp_path, job: str, timeout=300) -> str:
    """Wait until the job has left the queue.

    A requeued job waits about two minutes (Slurm's hold after a requeue); the test releases it
    once its previous instance is surely gone (KillWait is 5 s here), to save CI the wait.
    """
    env = _slurm_env(slurm, tmp_path)
    deadline = time.monotonic() + timeout
    held_since = None
    while time.monotonic() < deadline:
        q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], env=env, capture_output=True, text=True)
        if not q.stdout.strip():
            break
        if "BeginTime" in q.stdout:
            held_since = held_since or time.monotonic()
            if time.monotonic() - held_since > 8:
                subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], env=env, capture_output=True)
                held_since = None
        else:
            held_since = None
        time.sleep(1)
    else:
        subprocess.run(["scancel", job], env=env)
        pytest.fail(f"job {job} still queued or running after {timeout} s")
    out = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
    return re.search(r"JobState=(\S+)", out).group(1)


@pytest.mark.system
def test_slurm_usr1_checkpoints_requeues_and_finishes_identically(slurm, tmp_path, reference):
    """The preemption warning, as `#SBATCH --signal=B:USR1@...` delivers it, sent by hand mid-run."""
    job = _submit(slurm, tmp_path)
    run = tmp_path / "runs" / f"resnet18-digits-g2-j{job}"
    wait_for(lambda: epochs_done(run) >= 1, timeout=180, what="the first epoch under Slurm")
    env = _slurm_env(slurm, tmp_path)
    t0 = time.monotonic()
    subprocess.run(["scancel", "--batch", "-s", "USR1", job], env=env, check=True)
    wait_for(lambda: summary(run)["status"] == "preempted", timeout=60, what="the checkpoint")
    took = time.monotonic() - t0
    state = _wait_job(slurm, tmp_path, job)
    s = summary(run)
    record_fault("Slurm: USR1 (preemption warning), checkpoint and requeue", 60, took, 75, "preempted, then complete")
    assert state == "COMPLETED" and took < 60
    assert s["requeues"] == 1 and [a["status"] for a in s["attempts"]] == ["preempted", "complete"]
    log = (tmp_path / f"job-{job}.out").read_text()
    assert "requeueing it" in log and f"resuming resnet18-digits-g2-j{job}" in log
    assert_same_result(run, reference)


@pytest.mark.system
def test_slurm_time_limit_checkpoints_the_run(slurm, tmp_path):
    """A real time limit (--time=1) on a run far longer than a minute, with no requeue allowed: the run
    checkpoints (on the warning or on the limit's SIGTERM) and records 'preempted'; the same run id resumes."""
    job = _submit(slurm, tmp_path, "--time=10", "--export=ALL,LAB_MAX_REQUEUES=0", epochs=300)
    run = tmp_path / "runs" / f"resnet18-digits-g2-j{job}"
    # the limit drops to 1 minute once the run is underway, so a slow start on a loaded machine cannot
    # use up the whole minute before there is a run to checkpoint
    wait_for(lambda: epochs_done(run) >= 1, timeout=180, what="the first epoch under Slurm")
    t0 = time.monotonic()
    subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=1"], env=_slurm_env(slurm, tmp_path), check=True)
    _wait_job(slurm, tmp_path, job, timeout=240)
    took = time.monotonic() - t0
    s = summary(run)
    record_fault("Slurm: time limit of 1 min reached", 60 + 90, took, 75, s["status"])
    assert took < 60 + 90 and s["status"] == "preempted", (took, s["status"], s.get("error"))
    step = load_checkpoint(run / "checkpoint.pt")["global_step"]
    assert step == s["steps_done"] > 0
    p = lab(
        *BASE,
        "--epochs",
        "300",
        "--gpus",
        "2",
        "--stop_after_steps",
        str(step + 16),
        "--results_dir",
        tmp_path / "runs",
        "--run_id",
        run.name,
    )
    assert p.returncode == 0 and summary(run)["status"] == "stopped", p.stdout + p.stderr
    assert summary(run)["resumed_from_step"] == step and summary(run)["steps_done"] == step + 16


@pytest.mark.system
def test_slurm_scancel_term_checkpoints_and_a_resubmission_resumes(slurm, tmp_path, reference):
    """SIGTERM with no warning (scancel; a limit without --signal): a checkpoint within KillWait (5 s here)."""
    job = _submit(slurm, tmp_path)
    run = tmp_path / "runs" / f"resnet18-digits-g2-j{job}"
    wait_for(lambda: epochs_done(run) >= 1, timeout=180, what="the first epoch under Slurm")
    env = _slurm_env(slurm, tmp_path)
    t0 = time.monotonic()
    subprocess.run(["scancel", job], env=env, check=True)
    state = _wait_job(slurm, tmp_path, job)
    took = time.monotonic() - t0
    s = summary(run)
    record_fault("Slurm: scancel (SIGTERM, no warning)", 30, took, 143, s["status"])
    assert state == "CANCELLED" and took < 30
    assert s["status"] == "preempted" and "SIGTERM" in s["error"], s
    p = lab(*BASE, *EPOCHS, "--gpus", "2", "--results_dir", tmp_path / "runs", "--run_id", run.name)
    assert p.returncode == 0, p.stdout + p.stderr
    assert_same_result(run, reference)


@pytest.mark.system
def test_slurm_stopped_rank_ends_the_job(slurm, tmp_path):
    """A rank stopped under srun: the other's watchdog fails the run, srun ends the step, the job fails."""
    job = _submit(slurm, tmp_path, "--time=00:05:00", extra_p=("-p", "hang_timeout_min", "0.25"))
    run = tmp_path / "runs" / f"resnet18-digits-g2-j{job}"
    wait_for(lambda: epochs_done(run) >= 1, timeout=180, what="the first epoch under Slurm")
    victim = [
        p
        for p in psutil.process_iter(["environ"])
        if (p.info["environ"] or {}).get("SLURM_JOB_ID") == job
        and (p.info["environ"] or {}).get("SLURM_PROCID") == "1"
        and "kernels.train" in " ".join(p.cmdline())
    ]
    assert victim, "rank 1 of the job not found"
    t0 = time.monotonic()
    victim[0].suspend()
    state = _wait_job(slurm, tmp_path, job)
    took = time.monotonic() - t0
    record_fault("Slurm: rank 1 stopped (SIGSTOP), hang_timeout_min=0.25", 15 + 60, took, 1, summary(run)["status"])
    assert state == "FAILED" and took < 15 + 60, (state, took)
    assert summary(run)["status"] == "failed"


@pytest.mark.system
def test_slurm_study_array_task_is_requeued_and_resumes(slurm, tmp_path, reference):
    """A study point (an array task) warned by USR1: the task requeues itself and its point completes."""
    import yaml

    env = _slurm_env(slurm, tmp_path)
    spec = tmp_path / "arr.yaml"
    fixed = {
        "dataset": "digits",
        "width": 4,
        "batch": 32,
        "precision": "fp32",
        "train_samples": 512,
        "test_samples": 64,
        "log_every": 0,
        "timing_warmup_steps": 1,
        "comm_probe_steps": 0,
        "sync_check_steps": 1,
        "seed": 11,
        "epochs": 6,
        "results_dir": str(tmp_path / "runs"),
    }
    spec.write_text(yaml.safe_dump({"name": "arr", "cluster": "local", "mode": "strong", "gpus": [2], "fixed": fixed}))
    p = subprocess.run(
        [sys.executable, "-m", "kernels.slurm.study", "submit", str(spec)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    array = re.search(r"submitted job array (\d+)", p.stdout).group(1)
    run = tmp_path / "runs" / "arr-p000"
    wait_for(lambda: epochs_done(run) >= 1, timeout=180, what="the first epoch of the array task")
    t0 = time.monotonic()
    subprocess.run(["scancel", "--batch", "-s", "USR1", f"{array}_0"], env=env, check=True)
    wait_for(lambda: summary(run)["status"] in ("preempted", "complete"), timeout=60, what="the checkpoint")
    took = time.monotonic() - t0
    _wait_job(slurm, tmp_path, array)
    s = summary(run)
    record_fault("Slurm: USR1 to a study's array task", 60, took, 75, "preempted, then complete")
    assert s["requeues"] == 1 and [a["status"] for a in s["attempts"]] == ["preempted", "complete"], s["attempts"]
    assert_same_result(run, reference)


@pytest.mark.unit
def test_free_space_figures_never_print_alike_when_they_differ():
    """'has 20 MiB free, needs about 20 MiB' explained nothing: two different sizes always print differently,
    in one unit (KiB below 100 MiB)."""
    from kernels.base.files import sizes

    assert sizes(20.4 * 2**20, 20.6 * 2**20) == ["20,890 KiB", "21,094 KiB"]
    assert sizes(20 * 2**20, 20 * 2**20 + 10) == ["20,480.00 KiB", "20,480.01 KiB"]
    assert sizes(3 * 2**30, 150 * 2**30) == ["3 GiB", "150 GiB"]
    assert sizes(512 * 2**20, 2**30)[1] == "1,024 MiB"


def test_bad_notebook_parameters_are_refused_before_papermill_starts(tmp_path):
    """`lab run notebooks/01_train.ipynb -p btach 32` failed inside the kernel with exit 1, its error at line 73 of
    an 80-line traceback, and left a failed .ipynb and .html behind. The runner checks the parameters as the
    notebook's resolve cell does (names, types, choices; -p, -y and -f alike) and stops before Papermill."""
    env = {**os.environ, "LAB_RESULTS": str(tmp_path / "results")}
    cases = [
        (
            "01_train",
            ["-p", "btach", "32"],
            "unknown parameter 'btach' (injected into the notebook, e.g. by papermill -p); did you mean 'batch'?",
        ),
        ("02_profile", ["-p", "gpus", "2", "-y", "precision: bf17"], "parameter 'precision': unknown value 'bf17'"),
        ("01_train", ["-p", "batch", "abc"], "parameter 'batch': 'abc' is not a valid int"),
        (
            "03_commbench",
            ["-p", "itres", "3"],
            "unknown parameter 'itres' (injected into the notebook); did you mean 'iters'?",
        ),
        ("10_analyse_scaling", ["-p", "sytem", "x"], "did you mean 'system'?"),
    ]
    for notebook, args, error in cases:
        t0 = time.monotonic()
        p = subprocess.run(
            [sys.executable, "-m", "kernels.notebook.runner", "run", f"notebooks/{notebook}.ipynb", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if notebook == "01_train" and args[1] == "btach":
            record_fault(
                "notebook parameter misspelt (lab run ... -p btach 32)",
                10,
                time.monotonic() - t0,
                p.returncode,
                "refused, nothing written",
            )
        assert p.returncode == 2 and error in p.stderr, (notebook, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and "papermill" not in p.stdout.lower(), p.stdout + p.stderr
        assert not (tmp_path / "results").exists()  # no staged notebook, no HTML, no record
    # a good parameter set still runs (the notebook's own check agrees with the runner's)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernels.notebook.runner",
            "run",
            "notebooks/01_train.ipynb",
            "-p",
            "dataset",
            "digits",
            "-p",
            "width",
            "4",
            "-p",
            "epochs",
            "1",
            "-p",
            "precision",
            "fp32",
            "-y",
            "train_samples: 128\ntest_samples: 64\nbatch: 32",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0 and "notebook complete" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]


def test_an_integer_beyond_what_its_use_can_hold_is_refused_at_once():
    """--epochs 99999999999999999999999 was accepted and ran without end. Every integer parameter of a run and of a
    commbench is bounded by a C int, and the error says the bound."""
    t0 = time.monotonic()
    p = lab(*BASE, "--epochs", "99999999999999999999999")
    record_fault("--epochs 99999999999999999999999", 10, time.monotonic() - t0, p.returncode, "refused")
    assert p.returncode == 2 and "parameter 'epochs': 99999999999999999999999 is beyond what it can hold" in p.stderr
    assert "2,147,483,647" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "kernels.comm", "bench", "--iters", str(2**31)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "parameter 'iters': 2147483648 is beyond what it can hold" in p.stderr, p.stderr
    from kernels.base.params import COMMON, coerce

    gpus = next(x for x in COMMON if x.name == "gpus")
    assert coerce(gpus, str(2**31 - 1)) == 2**31 - 1 and coerce(gpus, "-3") == -3  # the range checks say the rest


def test_a_stop_point_is_absolute(tmp_path):
    """Running the same `--stop_after_steps 5` command again did one more step each time. A run already at its
    stop point does nothing and says so; a later stop point goes on from where it stopped."""
    run = tmp_path / "r"
    first = lab(*BASE, *EPOCHS, "--gpus", "1", "--stop_after_steps", "5", "--results_dir", tmp_path, "--run_id", "r")
    assert first.returncode == 0 and summary(run)["steps_done"] == 5
    before = (run / "summary.json").read_bytes()
    t0 = time.monotonic()
    p = lab(*BASE, *EPOCHS, "--gpus", "1", "--stop_after_steps", "5", "--results_dir", tmp_path, "--run_id", "r")
    record_fault(
        "the same --stop_after_steps command again", 10, time.monotonic() - t0, p.returncode, "nothing done, said so"
    )
    assert p.returncode == 0 and "run r has already done 5 steps, stop_after_steps=5: nothing to do" in p.stdout
    assert (run / "summary.json").read_bytes() == before  # not even a new attempt in the record
    p = lab(*BASE, *EPOCHS, "--gpus", "1", "--stop_after_steps", "8", "--results_dir", tmp_path, "--run_id", "r")
    assert p.returncode == 0 and summary(run)["steps_done"] == 8 and summary(run)["status"] == "stopped"


def _cut(path: Path) -> None:
    """Cut a file mid-write, inside its last row: a CSV keeps that row's first field only (a cut inside the last
    value alone would leave a well-formed file), a JSON file loses its end."""
    data = path.read_bytes()
    if path.suffix == ".csv":
        last = data.rstrip(b"\n").rfind(b"\n") + 1
        path.write_bytes(data[: data.index(b",", last)])
    else:
        path.write_bytes(data[: len(data) - max(3, min(40, len(data) // 5))])


def test_one_damaged_file_never_sinks_the_report(tmp_path):
    """One metrics.csv cut mid-row made the whole analysis and `lab paper` fail for every run. A report builds
    from a results folder holding one damaged copy of every kind of record file (a real profiled run's and a real
    commbench record's); each damaged record is left out, listed with the file and the reason."""
    import shutil

    import yaml

    from kernels.records import schema as records
    from kernels import report

    res = tmp_path / "results"
    env = {**os.environ, "LAB_RESULTS": str(res)}
    p = lab(
        "--dataset",
        "digits",
        "--width",
        "4",
        "--batch",
        "64",
        "--precision",
        "fp32",
        "--gpus",
        "2",
        "--epochs",
        "2",
        "--profile_steps",
        "2",
        "--profile_wait",
        "2",
        "--comm_probe_steps",
        "0",
        "--label",
        "dmg",
        "--run_id",
        "good",
        "--results_dir",
        res / "runs",
        env=env,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernels.comm",
            "bench",
            "--backend",
            "gloo",
            "--gpus",
            "2",
            "--ops",
            "all_reduce",
            "--max_bytes",
            "64K",
            "--iters",
            "2",
            "--repeats",
            "1",
            "--run_id",
            "cgood",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    good, cgood = res / "runs" / "good", res / "comm" / "cgood"
    assert all((good / f).exists() for f in ("monitor.csv", "breakdown.csv", "top_ops.csv"))
    damage = {
        "config.json": _cut,
        "summary.json": _cut,
        "metrics.csv": _cut,
        "monitor.csv": _cut,
        "breakdown.csv": _cut,
        "top_ops.csv": _cut,
    }
    for name, harm in damage.items():
        copy = res / "runs" / f"bad-{name.replace('.', '-')}"
        shutil.copytree(good, copy)
        harm(copy / name)
    missing_field = res / "runs" / "bad-metrics-field"  # a row with a field fewer, the file otherwise whole
    shutil.copytree(good, missing_field)
    lines = (missing_field / "metrics.csv").read_text().splitlines()
    (missing_field / "metrics.csv").write_text("\n".join(lines[:-1] + [lines[-1].rsplit(",", 1)[0]]) + "\n")
    edited = res / "runs" / "bad-summary-edited"  # by hand: numbers as strings, a NaN, and no checksum
    shutil.copytree(good, edited)
    s = json.loads((edited / "summary.json").read_text())
    s.update(samples_per_s=str(s["samples_per_s"]), final_eval_acc=float("nan"))
    del s["checksum"]
    (edited / "summary.json").write_text(json.dumps(s))
    rechecked = res / "runs" / "bad-summary-typed"  # the same, its checksum recomputed: the types still refuse it
    shutil.copytree(good, rechecked)
    s.pop("final_eval_acc")
    records.write_json(rechecked / "summary.json", s)
    foobar = res / "runs" / "bad-metrics-foobar"  # another program's CSV where metrics.csv belongs
    shutil.copytree(good, foobar)
    (foobar / "metrics.csv").write_text("foo,bar\n1,2\n")
    for name in ("results.csv", "summary.json", "config.json"):
        copy = res / "comm" / f"bad-{name.replace('.', '-')}"
        shutil.copytree(cgood, copy)
        _cut(copy / name)

    plan = yaml.safe_load((ROOT / "paper" / "plan.yaml").read_text())
    systems = yaml.safe_load((ROOT / "paper" / "systems.yaml").read_text())
    t0 = time.monotonic()
    built = report.build(res / "runs", res, plan, systems, select={"labels": ["dmg"], "studies": []})
    record_fault(
        "one damaged copy of every record file in the results folder",
        60,
        time.monotonic() - t0,
        0,
        "report built, each damaged record listed",
    )
    assert built["runs"]["run_id"].tolist() == ["good"]
    problems = built["problems"].set_index("run_id")
    expect = {
        **{f"bad-{n.replace('.', '-')}": n for n in damage},
        "bad-metrics-field": "metrics.csv",
        "bad-summary-edited": "summary.json: no checksum",
        "bad-summary-typed": "'samples_per_s' is '",
        "bad-metrics-foobar": "metrics.csv: not a metrics file",
        **{f"comm/bad-{n.replace('.', '-')}": n for n in ("results.csv", "summary.json", "config.json")},
    }
    for run_id, name in expect.items():
        assert problems.loc[run_id, "status"] == "unreadable" and name in problems.loc[run_id, "reason"], run_id
    listed = (res / "tables" / "excluded.csv").read_text()
    notes = (res / "tables" / "data_notes.tex").read_text()
    assert all(run_id in listed for run_id in expect) and all(
        r.replace("_", "\\_") in notes or r in notes for r in expect
    )
