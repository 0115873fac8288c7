"""`lab paper`: records -> analysis notebook -> figures and tables -> paper, proposal and slides (PDF).

    lab paper [--results DIR] [--system NAME] [--study NAME] [--paper-out DIR] [--slides-out DIR] [--no-appendix]
              [--force]

1. The analysis notebook (notebooks/10_analyse_scaling) runs under Papermill when
   any of its inputs changed: a record (config.json, summary.json, metrics.csv of
   any run, added or deleted), paper/plan.yaml, paper/systems.yaml, the analysis
   code, or the --system/--study choice. Its executed copy and HTML go to
   <results>/analysis/.
2. Each document is built when its source or any generated table or figure
   changed (content fingerprints, not time stamps), in a fresh temporary
   directory with latexmk, so a build from another results folder can never
   reuse a stale one, and paths with spaces work. The PDF replaces the old one
   atomically; a failed build keeps the old PDF and leaves <name>.log beside it.
3. The paper's detail tables and figures (all collectives, fits, engines, profiles, verdicts) sit in an appendix;
   --no-appendix builds the paper without it, within a conference's page limit, and its text then points to the
   full version instead of to the tables.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kernels.base.errors import ConfigError, exit_status
from kernels.base.files import PROJECT_ROOT, atomic_write_bytes, atomic_write_text, cannot_write
from kernels.base.sysinfo import short_of_room, usable_cores

ANALYSIS_NOTEBOOK = PROJECT_ROOT / "notebooks" / "10_analyse_scaling.ipynb"
DOCUMENTS = {
    "paper": PROJECT_ROOT / "paper" / "paper.tex",
    "proposal": PROJECT_ROOT / "paper" / "proposal.tex",
    "pitch": PROJECT_ROOT / "slides" / "pitch.tex",
}
BIB = PROJECT_ROOT / "paper" / "refs.bib"
TEX_PACKAGES = (
    "texlive-latex-base texlive-latex-recommended texlive-fonts-recommended texlive-pictures "
    "texlive-publishers texlive-science latexmk"
)


def fingerprint(files: list[Path], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for f in files:
        h.update(f.name.encode() + b"\0" + str(f.parent.name).encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def reporting_modules() -> list[Path]:
    """The registered workloads' reporting code (criteria, tables, sections): their folder, or their module."""
    from kernels.workloads import registered

    out = []
    for wl in registered():
        if wl.reporting:
            path = PROJECT_ROOT.joinpath(*wl.reporting.split("."))
            out += sorted(path.parent.glob("*.py")) if path.parent.name != "workloads" else [path.with_suffix(".py")]
    return out


def analysis_inputs(runs: Path) -> list[Path]:
    """What the analysis reads: the run records, the committed pilot records and benchmark tables, the code."""
    from kernels.report.evidence import PILOT_DIR

    records = [
        p
        for d in (runs, PILOT_DIR / "runs")
        if d.is_dir()
        for p in sorted(p for pattern in ("*/config.json", "*/summary.json", "*/metrics.csv") for p in d.glob(pattern))
    ]
    records += sorted((PROJECT_ROOT / "results" / "bench").glob("*.json"))  # the criteria read some
    kernels = PROJECT_ROOT / "kernels"  # the code that turns records into the documents' numbers
    code = [
        *sorted((kernels / "analysis").glob("*.py")),
        kernels / "base" / "stats.py",
        ANALYSIS_NOTEBOOK,
        *sorted((kernels / "report").glob("*.py")),
        *reporting_modules(),
        PROJECT_ROOT / "paper" / "plan.yaml",
        PROJECT_ROOT / "paper" / "systems.yaml",
    ]
    return records + code


def check_tex() -> None:
    missing = [t for t in ("latexmk", "pdflatex", "bibtex") if not shutil.which(t)]
    if missing:
        raise ConfigError(
            f"building the documents needs TeX Live ({', '.join(missing)} not found); on Debian/Ubuntu: "
            f"apt-get install --no-install-recommends {TEX_PACKAGES}"
        )


def run_analysis(results: Path, runs: Path, system: str, study: str, force: bool, out=sys.stdout) -> bool:
    """Run the analysis notebook when its inputs changed. True when it ran."""
    from kernels.notebook import runner as notebooks

    stamp = results / "tables" / ".inputs.sha256"
    fp = fingerprint(analysis_inputs(runs), extra=f"{runs.resolve()}|{system}|{study}")
    if not force and stamp.exists() and stamp.read_text() == fp and (results / "tables" / "numbers.tex").exists():
        print("analysis: inputs unchanged, not rerun", file=out, flush=True)
        return False
    rc = notebooks.run(
        ANALYSIS_NOTEBOOK,
        [
            "-p",
            "runs_dir",
            str(runs.resolve()),
            "-p",
            "out_dir",
            str(results.resolve()),
            "-p",
            "system",
            system,
            "-p",
            "study",
            study,
        ],
        name="10_analyse_scaling",
        staging=results / "notebooks",
    )
    if rc != 0:
        raise ConfigError(
            f"the analysis notebook failed (exit status {rc}); the failing cell is in "
            f"{results / 'notebooks' / '10_analyse_scaling.ipynb'} or {results / 'analysis'}"
        )
    atomic_write_text(stamp, fp)
    return True


def _latex_error(log: Path) -> str:
    if not log.exists():
        return "no log written"
    lines = log.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("!"):
            return "\n".join(lines[i : i + 6])
    return "\n".join(lines[-15:])


def build_options(appendix: bool) -> str:
    """build_options.tex: the switches the documents read (\\ifappendix in the paper)."""
    return "\\appendixtrue\n" if appendix else "\\appendixfalse\n"


# Room each output folder needs, checked before the analysis (the demo's: about 2 MiB of tables, figures and the
# executed analysis notebook; PDFs of 0.1-0.3 MiB)
ROOM = {
    "--results": (8 << 20, "the analysis' tables, figures and executed notebook"),
    "--paper-out": (4 << 20, "the paper and the proposal"),
    "--slides-out": (2 << 20, "the slides"),
}
OUT_OPTION = {"paper": "--paper-out", "proposal": "--paper-out", "pitch": "--slides-out"}  # where each PDF goes


def build_document(name: str, tex: Path, results: Path, out_dir: Path, force: bool, appendix: bool = True) -> bool:
    """Build one PDF if its inputs changed. True when built."""
    inputs = [tex, BIB, *sorted((results / "tables").glob("*.tex")), *sorted((results / "figures").glob("*.pdf"))]
    options = build_options(appendix)
    fp = fingerprint(inputs, extra=options)
    pdf, stamp = out_dir / f"{name}.pdf", out_dir / f".{name}.sha256"
    if not force and pdf.exists() and stamp.exists() and stamp.read_text() == fp:
        return False
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lab-tex-") as tmp:
        for f in inputs:
            shutil.copy2(f, Path(tmp) / f.name)
        (Path(tmp) / "build_options.tex").write_text(options)
        p = subprocess.run(
            ["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", tex.name],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        log = Path(tmp) / f"{name}.log"
        if p.returncode != 0 or not (Path(tmp) / f"{name}.pdf").exists():
            if log.exists():
                atomic_write_bytes(out_dir / f"{name}.log", log.read_bytes())
            raise ConfigError(
                f"LaTeX failed on {tex.relative_to(PROJECT_ROOT)} (full log: "
                f"{out_dir / (name + '.log')}):\n"
                f"{_latex_error(log)}"
            )
        # never half a PDF, never through a link
        atomic_write_bytes(pdf, (Path(tmp) / f"{name}.pdf").read_bytes(), OUT_OPTION[name])
    (out_dir / f"{name}.log").unlink(missing_ok=True)
    atomic_write_text(stamp, fp)
    return True


def make(
    results: Path,
    system: str = "",
    study: str = "",
    paper_out: Path | None = None,
    slides_out: Path | None = None,
    force: bool = False,
    out=sys.stdout,
    appendix: bool = True,
) -> dict[str, Path]:
    check_tex()
    results = Path(results)
    runs = results / "runs"
    # the plan and the systems are checked here, before the analysis notebook starts (a duplicate key, an unknown
    # key or system is one line naming the file, not a failed notebook)
    from kernels.base import yamlfile
    from kernels.report import check_plan, placeholders

    systems = yamlfile.read(PROJECT_ROOT / "paper" / "systems.yaml", "systems file")
    if system and system not in systems:
        raise ConfigError(
            f"--system: unknown system '{system}'; choose one of {', '.join(systems)} (paper/systems.yaml)"
        )
    plan = yamlfile.read(PROJECT_ROOT / "paper" / "plan.yaml", "plan")
    check_plan({**plan, "system": system or plan.get("system")}, systems)
    left = placeholders(plan)
    if left:
        print(
            f"warning: paper/plan.yaml: {', '.join(left)} still hold placeholders in <angle brackets>, which the "
            f"documents print as they are; edit them before you share the documents",
            file=out,
            flush=True,
        )
    if study and not re.fullmatch(r"[A-Za-z0-9_.,-]+", study):
        raise ConfigError(
            f"--study: {study!r} must be study ids or labels (letters, digits, '-', '_', '.'), comma-separated"
        )
    warning = study_warning(study, runs) if study else None
    if warning:
        print(warning, file=out, flush=True)
    paper_out = Path(paper_out or PROJECT_ROOT / "paper" / "build")
    slides_out = Path(slides_out or PROJECT_ROOT / "slides" / "build")
    for option, folder in (("--results", results), ("--paper-out", paper_out), ("--slides-out", slides_out)):
        short = short_of_room(folder, ROOM[option][0])  # before the analysis runs, not after its minutes
        if short:
            probe, has, needs = short
            raise ConfigError(
                f"{option}: {probe} has {has} free; {ROOM[option][1]} need about {needs}: free space there or pass "
                f"a folder with room"
            )
        why = cannot_write(folder)
        if why:
            raise ConfigError(f"{option}: cannot write in {folder} ({why}); pass a folder you can write")
    run_analysis(results, runs, system, study, force, out)
    targets = {name: (tex, slides_out if name == "pitch" else paper_out) for name, tex in DOCUMENTS.items()}
    # LaTeX runs on one core: the three documents are built side by side (each in its own temporary directory),
    # then reported in a fixed order; the first failure, in that order, is the one raised
    with ThreadPoolExecutor(max_workers=max(1, min(len(targets), usable_cores()))) as pool:
        jobs = {
            name: pool.submit(build_document, name, tex, results, target, force, appendix)
            for name, (tex, target) in targets.items()
        }
    built = {}
    for name, job in jobs.items():
        changed = job.result()
        built[name] = targets[name][1] / f"{name}.pdf"
        print(f"{name}: {'built' if changed else 'unchanged'} {built[name]}", file=out, flush=True)
    excluded = results / "tables" / "excluded.csv"
    if excluded.exists():
        n = max(0, len(excluded.read_text().splitlines()) - 1)
        if n:
            print(
                f"{n} record(s) were not used (outside the selection, or not complete or unreadable; why is in "
                f"the file): {excluded}",
                file=out,
            )
    return built


def study_warning(study: str, runs: Path) -> str | None:
    """A line naming the first id --study gives that no record carries as its study or label, with the ids the
    records there carry; None when each names some. The documents still build (a proposal is written before its
    study has run), but a misspelt id would otherwise leave only a count of unused records behind."""
    from kernels.analysis.runs import selection_names

    names = selection_names(runs)
    missing = [s for s in study.split(",") if s and s not in names]
    if not missing:
        return None
    there = ", ".join(f"{k} ({n})" for k, n in sorted(names.items(), key=lambda kv: (-kv[1], kv[0]))[:10])
    return (
        f"warning: --study: no record in {runs} belongs to study or label '{missing[0]}' ("
        + (f"the records there name {there}" if names else "that folder holds no records")
        + "); the documents are built without its records: check the spelling, or run the study first"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="lab paper", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--results",
        type=Path,
        default=Path(os.environ.get("LAB_RESULTS") or PROJECT_ROOT / "results"),
        help="results folder holding runs/ (default: <project>/results); figures/ and tables/ go there",
    )
    ap.add_argument(
        "--system", default="", help="EuroHPC target system, a key of paper/systems.yaml (default: paper/plan.yaml's)"
    )
    ap.add_argument(
        "--study",
        default="",
        help="use the records of these studies or labels, comma-separated (default: paper/plan.yaml's select)",
    )
    ap.add_argument(
        "--paper-out", type=Path, default=None, help="where paper.pdf and proposal.pdf go (default: paper/build)"
    )
    ap.add_argument("--slides-out", type=Path, default=None, help="where pitch.pdf goes (default: slides/build)")
    ap.add_argument(
        "--no-appendix",
        dest="appendix",
        action="store_false",
        help="build the paper without its appendix of detail tables (within the page limit)",
    )
    ap.add_argument("--force", action="store_true", help="rerun the analysis and rebuild every document")
    a = ap.parse_args(argv)
    return exit_status(
        lambda: make(a.results, a.system, a.study, a.paper_out, a.slides_out, a.force, appendix=a.appendix) and 0
    )


if __name__ == "__main__":
    sys.exit(main())
