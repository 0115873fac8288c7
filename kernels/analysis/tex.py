"""LaTeX building blocks for generated tables, sentences and number macros."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from kernels.base.files import atomic_write_bytes


def write_if_changed(path: Path, data: bytes | str) -> bool:
    """Write `data` atomically unless the file already holds it; True when written."""
    data = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_bytes() == data:
        return False
    atomic_write_bytes(path, data, "results folder (lab paper --results, or LAB_RESULTS)")
    return True


def tex_escape(s) -> str:
    s = str(s)
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("$", r"\$"),
        ("#", r"\#"),
        ("_", r"\_"),
        ("{", r"\{"),
        ("}", r"\}"),
        ("~", r"\textasciitilde{}"),
        ("^", r"\^{}"),
        ("<", r"\textless{}"),
        (">", r"\textgreater{}"),
    ):  # < and > print as such in any font encoding
        s = s.replace(a, b)
    while "--" in s:  # an option's two hyphens, not TeX's en or em dash
        s = s.replace("--", "-{}-")
    return s


GAP = "\\gap{"


def gap_note(text: str) -> str:
    """`\\gap{text}`: missing data, never a number that is not there. Each document defines \\gap: the paper
    prints nothing in place and lists every gap once under "Not yet measured" (not_measured.tex); the proposal
    and the slides frame it where it stands."""
    return GAP + tex_escape(text) + "}\n"


def note_box(text: str) -> str:
    """A framed note about the records themselves (left out, mixed versions): shown where it stands."""
    return "\\noindent\\fbox{\\parbox{0.95\\linewidth}{\\small\\textbf{Note:} " + tex_escape(text) + "}}\n"


def gaps_in(text: str) -> list[str]:
    """The texts of the \\gap{...} notes in a generated file (escaped LaTeX; gap texts hold no braces but
    escaped ones)."""
    out, i = [], text.find(GAP)
    while i >= 0:
        j, depth = i + len(GAP), 1
        while j < len(text) and depth:
            if text[j] == "\\":
                j += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        out.append(text[i + len(GAP) : j - 1])
        i = text.find(GAP, j)
    return out


def presence_file(files: dict[str, str]) -> str:
    """`\\has{stem}` is true in the documents for each generated file that holds something and no gap: a
    float or a paragraph around it is typeset only then (the paper's \\ifhas)."""
    lines = ["% generated: the generated files that hold measurements (\\ifhas{stem}{...} in the documents)"]
    lines += [
        f"\\expandafter\\def\\csname has:{Path(name).stem}\\endcsname{{}}"
        for name, text in sorted(files.items())
        if text.strip() and GAP not in text
    ]
    return "\n".join(lines) + "\n"


def not_measured_list(gaps: dict[str, list[str]]) -> str:
    """One line per section (title -> its gap texts in order): each gap once, and one that only repeats the
    start of a longer one (the longer names the command that measures it) left out."""
    lines = []
    for title, texts in gaps.items():
        uniq = list(dict.fromkeys(t.strip().rstrip(".") for t in texts if t.strip()))
        kept = [t for t in uniq if not any(o != t and o.startswith(t) for o in uniq)]
        if kept:
            lines.append(f"\\item \\textbf{{{title}}}: " + "; ".join(kept) + ".\n")
    return "\\begin{itemize}\n" + "".join(lines) + "\\end{itemize}\n" if lines else ""


def missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def num(v, digits: int = 3) -> str:
    """A number for running text: thousands grouped, `digits` significant below 100.

    Callers write a sentence only when the number exists; a missing one is a bug here.
    """
    if missing(v):
        raise ValueError("num() of a missing value: write the sentence only when the number exists")
    if abs(v) >= 100:
        return f"{v:,.0f}".replace(",", "{,}")
    return f"{v:.{digits}g}"


def pct(frac: float, digits: int = 0) -> str:
    return f"{100 * frac:.{digits}f}\\,\\%"


def listing(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = [i for i in items if i]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def booktabs(
    df: pd.DataFrame,
    columns: dict[str, tuple[str, str]],
    caption: str = "",
    label: str = "",
    size: str = "",
    spec: str = "",
) -> str:
    """A booktabs tabular of `df`; columns: name -> (header, python format spec, or 's'/'raw').

    spec: the column specification (default: l for text, r for numbers).
    """
    align = spec or "@{}" + "".join("l" if fmt in ("s", "raw") else "r" for _, fmt in columns.values()) + "@{}"
    lines = [
        f"\\begin{{tabular}}{{{align}}}",
        "\\toprule",
        " & ".join(h for h, _ in columns.values()) + r" \\",
        "\\midrule",
    ]
    for _, row in df.iterrows():
        cells = []
        for name, (_, fmt) in columns.items():
            v = row[name]
            if missing(v):
                cells.append("--")
            elif fmt == "s":
                cells.append(tex_escape(v))
            elif fmt == "raw":
                cells.append(str(v))
            else:
                cells.append(format(v, fmt).replace(",", "{,}"))
        lines.append(" & ".join(cells) + r" \\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    body = (f"{{{size}\n" if size else "") + "\n".join(lines) + "\n" + ("}\n" if size else "")
    if caption:
        body = (
            "\\begin{table}[t]\\centering\\small\n"
            + f"\\caption{{{caption}}}\\label{{{label}}}\n"
            + body
            + "\\end{table}\n"
        )
    return body


def macros_file(macros: dict[str, str]) -> str:
    lines = ["% Generated by kernels/report from the run records; do not edit."]
    lines += [f"\\newcommand{{\\{k}}}{{{v}}}" for k, v in macros.items()]
    return "\n".join(lines) + "\n"
