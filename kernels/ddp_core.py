"""The thin DDP/AMP training loop: one call per rank.

    env -> device -> process group -> data -> model (+ FLOP count) -> DDP -> loop
        -> per-epoch eval + record row + checkpoint -> comm probe -> summary -> teardown

The same code runs on 1 CPU process, N gloo processes, 1 GPU, N GPUs and N
nodes; only the device and the backend differ. The loop knows nothing about the
workload beyond the `Workload` interface. Every reported scalar is reduced over
ranks; global rank 0 alone writes files.
"""
from __future__ import annotations

import copy
import os
import resource
import secrets
import signal
import sys
import time
import traceback
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path
from statistics import median

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from kernels import checkpoint as ckpt
from kernels import records, sysinfo
from kernels.dist import all_gather_object, all_reduce, broadcast_object, process_group, rank_env, select_device
from kernels.flops import mfu, model_flops_per_sample, peak_tflops
from kernels.params import ConfigError, RunConfig, device_type
from kernels.stats import step_summary, thin
from kernels.timers import StepTimer, synchronize
from kernels.workloads import get_workload

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def make_run_id(cfg: RunConfig, environ=None) -> str:
    """A readable, unique id. Under Slurm it is derived from the job id, so a
    requeued job finds its checkpoint and resumes."""
    env = os.environ if environ is None else environ
    if cfg.run_id:
        return cfg.run_id
    parts = [cfg.workload, cfg.dataset, f"g{cfg.gpus}"] + ([cfg.label] if cfg.label else [])
    if "SLURM_JOB_ID" in env:
        job = env.get("SLURM_ARRAY_JOB_ID", env["SLURM_JOB_ID"])
        task = f"_{env['SLURM_ARRAY_TASK_ID']}" if "SLURM_ARRAY_TASK_ID" in env else ""
        return "-".join(parts + [f"j{job}{task}"])
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return "-".join([stamp] + parts + [secrets.token_hex(2)])


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Terminated(Exception):
    """SIGTERM arrived: Slurm's time limit, scancel, or the launcher stopping the ranks."""


def _on_sigterm(signum, frame):
    raise Terminated(f"terminated by signal {signum} (time limit, scancel or a stopped launcher)")


def run(cfg: RunConfig) -> dict | None:
    """Run this process's rank of `cfg`. Returns the summary on global rank 0."""
    # An exception, not a silent death, so rank 0 records `failed` instead of leaving `running`.
    signal.signal(signal.SIGTERM, _on_sigterm)
    renv = rank_env()
    if renv.world_size != cfg.gpus:
        raise ConfigError(
            f"parameter 'gpus': gpus={cfg.gpus} but the launcher started {renv.world_size} rank(s) "
            f"({renv.source}); make them agree (e.g. srun --ntasks={cfg.gpus})")
    device = select_device(device_type(cfg), renv.local_rank)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    with process_group(renv, device, cfg.timeout_min) as backend:
        return Trainer(cfg, renv, device, backend).run()


class Trainer:
    def __init__(self, cfg: RunConfig, renv, device: torch.device, backend: str):
        self.cfg, self.renv, self.device, self.backend = cfg, renv, device, backend
        self.is_rank0 = renv.is_rank0
        self.world = renv.world_size
        self.wl = get_workload(cfg.workload)
        self.run_dir: Path | None = None

    def log(self, msg: str) -> None:
        if self.is_rank0:
            print(msg, flush=True)

    # ---------------------------------------------------------------- setup
    def _prepare(self):
        cfg, wl, dev = self.cfg, self.wl, self.device
        seed_everything(cfg.seed)
        self.train_src, self.eval_src, info = wl.make_data(cfg, self.renv.global_rank, self.world, dev)
        if self.train_src.num_samples < cfg.batch:
            raise ConfigError(
                f"parameter 'batch': the training set has {self.train_src.num_samples} samples, fewer than one global "
                f"batch of {cfg.batch}; lower batch or raise train_samples")
        model, self.variant = wl.build_model(cfg, info)
        model = model.to(dev)
        if cfg.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model

        # FLOPs per sample from the model itself on real samples, on a throw-away copy so
        # that BatchNorm statistics of the real model are untouched.
        probe_x, probe_y = self.train_src.probe(2)
        self.flops = model_flops_per_sample(copy.deepcopy(model), probe_x, wl.loss, probe_y,
                                            forward=lambda m, x, y: wl.forward(m, x, y, 0, True))
        self.device_name = sysinfo.device_name(dev)
        self.peak = peak_tflops(self.device_name, cfg.precision) if dev.type == "cuda" else None

        self.ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None,
                       bucket_cap_mb=cfg.bucket_cap_mb, gradient_as_bucket_view=cfg.gradient_as_bucket_view)
        # Weights are initialised from the common seed (and DDP broadcasts rank 0's anyway); from
        # here on each rank draws its own random numbers (dropout), or all ranks would drop the
        # same units of their different samples.
        torch.manual_seed(cfg.seed * 1_000_003 + 7919 * (self.renv.global_rank + 1))
        self.train_model = torch.compile(self.ddp) if cfg.compile else self.ddp
        self.steps_per_epoch = self.train_src.steps_per_epoch
        self.recipe = wl.build_optimizer(cfg, model, self.steps_per_epoch)
        if self.recipe.schedule_unit not in ("step", "epoch"):
            raise ValueError(f"workload {wl.name}: schedule_unit must be 'step' or 'epoch'")
        self.opt, self.sched = self.recipe.optimizer, self.recipe.scheduler
        self.scaler = torch.amp.GradScaler(dev.type, enabled=cfg.precision == "fp16")
        self.autocast = (torch.autocast(dev.type, dtype=DTYPES[cfg.precision])
                         if cfg.precision in DTYPES else nullcontext())
        self.metric_cols = [c.removeprefix("eval_") for m in wl.metrics for c in m.columns("eval")]
        self.columns = records.metric_columns(wl.metrics)

    def _open_record(self):
        """Decide run id, fresh vs resume; rank 0 creates the directory. All ranks agree."""
        cfg = self.cfg
        decision = None
        if self.is_rank0:
            run_id = make_run_id(cfg)
            run_dir = cfg.results_root / run_id
            try:
                records.ensure_not_complete(run_dir)
                decision = {"run_id": run_id, "resume": (run_dir / ckpt.FILENAME).exists()}
            except ConfigError as e:
                decision = {"error": str(e)}
        decision = broadcast_object(decision)
        if "error" in decision:
            raise ConfigError(decision["error"])
        self.run_id = decision["run_id"]
        self.run_dir = cfg.results_root / self.run_id
        self.state = {"epoch": 0, "step_in_epoch": 0, "global_step": 0, "rows": [], "timing": _zero_timing(),
                      "started_utc": utc_now(), "resumed_from_step": 0}
        if decision["resume"]:
            state = ckpt.load(self.run_dir / ckpt.FILENAME)
            self.ddp.module.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
            self.sched.load_state_dict(state["scheduler"])
            ckpt.set_rng_state(state["rng"][self.renv.global_rank])
            for k in ("epoch", "step_in_epoch", "global_step", "rows", "timing", "started_utc"):
                self.state[k] = state[k]
            self.state["resumed_from_step"] = state["global_step"]
            self.log(f"resuming {self.run_id} from epoch {state['epoch'] + 1} step {state['step_in_epoch']} "
                     f"(global step {state['global_step']})")
        hosts = all_gather_object({"host": sysinfo.host(), "node": os.environ.get("SLURMD_NODENAME", sysinfo.host()),
                                   "device": self.device_name,
                                   "global_rank": self.renv.global_rank, "local_rank": self.renv.local_rank})
        if self.is_rank0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            records.write_json(self.run_dir / "config.json", self._config_record(hosts))
            self._write_summary("running")
        dist.barrier()

    def _config_record(self, ranks: list[dict]) -> dict:
        cfg = self.cfg
        return {
            "schema_version": records.SCHEMA_VERSION,
            "run_id": self.run_id,
            "params": cfg.to_dict(),
            "derived": {
                "world_size": self.world, "per_rank_batch": cfg.per_rank_batch,
                "micro_batch": cfg.per_rank_batch // cfg.micro_batches,
                "steps_per_epoch": self.steps_per_epoch, "train_samples_used": self.train_src.num_samples,
                "test_samples_used": self.eval_src.num_samples,
                "dropped_per_epoch": self.train_src.dropped_per_epoch, "data_source": self.train_src.describe(),
                "backend": self.backend, "device_type": self.device.type, "launch_source": self.renv.source,
                "model_variant": self.variant, "tf32": self.device.type == "cuda",
                **self.flops, "peak_tflops": self.peak,
                "nodes": len({r["node"] for r in ranks}),
            },
            "git": sysinfo.git_info(),
            "versions": sysinfo.software_versions(),
            "hosts": sorted({r["host"] for r in ranks}),
            "nodes": sorted({r["node"] for r in ranks}),
            "devices": sorted({r["device"] for r in ranks}),
            "ranks": ranks,
            "slurm": sysinfo.slurm_ids(),
            "system": sysinfo.node_facts(),
            "lab": sysinfo.lab_ids(),
            "command": sys.argv,
            "started_utc": self.state["started_utc"],
        }

    # ----------------------------------------------------------------- loop
    def run(self) -> dict | None:
        self._prepare()
        self._open_record()
        try:
            status = self._train()
            probe = self._comm_probe() if status == "complete" else {}
            summary = self._write_summary(status, probe)
            self.log(f"{status}: {self.run_dir}")
            return summary
        except BaseException as e:
            if self.is_rank0 and self.run_dir is not None:
                self._write_summary("failed", error=f"{type(e).__name__}: {e}")
                traceback.print_exc()
            raise

    def _train(self) -> str:
        cfg, st = self.cfg, self.state
        timer = StepTimer(self.device)
        steps_this_attempt = 0  # warm-up (compilation, autotuning) recurs in every new process
        for epoch in range(st["epoch"], cfg.epochs):
            self.ddp.train()
            sums = self._zero_sums()
            start = st["step_in_epoch"]
            synchronize(self.device)
            t_epoch = time.perf_counter()
            batches = self.train_src.batches(epoch, start)
            step = start
            while True:
                timer.start()
                batch = next(batches, None)
                if batch is None:
                    break
                timer.data_ready()
                self._step(*batch, sums, st["global_step"])
                timer.done(timed=steps_this_attempt >= cfg.timing_warmup_steps)
                steps_this_attempt += 1
                st["global_step"] += 1
                step += 1
                if cfg.log_every and step % cfg.log_every == 0:
                    self.log(f"epoch {epoch + 1}/{cfg.epochs} step {step}/{self.steps_per_epoch} "
                             f"loss {float(sums[0] / max(float(sums[1]), 1)):.4f} lr {self.sched.get_last_lr()[0]:.4g}")
                if cfg.stop_after_steps and st["global_step"] >= cfg.stop_after_steps and step < self.steps_per_epoch:
                    synchronize(self.device)
                    st["epoch"], st["step_in_epoch"] = epoch, step
                    self._checkpoint()
                    self.log(f"stopped after {st['global_step']} steps (stop_after_steps); re-run to resume")
                    return "stopped"
            synchronize(self.device)
            epoch_s = time.perf_counter() - t_epoch
            if self.recipe.schedule_unit == "epoch":
                self.sched.step()
            wait, comp = timer.collect()
            t_eval = time.perf_counter()
            ev = self._evaluate()
            eval_s = time.perf_counter() - t_eval
            row = self._epoch_row(epoch, step - start, wait, comp, sums, ev, epoch_s, eval_s)
            st["rows"].append(row)
            st["epoch"], st["step_in_epoch"] = epoch + 1, 0
            if self.is_rank0:
                records.write_metrics(self.run_dir / "metrics.csv", st["rows"], self.columns)
            self.log(self._epoch_line(row))
            last = epoch + 1 == cfg.epochs
            if cfg.checkpoint_every and ((epoch + 1) % cfg.checkpoint_every == 0 or last):
                self._checkpoint()
            if cfg.stop_after_steps and st["global_step"] >= cfg.stop_after_steps and not last:
                if not cfg.checkpoint_every or (epoch + 1) % cfg.checkpoint_every:
                    self._checkpoint()
                self.log(f"stopped after {st['global_step']} steps (stop_after_steps); re-run to resume")
                return "stopped"
        return "complete"

    def _zero_sums(self) -> torch.Tensor:
        """[loss sum, samples, metric numerators ..., metric denominators ...] on the device."""
        return torch.zeros(2 + 2 * len(self.metric_cols), dtype=torch.float64, device=self.device)

    def _add_metrics(self, sums: torch.Tensor, out, y) -> None:
        """Add the workload's (numerator, denominator) sums for this batch, flattened in metric order."""
        got = self.wl.metric_sums(out, y)
        k, i = len(self.metric_cols), 0
        for m in self.wl.metrics:
            num, den = (torch.as_tensor(v, device=self.device, dtype=torch.float64).reshape(-1) for v in got[m.name])
            sums[2 + i:2 + i + m.size] += num.expand(m.size)
            sums[2 + k + i:2 + k + i + m.size] += den.expand(m.size)
            i += m.size

    def _metric_values(self, sums: torch.Tensor, prefix: str) -> dict:
        k = len(self.metric_cols)
        num, den = sums[2:2 + k].tolist(), sums[2 + k:].tolist()
        return {f"{prefix}_{c}": (a / b if b else None) for c, a, b in zip(self.metric_cols, num, den)}

    def _step(self, x, y, sums, global_step: int) -> None:
        cfg, wl = self.cfg, self.wl
        self.opt.zero_grad(set_to_none=True)
        mb = cfg.micro_batches
        for i, (xm, ym) in enumerate(zip(_chunks(x, mb), _chunks(y, mb))):
            # Gradients are all-reduced once per step, on the last micro-batch.
            sync = self.ddp.no_sync() if i < mb - 1 else nullcontext()
            with sync:
                with self.autocast:
                    out = wl.forward(self.train_model, xm, ym, global_step, True)
                    loss = wl.loss(out, ym)
                self.scaler.scale(loss / mb).backward()
            with torch.no_grad():
                n = _batch_len(ym)
                sums[0] += loss.detach().double() * n
                sums[1] += n
                self._add_metrics(sums, _detach(out), ym)
        if self.recipe.clip_grad_norm:
            self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.ddp.parameters(), self.recipe.clip_grad_norm)
        self.scaler.step(self.opt)
        self.scaler.update()
        if self.recipe.schedule_unit == "step":
            self.sched.step()

    @torch.no_grad()
    def _evaluate(self) -> dict:
        model = self.ddp.module  # no DDP hooks: shards may differ by one batch between ranks
        model.eval()
        sums = self._zero_sums()
        for x, y in self.eval_src.batches():
            with self.autocast:
                out = self.wl.forward(model, x, y, self.state["global_step"], False)
                loss = self.wl.loss(out, y)
            n = _batch_len(y)
            sums[0] += loss.double() * n
            sums[1] += n
            self._add_metrics(sums, out, y)
        dist.all_reduce(sums)
        n = max(float(sums[1]), 1.0)
        return {"eval_loss": float(sums[0]) / n, **self._metric_values(sums, "eval")}

    def _epoch_row(self, epoch, steps, wait, comp, sums, ev, epoch_s, eval_s) -> dict:
        """One metrics.csv row. Throughput is the global batch over the MEDIAN step time of the
        epoch's timed steps, where a step's time is that of its slowest rank (it bounds a DDP step)."""
        cfg = self.cfg
        n_timed = len(wait)  # the same on every rank: same steps, same warm-up
        slowest, wait_mean = [], []
        if n_timed:
            per_step = torch.tensor([[w + c for w, c in zip(wait, comp)], wait], dtype=torch.float64,
                                    device=self.device)
            slow = per_step[0].clone()
            dist.all_reduce(slow, op=dist.ReduceOp.MAX)
            waits = per_step[1].clone()
            dist.all_reduce(waits)
            slowest, wait_mean = slow.tolist(), (waits / self.world).tolist()
        epoch_s_max, mem = all_reduce([epoch_s, peak_memory_gib(self.device)], self.device, op=dist.ReduceOp.MAX)
        dist.all_reduce(sums)
        n = max(float(sums[1]), 1.0)
        st = step_summary(slowest, cfg.batch)
        tput = st["samples_per_s"]
        per_dev = tput / self.world if tput else None
        tflops = per_dev * self.flops["train_flops_per_sample"] / 1e12 if per_dev else None
        kept = self.state["timing"]
        kept["step_ms"] += thin(slowest, STEP_SAMPLES_PER_EPOCH)
        kept["sum_step_ms"] += sum(slowest)
        kept["sum_wait_ms"] += sum(wait_mean)
        kept["timed_steps"] += n_timed
        mean_wait = sum(wait_mean) / n_timed if n_timed else None
        row = {
            "epoch": epoch + 1, "steps": steps, "timed_steps": n_timed, "samples": steps * cfg.batch,
            "epoch_s": round(epoch_s_max, 4), "eval_s": round(eval_s, 4),
            "samples_per_s": _r(tput), "samples_per_s_p10": _r(st["samples_per_s_p10"]),
            "samples_per_s_p90": _r(st["samples_per_s_p90"]), "samples_per_s_per_device": _r(per_dev),
            "step_ms_p50": _r(st["step_ms_p50"]), "step_ms_p10": _r(st["step_ms_p10"]),
            "step_ms_p90": _r(st["step_ms_p90"]), "step_ms_mean": _r(st["step_ms_mean"]),
            "data_wait_ms": _r(mean_wait),
            "compute_ms": _r(st["step_ms_mean"] - mean_wait if n_timed else None),
            "data_wait_frac": _r(sum(wait_mean) / sum(slowest) if n_timed and sum(slowest) else None, 5),
            "train_loss": float(sums[0]) / n, "eval_loss": ev["eval_loss"],
            "lr": self.sched.get_last_lr()[0], "peak_mem_gib": round(mem, 4),
            "tflops_per_device": _r(tflops, 5), "mfu": _r(mfu(per_dev, self.flops["train_flops_per_sample"], self.peak), 5),
        }
        row.update(self._metric_values(sums, "train"))
        row.update({k: v for k, v in ev.items() if k != "eval_loss"})
        return row

    def _epoch_line(self, row: dict) -> str:
        metrics = " ".join(f"eval_{c} {row[f'eval_{c}']:.4f}" for c in self.metric_cols
                           if row.get(f"eval_{c}") is not None)
        if row["samples_per_s"]:
            timing = (f"{row['samples_per_s']:,.1f} samples/s (median step {row['step_ms_p50']:.1f} ms, "
                      f"p10-p90 {row['step_ms_p10']:.1f}-{row['step_ms_p90']:.1f}; "
                      f"data wait {100 * (row['data_wait_frac'] or 0):.1f}%)")
        else:
            timing = "warm-up only: no timed steps this epoch"
        return (f"epoch {row['epoch']}/{self.cfg.epochs} done: train_loss {row['train_loss']:.4f} "
                f"eval_loss {row['eval_loss']:.4f} {metrics} | {timing} | epoch {row['epoch_s']:.1f} s")

    def _checkpoint(self) -> None:
        rng = all_gather_object(ckpt.rng_state())  # every rank's, so each resumes its own stream
        if self.is_rank0:
            st = self.state
            ckpt.save(self.run_dir / ckpt.FILENAME, rng=rng, model=self.ddp.module.state_dict(),
                      optimizer=self.opt.state_dict(), scaler=self.scaler.state_dict(),
                      scheduler=self.sched.state_dict(), epoch=st["epoch"], step_in_epoch=st["step_in_epoch"],
                      global_step=st["global_step"], rows=st["rows"], timing=st["timing"],
                      started_utc=st["started_utc"], config=self.cfg.to_dict())
        dist.barrier()

    def _comm_probe(self) -> dict:
        """Fwd+bwd with and without gradient all-reduce on one fixed batch.

        The difference is the communication that backward did not hide. Runs
        after training and after the last checkpoint, so it changes nothing
        that is kept; gradients are discarded and no optimizer step is taken.
        """
        n = self.cfg.comm_probe_steps
        if self.world == 1 or n == 0:
            return {}
        x, y = next(self.train_src.batches(0, 0))
        self.ddp.train()

        def timed(sync: bool) -> float:
            times = []
            for i in range(n + 2):  # two warm-ups
                self.opt.zero_grad(set_to_none=True)
                synchronize(self.device)
                t0 = time.perf_counter()
                with (nullcontext() if sync else self.ddp.no_sync()):
                    with self.autocast:
                        loss = self.wl.loss(self.wl.forward(self.train_model, x, y, 0, True), y)
                    loss.backward()
                synchronize(self.device)
                if i >= 2:
                    times.append((time.perf_counter() - t0) * 1e3)
            return median(times)

        nosync = timed(False)
        sync = timed(True)
        self.opt.zero_grad(set_to_none=True)
        s, ns = all_reduce([sync, nosync], self.device)
        s, ns = s / self.world, ns / self.world
        self.log(f"comm probe: fwd+bwd {s:.2f} ms with all-reduce, {ns:.2f} ms without: "
                 f"{s - ns:.2f} ms exposed communication per step")
        return {"comm_probe_sync_ms": round(s, 4), "comm_probe_nosync_ms": round(ns, 4),
                "exposed_comm_ms": round(s - ns, 4)}

    # --------------------------------------------------------------- record
    def _write_summary(self, status: str, probe: dict | None = None, error: str | None = None) -> dict | None:
        if not self.is_rank0:
            return None
        st, rows, t = self.state, self.state["rows"], self.state["timing"]
        run_stats = step_summary(t["step_ms"], self.cfg.batch)
        tput = run_stats["samples_per_s"]
        per_dev = tput / self.world if tput else None
        tflops = per_dev * self.flops["train_flops_per_sample"] / 1e12 if per_dev else None
        steady = rows[1:] if len(rows) > 1 else rows  # the first epoch carries start-up effects
        summary = {
            "schema_version": records.SCHEMA_VERSION, "run_id": self.run_id, "status": status, "error": error,
            "started_utc": st["started_utc"], "finished_utc": utc_now() if status != "running" else None,
            "resumed_from_step": st["resumed_from_step"],
            "epochs_done": len(rows), "steps_done": st["global_step"], "world_size": self.world,
            "device_name": self.device_name,
            "throughput_stat": (f"global batch / median step time over {t['timed_steps']} timed steps "
                                f"(slowest rank per step)") if t["timed_steps"] else "no timed steps",
            "timed_steps": t["timed_steps"],
            "samples_per_s": _r(tput), "samples_per_s_p10": _r(run_stats["samples_per_s_p10"]),
            "samples_per_s_p90": _r(run_stats["samples_per_s_p90"]),
            "samples_per_s_mean": _r(t["timed_steps"] * self.cfg.batch * 1e3 / t["sum_step_ms"]
                                     if t["sum_step_ms"] else None),
            "samples_per_s_per_device": _r(per_dev),
            "step_ms_p50": _r(run_stats["step_ms_p50"]), "step_ms_p10": _r(run_stats["step_ms_p10"]),
            "step_ms_p90": _r(run_stats["step_ms_p90"]),
            "step_ms_mean": _r(t["sum_step_ms"] / t["timed_steps"] if t["timed_steps"] else None),
            "epoch_s_median": _r(median(r["epoch_s"] for r in steady) if steady else None),
            "data_wait_frac": _r(t["sum_wait_ms"] / t["sum_step_ms"] if t["sum_step_ms"] else None, 5),
            "final_eval_loss": rows[-1]["eval_loss"] if rows else None,
            "peak_mem_gib": max((r["peak_mem_gib"] for r in rows), default=None),
            **self.flops, "peak_tflops": self.peak, "tflops_per_device": _r(tflops, 5),
            "mfu": _r(mfu(per_dev, self.flops["train_flops_per_sample"], self.peak), 5),
            "comm_probe_sync_ms": None, "comm_probe_nosync_ms": None, "exposed_comm_ms": None,
        }
        summary.update(probe or {})
        for c in self.metric_cols:
            summary[f"final_eval_{c}"] = rows[-1][f"eval_{c}"] if rows else None
        records.write_json(self.run_dir / "summary.json", summary)
        return summary


# Step times kept per epoch for the run's median (evenly strided beyond this): enough for a
# stable median and p10/p90, small enough for the checkpoint of a 100k-step epoch.
STEP_SAMPLES_PER_EPOCH = 4096


def _zero_timing() -> dict:
    return {"step_ms": [], "sum_step_ms": 0.0, "sum_wait_ms": 0.0, "timed_steps": 0}

def _chunks(batch, n: int):
    """`n` micro-batches of a tensor, or of each tensor of a tuple/list (zipped back into tuples)."""
    if n == 1:
        return [batch]
    if isinstance(batch, (tuple, list)):
        return list(zip(*(t.chunk(n) for t in batch)))
    return list(batch.chunk(n))


def _batch_len(y) -> int:
    return (y[0] if isinstance(y, (tuple, list)) else y).shape[0]


def _detach(out):
    return tuple(o.detach() for o in out) if isinstance(out, (tuple, list)) else out.detach()


def _r(v, nd: int = 3):
    return None if v is None else round(float(v), nd)
