"""The CNN of the PyTorch MNIST example, on MNIST, Fashion-MNIST, bigMNIST, the embedded digits or synthetic data.

Model (pytorch/examples, mnist/main.py): conv 1->32 3x3, ReLU, conv 32->64 3x3,
ReLU, max-pool 2, dropout 0.25, flatten (9216), fc 9216->128, ReLU, dropout 0.5,
fc 128->10. The example ends in log_softmax + NLL; here the model returns logits
and the loss is cross-entropy, the same function. About 12 M multiply-adds (24 MFLOPs)
per 28x28 image forward, counted from the model, not typed.

Recipe, as the example's defaults: Adadelta at lr 1.0, StepLR decaying the rate by
gamma 0.7 after every epoch, batch 64. The images are normalised with each data
set's mean and standard deviation and not augmented (bigMNIST is augmented when it is built;
its mean and standard deviation come from its manifest, and it is streamed from its shards).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernels.base.errors import ConfigError
from kernels.base.params import Param
from kernels.workloads import classification
from kernels.workloads.base import DataInfo, Recipe, Workload

if TYPE_CHECKING:  # annotations only: torch is imported where models and data are built
    import torch

# per data set: (mean, std) of the training images in [0, 1]
NORMALISE = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "digits": ((0.1307,), (0.3081,)),
    "synthetic": ((0.5,), (0.2887,)),
}


PARAMS = (
    Param("lr_gamma", float, 0.7, "StepLR: the learning rate is multiplied by this after every epoch", group="cnn"),
    Param(
        "dropout",
        bool,
        True,
        "the example's dropout layers (0.25 and 0.5); false makes runs on different rank "
        "counts comparable step by step",
        group="cnn",
    ),
)


def check(cfg) -> None:
    if not 0 < cfg.lr_gamma <= 1:
        raise ConfigError(f"parameter 'lr_gamma': must be in (0, 1], got {cfg.lr_gamma}")
    if cfg.dataset == "bigmnist":
        from kernels.data import bigmnist

        try:  # a set not built here yet (a study planned on a login node) is reported before launch instead
            d, manifest = bigmnist.load_manifest(cfg.data_root)
        except ConfigError:
            return
        shards = len(manifest["shards"])
        if cfg.gpus > shards:
            raise ConfigError(
                f"parameter 'gpus': {cfg.gpus} ranks but the bigMNIST set in {d} has {shards} shards; "
                f"every rank streams its own range of at least one shard. Use gpus <= {shards}, or "
                f"build the set with smaller --shard-samples"
            )


def make_data(cfg, rank: int, world: int, device: torch.device):
    from kernels.data import load_image_dataset
    from kernels.data.pipeline import ImageTransform, tensor_sources

    if cfg.dataset == "bigmnist":
        return _bigmnist_data(cfg, rank, world, device)
    train, test, classes = load_image_dataset(
        cfg.dataset, cfg.data_root, samples=cfg.train_samples, size=28, channels=1
    )
    mean, std = NORMALISE[cfg.dataset]
    src, ev = tensor_sources(cfg, train, test, ImageTransform(mean=mean, std=std), rank, world, device)
    return src, ev, DataInfo(input_shape=tuple(train.x.shape[1:]), num_classes=classes)


def _bigmnist_data(cfg, rank: int, world: int, device: torch.device):
    """Streamed shards (pipeline=stream) or the per-sample DataLoader over them; the untouched test split."""
    from kernels.data.pipeline import EvalSource, ImageTransform
    from kernels.data.stream import PerSampleSource, ShardSet, StreamSource

    shards = ShardSet(cfg.data_root)
    if cfg.train_samples:
        raise ConfigError(
            "parameter 'train_samples': a streamed set is used whole; build a smaller set "
            "(lab bigmnist build --replicas/--versions/--source-samples) for a quicker run"
        )
    mean, std = shards.manifest["mean"], shards.manifest["std"]
    transform = ImageTransform(mean=(mean,), std=(std,))
    if cfg.pipeline == "stream":
        src = StreamSource(
            shards,
            transform,
            cfg.batch,
            rank,
            world,
            cfg.seed,
            device,
            cfg.channels_last,
            cfg.cache,
            cfg.window_mb,
            cfg.read_mb,
            cfg.io_threads,
        )
    else:
        src = PerSampleSource(
            shards,
            mean,
            std,
            cfg.batch,
            rank,
            world,
            cfg.seed,
            device,
            cfg.channels_last,
            cfg.num_workers,
            cfg.prefetch_factor,
        )
    test = shards.test_split().head(cfg.test_samples)
    ev = EvalSource(test, transform, cfg.per_rank_eval_batch, rank, world, device, cfg.channels_last)
    return src, ev, DataInfo(input_shape=(1, 28, 28), num_classes=shards.manifest["num_classes"])


def build_model(cfg, info: DataInfo):
    if tuple(info.input_shape) != (1, 28, 28):
        raise ConfigError(f"workload 'cnn': needs 1x28x28 images, data set '{cfg.dataset}' gives {info.input_shape}")
    from kernels.workloads.convnets import MnistCNN

    return MnistCNN(info.num_classes, cfg.dropout), "mnist-cnn-pytorch-examples" + ("" if cfg.dropout else "-nodropout")


def build_optimizer(cfg, model, steps_per_epoch: int) -> Recipe:
    import torch

    opt = torch.optim.Adadelta(model.parameters(), lr=cfg.lr)
    return Recipe(opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=cfg.lr_gamma), "epoch")


WORKLOAD = Workload(
    name="cnn",
    title="the CNN of the PyTorch MNIST example",
    datasets=("mnist", "fashion-mnist", "bigmnist", "digits", "synthetic"),
    params=PARAMS,
    defaults={"precision": "fp32", "batch": 64, "epochs": 5, "lr": 1.0},
    metrics=(classification.ACCURACY,),
    make_data=make_data,
    build_model=build_model,
    build_optimizer=build_optimizer,
    loss=classification.loss,
    metric_sums=classification.metric_sums,
    check=check,
    primary_metric="acc",
)
