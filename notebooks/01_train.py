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
# # 01 · Train: one run of the scaling lab
#
# This notebook is the **driver** of one training run. It is not a rank. It validates the
# parameters, launches the ranks, waits for them, then reads the run record back and shows it.
#
# - On a Slurm cluster: `sbatch slurm/papermill_run.sbatch notebooks/01_train.ipynb -p gpus 8`.
#   The ranks start with `srun` over the allocation, one task per GPU.
# - On a laptop, in JupyterLab or in CI: the ranks start as local processes (gloo on CPU).
#
# The ranks run `kernels/ddp_core.py` on the chosen workload (`resnet18`, `cnn`, or your own as
# `module:OBJECT`). The record goes to `results/runs/<run_id>/` (`config.json`, `metrics.csv`,
# `summary.json`). When the notebook runs through `lab run` (which the sbatch script uses),
# the executed notebook and its HTML rendering are filed beside the record.
#
# The parameters cell below holds literals only: the common parameters, then a section per
# workload. `None` means "the workload's default" (its recipe's lr, batch, epochs, precision,
# data set). It is generated from `kernels/base/params.py` and the workloads by `lab notebooks sync`,
# and a test keeps them equal. Papermill injects overrides after it. A name that is not a
# parameter, or a parameter of another workload, is an error here, not a warning.

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
epochs = None                   # training epochs (None: the workload's default)
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
profile_steps = 0               # profile this many training steps (0: off): one gzipped Chrome
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
# Derived values live here, never in the parameters cell: Papermill re-injects literals only.
# An unknown name, a malformed value or an impossible combination stops the notebook here,
# before any process starts or any file is written.

# %%
_parameter_names = set(globals()) - _names_before_parameters  # first: before any import adds names
import pandas as pd

from kernels.notebook.tables import pairs, table
from kernels.notebook.runner import launch_from_notebook, preload, resolve_notebook_parameters
from kernels.records.schema import read_run
from kernels.workloads import get_workload

cfg = resolve_notebook_parameters(globals(), _parameter_names)
preload("matplotlib.pyplot")  # for the plots, while the ranks run
print(f"global batch {cfg.batch} = {cfg.gpus} rank(s) x {cfg.per_rank_batch} per rank"
      f" ({cfg.micro_batches} micro-batch(es) each); precision {cfg.precision}; pipeline {cfg.pipeline}")
# the whole configuration, folded under one line (the record's config.json holds it too); the job log gets the
# same values as name=value lines
table(pd.Series(cfg.to_dict(), name="value").to_frame(), log=pairs(cfg.to_dict()),
      fold=f"the resolved configuration: {len(cfg.to_dict())} parameters (open to read them)")

# %% [markdown]
# ## Launch the ranks
# The per-epoch lines stream here while the ranks train. Under Papermill's `--log-output`
# they also reach the Slurm job's output file.

# %%
run_dir = launch_from_notebook(cfg)

# %% [markdown]
# ## The run record

# %%
record = read_run(run_dir)
summary, config, metrics = record["summary"], record["config"], pd.DataFrame(record["metrics"])
assert summary["status"] == "complete", f"run ended with status {summary['status']}: {summary.get('error')}"
keys = ["run_id", "status", "world_size", "device_name", "throughput_stat", "samples_per_s",
        "samples_per_s_p10", "samples_per_s_p90", "samples_per_s_mean", "samples_per_s_per_device",
        "step_ms_p50", "epoch_s_median", "data_wait_frac", "final_eval_loss", "peak_mem_gib",
        "train_flops_per_sample", "mfu", "exposed_comm_ms"]
keys += [k for k in summary if k.startswith("final_eval_") and k != "final_eval_loss"]
facts = {"nodes": ", ".join(config["nodes"]), "slurm job": config["slurm"].get("slurm_job_id", "-"),
         "backend": config["derived"]["backend"], "model": config["derived"]["model_variant"],
         "torch": config["versions"]["torch"], "git": (config["git"]["commit"] or "-")[:10]}
contention = summary.get("contention") or {}
if contention.get("contended"):  # the analysis sets this point aside until it is re-run on quiet cores
    print("CONTENDED: this run shared its cores or GPUs with foreign work:\n  " + "\n  ".join(contention["evidence"]))
facts["contended"] = {True: "yes", False: "no", None: "not measured"}[contention.get("contended")]
table(pd.concat([pd.Series({k: summary.get(k) for k in keys}), pd.Series(facts)]).to_frame("value"))

# %%
table(metrics)

# %%
import matplotlib.pyplot as plt

from kernels.base.alttext import show
from kernels.base.axis_labels import plain_log_labels

fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
epoch_axis = metrics["epoch"]  # 1-based, as in metrics.csv
axes[0].plot(epoch_axis, metrics["samples_per_s"].astype(float), marker="o", label="median step")
axes[0].fill_between(epoch_axis, metrics["samples_per_s_p10"].astype(float), metrics["samples_per_s_p90"].astype(float),
                     alpha=0.25, label="p10-p90")
if summary["samples_per_s"] is not None:  # None when every step was a warm-up step
    axes[0].axhline(summary["samples_per_s"], ls="--", color="grey", lw=1, label="run headline")
axes[0].set(xlabel="epoch", ylabel="samples/s (all ranks)",
            title="throughput (timed steps)" if summary["timed_steps"] else "no timed steps (warm-up only)")
axes[0].legend(fontsize=7)
axes[0].set_ylim(bottom=0)
axes[1].plot(epoch_axis, metrics["train_loss"], marker="o", label="train")
axes[1].plot(epoch_axis, metrics["eval_loss"], marker="s", label="eval")
axes[1].set(xlabel="epoch", ylabel="loss", title="loss", yscale="log")
plain_log_labels(axes[1].yaxis)
axes[1].legend()
workload = get_workload(cfg.workload)  # its primary metric, one line per label (e.g. per forecast horizon)
shown = next((m for m in workload.metrics if m.name == workload.primary_metric), workload.metrics[0])
for c in shown.columns("eval"):
    axes[2].plot(epoch_axis, metrics[c].astype(float), marker="o", label=c)
axes[2].set(xlabel="epoch", ylabel=shown.name, title=f"evaluation over the test set ({shown.name})")
axes[2].legend()
for ax in axes:
    ax.xaxis.get_major_locator().set_params(integer=True)
fig.suptitle(f"{summary['run_id']} · {summary['world_size']} rank(s) on {summary['device_name']}", fontsize=9)
fig.tight_layout()
show(fig)
