"""The documents' names for the quantities the lab measures more than one way (step timers, the communication
probe, the profiler's trace): one name per definition, written beside every number, so that a reader never
meets two values under one name. The definitions table of the proposal and the paper's list are generated from
QUANTITIES; tables and sentences take their names from here."""

from __future__ import annotations

from kernels.analysis.tex import tex_escape

DATA_WAIT = "data wait"
DATA_WAIT_SLOWEST = "slowest rank's data wait"
EXPOSED_COMM = "exposed communication"
TRACE_COMM = "collectives (trace)"
TRACE_DATA = "data loading (trace)"

# name -> (where it is measured, its definition in LaTeX)
QUANTITIES = {
    DATA_WAIT: (
        "the step timers",
        "the time a step waits for its input batch over the step time, summed over the "
        "timed steps, mean over ranks (the verdict's data share)",
    ),
    DATA_WAIT_SLOWEST: ("the step timers", "the same for the rank that waits most (the I/O study's figure)"),
    EXPOSED_COMM: (
        "the communication probe",
        "forward and backward time with the gradient all-reduce minus that "
        "without it (DDP \\texttt{no\\_sync}), median over barrier-aligned pairs, zero within noise when "
        "its 90\\,\\% interval holds zero (the verdict's communication share)",
    ),
    TRACE_COMM: (
        "the profiler",
        "the share of a profiled step in collective operators (CPUs: on the step's "
        "thread, waits included; GPUs: NCCL kernels that compute does not overlap)",
    ),
    TRACE_DATA: ("the profiler", "the share of a profiled step in data-loading operators"),
}
# the trace's categories whose names would collide with a quantity above, as the documents print them
TRACE_NAMES = {"communication": TRACE_COMM, "data pipeline": TRACE_DATA}


def trace_name(category: str) -> str:
    """A profiler category as the documents print it."""
    return TRACE_NAMES.get(category, category)


def table_rows() -> str:
    """`Name & definition \\\\` rows for a two-column definitions table."""
    return "".join(
        f"{tex_escape(name[0].upper() + name[1:])} & from {src}: {d} \\\\\n" for name, (src, d) in QUANTITIES.items()
    )


def text() -> str:
    """The paper's sentence naming each quantity with its definition."""
    return (
        "Every share of the step is named for its definition. "
        + " ".join(f"The \\emph{{{tex_escape(name)}}}, from {src}, is {d}." for name, (src, d) in QUANTITIES.items())
        + "\n"
    )
