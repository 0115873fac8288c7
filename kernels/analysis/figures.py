"""Figure plumbing shared by the report's sections: style, saving, axes."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pandas as pd

from kernels.analysis.tex import write_if_changed


# Every text of a figure at its size when drawn; figures are drawn at about the width they are printed
# (a 3.5 in column, 3.4 in in a half-page panel), so 8 pt here prints at 7 pt or more (tests/test_paper.py
# checks each saved figure against the width the paper prints it at).
FONT_PT = {
    "font.size": 8.5,
    "axes.titlesize": 8.5,
    "axes.labelsize": 8.5,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.title_fontsize": 8,
    "figure.titlesize": 8.5,
}
SAVED: dict[str, tuple[float, float]] = {}  # name -> (smallest font in pt, width in inches as saved)


def style():
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper", rc=FONT_PT)
    matplotlib.rcParams["pdf.fonttype"] = 42  # TrueType glyphs, not Type 3 bitmaps, in the PDFs


def _smallest_font(fig) -> float:
    from matplotlib.text import Text

    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min(sizes) if sizes else float("inf")


def save_figure(fig, out: Path, name: str) -> list[Path]:
    """<out>/figures/<name>.pdf and .png, each rewritten only when its bytes change; the PNG carries the
    figure's alternative text (kernels.base.alttext)."""
    import matplotlib.pyplot as plt

    from kernels.base.alttext import png_metadata

    box = fig.get_tightbbox(fig.canvas.get_renderer())  # the box savefig crops to (laid out, not drawn)
    SAVED[name] = (_smallest_font(fig), box.width + 2 * 0.1)  # savefig's tight crop pads 0.1 in a side
    paths = []
    for ext, kw in (
        ("pdf", {"metadata": {"CreationDate": None, "ModDate": None}}),
        ("png", {"dpi": 160, "metadata": png_metadata(fig)}),
    ):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, bbox_inches="tight", **kw)
        p = out / "figures" / f"{name}.{ext}"
        write_if_changed(p, buf.getvalue())
        paths.append(p)
    plt.close(fig)
    return paths


def rank_axis(ax, ranks) -> None:
    """Log-2 rank axis with a tick at each measured rank count and no minor labels."""
    from matplotlib.ticker import NullFormatter, NullLocator

    ranks = sorted({int(r) for r in ranks})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ranks, [str(r) for r in ranks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("ranks (GPUs or CPU processes)")


def nice_log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks covering [lo, hi] for a log axis, at least two of them."""
    lo, hi = max(lo, 1e-12), max(hi, lo * 1.0001)
    ticks = []
    for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            t = m * 10.0**e
            if lo <= t <= hi:
                ticks.append(t)
    if len(ticks) < 2:  # a narrow range: round multiples of the coarsest 1-2-5 step that puts 3 or more inside
        ticks = round_ticks(lo, hi)
    return ticks


def round_ticks(lo: float, hi: float, least: int = 3) -> list[float]:
    """Multiples of a 1-2-5 step inside [lo, hi] (400, 500, 600; 2.8, 3, 3.2), of the coarsest step that gives at
    least `least` of them; never odd values such as 510 or 550 next to 600."""
    for e in range(math.ceil(math.log10(hi - lo)), math.floor(math.log10(hi - lo)) - 3, -1):
        for m in (5, 2, 1):
            step = m * 10.0**e
            ticks = [round(k * step, 12) for k in range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1)]
            if len(ticks) >= least:
                return ticks
    return [lo, hi]


def log_value_axis(ax, values, label: str) -> None:
    """Log y axis with plain-number tick labels (no '7x10^2' minor labels)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v)) and v > 0]
    ax.set_yscale("log")
    if vals:
        lo, hi = min(vals) / 1.15, max(vals) * 1.15
        ax.set_ylim(lo, hi)
        ax.yaxis.set_major_locator(FixedLocator(nice_log_ticks(lo, hi)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 10 else f"{v:g}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel(label)


def hardware_line(runs: pd.DataFrame) -> str:
    if runs.empty:
        return "no records"
    devs = ", ".join(sorted(runs["device"].unique()))
    return f"{devs}; torch {', '.join(sorted(runs['torch'].unique()))}"


def wrapped(text: str, width: int = 48) -> str:
    """Text wrapped to lines that fit a 3.5 in figure at the figures' font size."""
    import textwrap

    return "\n".join(textwrap.wrap(str(text), width, break_on_hyphens=False)) or str(text)


def legend(ax, width: int = 44, **kw) -> None:
    """A legend whose long labels (series names) wrap instead of widening the figure past its printed width."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, [wrapped(t, width) for t in labels], **kw)


def finish_rank_plot(fig, ax, ranks, title: str, out: Path, name: str) -> str:
    """Rank axis, title, and the legend under the plot, where it covers no point; the plot gives up the height
    the legend takes, so the figure prints no taller than with the legend inside."""
    rank_axis(ax, ranks)
    ax.set_title(wrapped(title))
    lines = sum(wrapped(t, 44).count("\n") + 1 for t in ax.get_legend_handles_labels()[1])
    w, h = fig.get_size_inches()
    height = max(1.6, h - 0.17 * lines)
    fig.set_size_inches(w, height)
    legend(ax, loc="upper center", bbox_to_anchor=(0.5, -0.24 * 2.6 / height), frameon=False, borderaxespad=0.0)
    save_figure(fig, out, name)
    return name


def figure_snippet(name: str, present: bool, why_missing: str, width: str = "\\linewidth") -> str:
    """The figure for the documents' own figure environments, or a marked gap saying why it is missing."""
    from kernels.analysis.tex import gap_note

    return f"\\includegraphics[width={width}]{{{name}.pdf}}\n" if present else gap_note(why_missing)
