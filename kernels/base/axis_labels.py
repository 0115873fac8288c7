"""Tick labels for the notebooks' figures."""

from __future__ import annotations


def plain_log_labels(axis) -> None:
    """Label a log-scaled matplotlib axis as 0.1, 0.5, 1, 10: matplotlib's own labels are mathtext (10^-1), whose
    layout took 0.2 s of the train notebook's plots cell, and its plain LogFormatter writes 1e-01 below 1. Which
    ticks carry a label is still LogFormatter's choice (the decades, and the minor ticks when few decades show)."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def __call__(self, x, pos=None):
            return f"{x:g}" if super().__call__(x, pos) else ""

    axis.set_major_formatter(Plain())
    axis.set_minor_formatter(Plain(labelOnlyBase=False))
