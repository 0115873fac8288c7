"""Where the suite's minutes go: `--durations-table FILE` writes every test's time into a Markdown table.

`make test` passes `--durations-table tests/DURATIONS.md`, so the committed table is the last whole run's:
the machine, the wall time, the time per tier and per module, and the slowest tests. The same run writes
its totals into README.md between the markers below, so the README quotes the table it sits beside. A test's time is
its setup, call and teardown together; a session fixture's start-up (the Slurm cluster, the shared demo
runs) is charged to the first test that asks for it. With several workers (pytest-xdist) the tests'
times add up to more than the wall time; the table gives both.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

from kernels.base.sysinfo import cpu_name

SLOWEST = 30
ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- test-durations: begin -->", "<!-- test-durations: end -->"


def pytest_addoption(parser):
    parser.addoption(
        "--durations-table",
        metavar="FILE",
        default=None,
        help="write every test's duration, per tier and per module, as a Markdown table to FILE",
    )
    parser.addoption(
        "--durations-readme",
        action="store_true",
        help="with --durations-table: also write the totals into README.md's test section",
    )


def _without_group(nodeid: str) -> str:
    """A test's id without the "@group" that --dist loadgroup appends (tests/schedule.py)."""
    head, at, group = nodeid.rpartition("@")
    return head if at and "]" not in group and "::" in head else nodeid


class Recorder:
    def __init__(self, path: Path, config):
        self.path = path
        self.config = config
        self.t0 = time.monotonic()
        self.commit = _commit()  # read before the table is rewritten, so a clean tree reads as clean
        self.seconds: dict[str, float] = defaultdict(float)
        self.tier: dict[str, str] = {}
        self.outcome: dict[str, str] = {}

    def pytest_runtest_logreport(self, report):
        nodeid = _without_group(report.nodeid)
        self.seconds[nodeid] += report.duration
        for key, value in report.user_properties:
            if key == "tier" and value:
                self.tier[nodeid] = value
        if report.when == "call" or report.outcome != "passed":
            if self.outcome.get(nodeid) in (None, "passed"):
                self.outcome[nodeid] = report.outcome

    def pytest_sessionfinish(self, session, exitstatus):
        if hasattr(self.config, "workerinput"):  # an xdist worker: the controller writes the table
            return
        wall = time.monotonic() - self.t0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(render(self.seconds, self.tier, self.outcome, wall, self.config, self.commit))
        if self.config.getoption("--durations-readme"):
            write_readme_totals(
                ROOT / "README.md", totals_line(self.seconds, self.tier, self.outcome, wall, self.config, self.path)
            )


def pytest_configure(config):
    path = config.getoption("--durations-table")
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Recorder(Path(path), config), "durations-table")


def _memory_gib() -> str:
    try:
        kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        return f"{kib / 2**20:.0f} GiB"
    except (OSError, IndexError, ValueError):
        return "? GiB"


def _commit() -> str:
    from kernels.base.sysinfo import git_info

    g = git_info(ROOT)
    if not g["commit"]:
        return "unknown"
    return g["commit"][:7] + (" (with uncommitted changes)" if g["dirty"] else "")


def _m_s(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:04.1f} s" if seconds >= 60 else f"{seconds:.1f} s"


def _workers(config) -> int:
    return getattr(config.option, "numprocesses", None) or 1


def _outcomes(outcome: dict) -> str:
    counts = defaultdict(int)
    for o in outcome.values():
        counts[o] += 1
    return f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"


def _by_tier(seconds: dict, tier: dict) -> dict:
    by_tier = defaultdict(lambda: [0, 0.0])
    for nodeid, s in seconds.items():
        t = tier.get(nodeid, "?")
        by_tier[t][0] += 1
        by_tier[t][1] += s
    return by_tier


def totals_line(seconds: dict, tier: dict, outcome: dict, wall: float, config, table: Path) -> str:
    tiers = _by_tier(seconds, tier)
    per = "; ".join(f"{t} {tiers[t][0]} tests, {_m_s(tiers[t][1])}" for t in TIER_ORDER if t in tiers)
    return (
        f"The last whole run (`{table.relative_to(ROOT) if table.is_relative_to(ROOT) else table}`, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}, {cpu_name()}, {os.cpu_count()} cores, "
        f"{_workers(config)} workers): {_outcomes(outcome)} in {_m_s(wall)} wall; {per}."
    )


def write_readme_totals(readme: Path, line: str) -> None:
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        return
    head, rest = text.split(BEGIN, 1)
    readme.write_text(head + BEGIN + "\n" + line + "\n" + END + rest.split(END, 1)[1])


TIER_ORDER = ("unit", "integration", "system", "?")


def render(seconds: dict, tier: dict, outcome: dict, wall: float, config, commit: str) -> str:
    workers = _workers(config)
    args = " ".join(config.invocation_params.args) or "(none)"
    total = sum(seconds.values())
    lines = [
        "# Test durations",
        "",
        "Written by the test suite itself (`make test` passes `--durations-table tests/DURATIONS.md`; "
        "tests/durations.py). Times are setup + call + teardown per test.",
        "",
        f"- machine: {cpu_name()}, {os.cpu_count()} cores, {_memory_gib()}, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}",
        f"- run: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC at commit {commit}, "
        f"`pytest {args}`, {workers} worker{'s' if workers > 1 else ''}"
        f"{', CI=true' if os.environ.get('CI') == 'true' else ''}",
        f"- outcome: {_outcomes(outcome)}",
        f"- wall time {_m_s(wall)}; the tests' times add up to {_m_s(total)}",
        "",
    ]
    lines += ["## Per tier", "", "| tier | tests | seconds | share |", "|---|---:|---:|---:|"]
    by_tier = _by_tier(seconds, tier)
    for t in TIER_ORDER:
        if t in by_tier:
            n, s = by_tier[t]
            lines.append(f"| {t} | {n} | {s:.1f} | {100 * s / total if total else 0:.0f} % |")
    lines += ["", "## Per module", "", "| module | tests | seconds | share | tiers |", "|---|---:|---:|---:|---|"]
    by_mod = defaultdict(lambda: [0, 0.0, set()])
    for nodeid, s in seconds.items():
        m = nodeid.split("::")[0]
        by_mod[m][0] += 1
        by_mod[m][1] += s
        by_mod[m][2].add(tier.get(nodeid, "?"))
    for m, (n, s, ts) in sorted(by_mod.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {m} | {n} | {s:.1f} | {100 * s / total if total else 0:.0f} % | {', '.join(sorted(ts))} |")
    lines += ["", f"## The {SLOWEST} slowest tests", "", "| test | tier | seconds | outcome |", "|---|---|---:|---|"]
    for nodeid, s in sorted(seconds.items(), key=lambda kv: -kv[1])[:SLOWEST]:
        lines.append(
            f"| `{nodeid.replace('|', chr(92) + '|')}` | {tier.get(nodeid, '?')} | {s:.1f} | "
            f"{outcome.get(nodeid, '?')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit("a pytest plugin: run `make test` (or pytest --durations-table FILE)")
