"""Figures, LaTeX tables, sentences and number macros from the run records (for `lab paper`).

Everything the paper, the proposal and the slides show comes from here:
    <out>/figures/*.pdf|png     figures (PDF for LaTeX, PNG for slides/README)
    <out>/tables/*.tex          booktabs tables, generated sentences and framed gaps (\\input by the documents)
    <out>/tables/numbers.tex    \\newcommand macros for numbers the static text quotes
One module per section (lab contents and validation, scaling, I/O, communication, profiling, the
targets, the resource request), and a workload's own section where its reporting module has one
(kernels/workloads/base.py: `reporting`); each reads the selected records from a Context and writes
its files and macros. A sentence is generated only when its numbers exist;
missing data gives a \\gap{...} note, never "n/a" in prose: the paper lists every gap once
under "Not yet measured" and typesets a float only when its file holds measurements
(has.tex); the proposal and the slides frame a gap where it stands. Files are
rewritten only when their content changes, so documents rebuild only when an
input really changed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from kernels.analysis import runs as analysis
from kernels.report import comm, conclusion, criteria_table, io, lab, profiling_section, request, scaling, workplan
from kernels.report.context import Context
from kernels.report.evidence import PILOT_DIR
from kernels.report.planned import describe, planned_points
from kernels.analysis.tex import booktabs, macros_file, not_measured_list, presence_file, tex_escape, write_if_changed

# criteria and request use the scaling results, request the I/O ones too: keep them last; the workloads' own
# sections come after I/O
SECTIONS = (
    ("Setup", lab),
    ("Scaling and optimisations", scaling),
    ("Input and output", io),
    ("Communication", comm),
    ("Profiling", profiling_section),
    ("Targets", criteria_table),
    ("Resource request", request),
    ("Work plan", workplan),
    ("Conclusion", conclusion),
)


def sections() -> list[tuple[str, object]]:
    """(title, module with section(ctx)) in the documents' order, the registered workloads' sections included."""
    from kernels.workloads import registered, reporting_of

    own = [(m.TITLE, m) for m in map(reporting_of, registered()) if m is not None and hasattr(m, "section")]
    return [*SECTIONS[:3], *own, *SECTIONS[3:]]


IDENTITY = {
    "author": "author line of the paper and the slides",
    "affiliation": "affiliation line of the paper",
    "pi": "the proposal's principal investigator",
    "institution": "the proposal's applicant institution",
    "repository": "where the code and the run records are published",
}
PLAN_KEYS = {
    "system": "a key of paper/systems.yaml",
    **IDENTITY,
    "select": "records the documents use: labels, studies",
    "workloads": "workloads the proposed study covers (objectives)",
    "studies": "the study files whose runs the request costs (studies/*.yaml)",
    "profiling_overhead": "extra share for profiled and failed runs",
    "assumed_efficiency": "efficiency assumed where a point is not measured yet",
    "margin": "share added to the computed node-hours in the request",
    "round_to": "the request is rounded up to a multiple of this",
    "io_study": "the planned I/O study (MNIST vs bigMNIST): gpus, epochs, samples, runs_per_point, repeats",
    "work_plan": "the proposal's work packages: package, work, months [first, last], milestone",
    "support": "what the proposal asks of the centre besides node-hours (support needed)",
}


def check_plan(plan: dict, systems: dict, where: str = "paper/plan.yaml") -> pd.DataFrame:
    """Refuse a bad plan in one line; return its planned runs (the study files, read once)."""
    from kernels.base.errors import ConfigError
    from kernels.base.params import unknown_name_error

    for k in plan:
        if k not in PLAN_KEYS:
            raise ConfigError(
                str(unknown_name_error(k, where=f" in {where}", known=PLAN_KEYS)).replace(
                    "unknown parameter", "unknown key"
                )
            )
    missing = [k for k in PLAN_KEYS if k not in plan and k not in ("select", "affiliation", "io_study")]
    if missing:
        raise ConfigError(f"{where}: missing key(s) {', '.join(missing)} ({'; '.join(PLAN_KEYS[k] for k in missing)})")
    if plan["system"] not in systems:
        raise ConfigError(
            f"{where}: key 'system': unknown system '{plan['system']}'; "
            f"choose one of {', '.join(systems)} (paper/systems.yaml)"
        )
    _check_kinds(plan, where)
    for k in ("margin", "profiling_overhead"):
        if not 0 <= float(plan[k]) <= 5:
            raise ConfigError(f"{where}: key '{k}' must be a fraction such as 0.2, got {plan[k]!r}")
    if not 0 < float(plan["assumed_efficiency"]) <= 1:
        raise ConfigError(f"{where}: key 'assumed_efficiency' must be in (0, 1], got {plan['assumed_efficiency']!r}")
    io = plan.get("io_study")
    if io is not None:
        need = {"gpus", "epochs", "samples", "runs_per_point", "repeats"}
        if not isinstance(io, dict) or set(io) != need:
            raise ConfigError(
                f"{where}: key 'io_study' needs exactly {', '.join(sorted(need))}, got "
                f"{', '.join(sorted(io)) if isinstance(io, dict) else io!r}"
            )
        for k, v in io.items():
            values = v if k == "gpus" else [v]
            if not isinstance(values, list) or not values or not all(_whole(x) and x >= 1 for x in values):
                shape = "a list of GPU counts, e.g. [1, 4, 8]" if k == "gpus" else "a whole number >= 1"
                raise ConfigError(f"{where}: key 'io_study.{k}' must be {shape}, got {v!r}")
    if int(plan["round_to"]) < 1:
        raise ConfigError(f"{where}: key 'round_to' must be >= 1")
    points = planned_points(plan, where)  # every study file loads
    workplan.check(plan, where)
    return points


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_kinds(plan: dict, where: str) -> None:
    """Each key's kind: text where the documents print text, lists where they list, numbers where they compute (a
    string where a list belongs was read one character at a time; '10%' for a share was a ValueError)."""
    from kernels.base.errors import ConfigError

    for k in ("system", *IDENTITY):
        if k in plan and not isinstance(plan[k], str):
            raise ConfigError(f"{where}: key '{k}' must be text ({PLAN_KEYS[k]}), got {plan[k]!r}")
    for k, example in (("workloads", "[ResNet-18 on CIFAR-10]"), ("studies", "[studies/strong_resnet18_seed.yaml]")):
        if not isinstance(plan[k], list) or not plan[k] or not all(isinstance(x, str) for x in plan[k]):
            raise ConfigError(f"{where}: key '{k}' must be a list of text, e.g. {example}, got {plan[k]!r}")
    select = plan.get("select") or {}
    if not isinstance(select, dict) or set(select) - {"labels", "studies"}:
        raise ConfigError(f"{where}: key 'select' must map labels and studies to lists, got {select!r}")
    for k, v in select.items():
        if not isinstance(v or [], list) or not all(isinstance(x, str) for x in v or []):
            raise ConfigError(f"{where}: key 'select.{k}' must be a list of ids, e.g. [demo], got {v!r}")
    for k in ("margin", "profiling_overhead", "assumed_efficiency", "round_to"):
        if isinstance(plan[k], bool) or not isinstance(plan[k], (int, float)):
            raise ConfigError(f"{where}: key '{k}' must be a number ({PLAN_KEYS[k]}), got {plan[k]!r}")


def placeholders(plan: dict) -> list[str]:
    """The identity keys of the plan that still hold a placeholder (a value in <angle brackets>)."""
    return [k for k in IDENTITY if re.fullmatch(r"\s*<.*>\s*", str(plan.get(k) or ""))]


def with_points(plan: dict, systems: dict, points: pd.DataFrame) -> dict:
    """The plan with what the sections read from its study files: every run (points), the GPU counts, the
    scaling studies' repeats; and the target's GPUs per node."""
    scaling = points[points["mode"].isin(("strong", "weak"))]
    return {
        **plan,
        "points": points,
        "gpus": sorted(int(n) for n in points["gpus"].unique()),
        "repeats": int((scaling if not scaling.empty else points)["repeat"].max()) + 1,
        "gpus_per_node": systems[plan["system"]]["gpus_per_node"],
    }


def plan_macros(ctx: Context) -> None:
    plan, system = ctx.plan, ctx.system
    m = ctx.macro
    m("labAuthor", tex_escape(plan["author"]))
    m("labAffiliation", tex_escape(plan.get("affiliation") or ""))
    m("labAuthorLine", tex_escape(", ".join(x for x in (plan["author"], plan.get("affiliation")) if x)))
    for key, name in (("pi", "labPi"), ("institution", "labInstitution"), ("repository", "labRepository")):
        m(name, tex_escape(plan[key]))
    m("labSystem", tex_escape(system["name"]))
    m("labSystemGpu", tex_escape(system["gpu"]))
    m("labSystemGpusPerNode", str(system["gpus_per_node"]))
    m("labSystemNetwork", tex_escape(system["network"]))
    m("labPlanWorkloads", tex_escape(" and ".join(plan["workloads"])))
    m("labPlanRepeats", str(plan["repeats"]))
    m("labPlanRuns", str(len(plan["points"])))
    m("labPlanStudies", str(plan["points"]["study"].nunique()))
    m("labPlanMaxGpus", str(max(plan["gpus"])))
    m("labPlanGpus", ", ".join(str(g) for g in plan["gpus"]))
    ctx.put("study_plan.tex", describe(plan["points"]) + "\n")
    m("labPlanOverhead", f"{100 * plan['profiling_overhead']:.0f}")
    m("labPlanEff", f"{100 * plan['assumed_efficiency']:.0f}")
    m("labPlanEffFrac", f"{plan['assumed_efficiency']:.2f}")
    m("labPlanMargin", f"{100 * plan['margin']:.0f}")
    m("labPlanRoundTo", str(plan["round_to"]))
    rows = pd.DataFrame([{"key": k, **v} for k, v in ctx.systems.items()])
    rows["target"] = ["$\\leftarrow$" if k == plan["system"] else "" for k in rows["key"]]
    ctx.put(
        "systems_table.tex",
        booktabs(
            rows,
            {
                "name": ("System", "s"),
                "gpu": ("GPU", "s"),
                "gpus_per_node": ("GPUs/node", "d"),
                "network": ("Network", "s"),
                "target": ("", "raw"),
            },
            size="\\small",
            spec="@{}p{0.28\\linewidth}p{0.3\\linewidth}rp{0.22\\linewidth}l@{}",
        ),
    )


def build(
    runs_dir: Path, out: Path, plan: dict, systems: dict, select: dict | None = None, pilot_dir: Path | None = PILOT_DIR
) -> dict:
    """Run the whole analysis and write figures, tables, sentences and macros under `out`.

    select: which records (labels/studies); None takes the plan's `select`.
    pilot_dir: committed pilot records the request is priced from where no selected record may (None: none).
    """
    points = check_plan(plan, systems)
    select = plan.get("select") if select is None else select
    runs, problems, excluded = analysis.load_runs(runs_dir, select)
    plan = {**with_points(plan, systems, points), "select": select}
    ctx = Context(
        runs=runs,
        problems=problems,
        excluded=excluded,
        plan=plan,
        systems=systems,
        out=Path(out),
        comm_dir=Path(runs_dir).parent / "comm",
        pilot_dir=pilot_dir,
    )
    plan_macros(ctx)
    _ = ctx.comm_records  # read first: an unreadable commbench record joins the problems the lab section lists
    for title, part in sections():
        ctx.section = title
        part.section(ctx)
    ctx.section = ""
    ctx.put("not_measured.tex", not_measured_list({k: v for k, v in ctx.gaps.items() if k}))
    ctx.written["has.tex"] = write_if_changed(ctx.tables / "has.tex", presence_file(ctx.texts))
    ctx.results.update(not_measured={k: v for k, v in ctx.gaps.items() if k and v})
    ctx.written["numbers.tex"] = write_if_changed(ctx.tables / "numbers.tex", macros_file(ctx.macros))
    # every record not used, and why: outside the selection, or not complete (failed, unreadable, ...)
    unused = pd.concat([excluded.assign(reason="outside the selection"), ctx.problems], ignore_index=True)
    unused = unused.reindex(columns=["run_id", "label", "study", "status", "reason"]).fillna("")
    ctx.written["excluded.csv"] = write_if_changed(ctx.tables / "excluded.csv", unused.to_csv(index=False))
    return {"runs": runs, "problems": ctx.problems, "excluded": excluded, "written": ctx.written, **ctx.results}
