"""DCRNN (Li et al., ICLR 2018): an encoder-decoder of diffusion-convolutional GRU cells.

As the original (liyaguang/DCRNN and its PyTorch port): each DCGRU cell replaces the GRU's
matrix products by diffusion convolutions over the sensor graph (kernels/workloads/dcrnn/graph.py);
gates r, u = sigmoid(gconv([x, h]) with bias 1.0), candidate c = tanh(gconv([x, r * h])),
h' = u * h + (1 - u) * c. Each input of a gconv is diffused once and its terms weighted by its own rows of the
weight, the same function as the concatenation's terms: x serves the gates and the candidate, and a lower layer's
new state serves as the next layer's input and as its own state at the next step (at 2 x 64 units, the sparse
products multiply a third fewer columns than when [x, h] and [x, r * h] are diffused whole). The encoder reads
seq_len steps of (speed, time of day); the decoder starts from a GO symbol of zeros and feeds back its own
prediction, or, while training, the true value with the scheduled-sampling probability k / (k + exp(step / k))
(k = cl_decay_steps). A linear projection maps the top decoder state to the speed. Weights are
created eagerly (the port creates them on first use) with the original's layout, rows
ordered (input feature, diffusion matrix), and Xavier-normal initialisation.

Tensors are node-major inside the model, (nodes, batch, features): the diffusion multiplies
them by a support without a transpose. The model returns speeds in mph, (batch, horizon,
nodes): the normalisation (one scalar mean and std, channel 0) is undone inside, so the loss
compares with the raw readings.
"""

from __future__ import annotations

import math
import random
from typing import Callable

import torch
import torch.nn as nn

from kernels.workloads.dcrnn.graph import Graph


Diffused = tuple  # (terms, folds) of Graph.diffuse_folded: one input's diffusion terms


class DiffusionConv(nn.Module):
    """gconv: stack the diffusion terms of [inputs, state] and apply one weight matrix."""

    def __init__(self, in_size: int, out_size: int, k_max: int, supports: int, bias_start: float):
        super().__init__()
        self.matrices = supports * k_max + 1  # the terms of one input: x_0, then x_1 .. x_K per support
        self.weight = nn.Parameter(torch.empty(in_size * self.matrices, out_size))
        self.bias = nn.Parameter(torch.full((out_size,), float(bias_start)))
        nn.init.xavier_normal_(self.weight, gain=1.0)

    def forward(self, parts: list[Diffused]) -> torch.Tensor:
        """sum_m T_m(x) W_m + b, x the features of the parts side by side and W_m the rows (f, m) of the weight:
        the same as stacking the terms into one (nodes * batch, features * matrices) matrix and one product,
        without copying them into it. The parts come diffused: a cell diffuses each input once, though the
        gates and the candidate both read it (and a layer's state is the next layer's input).

        The weight is cut into the terms' blocks by one split and one unbind: backward stacks their gradients
        once per call. A slice per term zero-filled and added a whole weight-sized gradient for each term: about
        650 more fills and 865 more in-place adds per training step (DCRNN 2 x 64 units on METR-LA, batch 64,
        torch profiler on a CPU)."""
        n, b, _ = parts[0][0][0].shape
        w = self.weight.view(-1, self.matrices, self.weight.shape[1])
        sizes = [terms[0].shape[-1] for terms, _ in parts]
        blocks = w.split([*sizes, w.shape[0] - sum(sizes)])  # a part left out (a zero state) weighs nothing
        out = None
        for (terms, folds), rows in zip(parts, blocks):
            ws = list(rows.unbind(1))
            for j, m in folds:  # term m stands for (term m - term j): term j takes -W_m
                ws[j] = ws[j] - ws[m]
            for term, wm in zip(terms, ws):  # accumulated in place: addmm would copy the sum at every term
                t = term.reshape(n * b, -1)
                if out is None:
                    out = torch.addmm(self.bias, t, wm)
                else:  # autocast leaves in-place ops alone: under it, the sum is bf16/fp16 and so are its terms
                    out = out.addmm_(t.to(out.dtype), wm.to(out.dtype))
        return out.reshape(n, b, -1)


class DCGRUCell(nn.Module):
    def __init__(self, in_dim: int, units: int, k_max: int, supports: int):
        super().__init__()
        self.units = units
        self.gates = DiffusionConv(in_dim + units, 2 * units, k_max, supports, bias_start=1.0)
        self.candidate = DiffusionConv(in_dim + units, units, k_max, supports, bias_start=0.0)

    def forward(
        self, x: Diffused, h: torch.Tensor | None, h_terms: Diffused | None, diffuse: Callable[[torch.Tensor], Diffused]
    ) -> torch.Tensor:
        """One step from the diffused input x, the state h and its diffusion terms; `diffuse` diffuses r * h.
        h None is the zero state the encoder starts from: its terms, and those of r * h, are zero and weigh
        nothing, so neither is diffused nor multiplied (at 2 x 64 units, 2 of 48 cell steps skip half or more of
        their products, forward and backward)."""
        if h is None:
            u = torch.sigmoid(self.gates([x]))[..., self.units :]
            c = torch.tanh(self.candidate([x]))
            return c - u * c
        ru = torch.sigmoid(self.gates([x, h_terms]))
        r, u = ru.split(self.units, dim=-1)
        c = torch.tanh(self.candidate([x, diffuse(r * h)]))
        return c + u * (h - c)  # u h + (1 - u) c in three operations, and their backward in four rather than six


class DCRNN(nn.Module):
    def __init__(
        self,
        graph: Graph,
        mean: float,
        std: float,
        *,
        input_dim: int = 2,
        output_dim: int = 1,
        units: int = 64,
        layers: int = 2,
        k_max: int = 2,
        seq_len: int = 12,
        horizon: int = 12,
        cl_decay_steps: int = 2000,
        curriculum: bool = True,
        form: str = "original",
        seed: int = 0,
    ):
        super().__init__()
        self.graph, self.form, self.k_max = graph, form, k_max
        self.units, self.layers, self.seq_len, self.horizon = units, layers, seq_len, horizon
        self.output_dim, self.cl_decay_steps, self.curriculum, self.seed = output_dim, cl_decay_steps, curriculum, seed
        self.encoder = nn.ModuleList(
            DCGRUCell(input_dim if i == 0 else units, units, k_max, graph.count) for i in range(layers)
        )
        self.decoder = nn.ModuleList(
            DCGRUCell(output_dim if i == 0 else units, units, k_max, graph.count) for i in range(layers)
        )
        self.projection = nn.Linear(units, output_dim)
        self.register_buffer("mean", torch.tensor(float(mean)))
        self.register_buffer("std", torch.tensor(float(std)))
        # DDP broadcasts rank 0's buffers: not the supports, which are each rank's own rows of the graph
        self._ddp_params_and_buffers_to_ignore = [f"graph.{n}" for n, _ in graph.named_buffers()]

    def sampling_probability(self, step: int) -> float:
        """Scheduled sampling: the probability of feeding the true value, k / (k + exp(step / k))."""
        k = self.cl_decay_steps
        return k / (k + math.exp(min(step / k, 700.0)))

    def teacher_forces(self, step: int, t: int) -> bool:
        """The coin for decoder step t at training step `step`: drawn on the host from (seed, step, t), so every
        rank and micro-batch of a step agrees without a device synchronisation."""
        coin = random.Random((self.seed * 1_000_003 + step) * 64 + t).random()
        return coin < self.sampling_probability(step)

    @torch.compiler.disable
    def teacher_mask(self, step: int, device: torch.device) -> torch.Tensor:
        """The coins of decoder steps 0 .. horizon - 2 as a bool tensor on `device`, copied without waiting for
        the device. Run outside torch.compile (one graph break, before any device work): the compiled forward
        then selects with torch.where and holds no branch on the coins, so it is traced once, not once per
        pattern of coins, and no training step number reaches the traced code."""
        mask = torch.tensor([self.teacher_forces(step, t) for t in range(self.horizon - 1)])
        return mask.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else mask

    def _diffuse(self, x: torch.Tensor) -> Diffused:
        return self.graph.diffuse_folded(x, self.k_max, self.form)

    def _step(self, cells: nn.ModuleList, inp: torch.Tensor, h: list, h_terms: list) -> torch.Tensor:
        """One time step through the stacked cells; h (None: the zero state) and h_terms (each state's diffusion
        terms, None until needed) are updated in place. A lower layer's new state is diffused once: it is the next
        layer's input now and this layer's state at the next step."""
        inp_terms = self._diffuse(inp)
        for i, cell in enumerate(cells):
            if h_terms[i] is None and h[i] is not None:
                h_terms[i] = self._diffuse(h[i])
            h[i] = cell(inp_terms, h[i], h_terms[i], self._diffuse)
            h_terms[i] = inp_terms = self._diffuse(h[i]) if i + 1 < len(cells) else None
        return h[-1]

    def forward(
        self, x: torch.Tensor, y: torch.Tensor | None = None, step: int = 0, train: bool = False
    ) -> torch.Tensor:
        """x (B, seq_len, nodes, 2) normalised; y (B, horizon, nodes) raw speeds or None -> (B, horizon, nodes) mph."""
        b = x.shape[0]
        teacher = self.teacher_mask(step, x.device) if train and self.curriculum and y is not None else None
        plan = self.graph.plan
        if plan is not None:  # the halo bytes of forwards that train (and so also run backward) are counted
            plan.counting = torch.is_grad_enabled()
            if plan.counting:
                plan.counters["samples"] += b
                plan.counters["forwards"] += 1
        x = x[:, -self.seq_len :].permute(1, 2, 0, 3).contiguous()  # (seq, n, B, 2)
        n = x.shape[1]
        h: list[torch.Tensor | None] = [None] * self.layers  # the zero state
        h_terms: list[Diffused | None] = [None] * self.layers
        for t in range(self.seq_len):
            self._step(self.encoder, x[t], h, h_terms)
        dec = x.new_zeros(n, b, self.output_dim)  # GO symbol
        outs = []
        for t in range(self.horizon):
            out = self.projection(self._step(self.decoder, dec, h, h_terms))  # (n, B, output_dim)
            outs.append(out)
            dec = out
            if teacher is not None and t + 1 < self.horizon:  # the true value where the coin says so
                dec = torch.where(teacher[t], ((y[:, t] - self.mean) / self.std).t().unsqueeze(-1).to(out.dtype), out)
        pred = torch.stack(outs)[..., 0]  # (horizon, n, B)
        return pred.permute(2, 0, 1) * self.std + self.mean
