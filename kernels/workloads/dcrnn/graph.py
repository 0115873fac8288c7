"""The sensor graph as the model uses it: diffusion supports, the partition, the halo exchange.

Supports (filter_type dual_random_walk of the original): S_1 = (D_O^-1 W)^T and
S_2 = (D_I^-1 W^T)^T, the random-walk matrices transposed as the original builds them, so
that S x diffuses x along the edges. They are held dense when small (one batched matmul)
and sparse (CSR on a CPU, COO on a GPU) when large or sparse (`supports=auto|dense|sparse`).

Diffusion (the gconv of a DCGRU cell) stacks x_0 and K (max_diffusion_step) terms per support.
form='original' (the default) is the released code's arithmetic, from which every published
METR-LA / PEMS-BAY accuracy comes: the Chebyshev-style recursion x_1 = S x_0,
x_k = 2 S x_{k-1} - x_{k-2}, with x_0 and x_1 carried over from the first support into the
second (liyaguang/DCRNN issues #45 and #90). form='paper' is the paper's equation (Li et al.
2018, eq. 2): plain powers S^k x_0, k = 1..K, for each support. Where it differs from the
paper's indexing: the paper sums k = 0..K-1 with a weight per support at k = 0 (the identity
twice); here x_0 appears once and K counts the powers after it, as in the code.

Graph parallel ("spatial" model parallel): the nodes are split into P parts, a partitioner
balancing nodes and cutting few edges (METIS through pymetis; without it, a breadth-first
ordering cut into P equal runs). Rank p of a group of P owns part p: the rows of the
supports for its nodes, with columns over its nodes and its halo (the other parts' nodes its
rows reach). Before every multiplication by a support the ranks exchange the halo: each
publishes the rows others need (all_gather over the group) and takes its halo from them;
backward sends the halo's gradients back to their owners (an all-reduce of the same
buffer). The result equals the unpartitioned model up to floating-point reduction order.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn


def random_walk(adj: np.ndarray) -> np.ndarray:
    """D^-1 W with D the row sums (out-degree); rows of zeros stay zero."""
    d = adj.sum(1)
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0)
    return (inv[:, None] * adj).astype(np.float32)


def dual_supports(adj: np.ndarray) -> list[np.ndarray]:
    """[(D_O^-1 W)^T, (D_I^-1 W^T)^T]: the original's dual_random_walk supports."""
    return [random_walk(adj).T.copy(), random_walk(adj.T).T.copy()]


# ------------------------------------------------------------------ partition
def undirected_neighbours(adj: np.ndarray) -> list[np.ndarray]:
    a = (adj != 0) | (adj.T != 0)
    np.fill_diagonal(a, False)
    return [np.flatnonzero(row) for row in a]


def edge_cut(adj: np.ndarray, membership: np.ndarray) -> int:
    """Undirected edges (pairs with a weight in either direction) whose ends lie in different parts."""
    a = (adj != 0) | (adj.T != 0)
    np.fill_diagonal(a, False)
    i, j = np.nonzero(np.triu(a))
    return int((membership[i] != membership[j]).sum())


def bfs_order(neigh: list[np.ndarray]) -> np.ndarray:
    """Breadth-first order from a pseudo-peripheral node of each connected component."""
    n = len(neigh)
    seen = np.zeros(n, bool)
    order: list[int] = []

    def sweep(start: int) -> list[int]:
        out, frontier, mark = [start], [start], {start}
        while frontier:
            nxt = []
            for u in frontier:
                for v in neigh[u]:
                    if v not in mark and not seen[v]:
                        mark.add(v)
                        nxt.append(int(v))
            out += nxt
            frontier = nxt
        return out

    for s in range(n):
        if seen[s]:
            continue
        far = sweep(s)[-1]  # the last node reached is far from s: start there
        comp = sweep(far)
        seen[comp] = True
        order += comp
    return np.array(order, dtype=np.int64)


def partition(adj: np.ndarray, parts: int, method: str = "metis") -> tuple[np.ndarray, str]:
    """(membership (N,), method used). method: metis (pymetis; bfs if it is not installed) or bfs."""
    n = adj.shape[0]
    if parts == 1:
        return np.zeros(n, np.int64), "none"
    neigh = undirected_neighbours(adj)
    if method == "metis":
        try:
            import pymetis
        except ImportError:
            method = "bfs (pymetis not installed)"
        else:
            _, member = pymetis.part_graph(parts, adjacency=[list(map(int, x)) for x in neigh])
            member = np.asarray(member, dtype=np.int64)
            if len(np.unique(member)) == parts:
                return member, "metis"
            method = "bfs (METIS left a part empty)"
    order = bfs_order(neigh)
    member = np.empty(n, np.int64)
    for p, chunk in enumerate(np.array_split(order, parts)):
        member[chunk] = p
    return member, method


# ------------------------------------------------------------------ halo plan
@dataclass
class HaloPlan:
    """What rank `part` of a group of `parts` owns, needs, and publishes; byte counters for the record."""

    part: int
    parts: int
    own: np.ndarray  # global ids of the owned nodes (sorted)
    halo: np.ndarray  # global ids of the halo nodes, in the order appended after `own`
    send_idx: torch.Tensor  # local indices (into own) of the rows this rank publishes
    halo_pos: torch.Tensor  # for each halo node: its row in the gathered (parts * max_send) buffer
    max_send: int
    group: object = None
    counting: bool = False  # set by the model: this forward trains (its bytes are counted)
    counters: dict = field(
        default_factory=lambda: {
            "fwd_bytes": 0,
            "bwd_bytes": 0,
            "wire_bytes": 0,
            "exchanges": 0,
            "samples": 0,
            "forwards": 0,
        }
    )

    def __deepcopy__(self, memo):  # a model copy (the FLOP count) shares the plan and its process group
        return self

    def to(self, device: torch.device) -> "HaloPlan":
        self.send_idx, self.halo_pos = self.send_idx.to(device), self.halo_pos.to(device)
        return self


def halo_plans(structure: np.ndarray, membership: np.ndarray, parts: int) -> list[HaloPlan]:
    """Every part's plan (each rank computes them all, identically). structure: bool N x N, row i reads column j."""
    owns = [np.flatnonzero(membership == p) for p in range(parts)]
    halos = []
    for p in range(parts):
        need = np.flatnonzero(structure[owns[p]].any(0))
        halos.append(need[membership[need] != p])
    sends = []
    for q in range(parts):
        wanted = [h[membership[h] == q] for p, h in enumerate(halos) if p != q]
        sends.append(np.unique(np.concatenate(wanted)) if wanted else np.zeros(0, np.int64))
    max_send = max(1, max(len(s) for s in sends))
    plans = []
    for p in range(parts):
        local = {g: i for i, g in enumerate(owns[p])}
        pos = []
        for g in halos[p]:
            q = int(membership[g])
            pos.append(q * max_send + int(np.searchsorted(sends[q], g)))
        plans.append(
            HaloPlan(
                p,
                parts,
                owns[p],
                halos[p],
                torch.tensor([local[g] for g in sends[p]], dtype=torch.long),
                torch.tensor(pos, dtype=torch.long),
                max_send,
            )
        )
    return plans


class _Halo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, plan: HaloPlan) -> torch.Tensor:
        ctx.plan, ctx.n_own = plan, x.shape[0]
        rest = x.shape[1:]
        send = x.new_zeros((plan.max_send, *rest))
        send[: len(plan.send_idx)] = x[plan.send_idx]
        gathered = [torch.empty_like(send) for _ in range(plan.parts)]
        dist.all_gather(gathered, send.contiguous(), group=plan.group)
        halo = torch.cat(gathered)[plan.halo_pos]
        if plan.counting:
            c = plan.counters
            c["fwd_bytes"] += halo.numel() * halo.element_size()
            c["wire_bytes"] += send.numel() * send.element_size() * plan.parts
            c["exchanges"] += 1
        return halo

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        plan = ctx.plan
        rest = grad.shape[1:]
        buf = grad.new_zeros((plan.parts * plan.max_send, *rest))
        buf.index_add_(0, plan.halo_pos, grad)
        dist.all_reduce(buf, group=plan.group)
        mine = buf[plan.part * plan.max_send : plan.part * plan.max_send + len(plan.send_idx)]
        out = grad.new_zeros((ctx.n_own, *rest))
        out.index_add_(0, plan.send_idx, mine)
        c = plan.counters
        c["bwd_bytes"] += grad.numel() * grad.element_size()
        c["wire_bytes"] += buf.numel() * buf.element_size()
        return out, None


def _sparse(m: np.ndarray, device_type: str) -> torch.Tensor:
    """CSR on a CPU (no zero-filled output per product, unlike COO); COO, the public implementations' layout, on
    a GPU."""
    t = torch.from_numpy(m)
    if device_type == "cpu":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "CSR support is in beta"
            return t.to_sparse_csr()
    return t.to_sparse_coo().coalesce()


class _SparseProduct(torch.autograd.Function):
    """S x with S a constant sparse matrix, its transpose held beside it: backward is one more sparse product,
    S^T g. torch's own backward of a sparse product transposes S and fills a zero output on every call, which
    cost a quarter of a DCRNN training step on a CPU."""

    @staticmethod
    def forward(ctx, s: torch.Tensor, s_t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.s_t = s_t
        return _product(s, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, None, _product(ctx.s_t, grad.contiguous())


def _product(s: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """CSR: ATen's own sum-reduction kernel, which writes the product row by row; MKL's (torch.mm on CSR) adds a
    zero fill and a copy of the output and took 1.6x as long per product on the DCRNN's shapes. COO: torch.mm,
    outside autocast, which would cast the sparse matrix to bf16 or fp16, where CUDA has no sparse addmm (a bf16
    DCRNN run on an H200 stopped at its first step with "addmm_sparse_cuda not implemented for 'BFloat16'")."""
    if s.layout == torch.sparse_csr:
        return torch.sparse.mm(s, x, "sum")
    with torch.autocast(x.device.type, enabled=False):
        return torch.mm(s, x)


# --------------------------------------------------------------- the graph module
# supports=auto holds a support dense when it is small (at most DENSE_LIMIT entries, 16 MiB in fp32) and, on a
# CPU, not too sparse (at least DENSE_MIN_DENSITY non-zeros): there road graphs (METR-LA: 4 % non-zero) are held
# sparse. On a GPU a small support is dense whatever its density: a DCRNN step on METR-LA (2 x 64 units, K=2,
# batch 64) took 198 ms with dense supports against 258 ms with COO ones on an NVIDIA H200, side by side in one
# run (bench_dcrnn.py, results/bench/dcrnn-nvidia-h200.md; an earlier run read 243 against 309 ms).
DENSE_LIMIT = 1 << 22
DENSE_MIN_DENSITY = 0.10


class Graph(nn.Module):
    """This rank's supports (rows: owned nodes; columns: owned then halo nodes) and its halo exchange.

    mode: dense, sparse (CSR on a CPU, COO on a GPU), or auto (dense when small and, on a CPU, at least 10 %
    non-zero; see DENSE_LIMIT).

    x tensors are node-major, (nodes, batch, features), so a support multiplies them without a transpose.
    The supports are buffers that are not saved (they come from the data); the model holding the graph
    tells DDP to leave them alone (they differ between the ranks of a graph-parallel group).
    """

    def __init__(
        self, supports: list[np.ndarray], plan: HaloPlan | None = None, mode: str = "auto", device_type: str = "cpu"
    ):
        super().__init__()
        n_own, n_ext = supports[0].shape
        self.plan, self.n_own, self.n_ext, self.count = plan, n_own, n_ext, len(supports)
        density = max(float((s != 0).mean()) for s in supports) if n_own * n_ext else 0.0
        self.sparse = mode == "sparse" or (
            mode == "auto" and (n_own * n_ext > DENSE_LIMIT or (device_type == "cpu" and density < DENSE_MIN_DENSITY))
        )
        if self.sparse:
            for i, s in enumerate(supports):  # each support, its double (the recursion's 2 S) and their transposes
                for name, m in ((f"support{i}", s), (f"twice{i}", 2 * s)):  # doubling is exact: 2S x == 2 (S x)
                    self.register_buffer(name, _sparse(m, device_type), persistent=False)
                    self.register_buffer(name + "_t", _sparse(np.ascontiguousarray(m.T), device_type), persistent=False)
        else:
            self.register_buffer("stacked", torch.from_numpy(np.stack(supports)), persistent=False)

    def __deepcopy__(self, memo):
        """A copy of the model (the FLOP count) shares the graph: it holds no trainable state, only the data's
        supports (CSR tensors cannot be deep-copied) and the halo plan with its process group."""
        return self

    def describe(self) -> dict:
        nnz = (
            sum(int(getattr(self, f"support{i}")._nnz()) for i in range(self.count))
            if self.sparse
            else int((self.stacked != 0).sum())
        )
        return {
            "supports": "sparse" if self.sparse else "dense",
            "support_nnz": nnz,
            "own_nodes": self.n_own,
            "halo_nodes": self.n_ext - self.n_own,
        }

    def extend(self, x: torch.Tensor) -> torch.Tensor:
        """(n_own, ...) -> (n_own + n_halo, ...): this rank's rows, then its halo from the other ranks."""
        if self.plan is None:
            return x
        return torch.cat([x, _Halo.apply(x, self.plan)])

    def mul(self, i: int, x_ext: torch.Tensor, twice: bool = False) -> torch.Tensor:
        """S_i x (2 S_i x when twice) over the extended rows: (n_ext, B, F) -> (n_own, B, F)."""
        flat = x_ext.reshape(self.n_ext, -1)
        if self.sparse:  # sparse products run in the supports' precision (no bf16 sparse kernels on every device)
            name = f"twice{i}" if twice else f"support{i}"
            s = getattr(self, name)
            out = _SparseProduct.apply(s, getattr(self, name + "_t"), flat.to(s.dtype)).to(flat.dtype)
        else:
            out = self.stacked[i] @ flat
            if twice:
                out = out * 2
        return out.reshape(self.n_own, *x_ext.shape[1:])

    def mul_all(self, x_ext: torch.Tensor) -> list[torch.Tensor]:
        """[S_i x for every support] of one input."""
        if self.sparse:
            return [self.mul(i, x_ext) for i in range(self.count)]
        flat = x_ext.reshape(self.n_ext, -1)
        out = torch.matmul(self.stacked, flat)  # (supports, n_own, B*F) in one batched matmul
        return [o.reshape(self.n_own, *x_ext.shape[1:]) for o in out]

    def mul_each(self, xs_ext: list[torch.Tensor]) -> list[torch.Tensor]:
        """[S_i x_i]: each support on its own input."""
        if self.sparse:
            return [self.mul(i, x) for i, x in enumerate(xs_ext)]
        flat = torch.stack([x.reshape(self.n_ext, -1) for x in xs_ext])
        out = torch.bmm(self.stacked, flat)
        return [o.reshape(self.n_own, *xs_ext[0].shape[1:]) for o in out]

    def diffuse(self, x0: torch.Tensor, k_max: int, form: str = "original") -> list[torch.Tensor]:
        """[x_0, then per support x_1 .. x_K]: 1 + supports * K tensors of x0's shape (n_own, B, F)."""
        return self.diffuse_folded(x0, k_max, form, fold=False)[0]

    def diffuse_folded(
        self, x0: torch.Tensor, k_max: int, form: str = "original", fold: bool = True
    ) -> tuple[list[torch.Tensor], list[tuple[int, int]]]:
        """(terms, folds). With fold, the recursion's last term of each support, x_K = 2 S x_(K-1) - x_(K-2), is
        returned as y = 2 S x_(K-1) and (j, m) in folds says term m stands for y - term j: a layer that weights
        the terms then gives term j the weight W_j - W_m. The output is the same function; the subtraction,
        its backward and one gradient sum over (nodes, batch, features) per support are not computed."""
        if k_max == 0:
            return [x0], []
        if form == "original":
            return self._diffuse_original(x0, k_max, fold)
        ones = self.mul_all(self.extend(x0))
        per = [[x] for x in ones]
        prev1 = ones
        for _ in range(2, k_max + 1):
            if self.plan is None:
                xs = prev1
            else:
                f = x0.shape[-1]
                ext = self.extend(torch.cat(prev1, dim=-1))  # one exchange for every support's x_{k-1}
                xs = [ext[..., i * f : (i + 1) * f] for i in range(self.count)]
            nxt = self.mul_each(xs)  # the paper's plain powers: S^k x0 = S (S^(k-1) x0)
            for i, x in enumerate(nxt):
                per[i].append(x)
            prev1 = nxt
        return [x0] + [x for xs in per for x in xs], []

    def _diffuse_original(self, x0: torch.Tensor, k_max: int, fold: bool):
        out, folds, at0 = [x0], [], 0  # at0: x0's index in out
        for i in range(self.count):
            x1 = self.mul(i, self.extend(x0))
            out.append(x1)
            at1 = len(out) - 1
            for k in range(2, k_max + 1):
                y = self.mul(i, self.extend(x1), twice=True)
                if fold and k == k_max:  # x_K is not used again: leave the subtraction to the weights
                    out.append(y)
                    folds.append((at0, len(out) - 1))
                    x2 = None
                else:
                    x2 = y - x0
                    out.append(x2)
                x1, x0, at1, at0 = x2, x1, len(out) - 1, at1
        return out, folds
