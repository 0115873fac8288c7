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
# # 03 · Commbench: collective latency and bandwidth, nccl-tests style
#
# This notebook is the **driver** of one communication benchmark. It validates the parameters,
# starts the ranks, waits for them, then reads the record back and plots it.
#
# - On a Slurm cluster: `sbatch --nodes=2 --ntasks-per-node=4 --gpus-per-node=4 slurm/papermill_run.sbatch
#   notebooks/03_commbench.ipynb -p backend nccl -p gpus 8`. Torch ranks start with `srun` over the
#   allocation; MPI ranks with `mpirun`.
# - On a laptop or in CI: local processes (gloo on CPU), or `mpirun` for `backend = 'mpi'`.
#
# Each collective runs from `min_bytes` to `max_bytes` by `factor`, is checked element by element
# (`#wrong`), and is timed out of place and in place where the API has the form. Bus bandwidth
# uses nccl-tests' factors (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n;
# the rest 1), so it compares with the link's bandwidth. The record goes to `results/comm/<id>/`
# (`config.json`, `results.csv`, `summary.json`, `commbench.txt`, `osu.txt`); the analysis fits
# the alpha-beta model to it (`python -m kernels.comm fit`).
#
# The parameters cell is generated from `kernels/comm/bench.py` by `lab notebooks sync`.

# %%
_names_before_parameters = set(globals())

# %% tags=["parameters"]
# --- communication benchmark (lab comm bench --help)
backend = 'auto'      # auto (nccl when GPUs are visible, else gloo), nccl, gloo or mpi (mpi4py)
gpus = 2              # ranks (one per GPU; CPU processes on gloo and MPI)
# collectives to run, comma-separated: all_reduce, all_gather, reduce_scatter, broadcast, reduce,
# all_to_all, send_recv, gather, scatter
ops = 'all_reduce,all_gather,reduce_scatter,broadcast,reduce,all_to_all,send_recv,gather,scatter'
dtypes = 'fp32'       # element types, comma-separated: fp32, bf16, fp16 (MPI: fp32 only)
min_bytes = '8'       # smallest size in bytes, K/M/G suffixes in powers of 1024 (nccl-tests -b)
max_bytes = '16M'     # largest size in bytes (nccl-tests -e)
factor = 2            # size multiplier between steps (nccl-tests -f), at least 2
warmup = 5            # untimed calls per size after the checked one (nccl-tests -w)
iters = 20            # timed calls per size in one timed loop (nccl-tests -n)
repeats = 3           # timed loops per size; the table reports the loop with the median time
                      # (noise)
check = True          # check every result element by element (#wrong; nccl-tests -c)
root = 0              # root rank of broadcast, reduce, gather and scatter
timeout_min = 5.0     # process-group timeout in minutes (a collective that hangs fails after this)
results_dir = ''      # where records go (empty: $LAB_RESULTS/comm, else <project>/results/comm)
label = ''            # free-form label added to the record id
run_id = ''           # record directory name (empty: generated)
launcher = 'auto'     # auto, local (rank processes here), mpirun (MPI here), srun (inside an
                      # allocation) or none (this process is one rank)
mpi_library = 'auto'  # backend=mpi: auto (the mpirun on PATH), openmpi or mpich where both are
                      # installed (kernels/comm/mpi_library.py)

# %% [markdown]
# ## Resolve and validate
# An unknown name, a malformed size, sizes out of order, a backend this machine cannot run (nccl
# without GPUs, mpi without mpi4py or an MPI library) stop the notebook here, before any process
# starts or any file is written.

# %%
_parameter_names = set(globals()) - _names_before_parameters  # first: before any import adds names
import pandas as pd

from kernels.comm import bench
from kernels.notebook.runner import check_parameter_names, handoff

check_parameter_names(_parameter_names, bench.BY_NAME)
cfg = bench.resolve({name: globals()[name] for name in bench.BY_NAME})
cfg.to_dict()

# %% [markdown]
# ## Launch
# The ranks print the nccl-tests table as they go; a failing rank fails this cell and the record
# says `failed`.

# %%
rc, run_dir = bench.launch(cfg)
if run_dir is not None:
    handoff(run_dir)
if rc != 0:
    raise RuntimeError(f"commbench failed (exit status {rc}); the reason is in the output above"
                       + (f" and in {run_dir / 'summary.json'}" if run_dir else ""))

# %% [markdown]
# ## The record

# %%
rec = bench.read_record(run_dir)
s = rec["summary"]
print(f"{s['status']}: backend {s['backend']}, {s['ranks']} rank(s) on {s['nodes']} node(s) ({s['placement']}), "
      f"#wrong {s['wrong']}")
for k, why in (s.get("unsupported") or {}).items():
    print(f"unsupported: {k}: {why}")
for note in s.get("notes") or []:
    print(f"note: {note}")
rows = pd.DataFrame(rec["rows"])
pd.Series(s["avg_busbw_gbs"], name="avg busbw (GB/s)").to_frame()

# %%
import matplotlib.pyplot as plt

from kernels.base.alttext import show

fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4))
for (op, dtype), g in rows.groupby(["op", "dtype"]):
    form = "out" if g["time_us_out"].notna().any() else "in"
    ax_t.plot(g["size_bytes"], g[f"time_us_{form}"], marker=".", label=f"{op} {dtype}")
    ax_b.plot(g["size_bytes"], g[f"busbw_{form}"], marker=".", label=f"{op} {dtype}")
for ax, label in ((ax_t, "time per call (us, mean over ranks)"), (ax_b, "bus bandwidth (GB/s)")):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel(label)
    ax.grid(True, which="both", alpha=0.3)
ax_b.legend(fontsize=7)
fig.suptitle(f"{s['backend']}, {s['ranks']} ranks on {s['nodes']} node(s); {rec['config']['rank_list'][0]['device']}")
fig.tight_layout()
show(fig)

# %% [markdown]
# ## nccl-tests table

# %%
print((run_dir / "commbench.txt").read_text())
