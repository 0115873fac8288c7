"""Write the reliability table of the last fault-injection run into docs/reliability.md (`make reliability`).

Reads results/reliability.json (written by tests/test_faults.py through conftest.py) and
replaces the table between the reliability markers of docs/reliability.md. The table says on which
machine and when it was measured; the times are that run's, not guarantees.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- reliability-table: begin -->", "<!-- reliability-table: end -->"


def table(data: dict) -> str:
    lines = [
        f"Measured by `make reliability` on {data['machine']}, {data['measured_utc']}: the time from the "
        f"injected fault until the run had stopped (checkpointed, failed, refused or, for the damaged "
        f"checkpoint, resumed to its end).",
        "",
        "| fault injected | bound (s) | measured (s) | exit status | record / outcome |",
        "|---|---:|---:|---:|---|",
    ]
    for r in data["rows"]:
        lines.append(f"| {r['case']} | {r['bound_s']:g} | {r['took_s']:.1f} | {r['exit_status']} | {r['outcome']} |")
    return "\n".join(lines)


def main() -> int:
    src = ROOT / "results" / "reliability.json"
    if not src.exists():
        print(f"error: {src} not found: run the fault suite first (make reliability)", file=sys.stderr)
        return 2
    readme = ROOT / "docs" / "reliability.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        print(f"error: docs/reliability.md lacks the markers {BEGIN} ... {END}", file=sys.stderr)
        return 2
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(head + BEGIN + "\n" + table(json.loads(src.read_text())) + "\n" + END + tail)
    print(f"wrote the reliability table ({len(json.loads(src.read_text())['rows'])} cases) into docs/reliability.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
