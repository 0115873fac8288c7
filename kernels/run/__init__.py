"""What a rank needs besides the loop: components that kernels/ddp_core.py calls at fixed points.

parts.py          what a rank trains with (RankParts), built once before the first step
record.py         the run record's lifecycle: run id, fresh/resume/refuse, lock, config, rows, summary
checkpointing.py  snapshot, asynchronous write, resume
observe.py        step timers, host syncs, the profiler window, the resource monitor
probe.py          the comm probe: communication that backward did not hide
io_stats.py       what each rank read and waited for
metrics.py        loss and metric sums, the epoch's row and log line
guards.py         stop signals, the hang watchdog, the ranks' agreement to stop or fail
"""
