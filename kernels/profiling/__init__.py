"""Profiling: the profiler schedule and traces, breakdowns, the resource monitor and the bottleneck verdict.

    trace.py      torch.profiler around chosen steps (one gzipped Chrome trace per rank), NVTX phase ranges,
                  the cudaProfilerApi capture window for Nsight
    breakdown.py  time by operator category and top operators from a trace (host and device timelines)
    hta.py        Holistic Trace Analysis on GPU traces (optional dependency)
    monitor.py    one sampler per node: GPU (NVML) and host (psutil) counters into monitor.csv
    verdict.py    data | communication | compute | launch-overhead | unknown, from measured shares
    tools.py      the nsys / ncu command lines of slurm/profile_nsys.sbatch and slurm/profile_ncu.sbatch
"""

# 02_profile's parameters: 01_train's table with these defaults (the same names: any run can be profiled
# from the CLI or 01_train by setting them)
NOTEBOOK_DEFAULTS = {"profile_steps": 5, "epochs": 2}


def notebook_params():
    """02_profile's parameters cell: kernels/params.py's table with NOTEBOOK_DEFAULTS."""
    from dataclasses import replace

    from kernels.params import table

    return [replace(p, default=NOTEBOOK_DEFAULTS[p.name]) if p.name in NOTEBOOK_DEFAULTS else p for p in table()]
