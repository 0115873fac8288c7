"""What a rank trains with, built once before its first step (`build`): the data, the model and its FLOPs, the
engine's wrap, the compiled training model, the workload's recipe, the scaler and autocast, and the accounts of
metrics and I/O. kernels/ddp_core.py reads them as `RankParts`; checkpoints save and restore its model,
optimizer, scheduler and scaler (kernels/run/checkpointing.py).
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kernels.base.flops import model_flops_per_sample
from kernels.base.sysinfo import device_name
from kernels.engines import Engine, make_engine
from kernels.records.checkpoint_file import seed_everything
from kernels.run import memory
from kernels.run.capture import Capture
from kernels.run.io_stats import IOAccount
from kernels.run.metrics import MetricSums
from kernels.workloads.base import DataInfo, Recipe, Workload

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class RankParts:
    src: Any  # this rank's training source (kernels/data/pipeline.py's contract)
    eval_src: Any  # its evaluation shard
    info: DataInfo
    model: torch.nn.Module  # the bare model: checkpoints and evaluation
    variant: str  # the model's name for the record
    engine: Engine
    wrapped: torch.nn.Module  # the engine's wrap (DDP on more than one rank)
    capture: Capture
    train_model: Callable  # the wrap, compiled and captured where asked: what the step calls
    recipe: Recipe
    opt: torch.optim.Optimizer  # the engine's wrap of the recipe's optimizer
    scaler: torch.amp.GradScaler  # enabled for fp16 only
    autocast: Any  # the precision's autocast context, or a null one for fp32
    metrics: MetricSums
    io: IOAccount
    derived: dict  # config.json's derived facts

    @property
    def sched(self):
        return self.recipe.scheduler

    @property
    def steps_per_epoch(self) -> int:
        return self.src.steps_per_epoch


def build(cfg, wl: Workload, device: torch.device, renv, backend: str, obs, record) -> RankParts:
    """The rank's parts from the common seed; the data source is closed again if anything after it fails."""
    seed_everything(cfg.seed)
    src, eval_src, info = wl.make_data(cfg, renv.global_rank, renv.world_size, device)
    try:
        src.check_batch(cfg.batch)
        px, py = src.probe(2)
        memory.refuse_what_cannot_fit(wl, cfg, info, (px, py), device, renv.global_rank)
        model, variant = wl.build_model(cfg, info)
        model = model.to(device)
        if cfg.channels_last:
            model = model.to(memory_format=torch.channels_last)
        # FLOPs per sample from the model itself on real samples, on a throw-away copy (BatchNorm untouched)
        flops = model_flops_per_sample(
            copy.deepcopy(model), px, wl.loss, py, forward=lambda m, x, y: wl.forward(m, x, y, 0, True)
        )
        name = device_name(device)
        engine = make_engine(cfg)
        wrapped = engine.wrap_model(model, device)
        # weights came from the common seed; from here on each rank draws its own random numbers (its own dropout)
        torch.manual_seed(cfg.seed * 1_000_003 + 7919 * (renv.global_rank + 1))
        capture = Capture(cfg)
        train_model = capture.compile(wrapped, cfg)
        obs.check_window(cfg.epochs * src.steps_per_epoch, src.steps_per_epoch)
        recipe = wl.build_optimizer(cfg, model, src.steps_per_epoch)
        opt = engine.wrap_optimizer(model, recipe.optimizer, cfg.micro_batches)
        scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")
        autocast = (
            torch.autocast(device.type, dtype=DTYPES[cfg.precision]) if cfg.precision in DTYPES else nullcontext()
        )
        metrics, io = MetricSums(wl, device), IOAccount(src, renv.global_rank, name)
        record.set_facts(model, wl, device, name, flops, cfg.precision, metrics.cols)
        derived = {
            "per_rank_batch": cfg.per_rank_batch,
            "micro_batch": cfg.per_rank_batch // cfg.micro_batches,
            "steps_per_epoch": src.steps_per_epoch,
            "train_samples_used": src.num_samples,
            "test_samples_used": eval_src.num_samples,
            "dropped_per_epoch": src.dropped_per_epoch,
            "data_source": src.describe(),
            "backend": backend,
            "device_type": device.type,
            "launch_source": renv.source,
            "model_variant": variant,
            "tf32": device.type == "cuda",
            **flops,
            "peak_tflops": record.facts["peak"],
            "peak_note": record.facts["peak_note"],
            **engine.facts(),
        }
        return RankParts(
            src=src,
            eval_src=eval_src,
            info=info,
            model=model,
            variant=variant,
            engine=engine,
            wrapped=wrapped,
            capture=capture,
            train_model=train_model,
            recipe=recipe,
            opt=opt,
            scaler=scaler,
            autocast=autocast,
            metrics=metrics,
            io=io,
            derived=derived,
        )
    except BaseException:
        src.close()
        raise
