"""The proposal's work plan (its table and Gantt chart) and its "support needed" paragraph, from paper/plan.yaml.

Work packages carry their months and milestone; the milestones are numbered M1, M2, ... in the plan's order and
fall at the package's last month. Placeholders in the plan's text ({system}, {gpus_per_node}, {max_gpus},
{repeats}, {network}, {max_nodes}, {time_limit}, {storage}) are filled from the plan, the target system, the batch
script and the data format, so no figure is typed twice.
"""

from __future__ import annotations

import math
import re

from kernels.base.errors import ConfigError
from kernels.base.files import PROJECT_ROOT
from kernels.report.context import Context
from kernels.analysis.tex import tex_escape

BATCH_SCRIPT = PROJECT_ROOT / "slurm" / "papermill_run.sbatch"
PACKAGE_KEYS = {"package", "work", "months", "milestone"}


def check(plan: dict, where: str = "paper/plan.yaml") -> None:
    """The work plan's shape: a list of packages with package, work, months [first, last] and milestone."""
    packages = plan.get("work_plan")
    if not isinstance(packages, list) or not packages:
        raise ConfigError(
            f"{where}: key 'work_plan' needs a list of work packages, each with {', '.join(sorted(PACKAGE_KEYS))}"
        )
    for i, p in enumerate(packages, 1):
        if not isinstance(p, dict) or set(p) != PACKAGE_KEYS:
            got = ", ".join(sorted(p)) if isinstance(p, dict) else repr(p)
            raise ConfigError(
                f"{where}: work_plan entry {i} needs exactly {', '.join(sorted(PACKAGE_KEYS))}; got {got}"
            )
        m = p["months"]
        if not (isinstance(m, list) and len(m) == 2 and all(isinstance(x, int) for x in m) and 1 <= m[0] <= m[1]):
            raise ConfigError(
                f"{where}: work_plan entry {i} ({p['package']}): months must be [first, last] with "
                f"1 <= first <= last, got {m!r}"
            )
    support = plan.get("support")
    if not isinstance(support, list) or not all(isinstance(s, str) for s in support):
        raise ConfigError(f"{where}: key 'support' needs a list of sentences (what the centre is asked for)")
    texts = [(f"work_plan entry {i} ({p['package']}): {k}", p[k]) for i, p in enumerate(packages, 1) for k in TEXTS]
    for what, text in [*texts, *((f"support item {i}", s) for i, s in enumerate(support, 1))]:
        if not isinstance(text, str):
            raise ConfigError(f"{where}: {what} must be text, got {text!r}")
        unknown = [n for n in re.findall(r"{(\w+)}", text) if n not in FIELDS]
        if unknown:  # found here, before the analysis, not in its notebook
            raise ConfigError(
                f"{where}: {what}: unknown placeholder {{{unknown[0]}}}; known: "
                f"{', '.join('{' + k + '}' for k in FIELDS)}"
            )


def time_limit(script=BATCH_SCRIPT) -> str:
    """The batch script's #SBATCH --time, as written (e.g. 02:00:00)."""
    found = re.search(r"^#SBATCH --time=(\S+)", script.read_text(), re.M)
    return found.group(1) if found else "the cluster's default"


def storage_bytes(plan: dict) -> int | None:
    """Bytes of the I/O study's streamed data set: its samples in the shard format's fixed-size records."""
    from kernels.data.bigmnist import RECORD_BYTES

    io = plan.get("io_study")
    return int(io["samples"]) * RECORD_BYTES if io else None


# The placeholders a work package, a milestone or a support item may hold (fields() fills them)
FIELDS = ("system", "gpus_per_node", "max_gpus", "repeats", "network", "max_nodes", "time_limit", "storage")
TEXTS = ("package", "work", "milestone")  # a work package's text, printed in the proposal and the pitch


def fields(ctx: Context) -> dict:
    plan, system = ctx.plan, ctx.system
    size = storage_bytes(plan)
    return {
        "system": system["name"],
        "gpus_per_node": system["gpus_per_node"],
        "max_gpus": max(plan["gpus"]),
        "repeats": plan["repeats"],
        "network": system["network"],
        "max_nodes": math.ceil(max(plan["gpus"]) / system["gpus_per_node"]),
        "time_limit": time_limit(),
        "storage": f"{math.ceil(size / 1e9)} GB" if size else None,
    }


def fill(text: str, values: dict, where: str) -> str | None:
    """`text` with its placeholders filled and escaped for LaTeX; None when a value it names does not exist."""
    names = re.findall(r"{(\w+)}", text)
    unknown = [n for n in names if n not in values]
    if unknown:
        raise ConfigError(
            f"paper/plan.yaml: {where}: unknown placeholder {{{unknown[0]}}}; "
            f"known: {', '.join('{' + k + '}' for k in values)}"
        )
    if any(values[n] is None for n in names):
        return None
    return re.sub(r"(?<= )x(?= )", r"$\\times$", tex_escape(text.format(**values)))  # "batch x precision"


def table(packages: list[dict], values: dict) -> str:
    lines = [
        "\\begin{tabularx}{\\linewidth}{@{}lp{0.17\\linewidth}Xp{0.27\\linewidth}@{}}",
        "\\toprule",
        "Months & Package & Work & Milestone \\\\",
        "\\midrule",
    ]
    for i, p in enumerate(packages, 1):
        first, last = p["months"]
        months = str(first) if first == last else f"{first}--{last}"
        lines.append(
            f"{months} & {tex_escape(p['package'])} & {fill(p['work'], values, f'work package {i}')} & "
            f"M{i} {fill(p['milestone'], values, f'milestone {i}')} \\\\"
        )
    return "\n".join(lines + ["\\bottomrule", "\\end{tabularx}"]) + "\n"


def gantt(packages: list[dict]) -> str:
    """A pgfgantt chart: one bar per package over its months, its milestone a diamond at the last month."""
    months = max(p["months"][1] for p in packages)
    unit = 0.62 / months
    lines = [
        f"\\begin{{ganttchart}}[hgrid, vgrid, x unit={unit:.4f}\\linewidth, y unit chart=0.5cm, "
        "y unit title=0.5cm, bar height=0.5, bar/.append style={fill=black!25}, "
        "milestone/.append style={fill=black}, milestone height=0.5, milestone left shift=0.88, "
        "milestone right shift=0.12, milestone inline label node/.append style={right=0.5mm}, "
        "bar label font=\\small, title label font=\\small]"
        f"{{1}}{{{months}}}",
        f"\\gantttitle{{Month}}{{{months}}} \\\\",
        f"\\gantttitlelist{{1,...,{months}}}{{1}} \\\\",
    ]
    for i, p in enumerate(packages, 1):
        first, last = p["months"]
        lines.append(
            f"\\ganttbar{{WP{i} {tex_escape(p['package'])}}}{{{first}}}{{{last}}}"
            f"\\ganttmilestone[inline]{{M{i}}}{{{last}}} \\\\"
        )
    lines[-1] = lines[-1].removesuffix(" \\\\")
    return "\n".join(lines + ["\\end{ganttchart}"]) + "\n"


def milestone_table(packages: list[dict], values: dict) -> str:
    """The pitch's milestones: each package's, numbered as in the proposal, at its package's last month."""
    rows = [
        f"M{i} & month {p['months'][1]} & {fill(p['milestone'], values, f'milestone {i}') or '--'}\\\\"
        for i, p in enumerate(packages, 1)
    ]
    return "\n".join(["\\begin{tabular}{@{}lll@{}}", "\\toprule", *rows, "\\bottomrule", "\\end{tabular}"]) + "\n"


def support_items(support: list[str], values: dict) -> list[str]:
    """The support items with their placeholders filled; an item whose value does not exist is left out."""
    items = [fill(s, values, f"support item {i}") for i, s in enumerate(support, 1)]
    return [s for s in items if s]


def support_text(items: list[str]) -> str:
    if not items:
        return ""
    return (
        "\\textbf{Support needed.} Besides the node-hours, the study needs from the centre: " + "; ".join(items) + ".\n"
    )


def support_slide(items: list[str]) -> str:
    """The pitch's support slide body: the same items as the proposal's paragraph, as bullets."""
    if not items:
        return "Besides the node-hours, the study needs nothing from the centre (paper/plan.yaml: support).\n"
    return "\\begin{itemize}\\small\n" + "".join(f"\\item {s[0].upper()}{s[1:]}.\n" for s in items) + "\\end{itemize}\n"


def section(ctx: Context) -> None:
    packages, values = ctx.plan["work_plan"], fields(ctx)
    ctx.put("workplan_table.tex", table(packages, values))
    ctx.put("workplan_gantt.tex", gantt(packages))
    support = support_items(ctx.plan["support"], values)
    ctx.put("support_text.tex", support_text(support))
    ctx.put("support_slide.tex", support_slide(support))
    ctx.put("milestones_slide.tex", milestone_table(packages, values))
    ctx.macro("labLastMilestone", f"M{len(packages)}")
    ctx.macro("labPlanMonths", str(max(p["months"][1] for p in packages)))
