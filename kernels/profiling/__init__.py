"""Profiling: the profiler schedule and traces, breakdowns, the resource monitor and the bottleneck verdict.

trace.py      torch.profiler around chosen steps (one gzipped Chrome trace per rank), NVTX phase ranges,
              the cudaProfilerApi capture window for Nsight
breakdown.py  time by operator category and top operators from a trace (host and device timelines)
hta.py        Holistic Trace Analysis on GPU traces (optional dependency)
monitor.py    one sampler per node: GPU (NVML) and host (psutil) counters into monitor.csv
verdict.py    data | communication | compute | host-bound (launch) | unknown, from measured shares
tools.py      the nsys / ncu command lines of slurm/profile_nsys.sbatch and slurm/profile_ncu.sbatch
nsight.py     Nsight Systems reports read back into the record (nsys stats -> <run>/nsys/summary.json)
"""
