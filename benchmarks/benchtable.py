"""What every benchmark table shares: the header naming the machine and versions, and where the table goes."""
from __future__ import annotations

import os
import re
from pathlib import Path

from kernels import sysinfo


def header(title: str) -> list[str]:
    """The table's title and the line that names host, cores, software versions and git commit."""
    versions = sysinfo.software_versions()
    return [f"# {title}", "",
            f"host {sysinfo.host()}, {os.cpu_count()} CPU cores; " +
            ", ".join(f"{k} {v}" for k, v in versions.items() if v) +
            f"; git {sysinfo.git_info().get('commit') or 'n/a'}", ""]


def write(lines: list[str], out: Path, device_name: str, prefix: str = "") -> Path:
    """Print the table and store it as <out>/<prefix><device slug>.md."""
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device_name).strip("-").lower()
    path = out / f"{prefix}{slug}.md"
    path.write_text(text)
    print("\n" + text + f"\nwritten to {path}")
    return path
