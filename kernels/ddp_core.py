"""The DDP/AMP training loop, and only the loop: one call per rank.

    device + process group -> data, model (+ FLOPs), engine wrap, recipe -> record (fresh or resumed)
      -> epochs of steps: data -> autocast forward -> loss -> scaled backward (averaged once per step,
         no_sync for earlier micro-batches) -> optimizer and scheduler step -> per epoch: evaluation,
         the row, a checkpoint when due -> comm probe -> summary

The same code runs on 1 CPU process, N gloo processes, 1 GPU, N GPUs and N nodes: only the device and
the backend differ. Workloads (kernels/workloads) and engines (kernels/engines) are reached through their
interfaces; the record, checkpointing, observers and guards (kernels/run) are called at fixed points.
"""

from __future__ import annotations

from functools import partial
import time

import torch
import torch.distributed as dist

from kernels.base.dist import agreed_precision, all_gather_object, process_group, rank_env, select_device
from kernels.base.params import RunConfig, device_type
from kernels.base.timers import synchronize
from kernels.data.pipeline import micro_batches
from kernels.run.checkpointing import Checkpointer, LoopState, restore
from kernels.run.guards import StopSignals, Watchdog, agree, die_hung, stop_note
from kernels.run.metrics import detach, epoch_line, epoch_row
from kernels.run.observe import Observers
from kernels.run.parts import RankParts, build
from kernels.run.probe import run_probe
from kernels.run.record import RunRecord, utc_now, workload_report
from kernels.workloads import get_workload


def run(cfg: RunConfig) -> str:
    """Run this process's rank of `cfg`. Returns the run's status (the same on every rank)."""
    stops = StopSignals(cfg.term_grace_s)
    renv = rank_env()
    renv.check_world(cfg.gpus)
    device = select_device(device_type(cfg), renv.local_rank)  # on a GPU: TF32, cuDNN autotuner
    with process_group(renv, device, cfg.timeout_min, cfg.startup_timeout_min, cfg.backend) as backend:
        precision, note = agreed_precision(cfg.precision, device)  # fp16 on every rank where a GPU has no bf16
        cfg = cfg if note is None else RunConfig({**cfg.to_dict(), "precision": precision})
        return RankLoop(cfg, renv, device, backend, stops, {"precision_note": note} if note else {}).run()


class RankLoop:
    """One rank's training run: its parts (RankParts), its state (LoopState) and the epochs of steps."""

    parts: RankParts | None
    state: LoopState

    def __init__(self, cfg: RunConfig, renv, device: torch.device, backend: str, stops: StopSignals, notes: dict):
        self.cfg, self.renv, self.device, self.backend, self.stops = cfg, renv, device, backend, stops
        self.notes = notes  # what the rank changed from the asked configuration, for config.json's derived facts
        self.rank, self.world = renv.global_rank, renv.world_size
        self.log = partial(print, flush=True) if renv.is_rank0 else (lambda msg: None)  # rank 0 speaks
        self.wl = get_workload(cfg.workload)
        self.record = RunRecord(cfg, renv, self.log)
        self.watchdog = Watchdog(cfg.startup_timeout_min * 60, cfg.hang_timeout_min * 60, self._hung)
        self.watchdog.start()
        self.ckpt = Checkpointer(cfg, self.record, self.watchdog.beat)
        self.obs = Observers(cfg, device, self.rank, renv.local_rank, self.log)
        self.seen: dict = {}  # what the run measured besides its rows, for the summary
        self.parts, self.stop_note = None, None

    def _open(self) -> None:
        """The record, fresh or resumed from its checkpoint; rank 0 writes config.json and a 'running' summary."""
        p = self.parts
        saved = self.record.open(self.device, p.model)
        if saved is None:
            self.state = LoopState(utc_now())
        else:
            mine = restore(saved, p, p.engine, self.rank)
            self.state = LoopState.resumed(saved, mine["partial_sums"])
            p.io.restore(mine["io"])
            self.record.resumed(saved)
        for note in self.notes.values():
            self.log(f"note: {note}")
        self.record.write_config(self.state, {**p.derived, **self.notes})
        self._summarise("running")
        dist.barrier()
        self.watchdog.beat()

    def run(self) -> str:
        try:
            self.parts = build(self.cfg, self.wl, self.device, self.renv, self.backend, self.obs, self.record)
            self.watchdog.beat()
            self._open()
            self.obs.run_start(self.record.run_dir, self.record.run_id, self.record.ranks)
            with self.obs.training():
                status = self._epochs()
            if self.renv.is_rank0:
                self.ckpt.wait()  # a stopped or finished run's last checkpoint is on disk before its record
            self._finish(status)
            return status
        except BaseException as e:
            if self.renv.is_rank0 and self.record.owned:
                self.record.fail(e, lambda error: self._summarise("failed", error=error))
            raise  # the rank's main prints it (kernels/train.py)
        finally:
            self.watchdog.stopped = True
            self.obs.stop_monitor()
            self.ckpt.join()  # an error path: a write in progress finishes (it is atomic either way)
            self.record.release()
            if self.parts is not None:
                self.parts.src.close()  # reader threads and open shards

    def _epochs(self) -> str:
        state = self.state
        for epoch in range(state.epoch, self.cfg.epochs):
            self.parts.wrapped.train()
            start, sums = state.step_in_epoch, self.parts.metrics.zeros()
            if start and state.partial_sums:  # an interrupted epoch: its loss and metric sums so far
                sums += torch.tensor(state.partial_sums, dtype=torch.float64, device=self.device)
            state.partial_sums = None
            t_epoch = self.obs.epoch_start()
            step, stop = self._steps(epoch, start, sums)
            stop = stop or self._epoch_end(epoch, step - start, sums, t_epoch)
            if stop:
                return stop
        return "complete"

    def _steps(self, epoch: int, start: int, sums: torch.Tensor) -> tuple[int, str | None]:
        """The epoch's steps from `start`; returns (steps done, a stop if one came mid-epoch)."""
        cfg, state, obs, p = self.cfg, self.state, self.obs, self.parts
        batches, step = p.src.batches(epoch, start), start
        while True:
            obs.step_start()
            with obs.phase("data"):
                batch = next(batches, None)
            if batch is None:
                return step, None
            obs.data_ready()
            self._step(*batch, sums, state.global_step)
            obs.step_end()
            state.global_step += 1
            step += 1
            self.watchdog.beat(step=True)
            if cfg.log_every and step % cfg.log_every == 0:
                self.log(
                    f"epoch {epoch + 1}/{cfg.epochs} step {step}/{p.steps_per_epoch} loss "
                    f"{float(sums[0] / max(float(sums[1]), 1)):.4f} lr {p.sched.get_last_lr()[0]:.4g}"
                )
            if step < p.steps_per_epoch:
                stop = self._agree(sums) if state.global_step % cfg.sync_check_steps == 0 else None
                if stop is None and cfg.stop_after_steps and state.global_step >= cfg.stop_after_steps:
                    stop = "stopped"
                if stop:
                    synchronize(self.device)
                    state.epoch, state.step_in_epoch, state.partial_sums = epoch, step, sums.tolist()
                    return step, self._stop(stop)

    def _step(self, x, y, sums: torch.Tensor, global_step: int) -> None:
        wl, phase, parts, mb = self.wl, self.obs.phase, self.parts, self.cfg.micro_batches
        eng = parts.engine
        eng.zero_grad(parts.opt)
        for i, (xm, ym) in enumerate(zip(micro_batches(x, mb), micro_batches(y, mb))):
            parts.capture.step_begin()
            with eng.no_sync(i, mb):  # gradients are averaged once per step, on the last micro-batch
                with phase("forward"), parts.autocast:
                    out = wl.forward(parts.train_model, xm, ym, global_step, True)
                    loss = wl.loss(out, ym)
                with phase("backward"):  # DDP's all-reduce runs inside, as buckets fill
                    parts.scaler.scale(loss / mb).backward()
            with torch.no_grad():
                parts.metrics.add(sums, loss.detach(), detach(out), ym)
        clip = parts.recipe.clip_grad_norm
        eng.step(parts.opt, parts.scaler, phase, (parts.wrapped.parameters(), clip) if clip else None)
        if parts.recipe.schedule_unit == "step":
            parts.sched.step()

    def _epoch_end(self, epoch: int, steps: int, sums: torch.Tensor, t_epoch: float) -> str | None:
        """Evaluation when due, the row, a checkpoint when due; returns a stop if one was asked for."""
        cfg, state, p = self.cfg, self.state, self.parts
        synchronize(self.device)
        timed = {"epoch": epoch, "steps": steps, "epoch_s": time.perf_counter() - t_epoch}
        stop = self._agree(sums)  # the whole epoch's loss is finite, and nobody asked to stop
        if p.recipe.schedule_unit == "epoch":
            p.sched.step()
        timed["wait"], timed["comp"] = self.obs.epoch_timings()
        t_eval, last = time.perf_counter(), epoch + 1 == cfg.epochs
        due = last or (cfg.eval_every and (epoch + 1) % cfg.eval_every == 0)
        evals = self._evaluate() if due else p.metrics.no_eval()
        timed["eval_s"] = time.perf_counter() - t_eval
        p.io.add_epoch(timed["wait"], timed["comp"])
        facts, lr = self.record.facts, p.sched.get_last_lr()[0]
        row = epoch_row(
            timed, sums, p.metrics, state.timing, evals, lr, facts["flops"], facts["peak"], cfg.batch, self.world
        )
        state.rows.append(row)
        state.epoch, state.step_in_epoch = epoch + 1, 0
        self.record.write_rows(state.rows)
        self.log(epoch_line(row, cfg.epochs, p.metrics.cols))
        if not last and stop is None and cfg.stop_after_steps and state.global_step >= cfg.stop_after_steps:
            stop = "stopped"
        if (cfg.checkpoint_every and ((epoch + 1) % cfg.checkpoint_every == 0 or last)) or (stop and not last):
            self.ckpt.save(state, p, p.io.state())
        return self._stop(stop) if stop and not last else None

    @torch.no_grad()
    def _evaluate(self) -> dict:
        p = self.parts
        p.model.eval()  # the bare model, no DDP hooks: shards may differ by one batch between ranks
        sums = p.metrics.zeros()
        for x, y in p.eval_src.batches():
            self.watchdog.beat()
            with p.autocast:
                out = self.wl.forward(p.model, x, y, self.state.global_step, False)
                loss = self.wl.loss(out, y)
            p.metrics.add(sums, loss, out, y)
        dist.all_reduce(sums)
        n = max(float(sums[1]), 1.0)
        return {"eval_loss": float(sums[0]) / n, **p.metrics.values(sums, "eval")}

    def _agree(self, sums: torch.Tensor) -> str | None:
        """Every sync_check_steps steps and at each epoch's end: did any rank get a stop request or a
        non-finite loss? One small all-reduce."""
        state = self.state
        with self.obs.phase("communication"):
            why = agree(self.stops, sums[0], self.device, f"global step {state.global_step} (epoch {state.epoch + 1})")
        if why is not None:
            self.stop_note = stop_note(why, state.global_step)
        return None if why is None else "preempted"

    def _stop(self, stop: str) -> str:
        """Checkpoint (mid-epoch, unless the epoch's end just did) and say why the run stops."""
        if self.state.step_in_epoch:
            self.ckpt.save(self.state, self.parts, self.parts.io.state())
        self.stops.checkpointed()
        self.log(
            f"stopped after {self.state.global_step} steps (stop_after_steps); re-run to resume"
            if stop == "stopped"
            else f"preempted: {self.stop_note}"
        )
        return stop

    def _finish(self, status: str) -> None:
        """After training: the comm probe, the profile, I/O and the workload's report, then the summary."""
        p = self.parts
        probe = (
            run_probe(
                self.cfg,
                self.world,
                p.engine,
                p.wrapped,
                p.train_model,
                self.wl,
                p.autocast,
                p.opt,
                p.src,
                self.device,
                self.log,
            )
            if status == "complete"
            else {}
        )
        self.seen.update(
            probe=probe,
            cuda_graphs=p.capture.summary(),
            profile=self.obs.collect_profile(probe, self.world, self.record.facts["device_name"]),
        )
        self.seen["io"] = p.io.summary(all_gather_object(p.io.state()), self.state.rows)
        self.seen.update(workload_report(self.wl, p.model, p.info, self.rank, self.device))
        self.obs.stop_monitor()
        self._summarise(status, error=self.stop_note if status == "preempted" else None)
        if status == "complete":  # e.g. Horovod's benchmark lines, for scripts that grep them
            step_ms = self.state.timing["step_ms"]
            for line in p.engine.run_end_lines(step_ms, self.cfg.batch, self.world, self.device):
                self.log(line)
        self.log(f"{status}: {self.record.run_dir}")

    def _summarise(self, status: str, error: str | None = None) -> None:
        seen = {**self.seen, "checkpoints": self.ckpt.summary(), **self.obs.sync_facts()}
        if status != "running":
            seen["monitor"] = self.obs.monitor_summary(self.record.run_dir)
        self.record.write_summary(status, self.state, seen, error)

    def _hung(self, why: str) -> None:
        """The watchdog's verdict: stacks to stderr, the record says failed (rank 0), and the process ends."""
        owned = self.renv.is_rank0 and self.record.owned
        die_hung(self.rank, why, (lambda: self._summarise("failed", error=f"hung: {why}")) if owned else None)
