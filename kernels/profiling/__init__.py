"""Profiling: the profiler schedule and traces, breakdowns, the resource monitor and the bottleneck verdict.

trace.py      torch.profiler around chosen steps (one gzipped Chrome trace per rank), NVTX phase ranges,
              the cudaProfilerApi capture window for Nsight
breakdown.py  time by operator category and top operators from a trace (host and device timelines)
hta.py        Holistic Trace Analysis on GPU traces (optional dependency)
monitor.py    one sampler per node: GPU (NVML) and host (psutil) counters into monitor.csv
verdict.py    data | communication | compute | host-bound (launch) | unknown, from measured shares
tools.py      the nsys / ncu command lines of slurm/profile_nsys.sbatch and slurm/profile_ncu.sbatch
reports.py    Nsight reports in a run directory read back into its record (what the two below share)
nsight.py     Nsight Systems reports read back into the record (nsys stats -> <run>/nsys/summary.json)
ncu.py        Nsight Compute reports read back into the record (ncu --import -> <run>/ncu/summary.json)
"""
