"""What every section of the report reads (the selected records, the plan) and writes (files, macros)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pandas as pd

from kernels.analysis.tex import gaps_in, write_if_changed


@dataclass
class Context:
    runs: pd.DataFrame  # complete, selected run records (kernels/analysis/runs.load_runs)
    problems: pd.DataFrame  # selected records that are not complete
    excluded: pd.DataFrame  # records outside the selection
    plan: dict  # paper/plan.yaml (with gpus_per_node of the target system)
    systems: dict  # paper/systems.yaml
    out: Path  # <results>: figures/ and tables/ go here
    comm_dir: Path | None = None  # commbench records (results/comm beside results/runs)
    pilot_dir: Path | None = None  # pilot records committed with the lab (kernels/report/evidence.PILOT_DIR)
    macros: dict[str, str] = field(default_factory=dict)
    written: dict[str, bool] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)  # what each generated .tex file holds (gaps, presence)
    section: str = ""  # the section writing now (its gaps are listed under it)
    gaps: dict[str, list[str]] = field(default_factory=dict)  # section -> the gap texts of the files it wrote
    results: dict = field(default_factory=dict)  # data frames for the notebook

    @property
    def system(self) -> dict:
        return self.systems[self.plan["system"]]

    @cached_property
    def comm_records(self) -> list[dict]:
        """Every complete commbench record in comm_dir, read once for all sections (unselected); one that cannot
        be read joins `problems` (the documents list it) instead of stopping the build."""
        from kernels.comm.predict import load_comm_records

        if not (self.comm_dir and self.comm_dir.is_dir()):
            return []
        unreadable: list[dict] = []
        recs = load_comm_records(self.comm_dir, unreadable)
        if unreadable:
            self.problems = pd.concat([self.problems, pd.DataFrame(unreadable)], ignore_index=True)
        return recs

    @cached_property
    def selected_comm(self) -> list[dict]:
        """The commbench records of the selection's labels and studies (every one when nothing is selected)."""
        sel = self.plan.get("select") or {}
        names = set(sel.get("labels") or []) | set(sel.get("studies") or [])
        if not names:
            return self.comm_records
        return [r for r in self.comm_records if (r["config"].get("params") or {}).get("label") in names]

    @cached_property
    def hardware(self) -> set[str]:
        """The devices of the selected run and commbench records: Table I's hardware, the only hardware whose
        numbers the documents quote."""
        devs = set(self.runs["device"].dropna()) if not self.runs.empty else set()
        return devs | {
            r["device"] for rec in self.selected_comm for r in rec["config"].get("rank_list") or [] if r.get("device")
        }

    @property
    def tables(self) -> Path:
        return self.out / "tables"

    @property
    def on_gpu(self) -> bool:
        return not self.runs.empty and not self.runs["device"].str.startswith("CPU").all()

    def put(self, name: str, text: str) -> None:
        """A generated .tex file under tables/ (rewritten only when it changes)."""
        self.written[name] = write_if_changed(self.tables / name, text)
        self.texts[name] = text
        self.gaps.setdefault(self.section, []).extend(gaps_in(text))

    def macro(self, name: str, value) -> None:
        if name in self.macros:
            raise ValueError(f"macro \\{name} defined twice")
        self.macros[name] = str(value)
