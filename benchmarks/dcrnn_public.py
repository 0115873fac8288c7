"""The public PyTorch DCRNN pipeline's mechanics, re-implemented for the baseline of bench_dcrnn.py.

What it reproduces (from the widely used port of liyaguang/DCRNN to PyTorch and its data
preparation), because these are what make it slow, not its mathematics:
- data: every (input, target) window materialised on the host in float64, (S, 12, N, 2) for
  inputs and targets, so each time step is stored 24 times; one shuffle before the first epoch,
  the same order every epoch;
- a batch is sliced from those arrays, converted to float32 and copied to the device, each step;
- the model: a Python loop over 12 encoder and 12 decoder steps x 2 layers x 2 gconvs, each gconv
  one torch.sparse.mm per support and diffusion step (2 x 2 x 2 x 2 x 24 = 384 per forward),
  with the permutes and reshapes of (batch, nodes * features) tensors around them; the supports
  are sparse tensors on a device fixed at import; the diffusion carries x0, x1 over between the
  supports as the released code does.
The weights have the same layout as kernels/workloads/dcrnn (rows ordered input feature, then
diffusion matrix), so the benchmark loads one model's weights into the other and checks that
they compute the same function before it times them.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn


def materialise_windows(speeds: np.ndarray, time_of_day: np.ndarray):
    """generate_graph_seq2seq_io_data: x, y as float64 (S, 12, N, 2), one entry per window and offset."""
    data = np.stack([speeds.astype(np.float64), np.broadcast_to(time_of_day[:, None], speeds.shape)], axis=-1)
    x_off, y_off = np.arange(-11, 1), np.arange(1, 13)
    t = np.arange(11, speeds.shape[0] - 12)
    return data[t[:, None] + x_off], data[t[:, None] + y_off]


def normalised_windows(series, mean: float, std: float, rows: range):
    """The port's windows of `rows` (window starts) with the speed channel of inputs and targets normalised."""
    xs, ys = materialise_windows(series.speeds, series.time_of_day)
    xs, ys = xs[rows.start : rows.stop], ys[rows.start : rows.stop]
    xs[..., 0] = (xs[..., 0] - mean) / std
    ys[..., 0] = (ys[..., 0] - mean) / std
    return xs, ys


def masked_loss(out: torch.Tensor, y: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """The port's masked MAE from normalised forecasts and labels: both unscaled first, so float error hides some
    zeros (missing readings) from the mask, as in the released code."""
    out, truth = out * std + mean, y * std + mean
    mask = (truth != 0).float()
    mask = mask / mask.mean()
    return torch.nan_to_num((out - truth).abs() * mask).mean()


class HostLoader:
    """The port's DataLoader: padded to a multiple of the batch, shuffled once, numpy slices per batch."""

    def __init__(self, xs: np.ndarray, ys: np.ndarray, batch: int, seed: int = 0):
        pad = (batch - len(xs) % batch) % batch
        xs = np.concatenate([xs, np.repeat(xs[-1:], pad, axis=0)])
        ys = np.concatenate([ys, np.repeat(ys[-1:], pad, axis=0)])
        perm = np.random.default_rng(seed).permutation(len(xs))
        self.xs, self.ys, self.batch = xs[perm], ys[perm], batch

    def __iter__(self):
        for i in range(0, len(self.xs), self.batch):
            yield self.xs[i : i + self.batch], self.ys[i : i + self.batch]


def to_device(x: np.ndarray, y: np.ndarray, device: torch.device):
    """The port's _prepare_data: float32 tensors, (seq, batch, nodes * features), copied to the device."""
    x = torch.from_numpy(x).float().permute(1, 0, 2, 3)
    y = torch.from_numpy(y).float().permute(1, 0, 2, 3)
    b, n = x.shape[1], x.shape[2]
    return x.reshape(12, b, n * 2).to(device), y[..., :1].reshape(12, b, n).to(device)


def sparse_supports(mats: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    return [sparse_support(m, device) for m in mats]


def sparse_support(m: np.ndarray, device: torch.device) -> torch.Tensor:
    m = m.astype(np.float32)
    idx = np.nonzero(m)
    return torch.sparse_coo_tensor(np.vstack(idx), m[idx], m.shape, device=device, check_invariants=True)


class Cell(nn.Module):
    def __init__(self, in_dim: int, units: int, supports: list, nodes: int, k_max: int):
        super().__init__()
        self.units, self.supports, self.nodes, self.k_max = units, supports, nodes, k_max
        m = len(supports) * k_max + 1
        self.ru_w = nn.Parameter(torch.empty((in_dim + units) * m, 2 * units))
        self.ru_b = nn.Parameter(torch.ones(2 * units))
        self.c_w = nn.Parameter(torch.empty((in_dim + units) * m, units))
        self.c_b = nn.Parameter(torch.zeros(units))

    def gconv(self, inputs, state, w, b):
        bs = inputs.shape[0]
        inputs = inputs.reshape(bs, self.nodes, -1)
        state = state.reshape(bs, self.nodes, -1)
        x = torch.cat([inputs, state], dim=2)
        size = x.shape[2]
        x0 = x.permute(1, 2, 0).reshape(self.nodes, size * bs)
        xs = [x0]
        if self.k_max:
            for s in self.supports:
                x1 = torch.sparse.mm(s, x0)
                xs.append(x1)
                for _ in range(2, self.k_max + 1):
                    x2 = 2 * torch.sparse.mm(s, x1) - x0
                    xs.append(x2)
                    x1, x0 = x2, x1
        m = len(xs)
        x = torch.stack(xs).reshape(m, self.nodes, size, bs).permute(3, 1, 2, 0).reshape(bs * self.nodes, size * m)
        return (x @ w + b).reshape(bs, self.nodes * w.shape[1])

    def forward(self, inputs, hx):
        value = torch.sigmoid(self.gconv(inputs, hx, self.ru_w, self.ru_b)).reshape(-1, self.nodes, 2 * self.units)
        r, u = torch.split(value, self.units, dim=-1)
        r, u = r.reshape(-1, self.nodes * self.units), u.reshape(-1, self.nodes * self.units)
        c = torch.tanh(self.gconv(inputs, r * hx, self.c_w, self.c_b))
        return u * hx + (1.0 - u) * c


class PublicDCRNN(nn.Module):
    def __init__(
        self, supports: list, nodes: int, units: int = 64, layers: int = 2, k_max: int = 2, cl_decay_steps: int = 2000
    ):
        super().__init__()
        self.nodes, self.units, self.layers, self.k = nodes, units, layers, cl_decay_steps
        self.enc = nn.ModuleList(Cell(2 if i == 0 else units, units, supports, nodes, k_max) for i in range(layers))
        self.dec = nn.ModuleList(Cell(1 if i == 0 else units, units, supports, nodes, k_max) for i in range(layers))
        self.proj = nn.Linear(units, 1)

    def forward(self, x, labels=None, batches_seen: int = 0, rng: np.random.Generator | None = None):
        b = x.shape[1]
        h = [torch.zeros(b, self.nodes * self.units, device=x.device) for _ in range(self.layers)]
        for t in range(12):
            out = x[t]
            for i, cell in enumerate(self.enc):
                h[i] = cell(out, h[i])
                out = h[i]
        dec = torch.zeros(b, self.nodes, device=x.device)
        outs = []
        for t in range(12):
            out = dec
            for i, cell in enumerate(self.dec):
                h[i] = cell(out, h[i])
                out = h[i]
            out = self.proj(out.reshape(-1, self.units)).reshape(b, self.nodes)
            outs.append(out)
            dec = out
            if self.training and labels is not None and rng is not None:
                if rng.uniform() < self.k / (self.k + math.exp(batches_seen / self.k)):
                    dec = labels[t]
        return torch.stack(outs)  # (12, batch, nodes), normalised


def load_lab_weights(public: PublicDCRNN, lab) -> None:
    """Copy kernels/workloads/dcrnn weights (same layout) into the public model."""
    with torch.no_grad():
        for mine, theirs in ((public.enc, lab.encoder), (public.dec, lab.decoder)):
            for p, q in zip(mine, theirs):
                p.ru_w.copy_(q.gates.weight)
                p.ru_b.copy_(q.gates.bias)
                p.c_w.copy_(q.candidate.weight)
                p.c_b.copy_(q.candidate.bias)
        public.proj.weight.copy_(lab.projection.weight)
        public.proj.bias.copy_(lab.projection.bias)
