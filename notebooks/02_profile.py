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
# # 02 · Profile: where a training step's time goes, and what bounds it
#
# The **driver** of one profiled run: the same parameters, launch and record as `01_train`, with
# the profiler on (`profile_steps` active steps after `profile_wait` skipped and `profile_warmup`
# discarded ones). Every rank writes a gzipped Chrome/Perfetto trace (open it in
# <https://ui.perfetto.dev> or `chrome://tracing`); rank 0 turns them into a breakdown by operator
# category and the top operators. Every run, profiled or not, also carries the resource monitor
# (`monitor.csv`: GPU utilisation, memory, power, temperature, SM clock per GPU; CPU, memory,
# network and disk per node) and a bottleneck verdict (data, communication, compute,
# host-bound (launch) or unknown) with its evidence.
#
# - On a Slurm cluster: `sbatch slurm/papermill_run.sbatch notebooks/02_profile.ipynb -p gpus 8`.
#   Under Nsight Systems instead: `sbatch slurm/profile_nsys.sbatch notebooks/02_profile.ipynb -p gpus 8`
#   (one report per rank in `<run>/nsys/`); Nsight Compute on one rank: `slurm/profile_ncu.sbatch`.
# - From the CLI, any run: `lab train ... --profile_steps 5`.
#
# The parameters cell is `01_train`'s (generated from `kernels/base/params.py` by `lab notebooks sync`)
# with `profile_steps = 5` and two epochs by default.

# %%
_names_before_parameters = set(globals())

# %% tags=["parameters"]
# --- common parameters
workload = 'resnet18'           # model family: a registered workload (lab train --help lists them)
                                # or module:OBJECT for your own
dataset = None                  # data set; each workload lists the ones it takes (None: the
                                # workload's default)
gpus = 1                        # world size: number of ranks (one per GPU; CPU processes on gloo
                                # when no GPU)
precision = None                # fp32, bf16 or fp16 autocast; GradScaler only for fp16, which needs
                                # a GPU; bf16 on a GPU without it (V100, T4) trains as fp16 (None:
                                # the workload's default)
batch = None                    # GLOBAL batch size over all ranks; each rank takes batch / gpus
                                # (None: the workload's default)
micro_batches = 1               # gradient-accumulation micro-batches per rank and step (per-rank
                                # batch must divide)
epochs = 2                      # training epochs (None: the workload's default)
lr = None                       # peak learning rate of the workload's optimizer for the global
                                # batch (None: the workload's recipe)
engine = 'ddp'                  # data-parallel engine: ddp (torch DistributedDataParallel) or
                                # horovod (Horovod's DistributedOptimizer; build it with `make
                                # horovod`)
bucket_cap_mb = 25.0            # DDP gradient bucket size in MiB
gradient_as_bucket_view = True  # DDP: gradients are views into the all-reduce buckets (saves a
                                # copy)
hvd_fusion_mb = 128.0           # horovod: tensor fusion threshold in MiB (HOROVOD_FUSION_THRESHOLD)
hvd_cycle_ms = 1.0              # horovod: cycle time in ms between fusion rounds
                                # (HOROVOD_CYCLE_TIME)
pipeline = 'auto'               # auto (stream for sets streamed from disk, else device), device
                                # (data resident on the device, batched on-device transforms),
                                # stream (shards read sequentially by background threads) or
                                # dataloader (torch DataLoader baseline)
cache = 'warm'                  # stream pipeline: warm (the page cache may serve re-reads) or cold
                                # (reads bypass the page cache with O_DIRECT, or evict each byte
                                # range where the file system refuses it: every epoch reads storage)
window_mb = 64.0                # stream pipeline: MiB per read-ahead window (samples are shuffled
                                # within a window, windows within a rank's range)
read_mb = 8.0                   # stream pipeline: MiB per sequential read call (at least 1)
io_threads = 2                  # stream pipeline: background reader threads per rank
num_workers = 4                 # dataloader pipeline: worker processes per rank
prefetch_factor = 2             # dataloader pipeline: batches prefetched per worker
train_samples = 0               # use the first N training samples (0: all); for quick runs
test_samples = 0                # use the first N test samples (0: all); for quick runs
seed = 0                        # seed of model init, data order and augmentation; same seed, same
                                # run
compile = None                  # torch.compile the model (None: on with CUDA, off on CPU)
cuda_graphs = None              # CUDA: replay the compiled forward and backward as CUDA graphs
                                # (torch.compile mode reduce-overhead): a step is a few graph
                                # launches, not hundreds of kernel launches (None: on with CUDA and
                                # compile where the workload's shapes are static; needs compile)
channels_last = None            # channels_last memory format for model and inputs (convolutional
                                # models; None: on with CUDA; on a CPU where the workload measured
                                # it faster: ResNet-18 from width 16)
device = 'auto'                 # auto (cuda when visible, else cpu), cuda or cpu
timing_warmup_steps = 5         # first steps of the run excluded from throughput (compilation,
                                # autotuning)
comm_probe_steps = 10           # after training, time this many fwd+bwd with and without gradient
                                # sync to expose communication (0: off; needs gpus > 1)
profile_steps = 5               # profile this many training steps (0: off): one gzipped Chrome
                                # trace per rank, a breakdown by operator category and the top
                                # operators in the run directory
profile_wait = 10               # profiling: steps skipped before the profiler starts (compilation,
                                # autotuning)
profile_warmup = 2              # profiling: steps the profiler traces and discards before the
                                # active steps
profile_with = 'torch'          # profiling: torch (torch.profiler traces) or external (Nsight wraps
                                # the ranks: NVTX ranges and cudaProfilerStart/Stop around the
                                # active steps)
profile_memory = False          # profiling: record tensor allocations (larger traces)
profile_shapes = True           # profiling: record operator input shapes
profile_dir = ''                # profiling: where the traces go (empty: <run directory>/traces)
profile_hta = 'auto'            # profiling: Holistic Trace Analysis on GPU traces: auto (when
                                # installed), on (required), off
monitor_hz = 2.0                # resource monitor samples per second on each node (GPU via NVML,
                                # host via psutil) into monitor.csv; 0: off; at most 5 (NVML
                                # refreshes slower)
sync_debug_steps = 0            # CUDA: count the host-device synchronisations over this many steps
                                # after the timing warm-up (torch.cuda.set_sync_debug_mode) into
                                # host_syncs_per_step
log_every = 50                  # print a progress line every N steps (0: per epoch only)
checkpoint_every = 1            # checkpoint every N epochs (0: never; a run then cannot resume)
checkpoint_async = True         # write checkpoints in a background thread (the state is copied to
                                # host memory first; the next save or the end of the run waits for
                                # the write)
eval_every = 1                  # evaluate over the test set every N epochs, and after the last (0:
                                # after the last only)
eval_batch = 0                  # samples per rank per evaluation batch (0: 4 x the per-rank
                                # training batch; evaluation keeps no activations for backward)
stop_after_steps = 0            # checkpoint and stop at this total step count (0: run to the end);
                                # a run already there does nothing, a larger value or 0 resumes it
timeout_min = 10.0              # process-group timeout in minutes (collectives that hang fail after
                                # this)
startup_timeout_min = 5.0       # minutes for all ranks to reach the rendezvous (MASTER_ADDR,
                                # MASTER_PORT) and for the first step to complete
hang_timeout_min = 10.0         # a rank with no step (or evaluation batch) for this many minutes
                                # dumps its Python stacks and fails the run
sync_check_steps = 10           # every N steps the ranks agree on a stop request (USR1 or TERM:
                                # checkpoint and stop) and on a non-finite loss; one small all-
                                # reduce each time
term_grace_s = 60.0             # after SIGTERM, seconds to reach a step boundary and checkpoint
                                # before giving up
allow_config_change = False     # resume even though a parameter that alters the run changed (the
                                # change is recorded)
resume_unverified = False       # resume from a checkpoint that carries no checksum (one written by
                                # a lab before checksums): nothing vouches for its bytes; it is read
                                # as data only (tensors, numbers, containers) all the same
backend = 'auto'                # process-group backend: auto (nccl on CUDA, gloo on CPU), nccl or
                                # gloo; gloo on CUDA lets several ranks share one GPU (a check of
                                # the multi-rank path on one GPU, not a way to train fast)
oversubscribe = False           # allow more CPU ranks on this node than it has cores
data_dir = ''                   # data root (empty: <project>/data)
results_dir = ''                # where run records go (empty: $LAB_RESULTS/runs, else
                                # <project>/results/runs)
label = ''                      # free-form label added to the run id
run_id = ''                     # run directory name (empty: generated; an existing run with a
                                # checkpoint resumes)
launcher = 'auto'               # auto, local (spawn gpus processes here), srun (inside an
                                # allocation) or none (this process is one rank)
# --- workload resnet18: its own parameters, used only when workload is 'resnet18'
width = 64                      # ResNet base width (64 is the standard model; smaller only for
                                # tests and demos)
model_source = 'native'         # native (kernels/, CIFAR stem) or torchvision (ImageNet stem,
                                # optional dependency)
momentum = 0.9                  # SGD momentum (nesterov when > 0)
weight_decay = 0.0005           # SGD weight decay
lr_warmup_epochs = 1.0          # linear LR warm-up length in epochs, then cosine decay to 0
# --- workload cnn: its own parameters, used only when workload is 'cnn'
lr_gamma = 0.7                  # StepLR: the learning rate is multiplied by this after every epoch
dropout = True                  # the example's dropout layers (0.25 and 0.5); false makes runs on
                                # different rank counts comparable step by step
# --- workload dcrnn: its own parameters, used only when workload is 'dcrnn'
rnn_units = 64                  # DCGRU hidden units per node
num_rnn_layers = 2              # DCGRU layers of the encoder and of the decoder
max_diffusion_step = 2          # K: diffusion steps per support (0: no graph convolution)
seq_len = 12                    # input steps (1..12; the windows hold the 12 steps before the
                                # forecast)
horizon = 12                    # forecast steps (1..12; metrics at 3, 6, 12 steps where they exist)
cl_decay_steps = 2000           # scheduled sampling: probability k / (k + exp(step / k)) of feeding
                                # the true value to the decoder
use_curriculum_learning = True  # scheduled sampling while training (false: always the model's own
                                # predictions)
diffusion_form = 'original'     # original (the released code's recursion, x0 and x1 carried over
                                # between supports: every published accuracy's arithmetic) or paper
                                # (the paper's equation: plain powers S^k x0 per support)
supports = 'auto'               # diffusion matrices dense, sparse, or auto (dense when at most 4M
                                # entries per rank and, on a CPU, at least 10 % non-zero)
gp = 1                          # graph-parallel group size: the sensor graph is split over gp ranks
                                # (gpus is dp x gp); 0: all ranks (pure graph parallel)
partition = 'metis'             # graph partitioner for gp > 1: metis (pymetis; bfs if missing) or
                                # bfs (breadth-first order cut into equal runs)
lr_milestones = '20,30,40,50'   # epochs after which the learning rate is multiplied by lr_decay
lr_decay = 0.1                  # learning-rate factor at each milestone
max_grad_norm = 5.0             # gradient clipping norm
adam_eps = 0.001                # Adam epsilon
synthetic_shape = 'metr-la'     # shape of the synthetic traffic set: metr-la (34,272 x 207), pems-
                                # bay (52,116 x 325) or large (8,064 x 11,160, PeMS-like)

# %% [markdown]
# ## Resolve and validate
# A window that leaves no active step, an unwritable `profile_dir`, or `profile_hta = 'on'` without
# Holistic Trace Analysis installed stop the notebook here, before any process starts.

# %%
_parameter_names = set(globals()) - _names_before_parameters  # first: before any import adds names
import pandas as pd

from kernels.notebook.tables import readable, table
from kernels.notebook.runner import launch_from_notebook, preload, resolve_notebook_parameters
from kernels.base.params import ConfigError
from kernels.records.schema import read_run

cfg = resolve_notebook_parameters(globals(), _parameter_names)
if cfg.profile_steps == 0:
    raise ConfigError("parameter 'profile_steps': 02_profile profiles; set profile_steps > 0 (or run 01_train)")
preload("matplotlib.pyplot")  # for the plots, while the ranks run
print(f"profiling {cfg.profile_steps} step(s) after {cfg.profile_wait} skipped and {cfg.profile_warmup} warm-up "
      f"step(s) on each of {cfg.gpus} rank(s), with {cfg.profile_with}; monitor at {cfg.monitor_hz:g} Hz")

# %% [markdown]
# ## Launch the ranks

# %%
run_dir = launch_from_notebook(cfg)

# %% [markdown]
# ## The verdict
# Thresholds (one place: `kernels/profiling/verdict.py`): data wait < 5 % of the step,
# exposed communication < 20 %, device utilisation > 80 %.

# %%
record = read_run(run_dir)
summary = record["summary"]
assert summary["status"] == "complete", f"run ended with status {summary['status']}: {summary.get('error')}"
verdict = summary["bottleneck"]
print(f"bottleneck: {verdict['verdict']} ({verdict['reason']})")
table(pd.Series({**verdict["evidence"], **{f"threshold {k}": v for k, v in verdict["thresholds"].items()}},
                name="value").to_frame())

# %% [markdown]
# ## Breakdown by operator category
# Milliseconds per profiled step and share, per rank and averaged over ranks. On CPU traces the
# host timeline (the thread that runs the step); on GPU traces the device timeline (kernels and
# copies; communication overlapped by compute counts as hidden).

# %%
profile = summary["profile"] or {}
if profile.get("status") != "complete":
    raise RuntimeError(f"no breakdown: {profile.get('status', 'the run was not profiled')}")
bd = pd.read_csv(run_dir / "breakdown.csv")
by_category = bd.pivot(index="category", columns="rank", values="ms_per_step")
by_category["share (all)"] = bd[bd["rank"] == "all"].set_index("category")["share"]
print(f"{profile['steps']} profiled step(s), {profile['profiled_ms_per_step']:.1f} ms per step, "
      f"{profile['timeline']} timeline; {profile['comm_crosscheck']}")
table(by_category.sort_values("share (all)", ascending=False).round(3))

# %%
from IPython.display import display

from kernels.base.alttext import show, show_png

show_png(run_dir / "breakdown.png", required=True)

# %% [markdown]
# ## Top operators by self time

# %%
ops = pd.read_csv(run_dir / "top_ops.csv")
table(ops[ops["rank"] == "all"].drop(columns="rank").head(15).reset_index(drop=True))

# %% [markdown]
# ## Resource monitor
# One sampler per node; GPU columns are empty on nodes without GPUs.

# %%
import matplotlib.pyplot as plt

mon = pd.read_csv(run_dir / "monitor.csv") if (run_dir / "monitor.csv").exists() else None
# only what was measured: a CPU node has no GPU rows (blank there, not NaN)
measured = {k: readable(v) for k, v in (summary["monitor"] or {}).items() if readable(v) != ""}
print("monitor:", "  ".join(f"{k} {v}" for k, v in measured.items()) or "no samples")
contention = summary.get("contention") or {}
print("contended:", {True: "yes", False: "no", None: "not measured"}[contention.get("contended")],
      *(["--"] + contention["evidence"] if contention.get("evidence") else []))
if mon is not None and len(mon):
    gpu = mon.dropna(subset=["gpu_util_pct"])
    hosts = mon.drop_duplicates(["node", "unix_s"])
    fig, axes = plt.subplots(1, 2 if gpu.empty else 3, figsize=(13, 3.2))
    for node, g in hosts.groupby("node"):  # the run's own share of the CPUs, and other work's beside it
        line, = axes[0].plot(g["t_s"], g["own_cpu_cores"], label=f"{node}: this run")
        axes[0].plot(g["t_s"], g["foreign_cpu_cores"], ls=":", color=line.get_color(), label=f"{node}: other work")
    axes[0].set(xlabel="s since the sampler started", ylabel="cores busy", ylim=(0, None), title="CPU")
    memory = axes[1] if gpu.empty else axes[2]
    for (node, idx), g in gpu.groupby(["node", "gpu"]):
        axes[1].plot(g["t_s"], g["gpu_util_pct"], label=f"{node} GPU {int(idx)}")
        memory.plot(g["t_s"], g["gpu_mem_used_mib"] / 1024, label=f"{node} GPU {int(idx)}")
    if len(gpu):
        axes[1].set(xlabel="s since the sampler started", ylabel="utilisation %", ylim=(0, 105), title="GPU")
    else:
        for node, g in hosts.groupby("node"):
            memory.plot(g["t_s"], g["host_mem_used_gib"], label=f"{node} host")
    memory.set(xlabel="s since the sampler started", ylabel="GiB",
               title="GPU memory used" if len(gpu) else "host memory used (no GPU on these nodes)")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    show(fig)

# %% [markdown]
# ## Holistic Trace Analysis and the traces

# %%
print("HTA:", profile["hta"]["status"])
for name in profile["hta"].get("files", []):
    display(table(pd.read_csv(run_dir / "hta" / name).head(8)))
print("traces:", *profile["traces"], sep="\n  ")
