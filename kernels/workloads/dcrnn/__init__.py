"""DCRNN on traffic sensor graphs (METR-LA, PEMS-BAY, or the synthetic set in their formats).

The workload: data (kernels/data/traffic.py reads the real formats and makes windows and
splits; kernels/data/series.py index-batches them on the device), the model
(kernels/workloads/dcrnn/model.py), the graph and its partition
(kernels/workloads/dcrnn/graph.py), and the recipe of the original: Adam at lr 0.01, eps
1e-3, the rate x0.1 at epochs 20, 30, 40, 50, gradient norm clipped at 5, batch 64, up to
100 epochs, loss the masked MAE in mph (mask from the raw readings: 0 = missing).

Metrics: masked MAE, RMSE and MAPE of the test windows at horizons 3, 6 and 12 steps (15,
30 and 60 minutes), each its own column, never averaged over horizons. RMSE is the root of
the masked mean squared error over the whole test set (as the original's evaluation).

Parallelism: data parallel through the lab's loop as every workload; with gp > 1 the ranks
form a grid gpus = dp x gp and each group of gp ranks splits the graph (graph parallel, see
graph.py). The loss of a rank covers its own nodes, scaled so that the gradients DDP averages
over all ranks are those of the unpartitioned model: the weights are shared and all-reduced
as in data parallelism.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kernels.base.errors import ConfigError
from kernels.base.params import Param
from kernels.workloads.base import DataInfo, Metric, Recipe, Workload, fused

if TYPE_CHECKING:  # annotations only: torch is imported where models and data are built
    import torch

HORIZONS = {"15min": 3, "30min": 6, "60min": 12}  # label -> step ahead (5-minute steps)
LABELS = tuple(HORIZONS)

# Published test MAE (mph) per horizon, for the analysis (never for tests): the paper (Li et al. 2018, Table 2)
# and the original repository's README after its 2018 fix.
REFERENCE_MAE = {
    "metr-la": {"paper": (2.77, 3.15, 3.60), "original-fixed": (2.67, 3.08, 3.56)},
    "pems-bay": {"paper": (1.38, 1.74, 2.07), "original-fixed": (1.31, 1.66, 1.98)},
}

PARAMS = (
    Param("rnn_units", int, 64, "DCGRU hidden units per node", group="dcrnn"),
    Param("num_rnn_layers", int, 2, "DCGRU layers of the encoder and of the decoder", group="dcrnn"),
    Param("max_diffusion_step", int, 2, "K: diffusion steps per support (0: no graph convolution)", group="dcrnn"),
    Param("seq_len", int, 12, "input steps (1..12; the windows hold the 12 steps before the forecast)", group="dcrnn"),
    Param("horizon", int, 12, "forecast steps (1..12; metrics at 3, 6, 12 steps where they exist)", group="dcrnn"),
    Param(
        "cl_decay_steps",
        int,
        2000,
        "scheduled sampling: probability k / (k + exp(step / k)) of feeding the true value to the decoder",
        group="dcrnn",
    ),
    Param(
        "use_curriculum_learning",
        bool,
        True,
        "scheduled sampling while training (false: always the model's own predictions)",
        group="dcrnn",
    ),
    Param(
        "diffusion_form",
        str,
        "original",
        "original (the released code's recursion, x0 and x1 carried over "
        "between supports: every published accuracy's arithmetic) or paper "
        "(the paper's equation: plain powers S^k x0 per support)",
        ("original", "paper"),
        group="dcrnn",
    ),
    Param(
        "supports",
        str,
        "auto",
        "diffusion matrices dense, sparse, or auto (dense when at most 4M entries per "
        "rank and, on a CPU, at least 10 % non-zero)",
        ("auto", "dense", "sparse"),
        group="dcrnn",
    ),
    Param(
        "gp",
        int,
        1,
        "graph-parallel group size: the sensor graph is split over gp ranks (gpus is dp x gp); "
        "0: all ranks (pure graph parallel)",
        group="dcrnn",
    ),
    Param(
        "partition",
        str,
        "metis",
        "graph partitioner for gp > 1: metis (pymetis; bfs if missing) or bfs "
        "(breadth-first order cut into equal runs)",
        ("metis", "bfs"),
        group="dcrnn",
    ),
    Param(
        "lr_milestones",
        str,
        "20,30,40,50",
        "epochs after which the learning rate is multiplied by lr_decay",
        group="dcrnn",
    ),
    Param("lr_decay", float, 0.1, "learning-rate factor at each milestone", group="dcrnn"),
    Param("max_grad_norm", float, 5.0, "gradient clipping norm", group="dcrnn"),
    Param("adam_eps", float, 1e-3, "Adam epsilon", group="dcrnn"),
    Param(
        "synthetic_shape",
        str,
        "metr-la",
        "shape of the synthetic traffic set: metr-la (34,272 x 207), pems-bay "
        "(52,116 x 325) or large (8,064 x 11,160, PeMS-like)",
        ("metr-la", "pems-bay", "large"),
        group="dcrnn",
    ),
)


def _milestones(cfg) -> list[int]:
    try:
        ms = [int(t) for t in cfg.lr_milestones.replace(" ", "").split(",") if t]
    except ValueError:
        raise ConfigError(
            f"parameter 'lr_milestones': {cfg.lr_milestones!r} is not a comma-separated list of "
            f"epochs, e.g. 20,30,40,50"
        ) from None
    if any(m < 1 for m in ms) or ms != sorted(ms):
        raise ConfigError(f"parameter 'lr_milestones': epochs must be >= 1 and increasing, got {cfg.lr_milestones!r}")
    return ms


def _num_sensors(cfg) -> int | None:
    from kernels.data import traffic

    if cfg.dataset == "synthetic":
        return traffic.SYNTHETIC_SHAPES[cfg.synthetic_shape][1]
    return traffic.SETS[cfg.dataset].shape[1] if cfg.dataset in traffic.SETS else None


def check(cfg) -> None:
    from kernels.data.traffic import HORIZON, SEQ_LEN

    for name, hi in (("seq_len", SEQ_LEN), ("horizon", HORIZON)):
        v = getattr(cfg, name)
        if not 1 <= v <= hi:
            raise ConfigError(
                f"parameter '{name}': must be in 1..{hi} (the windows hold {SEQ_LEN} input and "
                f"{HORIZON} target steps, as the original data preparation), got {v}"
            )
    for name in ("rnn_units", "num_rnn_layers", "cl_decay_steps"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"parameter '{name}': must be >= 1, got {getattr(cfg, name)}")
    if cfg.max_diffusion_step < 0:
        raise ConfigError(f"parameter 'max_diffusion_step': must be >= 0, got {cfg.max_diffusion_step}")
    gp = group_size(cfg)
    if gp < 1 or cfg.gpus % gp:
        raise ConfigError(
            f"parameter 'gp': {cfg.gp} does not divide gpus={cfg.gpus}; the ranks form a grid "
            f"gpus = dp x gp (e.g. gpus={gp * max(1, cfg.gpus // max(gp, 1))} gp={cfg.gp}), or gp=0 "
            f"puts all ranks in one group"
        )
    n = _num_sensors(cfg)
    if n is not None and gp > n:
        raise ConfigError(f"parameter 'gp': {gp} parts for {n} sensors; every rank needs at least one sensor")
    dp = cfg.gpus // gp
    if (cfg.batch // dp) % cfg.micro_batches:
        raise ConfigError(
            f"parameter 'micro_batches': the batch of a graph-parallel group ({cfg.batch // dp}) is "
            f"not divisible by micro_batches={cfg.micro_batches}"
        )
    _milestones(cfg)
    if not 0 < cfg.lr_decay <= 1:
        raise ConfigError(f"parameter 'lr_decay': must be in (0, 1], got {cfg.lr_decay}")
    if cfg.max_grad_norm <= 0 or cfg.adam_eps <= 0:
        raise ConfigError("parameters 'max_grad_norm' and 'adam_eps' must be > 0")
    if cfg.compile and gp > 1:
        raise ConfigError(
            "parameter 'compile': not with gp > 1 (the halo "
            "exchange is a collective inside autograd); use compile=false"
        )


def group_size(cfg) -> int:
    """The graph-parallel group size: gp, or every rank for gp=0."""
    return cfg.gpus if cfg.gp == 0 else cfg.gp


def prepare(cfg) -> None:
    """Before launch, once: generate the synthetic set if it is not there yet."""
    if cfg.dataset == "synthetic":
        from kernels.data import traffic

        traffic.generate(cfg.synthetic_shape, cfg.data_root)


def make_data(cfg, rank: int, world: int, device: torch.device):
    from kernels.data import traffic
    from kernels.data.series import SeriesStore, WindowEvalSource, WindowSource
    from kernels.base.dist import grid
    from kernels.workloads.dcrnn.graph import Graph, dual_supports, edge_cut, halo_plans, partition

    gp = group_size(cfg)
    series = traffic.load(cfg.dataset, cfg.data_root, cfg.synthetic_shape)
    n = series.num_nodes
    if gp > n:
        raise ConfigError(f"parameter 'gp': {gp} parts for {n} sensors; every rank needs at least one sensor")
    g = grid(gp)
    mean, std = series.scaler()
    splits = series.splits()
    train = splits["train"] if not cfg.train_samples else splits["train"][: cfg.train_samples]
    test = splits["test"] if not cfg.test_samples else splits["test"][: cfg.test_samples]
    supports = dual_supports(series.adj)
    member, method = partition(series.adj, gp, cfg.partition)
    plan = None
    own = np.arange(n)
    ext = own
    if gp > 1:
        structure = np.zeros((n, n), dtype=bool)
        for s in supports:
            structure |= s != 0
        plan = halo_plans(structure, member, gp)[g.gp_rank]
        plan.group = g.group
        own, ext = plan.own, np.concatenate([plan.own, plan.halo])
        plan.to(device)
    local = [np.ascontiguousarray(s[np.ix_(own, ext)]) for s in supports]
    inputs = series.inputs(mean, std)[:, own]
    raw = series.speeds[:, own]
    norm = (series.speeds != 0).sum(1).astype(np.float32) / gp
    store = SeriesStore(inputs, raw, norm, device, cfg.seq_len, cfg.horizon)
    src = WindowSource(store, train, cfg.batch, g.dp_rank, g.dp, cfg.seed)
    ev = WindowEvalSource(store, test, cfg.eval_batch or 4 * (cfg.batch // g.dp), g.dp_rank, g.dp)
    shared = {
        "dataset_shape": [series.num_steps, n],
        "graph_edges": int((series.adj != 0).sum() - (np.diag(series.adj) != 0).sum()),
        "missing_frac": round(float((series.speeds == 0).mean()), 5),
        "scaler_mean": mean,
        "scaler_std": std,
        "windows": {k: len(v) for k, v in splits.items()},
        "train_windows_used": len(train),
        "test_windows_used": len(test),
        "dp": g.dp,
        "gp": g.gp,
        "partition": method,
        "edge_cut": edge_cut(series.adj, member) if gp > 1 else 0,
        "part_sizes": np.bincount(member, minlength=gp).tolist(),
        "diffusion_form": cfg.diffusion_form,
    }
    if rank == 0:
        shared["historical_average"] = historical_average_metrics(series, test, cfg.horizon)
    graph = Graph(local, plan, cfg.supports, device.type)
    info = DataInfo(
        input_shape=(cfg.seq_len, len(own), 2),
        extra={"graph": graph, "mean": mean, "std": std, "shared": shared, "per_group_batch": cfg.batch // g.dp},
    )
    return src, ev, info


def build_model(cfg, info: DataInfo):
    from kernels.workloads.dcrnn.model import DCRNN

    graph = info.extra["graph"]
    model = DCRNN(
        graph,
        info.extra["mean"],
        info.extra["std"],
        units=cfg.rnn_units,
        layers=cfg.num_rnn_layers,
        k_max=cfg.max_diffusion_step,
        seq_len=cfg.seq_len,
        horizon=cfg.horizon,
        cl_decay_steps=cfg.cl_decay_steps,
        curriculum=cfg.use_curriculum_learning,
        form=cfg.diffusion_form,
        seed=cfg.seed,
    )
    model._lab_info = info.extra  # for report()
    variant = (
        f"dcrnn-{cfg.num_rnn_layers}x{cfg.rnn_units}-K{cfg.max_diffusion_step}-{cfg.diffusion_form}-"
        f"{'sparse' if graph.sparse else 'dense'}" + (f"-gp{group_size(cfg)}" if group_size(cfg) > 1 else "")
    )
    return model, variant


def build_optimizer(cfg, model, steps_per_epoch: int) -> Recipe:
    import torch

    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, eps=cfg.adam_eps, **fused(model))
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=_milestones(cfg), gamma=cfg.lr_decay)
    return Recipe(opt, sched, "epoch", clip_grad_norm=cfg.max_grad_norm)


def forward(model, x, y, step: int, train: bool):
    return model(x, y[0] if y is not None else None, step, train)


def loss(outputs, targets):
    """Masked MAE (mph) over this rank's nodes, normalised by the batch's non-missing targets (see series.py)."""
    import torch

    y, norm = targets
    mask = y != 0
    err = torch.where(mask, (outputs.float() - y).abs(), torch.zeros((), device=y.device))
    return err.sum() / norm.sum().clamp(min=1.0)


def metric_sums(outputs, targets):
    """Per horizon label: sums of |e|, e^2 and |e|/y over non-missing targets, and their count."""
    import torch

    y, _ = targets
    h = outputs.shape[1]
    idx = [HORIZONS[lab] - 1 for lab in LABELS]
    # the horizons picked by slices and one stack: an index tensor made here would be a host-to-device copy (a sync)
    # in every training step
    out = torch.stack([outputs[:, min(i, h - 1)] for i in idx], 1).float()  # (B, 3, nodes)
    y = torch.stack([y[:, min(i, h - 1)] for i in idx], 1)
    mask = y != 0
    for k, i in enumerate(idx):
        if i >= h:  # a horizon beyond the model's: nothing counts
            mask[:, k] = False
    zero = torch.zeros((), device=y.device)
    e = torch.where(mask, out - y, zero)
    count = mask.sum((0, 2)).double()
    ae = e.abs().sum((0, 2)).double()
    se = e.square().sum((0, 2)).double()
    pe = torch.where(mask, e.abs() / torch.where(mask, y, torch.ones((), device=y.device)), zero).sum((0, 2)).double()
    return {"mae": (ae, count), "rmse": (se, count), "mape": (pe, count)}


def historical_average_metrics(series, test: range, horizon: int) -> dict:
    """The historical-average baseline on the same test windows and horizons: {metric_label: value}."""
    from kernels.data.traffic import SEQ_LEN

    ha = series.historical_average()
    out = {}
    for label, step in HORIZONS.items():
        if step > horizon:
            continue
        rows = slice(test.start + SEQ_LEN + step - 1, test.stop + SEQ_LEN + step - 1)
        y, p = series.speeds[rows].astype(np.float64), ha[rows].astype(np.float64)
        m = y != 0
        e = np.where(m, p - y, 0.0)
        c = max(int(m.sum()), 1)
        out[f"mae_{label}"] = float(np.abs(e).sum() / c)
        out[f"rmse_{label}"] = float(np.sqrt(np.square(e).sum() / c))
        out[f"mape_{label}"] = float((np.abs(e) / np.where(m, y, 1.0)).sum() / c)
    return out


def report(model, info=None) -> dict:
    """For the record: what every rank shares (the data, the grid, the partition, the baseline) and its own part
    (nodes, halo, bytes exchanged per step)."""
    extra = model._lab_info
    graph = model.graph
    mine = graph.describe()
    plan = graph.plan
    if plan is not None:
        c = plan.counters
        per_sample = (c["fwd_bytes"] + c["bwd_bytes"]) / c["samples"] if c["samples"] else None
        wire = c["wire_bytes"] / c["samples"] if c["samples"] else None
        b = extra["per_group_batch"]
        mine.update(
            halo_bytes_per_step=round(per_sample * b) if per_sample is not None else None,
            collective_bytes_per_step=round(wire * b) if wire is not None else None,
            exchanges_per_forward=round(c["exchanges"] / c["forwards"]) if c["forwards"] else None,
        )
    return {"shared": extra["shared"], "rank": mine}


WORKLOAD = Workload(
    name="dcrnn",
    title="DCRNN, a diffusion-convolutional recurrent network",
    datasets=("synthetic", "metr-la", "pems-bay"),
    params=PARAMS,
    defaults={"precision": "fp32", "batch": 64, "epochs": 100, "lr": 0.01},
    metrics=(
        Metric("mae", LABELS, higher_is_better=False),
        Metric("rmse", LABELS, higher_is_better=False, root=True),
        Metric("mape", LABELS, higher_is_better=False),
    ),
    make_data=make_data,
    build_model=build_model,
    build_optimizer=build_optimizer,
    loss=loss,
    reporting="kernels.workloads.dcrnn.reporting",
    metric_sums=metric_sums,
    forward=forward,
    check=check,
    prepare=prepare,
    report=report,
    primary_metric="mae",
    # the decoder's teacher-forcing coins are drawn on the host each step (a graph break and a copy): no capture
    static_shapes=False,
)
