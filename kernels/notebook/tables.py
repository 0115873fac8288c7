"""Tables a notebook shows: whole in the notebook, readable in the job log.

Papermill's `--log-output` copies each displayed value's plain text into the job log. That
text is pandas' repr: long tables cut to "... [61 rows x 1 columns]", wide ones wrapped in
blocks with "...", and numbers such as 1.342042e+07 or NaN. `table(df)` displays the whole
table as HTML in the notebook and gives the log a plain text with every row and column,
plain numbers (thousands separated), and blanks for missing values. Pass `log=` to put
something shorter in the log.
"""

from __future__ import annotations

import math
import textwrap


def readable(x) -> str:
    """A number as a reader writes it: 13,420,416 not 13420416.0 or 1.342e+07; 0.00928 not 9.28e-03;
    blank for None and NaN. Anything else as str()."""
    if x is None or isinstance(x, bool):
        return "" if x is None else str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if math.isnan(x):
            return ""
        if math.isinf(x) or x == 0:
            return str(x) if x else "0"
        if x.is_integer() and abs(x) < 1e15:
            return f"{int(x):,}"
        if abs(x) >= 100:
            return f"{x:,.1f}"
        if abs(x) >= 1e-4:
            return f"{x:.4g}"
        return f"{x:.3g}"
    try:  # numpy scalars
        import numpy as np

        if isinstance(x, np.integer):
            return readable(int(x))
        if isinstance(x, np.floating):
            return readable(float(x))
    except ImportError:
        pass
    return str(x)


def as_text(df) -> str:
    """Every row and column of a DataFrame (or Series) as plain text, numbers readable."""
    import pandas as pd

    frame = df.to_frame() if isinstance(df, pd.Series) else df
    shown = frame.map(readable) if hasattr(frame, "map") else frame.applymap(readable)
    return shown.to_string(max_rows=None, max_cols=None, line_width=None)


def pairs(values: dict, width: int = 110) -> str:
    """name=value pairs, wrapped to `width` columns: a long parameter list in a few lines."""
    items = [f"{k}={readable(v) if v != '' else repr(v)}" for k, v in values.items()]
    return textwrap.fill("  ".join(items), width=width, break_long_words=False, break_on_hyphens=False)


NONE = "nothing to show: no selected record has these measurements"


class Table:
    """A DataFrame that a notebook shows whole (HTML) and a log reads as plain text (`text` or the table); an
    empty one is the sentence `none`, not pandas' "Empty DataFrame" with its column list."""

    def __init__(self, df, log: str | None = None, none: str = NONE, fold: str | None = None):
        self.df, self.log, self.none, self.fold = df, log, none, fold

    def _repr_html_(self) -> str:
        import html

        import pandas as pd

        if self.df.empty:
            return f"<p><em>{html.escape(self.none)}</em></p>"
        frame = self.df.to_frame() if isinstance(self.df, pd.Series) else self.df
        # a wide table scrolls inside the page instead of running off its right edge
        body = (
            '<div style="overflow-x: auto; max-width: 100%;">'
            + frame.to_html(max_rows=None, max_cols=None, na_rep="", float_format=readable)
            + "</div>"
        )
        if self.fold:  # folded: one line until the reader opens it
            return f"<details><summary>{html.escape(self.fold)}</summary>{body}</details>"
        return body

    def __repr__(self) -> str:
        if self.df.empty:
            return self.none
        return self.log if self.log is not None else as_text(self.df)


def table(df, log: str | None = None, none: str = NONE, fold: str | None = None) -> Table:
    """`fold`: the line a folded table shows until it is opened (the page's results come first)."""
    return Table(df, log, none, fold)
