"""Alternative text for the lab's figures, so the executed notebooks' HTML says what each chart shows.

A figure's text is built from what the figure itself states (its title, each panel's title and axes, the
series in its legend), so it cannot drift from the chart. PNGs the lab saves carry it in their Description
field; the notebooks show figures and PNGs through `show` and `show_png`, which hand it to the notebook as
the output's `alt`; the lab's HTML template (kernels/notebook/templates/lab_alt.html.j2) writes it into <img alt="...">.
"""

from __future__ import annotations

from pathlib import Path


def describe(fig) -> str:
    """One sentence per panel: '<title>: <y> against <x> for <series>'."""
    sup = fig.get_suptitle() if hasattr(fig, "get_suptitle") else ""
    panels = []
    for ax in fig.axes:
        title, x, y = ax.get_title(), ax.get_xlabel(), ax.get_ylabel()
        legend = ax.get_legend()
        series = (
            [t.get_text() for t in legend.get_texts()]
            if legend
            else [s for s in ax.get_legend_handles_labels()[1] if not s.startswith("_")]
        )
        what = f"{y} against {x}" if x and y else (x or y or "chart")
        if series:
            what += " for " + ", ".join(series)
        panels.append(f"{title}: {what}" if title else what)
    text = " ".join(("; ".join(panels) or "empty figure").split())  # titles may break lines
    sup = " ".join(sup.split())
    return f"Figure ({sup}). {text}." if sup else f"Figure. {text}."


def png_metadata(fig) -> dict:
    """savefig(..., metadata=png_metadata(fig)) for a PNG: its Description is the figure's text."""
    return {"Description": describe(fig)}


def png_description(path: Path) -> str:
    """The Description a PNG was saved with, or its name when it has none."""
    from PIL import Image

    with Image.open(path) as im:
        text = getattr(im, "text", {}).get("Description", "")
    return text or f"Figure {Path(path).stem.replace('_', ' ')}."


def show(fig) -> None:
    """Display a matplotlib figure in a notebook with its text, then close it (no second inline copy).

    The PNG is drawn once, at the figure's size and dpi: the inline backend's own display (bbox_inches='tight')
    draws it twice, once to measure its ink; the lab's figures have their margins from tight_layout already."""
    import io

    import matplotlib.pyplot as plt

    png = io.BytesIO()
    fig.savefig(png, format="png")
    _display_png(png.getvalue(), describe(fig))
    plt.close(fig)


def _display_png(data: bytes, alt: str) -> None:
    """A PNG output whose plain-text form is its description: a log (papermill --log-output) or a terminal then
    says what the chart shows instead of `<IPython.core.display.Image object>`; the HTML still shows the PNG."""
    import base64

    from IPython.display import display

    display(
        {"image/png": base64.b64encode(data).decode("ascii"), "text/plain": alt},
        raw=True,
        metadata={"image/png": {"alt": alt}},
    )


def show_png(path: Path, required: bool = False) -> None:
    """Display a saved PNG with the text it was saved with. A missing file shows nothing (an analysis whose
    records lack that figure), or raises FileNotFoundError when the figure is required."""
    path = Path(path)
    if not path.exists():
        if required:
            raise FileNotFoundError(f"{path}: the figure this notebook shows was not written")
        return
    _display_png(path.read_bytes(), png_description(path))
