"""torch.compile and CUDA graphs for the training step: how the model is compiled, and what was captured.

With cuda_graphs (the default with CUDA and compile where a workload's shapes are static), the model is
compiled with mode "reduce-overhead": Inductor records the compiled forward and backward as CUDA graphs
(CUDA graph trees) at their second and third calls and replays them from then on, so a ResNet-18 step is a
few graph launches instead of about 400 kernel launches the host must enqueue one by one. Those first calls
fall in timing_warmup_steps. The optimizer step stays outside the graphs (torch's fused kernel on CUDA, a
launch or two), so its state needs no capturable form and checkpoints are unchanged.

Inductor refuses capture for some graphs (a CPU tensor in the graph, an input mutated in a way it cannot
replay, dynamic shapes) and runs them as ordinary kernels instead; the run goes on, and the record says how
many graphs fell back (summary.json's cuda_graphs) and the log names the fix to see why.
"""

from __future__ import annotations

import torch


def _skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


class Capture:
    """Marks each forward as a new step of the graph trees, and reports what was captured."""

    def __init__(self, cfg):
        self.on = bool(cfg.cuda_graphs)
        self.skips_before = _skips() if self.on else 0

    @staticmethod
    def compile(module, cfg):
        """The module the training step calls: compiled (with CUDA graphs when cfg.cuda_graphs) or as it is."""
        if cfg.cuda_graphs:
            return torch.compile(module, mode="reduce-overhead")
        return torch.compile(module) if cfg.compile else module

    def step_begin(self) -> None:
        """Before each training forward: the previous step's graph outputs (loss, logits) have been read (the
        metrics add them up right after backward), so the next replay may overwrite them."""
        if self.on:
            torch.compiler.cudagraph_mark_step_begin()

    def summary(self) -> dict:
        """summary.json's cuda_graphs: {mode, graphs_not_captured, status}."""
        if not self.on:
            return {"mode": "off", "graphs_not_captured": None, "status": "off (cuda_graphs=false)"}
        skipped = _skips() - self.skips_before
        status = (
            "captured: the compiled forward and backward replay as CUDA graphs"
            if not skipped
            else f"{skipped} compiled graph(s) ran without capture (Inductor refused them); run with "
            f"TORCH_LOGS=cudagraphs to see why"
        )
        return {"mode": "reduce-overhead", "graphs_not_captured": skipped, "status": status}
