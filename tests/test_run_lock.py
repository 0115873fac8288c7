"""The run lock is a lock: processes racing for one run directory never both hold it.

Each round forks 2 or 8 processes that wait at a barrier, try RunLock.acquire at once, and keep what
they got until every one has tried. Half the rounds start with a stale lock in place (its pid is dead),
so the racers also race to take it over. Exactly one must win each round.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time

import pytest

from kernels.records import schema as records
from kernels.base.errors import ConfigError

from conftest import record_fault

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def _racer(run_dir, start, tried, results):
    lock = records.RunLock(run_dir)
    start.wait()
    try:
        lock.acquire()
        results.put("held")
    except ConfigError as e:
        results.put("refused" if "is in use by another run" in str(e) else f"error: {e}")
    except Exception as e:  # noqa: BLE001 - any other failure is a finding, reported to the parent
        results.put(f"error: {type(e).__name__}: {e}")
    tried.wait()  # hold it until every racer has tried


def _dead_pid() -> int:
    p = mp.get_context("fork").Process(target=lambda: None)
    p.start()
    p.join()
    return p.pid


def _round(run_dir, n: int, stale: bool) -> list[str]:
    ctx = mp.get_context("fork")
    run_dir.mkdir(parents=True, exist_ok=True)
    for f in run_dir.iterdir():
        f.unlink()
    if stale:
        import socket

        (run_dir / ".lock").write_text(
            json.dumps(
                {
                    "host": socket.gethostname(),
                    "pid": _dead_pid(),
                    "slurm_job": None,
                    "started_utc": "2026-01-01T00:00:00+00:00",
                }
            )
        )
    start, tried, results = ctx.Barrier(n), ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(run_dir, start, tried, results)) for _ in range(n)]
    for p in procs:
        p.start()
    out = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return out


@pytest.mark.parametrize("n,rounds", [(2, 60), (8, 20)])
def test_racing_processes_never_both_hold_the_lock(tmp_path, monkeypatch, n, rounds):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    t0, outcomes = time.monotonic(), []
    for i in range(rounds):
        got = _round(tmp_path / "run", n, stale=i % 2 == 1)
        assert not [g for g in got if g.startswith("error")], got
        outcomes.append(got.count("held"))
    record_fault(
        f"{n} processes racing for one run's lock, {rounds} rounds (half over a stale lock)",
        60,
        time.monotonic() - t0,
        0,
        f"one holder in {outcomes.count(1)} of {rounds} rounds",
    )
    assert outcomes == [1] * rounds, outcomes


def test_an_unreadable_lock_is_held_while_fresh_and_stale_after(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text("")  # what a run of an earlier lab held between its create and its write
    with pytest.raises(ConfigError, match="in use by another run .*unreadable"):
        records.RunLock(run).acquire()
    old = time.time() - records.RunLock.UNREADABLE_STALE_S - 5
    os.utime(run / ".lock", (old, old))
    lock = records.RunLock(run)
    lock.acquire()
    assert lock.held and json.loads((run / ".lock").read_text())["pid"] == os.getpid()
    assert sorted(p.name for p in run.iterdir()) == [".lock"]  # no private file or break lock left behind
    lock.release()
    assert not list(run.iterdir())
