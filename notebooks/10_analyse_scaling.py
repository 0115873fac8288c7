# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 10 · Analyse scaling: from run records to figures, tables and numbers
#
# Reads the run records under `runs_dir` that the plan selects (`select:` in `paper/plan.yaml`,
# or the `study` parameter), and aggregates repeats by their median with an order-statistic
# confidence interval of that median (its real coverage is shown: 95% needs six repeats).
# Each run's own throughput is already a median over its timed steps. It computes speedup and
# scaling efficiency for every strong series (fixed global batch) and weak series (fixed
# per-rank batch), the final-accuracy gap to the baseline, and the before/after gains of the
# optimisations. Then it writes what `lab paper` builds the paper, the EuroHPC proposal and
# the slides from:
#
# - `results/figures/*.pdf|png`: throughput vs ranks with the ideal line, efficiency with the
#   targets (70% at 8 GPUs, 80%), time per epoch, accuracy, gains;
# - `results/tables/*.tex`: booktabs tables, the experimental setup from the records'
#   metadata, the node-hour table, and generated sentences: a sentence exists only when its
#   numbers do, otherwise the document shows a framed gap;
# - `results/tables/numbers.tex`: `\newcommand` macros, so the prose never types a number.
#
# Definitions are in `kernels/analysis/runs.py`: E_s = T1/(N·TN), E_w = T1/TN, both equal
# to (X_N/N)/X_1. Records that are not complete, or whose software versions differ, are
# listed and flagged, not silently mixed; records outside the selection are listed too.

# %%
_names_before_parameters = set(globals())

# %% tags=["parameters"]
runs_dir = ""       # run records to read (empty: <project>/results/runs)
out_dir = ""        # where figures/ and tables/ go (empty: <project>/results)
plan = ""           # the documents' plan (empty: <project>/paper/plan.yaml)
system = ""         # EuroHPC target system, a key of paper/systems.yaml (empty: the plan's)
study = ""          # records of these studies or labels, comma-separated (empty: the plan's select)

# %%
_parameter_names = set(globals()) - _names_before_parameters  # first: before any import adds names
from pathlib import Path

import pandas as pd  # noqa: F401 - the tables below are DataFrames; the kernel imports pandas ahead
from IPython.display import display

from kernels import report
from kernels.base import yamlfile
from kernels.base.alttext import show_png
from kernels.notebook.tables import table
from kernels.notebook.runner import check_parameter_names, handoff
from kernels.base.params import PROJECT_ROOT

check_parameter_names(_parameter_names, ["runs_dir", "out_dir", "plan", "system", "study"])
runs_path = Path(runs_dir) if runs_dir else PROJECT_ROOT / "results" / "runs"
out_path = Path(out_dir) if out_dir else PROJECT_ROOT / "results"
plan_path = Path(plan) if plan else PROJECT_ROOT / "paper" / "plan.yaml"
systems = yamlfile.read(PROJECT_ROOT / "paper" / "systems.yaml", "systems file")
study_plan = yamlfile.read(plan_path, "plan")
if system:
    study_plan["system"] = system
select = None
if study:
    names = [s.strip() for s in study.split(",") if s.strip()]
    select = {"labels": names, "studies": names}
(out_path / "analysis").mkdir(parents=True, exist_ok=True)
handoff(out_path / "analysis")  # the executed copy of this notebook is filed there
print(f"records: {runs_path}\noutputs: {out_path}\nplan: {plan_path} (system {study_plan['system']})\n"
      f"selection: {select or study_plan.get('select') or 'all records'}")

# %%
result = report.build(runs_path, out_path, study_plan, systems, select=select)
runs = result["runs"]
print(f"{len(runs)} complete selected run(s), {len(result['problems'])} selected but left out, "
      f"{len(result['excluded'])} outside the selection")
if result["versions"]:
    print("WARNING: records differ in", result["versions"], "- numbers are not directly comparable")
table(result["problems"], none="no selected record was left out")

# %% [markdown]
# ## Records outside the selection
# Not used by the documents; listed so that nothing disappears silently (also in `tables/excluded.csv`).

# %%
table(result["excluded"], none="no record outside the selection")

# %% [markdown]
# ## Scaling series
# One row per series and rank count. Throughput is the median over repeats, with the
# order-statistic interval of that median and its coverage (`ci_level`). Speedup and
# efficiency are relative to the series' smallest rank count.

# %%
# `reasons`, the kinds behind `flags`, and the run ids are left out here
table(result["scaling"].drop(columns=["run_ids", "reasons"]), none="no scaling series: no run selected")

# %% [markdown]
# ## Results to re-run
# Points set aside (column `flags` above) and never quoted in the abstract, the request or
# the slides: a contended run, efficiency above 100 % + the tolerance, disagreeing repeats,
# fewer repeats than the study asked for (kernels/analysis/trust.py). Each with the command that
# measures it again.

# %%
rerun = result["rerun"]
print("nothing set aside" if rerun.empty else
      "\n".join(f"N={r.gpus} {r.series}: {r.reasons}\n  " + "\n  ".join(r.commands) for r in rerun.itertuples()))

# %% [markdown]
# ## The project's targets as criteria
# Met / not met / not measured, from the records above (set-aside points excluded); a
# criterion not measured names the study that measures it.

# %%
table(result["criteria"][["key", "status", "value", "threshold", "evidence", "source"]])

# %%
for name in ("throughput", "efficiency", "epoch_time", "accuracy", "gains"):
    show_png(out_path / "figures" / f"{name}.png")

# %% [markdown]
# ## Optimisations (before/after at equal everything else)

# %%
table(result["gains"], none="no optimisation measured before and after")

# %% [markdown]
# ## Input and output (MNIST vs bigMNIST)
# One row per data set, pipeline, cache mode and rank count, medians over repeats: samples/s,
# aggregate read bandwidth (bytes read by all ranks over the training time; `storage_mb_s` is
# what the reads themselves achieved), the slowest rank's data-wait share and its spread to the
# fastest rank, and the device types of the ranks (mixed node types show here).

# %%
for name in ("io_samples", "io_bandwidth", "io_wait", "io_ranks"):
    show_png(out_path / "figures" / f"{name}.png")
table(result["io"], none="no I/O records selected")

# %% [markdown]
# ## DCRNN on traffic graphs
# One row per series (data set, model size, batch, parallelism: `gp` 1 data parallel, 0 the graph
# split over all ranks, k a dp x k grid) and rank count, medians over repeats: throughput, epoch
# time, strong-scaling efficiency, masked MAE/RMSE/MAPE at 15, 30 and 60 minutes beside the
# historical average on the same test windows (`ha_*`), the largest relative MAE change against
# the series' baseline (`mae_gap_pct`, the 2 % criterion), the largest rank's peak memory and
# halo traffic per step, and the partition's edge cut.

# %%
show_png(out_path / "figures" / "dcrnn_scaling.png")
table(result["dcrnn"], none="no DCRNN records selected")

# %% [markdown]
# ## Communication: collectives, fits, the step predictor, DDP against Horovod
# The commbench records beside the runs (`results/comm/`): per backend and collective the latency at
# the smallest size and the bus bandwidth at the largest; the alpha-beta fits per backend, collective,
# placement and system; the step predictor against every measured series that has a 1-rank run and
# fits on its system (error = predicted / measured - 1; `probe_exposed_ms` is the run's own measure of
# the communication backward did not hide, `exposed_ms` the model's); DDP against Horovod where both ran.

# %%
display(table(result["comm_compare"], none="no collective benchmark records"))
display(table(result["comm_fits"], none="no alpha-beta fits (they need collective benchmark records)"))
show_png(out_path / "figures" / "predictor.png")
display(table(result["predictor"], none="no series to predict (a measured series with a 1-rank run and a fit)"))
table(result["engines"], none="no DDP and Horovod runs of the same configuration")

# %% [markdown]
# ## Profiling and the bottleneck verdict
# Profiled records (`profile_steps > 0`): the share of a profiled step per operator category (mean over
# ranks; host timeline on CPUs, device timeline on GPUs) and the run's verdict. Then every record's
# verdict by series and rank count, with the median evidence (data wait, exposed communication and
# device utilisation as % of the step or of the time, MFU): does the bottleneck move from compute to
# communication as the ranks grow? Thresholds: `kernels/profiling/verdict.py`.

# %%
show_png(out_path / "figures" / "profile_breakdown.png")
display(table(result["profile"], none="no profiled records selected"))
table(result["bottleneck"])

# %% [markdown]
# ## Resource request for the proposal

# %%
if result["node_hours_total"] is not None:
    print(f"total with profiling overhead: {result['node_hours_total']:.4g} node-hours; "
          f"request: {result['node_hours_request']} node-hours")
table(result["node_hours"])

# %%
changed = [k for k, v in result["written"].items() if v]
print("rewritten:", ", ".join(changed) if changed else "nothing changed")
