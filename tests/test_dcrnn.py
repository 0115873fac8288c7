"""DCRNN on traffic graphs: the real file formats, the graph builder, windows, metrics, diffusion, parallelism.

Files are written here in the distributed layouts, independently of kernels/: a pandas
HDFStore with the speeds under key 'df', and a pickle assembled opcode by opcode as Python 2
wrote adj_mx.pkl (str as 8-bit strings, a numpy array reduced with its raw bytes), which
only loads with encoding='latin1'.
"""

from __future__ import annotations

import csv
import inspect
import json
import math
import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from kernels.data import traffic
from kernels.data.series import SeriesStore, WindowEvalSource, WindowSource
from kernels.base.params import ConfigError
from kernels.launch.config import resolve
from kernels.workloads import dcrnn
from kernels.workloads.dcrnn.graph import Graph, dual_supports, edge_cut, halo_plans, partition
from kernels.workloads.dcrnn.model import DCRNN

from conftest import ROOT, cli_in_process, run_cli

pytestmark = pytest.mark.unit


# ------------------------------------------------------------------ files in the real layouts
def py2_pickle(ids: list[str], adj: np.ndarray) -> bytes:
    """[sensor_ids, sensor_id_to_ind, adj_mx] as Python 2's pickle protocol 2 wrote it."""

    def s(b: bytes) -> bytes:  # SHORT_BINSTRING / BINSTRING: a Python 2 str
        return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b

    def i(v: int) -> bytes:
        return b"K" + bytes([v]) if 0 <= v < 256 else b"J" + struct.pack("<i", v)

    out = b"\x80\x02]q\x00(" + b"]q\x01(" + b"".join(s(x.encode()) for x in ids) + b"e"
    out += b"}q\x02(" + b"".join(s(x.encode()) + i(n) for n, x in enumerate(ids)) + b"u"
    a = np.ascontiguousarray(adj, dtype="<f4")
    out += (
        b"cnumpy.core.multiarray\n_reconstruct\nq\x03cnumpy\nndarray\nq\x04"
        + i(0)
        + b"\x85"
        + s(b"b")
        + b"\x87R"
        + b"("
        + i(1)
        + i(a.shape[0])
        + i(a.shape[1])
        + b"\x86"
        + b"cnumpy\ndtype\n"
        + s(b"f4")
        + i(0)
        + i(1)
        + b"\x87R("
        + i(3)
        + s(b"<")
        + b"NNN"
        + i(-1)
        + i(-1)
        + i(0)
        + b"tb"
        + b"\x89"
        + s(a.tobytes())
        + b"tb"
    )
    return out + b"e."


def write_set(
    d,
    speeds: np.ndarray,
    ids: list[str],
    adj: np.ndarray,
    key: str = "df",
    h5="speeds.h5",
    pkl="adj_mx.pkl",
    start="2012-03-01",
):
    d.mkdir(parents=True, exist_ok=True)
    index = pd.date_range(start, periods=speeds.shape[0], freq="5min")
    with pd.HDFStore(d / h5, mode="w") as store:
        store.put(key, pd.DataFrame(speeds, index=index, columns=ids), track_times=False)
    (d / pkl).write_bytes(py2_pickle(ids, adj))


def small_graph(n: int = 6):
    ids = [str(400000 + 11 * k) for k in range(n)]
    adj = np.zeros((n, n), np.float32)
    for k in range(n):
        adj[k, k] = 1.0
        adj[k, (k + 1) % n] = 0.7
        adj[(k + 2) % n, k] = 0.3
    return ids, adj


def test_the_readers_take_the_distributed_layouts(tmp_path):
    ids, adj = small_graph()
    rng = np.random.default_rng(0)
    speeds = rng.uniform(20, 70, (300, 6))
    speeds[5:9, 2] = 0
    write_set(tmp_path / "traffic-synthetic-metr-la", speeds, ids, adj)
    raw = (tmp_path / "traffic-synthetic-metr-la" / "adj_mx.pkl").read_bytes()
    with pytest.raises(UnicodeDecodeError):  # the reason for latin1: the array's raw bytes are a py2 str
        pickle.loads(raw)
    got_ids, to_ind, got_adj = traffic.read_adjacency(tmp_path / "traffic-synthetic-metr-la" / "adj_mx.pkl")
    assert got_ids == ids and to_ind == {x: n for n, x in enumerate(ids)}
    assert got_adj.dtype == np.float32 and np.array_equal(got_adj, adj)
    s = traffic.load("synthetic", tmp_path)
    assert s.speeds.shape == (300, 6) and np.allclose(s.speeds, speeds.astype(np.float32))
    assert s.sensor_ids == ids
    assert s.time_of_day[0] == 0 and math.isclose(float(s.time_of_day[1]), 5 / 1440, rel_tol=1e-6)
    assert float(s.time_of_day.max()) < 1


@pytest.mark.integration
def test_the_graph_builder_matches_a_hand_computed_case(tmp_path):
    # distances (metres) with each sensor's 0 to itself, as the distributed CSV; 'x' is not a listed sensor
    rows = "from,to,distance\na,a,0\nb,b,0\nc,c,0\na,b,1\nb,c,2\nc,a,10\nx,a,1\n"
    (tmp_path / "d.csv").write_text(rows)
    (tmp_path / "ids.txt").write_text("a,b,c")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernels.data.traffic",
            "adjacency",
            "--distances",
            tmp_path / "d.csv",
            "--sensor-ids",
            tmp_path / "ids.txt",
            "--out",
            tmp_path / "adj.pkl",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    ids, _, adj = traffic.read_adjacency(tmp_path / "adj.pkl")
    # finite entries 0,0,0,1,2,10: mean 13/6, population std sqrt(105/6 - (13/6)^2) = 3.5785
    sigma = math.sqrt(105 / 6 - (13 / 6) ** 2)
    assert math.isclose(sigma, 3.5785, rel_tol=1e-4)
    want = np.zeros((3, 3), np.float32)
    np.fill_diagonal(want, 1.0)
    want[0, 1] = math.exp(-((1 / sigma) ** 2))  # 0.9249
    want[1, 2] = math.exp(-((2 / sigma) ** 2))  # 0.7317
    # c -> a: exp(-(10/3.5785)^2) = 0.0004 < 0.1: dropped; nothing symmetrised
    assert ids == ["a", "b", "c"] and np.allclose(adj, want, atol=1e-6)
    (tmp_path / "ids2.txt").write_text("a\nb\nc\n")  # one per line works too
    assert traffic.read_sensor_ids(tmp_path / "ids2.txt") == ["a", "b", "c"]


# The first lines of the original repository's data/sensor_graph/distances_bay_2017.csv, as published: no
# header, the first line is already a pair; metres.
BAY_HEAD = """400001,400001,0.0
400017,400017,0.0
400030,400030,0.0
400030,400045,5108.4
400030,400065,7401.1
400030,400088,10961.1
400030,400100,8360.4
400030,400122,5430.2
400040,400040,0.0
400045,400030,2525.0
400045,400045,0.0
400045,400065,7661.0
400045,400088,5853.5
400045,400122,322.6
400065,400065,0.0
400088,400088,0.0
400100,400100,0.0
400122,400030,2203.0
400122,400045,3440.4
400122,400065,7338.9
400122,400088,5531.4
400122,400122,0.0
"""
BAY_IDS = ["400001", "400017", "400030", "400040", "400045", "400065", "400088", "400100", "400122"]


def gen_adj_mx(pairs, sensor_ids, normalized_k=0.1):
    """The original scripts/gen_adj_mx.py's arithmetic, written out here as the reference: float32 distances
    from inf, sigma the std of the finite ones, exp(-(d/sigma)^2), below normalized_k set to 0."""
    index = {s: i for i, s in enumerate(sensor_ids)}
    dist = np.full((len(sensor_ids), len(sensor_ids)), np.inf, dtype=np.float32)
    for a, b, d in pairs:
        if a in index and b in index:
            dist[index[a], index[b]] = d
    adj = np.exp(-np.square(dist / dist[~np.isinf(dist)].flatten().std()))
    adj[adj < normalized_k] = 0
    return adj


@pytest.mark.integration
@pytest.mark.parametrize("layout", ["bay: no header", "la: from,to,cost", "lab: from,to,distance"])
def test_distances_files_read_as_published_rebuild_the_reference_adjacency(tmp_path, layout):
    """distances_bay_2017.csv (no header), distances_la_2012.csv (header from,to,cost) and the lab's own
    (from,to,distance), with graph_sensor_ids.txt as published (one comma-separated line): the adjacency equals
    the original script's within 1e-6, and the pickle is the published [ids, id_to_ind, adj] triple."""
    pairs = [(a, b, float(d)) for a, b, d in (ln.split(",") for ln in BAY_HEAD.split())]
    header = {
        "bay: no header": "",
        "la: from,to,cost": "from,to,cost\n",
        "lab: from,to,distance": "from,to,distance\n",
    }[layout]
    (tmp_path / "d.csv").write_text(header + BAY_HEAD)
    (tmp_path / "graph_sensor_ids.txt").write_text(",".join(BAY_IDS))  # one line, no newline, as published
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernels.data.traffic",
            "adjacency",
            "--distances",
            tmp_path / "d.csv",
            "--sensor-ids",
            tmp_path / "graph_sensor_ids.txt",
            "--out",
            tmp_path / "adj.pkl",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    ids, to_ind, adj = traffic.read_adjacency(tmp_path / "adj.pkl")
    want = gen_adj_mx(pairs, BAY_IDS)
    assert ids == BAY_IDS and to_ind == {s: i for i, s in enumerate(BAY_IDS)}
    assert adj.dtype == np.float32 and np.abs(adj - want).max() <= 1e-6
    assert adj[0, 0] == 1.0  # the first line's pair (400001 to itself) was read, not taken for a header
    assert adj[2, 4] > 0.1 and adj[4, 2] > 0.1 and adj[4, 8] > 0.9  # 400030->400045, back, 400045->400122


def test_a_distances_file_that_is_not_one_is_refused_naming_the_line(tmp_path):
    (tmp_path / "ids.txt").write_text("a,b")
    for text, needle in (
        ("sensor,dest,km\na,b,1\n", "neither a header"),
        ("from,to,cost\na,b,far\n", "line 2"),
        ("a,b,1\nb\n", "line 2"),
        ("", "is empty"),
    ):
        (tmp_path / "d.csv").write_text(text)
        with pytest.raises(ConfigError, match=needle):
            traffic.read_distances(tmp_path / "d.csv")


def test_windows_and_splits_follow_the_original_counts(tmp_path):
    ids, adj = small_graph(4)
    t = 100
    speeds = np.arange(t * 4, dtype=np.float64).reshape(t, 4) + 1
    write_set(tmp_path / "traffic-synthetic-metr-la", speeds, ids, adj)
    s = traffic.load("synthetic", tmp_path)
    assert s.num_windows == 77  # T - 23
    sp = s.splits()  # test round(15.4) = 15, train round(53.9) = 54, val the rest
    assert (len(sp["train"]), len(sp["val"]), len(sp["test"])) == (54, 8, 15)
    assert sp["train"].start == 0 and sp["val"].start == 54 and sp["test"].stop == 77
    # the scaler: mean and std of the training input windows' speeds, each window counted
    xs = np.stack([speeds[w : w + 12] for w in sp["train"]])
    mean, std = s.scaler()
    assert math.isclose(mean, xs.mean(), rel_tol=1e-9) and math.isclose(std, xs.std(), rel_tol=1e-9)
    store = SeriesStore(s.inputs(mean, std), s.speeds, (s.speeds != 0).sum(1), torch.device("cpu"), 12, 12)
    src = WindowSource(store, sp["train"], 8, 0, 1, 0)
    assert src.steps_per_epoch == 6 and src.dropped_per_epoch == 6
    x, (y, norm) = next(src.batches(0))
    first = int(round(float(x[0, 0, 0, 0]) * std + mean - 1)) // 4  # window start from its first value
    assert torch.allclose(x[0, :, :, 0] * std + mean, torch.tensor(speeds[first : first + 12], dtype=torch.float32))
    assert torch.equal(y[0], torch.tensor(speeds[first + 12 : first + 24], dtype=torch.float32))
    assert float(norm[0]) == 48  # 12 steps x 4 sensors, none missing
    # two ranks: the same global batch, split
    a = [next(WindowSource(store, sp["train"], 8, r, 2, 0).batches(0))[0] for r in (0, 1)]
    assert torch.equal(torch.cat(a), x)
    ev = WindowEvalSource(store, sp["test"], 4, 0, 1)
    assert sum(b[0].shape[0] for b in ev.batches()) == 15


def test_masked_metrics_and_loss_match_numpy():
    rng = np.random.default_rng(1)
    y = rng.uniform(10, 70, (5, 12, 7)).astype(np.float32)
    y[rng.random(y.shape) < 0.2] = 0
    p = rng.uniform(10, 70, (5, 12, 7)).astype(np.float32)
    norm = (y != 0).sum((1, 2)).astype(np.float32)
    sums = dcrnn.metric_sums(torch.tensor(p), (torch.tensor(y), torch.tensor(norm)))
    for k, h in enumerate((3, 6, 12)):
        m = y[:, h - 1] != 0
        e = (p[:, h - 1] - y[:, h - 1])[m]
        n = float(sums["mae"][1][k])
        assert n == m.sum()
        assert math.isclose(float(sums["mae"][0][k]) / n, np.abs(e).mean(), rel_tol=1e-5)
        assert math.isclose(math.sqrt(float(sums["rmse"][0][k]) / n), math.sqrt((e**2).mean()), rel_tol=1e-5)
        assert math.isclose(float(sums["mape"][0][k]) / n, (np.abs(e) / y[:, h - 1][m]).mean(), rel_tol=1e-5)
    loss = float(dcrnn.loss(torch.tensor(p), (torch.tensor(y), torch.tensor(norm))))
    m = y != 0
    assert math.isclose(loss, np.abs(p - y)[m].mean(), rel_tol=1e-5)  # the original's masked MAE


def test_diffusion_matches_dense_matrix_powers():
    ids, adj = small_graph(6)
    s1, s2 = dual_supports(adj)
    # the supports are the random-walk matrices transposed, as the original
    d_out, d_in = adj.sum(1), adj.sum(0)
    assert np.allclose(s1, (adj / d_out[:, None]).T) and np.allclose(s2, (adj.T / d_in[:, None]).T)
    x = torch.randn(6, 3, 4, dtype=torch.float64)
    for mode in ("dense", "sparse"):
        g = Graph([s1.astype(np.float64), s2.astype(np.float64)], None, mode).double()
        a, b = (torch.tensor(m, dtype=torch.float64) for m in (s1, s2))

        def mm(m, v):
            return torch.einsum("ij,jbf->ibf", m, v)

        # the paper's equation: plain powers of each support
        paper = g.diffuse(x, 3, "paper")
        want = [x]
        for m in (a, b):
            want += [mm(m, x), mm(m @ m, x), mm(m @ m @ m, x)]
        assert len(paper) == 7 and all(torch.allclose(u, v) for u, v in zip(paper, want))
        # the released code: x0, x1 carry over into the second support (DCRNN issues #45, #90)
        orig = g.diffuse(x, 2)  # the default
        t1 = mm(a, x)
        t2 = 2 * mm(a, t1) - x
        u1 = mm(b, t1)  # x0 is now t1
        u2 = 2 * mm(b, u1) - t1
        assert all(torch.allclose(u, v) for u, v in zip(orig, [x, t1, t2, u1, u2]))
        assert not torch.allclose(orig[3], mm(b, x))


def test_auto_supports_are_sparse_for_a_road_graph_on_a_cpu_and_dense_on_a_gpu():
    """supports=auto: a small road graph (about 4 % non-zero, as METR-LA) is held sparse on a CPU and dense on
    a GPU, where the dense product was the faster (results/bench/dcrnn-nvidia-h200.md); a graph past DENSE_LIMIT
    entries stays sparse on both."""
    from kernels.workloads.dcrnn import graph

    rng = np.random.default_rng(0)
    adj = (rng.random((200, 200)) < 0.03).astype(np.float32)
    np.fill_diagonal(adj, 1)
    sup = dual_supports(adj)
    assert Graph(sup, None, "auto", device_type="cpu").sparse
    assert not Graph(sup, None, "auto", device_type="cuda").sparse
    assert Graph(sup, None, "auto", device_type="cuda").describe()["supports"] == "dense"
    big = 2049  # 2049 x 2049 > DENSE_LIMIT entries
    assert big * big > graph.DENSE_LIMIT
    eye = [np.eye(big, dtype=np.float32)] * 2
    assert Graph(eye, None, "auto", device_type="cuda").sparse


@pytest.mark.parametrize("mode, layout", [("dense", "cpu"), ("sparse", "cpu"), ("sparse", "cuda")])
def test_the_model_trains_under_bf16_autocast_with_each_support_layout(mode, layout):
    """precision=bf16 runs the model under autocast: the in-place accumulation of the gconv's terms and the
    sparse products (CSR on a CPU, COO as held on a GPU, which autocast would otherwise cast to bf16: no such
    CUDA kernel) must run there, computing what the fp32 model computes to bf16's precision, teacher forcing
    included."""
    ids, adj = small_graph(6)
    sup = [m.astype(np.float32) for m in dual_supports(adj)]
    torch.manual_seed(1)
    x, y = torch.randn(3, 12, 6, 2), 50 + 10 * torch.randn(3, 12, 6)

    def run(autocast: bool):
        torch.manual_seed(0)
        model = DCRNN(Graph(sup, None, mode, device_type=layout), 50.0, 10.0, units=8, k_max=2)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(x, y, step=100, train=True)
        out.float().pow(2).mean().backward()
        return out.float().detach(), model.encoder[0].gates.weight.grad.clone()

    (ref, ref_grad), (out, grad) = run(False), run(True)
    assert (out - ref).norm() / ref.norm() < 1e-2
    assert (grad - ref_grad).norm() / ref_grad.norm() < 5e-2
    sparse_product = Graph(sup, None, mode, device_type=layout)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        s_x = sparse_product.mul(0, x[0].permute(1, 0, 2).contiguous())
    if mode == "sparse":  # the supports' own precision, not bf16
        assert torch.allclose(s_x, torch.einsum("ij,jbf->ibf", torch.tensor(sup[0]), x[0].permute(1, 0, 2)))


@pytest.mark.parametrize("k_max", [1, 2, 3])
def test_the_gconv_computes_the_released_recursion_and_its_gradient(k_max):
    """The graph convolution takes shortcuts: sparse products whose backward multiplies by a transpose held beside
    the support, 2S held for the recursion's 2 S x, and the last x_K = 2 S x_(K-1) - x_(K-2) of each support left
    to the weights (term x_(K-2) takes -W_K), and an input given in parts diffused apart (the cell diffuses x and
    h once each). Output and every gradient must equal sum_m x_m W_m + b written out from the unshortened terms of
    the whole input, on sparse and dense supports alike."""
    from kernels.workloads.dcrnn.model import DiffusionConv

    ids, adj = small_graph(6)
    supports = [m.astype(np.float64) for m in dual_supports(adj)]
    for mode in ("sparse", "dense"):
        torch.manual_seed(0)
        g = Graph(supports, None, mode).double()
        conv = DiffusionConv(4, 5, k_max, 2, bias_start=1.0).double()
        x = torch.randn(6, 3, 4, dtype=torch.float64, requires_grad=True)
        got = conv([g.diffuse_folded(x, k_max)])
        parts = conv([g.diffuse_folded(x[..., :1], k_max), g.diffuse_folded(x[..., 1:], k_max)])
        terms, x0 = [x], x  # the released code's recursion on dense matrices, subtractions included
        for m in (torch.tensor(s) for s in supports):
            x1 = torch.einsum("ij,jbf->ibf", m, x0)
            terms.append(x1)
            for _ in range(2, k_max + 1):
                x2 = 2 * torch.einsum("ij,jbf->ibf", m, x1) - x0
                terms.append(x2)
                x1, x0 = x2, x1
        w = conv.weight.view(4, len(terms), 5)
        want = sum(torch.einsum("nbf,fo->nbo", t, w[:, m]) for m, t in enumerate(terms)) + conv.bias
        assert torch.allclose(got, want) and torch.allclose(parts, want)
        wants = torch.autograd.grad(want.square().sum(), [x, conv.weight, conv.bias], retain_graph=True)
        for out in (got, parts):
            grads = torch.autograd.grad(out.square().sum(), [x, conv.weight, conv.bias], retain_graph=True)
            assert all(torch.allclose(a, b) for a, b in zip(grads, wants))


def test_a_cell_from_the_zero_state_skips_its_terms_and_computes_the_same_step():
    """The encoder starts from h = None, the zero state, whose terms (and those of r * h) the cell neither diffuses
    nor weights. The step and every gradient must equal the GRU equations with an explicit zero state, their
    diffusion included, on sparse and dense supports."""
    from kernels.workloads.dcrnn.model import DCGRUCell

    ids, adj = small_graph(6)
    supports = [m.astype(np.float64) for m in dual_supports(adj)]
    for mode in ("sparse", "dense"):
        torch.manual_seed(0)
        g = Graph(supports, None, mode).double()
        cell = DCGRUCell(2, 3, 2, 2).double()
        x = torch.randn(6, 4, 2, dtype=torch.float64, requires_grad=True)
        diffuse = lambda t: g.diffuse_folded(t, 2)  # noqa: E731
        zero = torch.zeros(6, 4, 3, dtype=torch.float64)
        got = cell(diffuse(x), None, None, diffuse)
        want = cell(diffuse(x), zero, diffuse(zero), diffuse)
        ru = torch.sigmoid(cell.gates([diffuse(x), diffuse(zero)]))
        by_hand = (1 - ru[..., 3:]) * torch.tanh(cell.candidate([diffuse(x), diffuse(zero)]))
        assert torch.allclose(got, want) and torch.allclose(got, by_hand)
        params = [x, *cell.parameters()]
        for a, b in zip(
            torch.autograd.grad(got.square().sum(), params), torch.autograd.grad(want.square().sum(), params)
        ):
            assert torch.allclose(a, b)


def test_a_checkpoint_holding_sparse_supports_is_written_and_verified(tmp_path):
    """DCRNN's supports on a CPU are CSR tensors in the model's state: the checkpoint holds and verifies them, a
    changed byte is found, and the content checksum of an earlier format's files covers their indices and values
    (a CSR tensor has no flat bytes; that write failed at the first epoch's end)."""
    from kernels.records import checkpoint_file as checkpoint

    ids, adj = small_graph(6)
    g = Graph([m.astype(np.float32) for m in dual_supports(adj)], None, "sparse")
    held = dict(g.named_buffers())  # what a checkpoint's rank_buffers hold
    assert {v.layout for v in held.values()} == {torch.sparse_csr}
    checkpoint.write(tmp_path, checkpoint.serialise([checkpoint.rng_state()], rank_buffers=[held], epoch=1))
    state, path, notes = checkpoint.load(tmp_path)
    assert path.name == "checkpoint.pt" and not notes and state["epoch"] == 1
    assert all(torch.equal(state["rank_buffers"][0][k].to_dense(), v.to_dense()) for k, v in held.items())
    before = checkpoint.content_digest(state)
    state["rank_buffers"][0]["support0"].values()[0] += 1.0
    assert checkpoint.content_digest(state) != before
    data = bytearray(path.read_bytes())
    data[-300] ^= 1
    path.write_bytes(bytes(data))
    assert "checksum mismatch" in checkpoint.read_state(path)[1]


def test_the_default_is_the_released_codes_recursion():
    """Every published METR-LA / PEMS-BAY accuracy comes from the released code's arithmetic: the default
    diffusion_form is that recursion, in the parameters, the model and the graph alike (the recursion itself is
    checked against dense matrices above)."""
    from kernels.workloads.dcrnn.model import DCRNN

    assert resolve({"workload": "dcrnn"}).diffusion_form == "original"
    assert inspect.signature(DCRNN).parameters["form"].default == "original"
    assert inspect.signature(Graph.diffuse).parameters["form"].default == "original"


def test_partition_balances_and_plans_cover_the_halo():
    ids, adj = small_graph(12)
    for method in ("metis", "bfs"):
        member, used = partition(adj, 3, method)
        assert used in (method, "bfs (pymetis not installed)")
        assert sorted(np.bincount(member, minlength=3).tolist()) == [4, 4, 4]
        # 24 undirected edges (ring and chords); a random 3-way split cuts 16 on average, arcs cut 9
        assert 0 < edge_cut(adj, member) <= 12
    s1, s2 = dual_supports(adj)
    structure = (s1 != 0) | (s2 != 0)
    plans = halo_plans(structure, member, 3)
    assert sorted(np.concatenate([p.own for p in plans]).tolist()) == list(range(12))
    for p in plans:
        reads = np.flatnonzero(structure[p.own].any(0))
        assert set(reads) == set(p.own) | set(p.halo) and not set(p.halo) & set(p.own)


GP_WORKER = r"""
import json, os, sys
import numpy as np, torch, torch.distributed as dist
from kernels.data import traffic
from kernels.base.dist import grid
from kernels.workloads import dcrnn
from kernels.workloads.dcrnn.graph import Graph, dual_supports, halo_plans, partition
from kernels.workloads.dcrnn.model import DCRNN

root, out, pairs = sys.argv[1:4]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
g = grid(world)
s = traffic.load("synthetic", root)
n = s.num_nodes
sup = dual_supports(s.adj)
own, ext, plan = np.arange(n), np.arange(n), None
if world > 1:
    member, _ = partition(s.adj, world)
    plan = halo_plans((sup[0] != 0) | (sup[1] != 0), member, world)[rank]
    plan.group = g.group
    own, ext = plan.own, np.concatenate([plan.own, plan.halo])
mean, std = s.scaler()
x = torch.from_numpy(s.inputs(mean, std)[:, own][np.arange(3)[:, None] + np.arange(12)])
y = torch.from_numpy(s.speeds[:, own][np.arange(3)[:, None] + 12 + np.arange(12)])
norm = torch.tensor([(s.speeds[w + 12:w + 24] != 0).sum() / world for w in range(3)], dtype=torch.float32)
for pair in pairs.split(","):  # each form and support layout in the same processes: one start per rank
    form, mode = pair.split(":")
    torch.manual_seed(0)
    model = DCRNN(Graph([m[np.ix_(own, ext)] for m in sup], plan, mode), 50.0, 10.0, units=8, k_max=2, form=form)
    pred = model(x, y, 0, True)
    loss = dcrnn.loss(pred, (y, norm))
    loss.backward()
    json.dump({"own": own.tolist(), "pred": pred.detach().tolist(), "loss": float(loss),
               "halo": len(plan.halo) if plan else 0,
               "grads": {k: p.grad.tolist() for k, p in model.named_parameters()}},
              open(f"{out}/{form}-{mode}-{rank}.json", "w"))
dist.destroy_process_group()
"""


def run_gp(tmp_path, root, world: int, pairs: list[tuple[str, str]]) -> dict:
    """The model split over `world` ranks, for each (form, support layout): {pair: (predictions of all nodes, the
    loss, the gradients as DDP averages them, halo nodes of rank 0)}."""
    from kernels.base.ports import free_port

    out = tmp_path / f"gp{world}"
    out.mkdir()
    script = tmp_path / "gp_worker.py"
    script.write_text(GP_WORKER)
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(world),
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    arg = ",".join(f"{form}:{mode}" for form, mode in pairs)
    procs = [
        subprocess.Popen(
            [sys.executable, script, root, out, arg], env={**env, "RANK": str(r)}, stderr=subprocess.PIPE, text=True
        )
        for r in range(world)
    ]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    found = {}
    for form, mode in pairs:
        res = [json.loads((out / f"{form}-{mode}-{r}.json").read_text()) for r in range(world)]
        n = sum(len(r["own"]) for r in res)
        pred = np.zeros((3, 12, n))
        for r in res:
            pred[:, :, r["own"]] = np.array(r["pred"])
        # each rank's loss is gp x its share of the graph's loss, so that the mean over ranks (what DDP averages)
        # is the whole graph's loss and gradient
        grads = {k: sum(np.array(r["grads"][k]) for r in res) / world for k in res[0]["grads"]}
        found[(form, mode)] = pred, sum(r["loss"] for r in res) / world, grads, res[0]["halo"]
    return found


@pytest.mark.integration
def test_graph_parallel_equals_the_unpartitioned_model(tmp_path):
    """The released recursion with dense supports and the original form with sparse ones, on 1, 2 and 4 ranks;
    both in the same rank processes (they were two tests, each starting its own seven)."""
    pairs = [("paper", "dense"), ("original", "sparse")]
    root = tmp_path / "data"
    traffic.write_synthetic(traffic.directory("synthetic", root), 200, 60, progress=lambda m: None)
    ref = run_gp(tmp_path, root, 1, pairs)
    for world in (2, 4):
        split = run_gp(tmp_path, root, world, pairs)
        for pair in pairs:
            (pred, loss, grads, halo), (ref_pred, ref_loss, ref_grads, _) = split[pair], ref[pair]
            assert halo > 0  # the parts do exchange rows
            # tolerance: float32 sums in another order (outputs in mph, about 60; gradients relative to their scale)
            assert np.abs(pred - ref_pred).max() < 1e-4, pair
            assert math.isclose(loss, ref_loss, rel_tol=1e-5), pair
            for k, g in ref_grads.items():
                assert np.abs(grads[k] - g).max() <= 1e-4 * max(np.abs(g).max(), 1e-6), (pair, k)


# ------------------------------------------------------------------ the lab's loop, real processes
def tiny_set(root, t: int = 300, n: int = 40):
    traffic.write_synthetic(traffic.directory("synthetic", root), t, n, progress=lambda m: None)


TINY_DCRNN = [
    "--workload",
    "dcrnn",
    "--dataset",
    "synthetic",
    "--rnn_units",
    "8",
    "--batch",
    "8",
    "--epochs",
    "2",
    "--train_samples",
    "48",
    "--test_samples",
    "24",
    "--log_every",
    "0",
    "--timing_warmup_steps",
    "1",
    "--comm_probe_steps",
    "0",
    "--oversubscribe",
    "true",
    "--seq_len",
    "3",
    "--horizon",
    "6",
]  # 9 cell steps instead of 24: what the DDP checks need, at 0.7x


def losses(run_dir) -> list[float]:
    with open(run_dir / "metrics.csv") as f:
        return [float(r["train_loss"]) for r in csv.DictReader(f)] + [
            float(r["eval_mae_15min"]) for r in csv.DictReader(open(run_dir / "metrics.csv"))
        ]


@pytest.mark.integration
def test_ddp_two_ranks_equal_one_process_with_two_micro_batches_and_a_2x2_grid_equals_both(tmp_path):
    tiny_set(tmp_path / "data")
    base = [*TINY_DCRNN, "--data_dir", tmp_path / "data", "--results_dir", tmp_path / "runs"]
    runs = {
        "one": ["--gpus", "1", "--micro_batches", "2"],
        "ddp": ["--gpus", "2"],
        "grid": ["--gpus", "4", "--gp", "2"],
    }
    for name, extra in runs.items():
        p = run_cli(*base, *extra, "--run_id", name)
        assert p.returncode == 0, p.stdout + p.stderr
    one, ddp, grid = (losses(tmp_path / "runs" / k) for k in runs)
    assert np.allclose(ddp, one, rtol=1e-4), (ddp, one)
    assert np.allclose(grid, ddp, rtol=1e-4), (grid, ddp)
    s = json.loads((tmp_path / "runs" / "grid" / "summary.json").read_text())
    w = s["workload"]
    assert (w["dp"], w["gp"], w["partition"]) == (2, 2, "metis") and w["edge_cut"] > 0
    assert sum(w["part_sizes"]) == 40 and set(w["historical_average"]) >= {"mae_15min", "rmse_30min", "mape_30min"}
    assert [r["rank"] for r in s["ranks"]] == [0, 1, 2, 3]
    assert all(r["halo_nodes"] > 0 and r["halo_bytes_per_step"] > 0 and r["peak_mem_gib"] > 0 for r in s["ranks"])
    cfg = json.loads((tmp_path / "runs" / "grid" / "config.json").read_text())
    variant = cfg["derived"]["model_variant"]  # supports dense or sparse by each rank's share of the graph
    assert variant.startswith("dcrnn-2x8-K2-original-") and variant.endswith("-gp2"), variant
    assert cfg["derived"]["data_source"]["source"] == "index-batched series"

    # the records feed the paper's DCRNN section: tables, sentences and the scaling figure
    import yaml

    from kernels import report

    plan = yaml.safe_load((ROOT / "paper" / "plan.yaml").read_text())
    systems = yaml.safe_load((ROOT / "paper" / "systems.yaml").read_text())
    out = report.build(tmp_path / "runs", tmp_path / "report", plan, systems, select={})
    t = out["dcrnn"]
    dp = t[t["parallel"] == "data parallel"].sort_values("gpus")
    assert list(dp["gpus"]) == [1, 2] and dp["efficiency"].iloc[0] == 1.0
    assert abs(dp["mae_gap_pct"].iloc[1]) < 0.01  # 2 ranks = 1 process with 2 micro-batches
    assert t[t["parallel"] == "grid, gp=2"]["halo_mb_per_step"].iloc[0] > 0
    text = (tmp_path / "report" / "tables" / "dcrnn_text.tex").read_text()
    assert "historical average on the same test windows" in text and "2 ranks reach" in text
    assert "MAE at 15 and 30 minutes is" in text  # the horizons this 6-step model forecasts, no third one named
    assert "historical average, synthetic" in (tmp_path / "report" / "tables" / "dcrnn_metrics_table.tex").read_text()
    assert (tmp_path / "report" / "figures" / "dcrnn_scaling.pdf").exists()


@pytest.mark.integration
def test_a_short_run_on_the_metr_la_shape_beats_the_historical_average(tmp_path):
    # the product's synthetic default (34,272 steps x 207 sensors), generated by the run itself; a small model
    p = run_cli(
        "--workload",
        "dcrnn",
        "--dataset",
        "synthetic",
        "--data_dir",
        tmp_path / "data",
        "--results_dir",
        tmp_path / "runs",
        "--run_id",
        "short",
        "--rnn_units",
        "16",
        "--batch",
        "32",
        "--epochs",
        "1",
        "--train_samples",
        "2560",
        "--test_samples",
        "288",
        "--use_curriculum_learning",
        "false",
        "--log_every",
        "0",
        "--comm_probe_steps",
        "0",
        "--checkpoint_every",
        "0",
        timeout=900,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "synthetic metr-la: 34,272 x 207 written" in p.stdout + p.stderr
    s = json.loads((tmp_path / "runs" / "short" / "summary.json").read_text())
    ha = s["workload"]["historical_average"]
    assert s["final_eval_mae_15min"] < 0.8 * ha["mae_15min"], (s["final_eval_mae_15min"], ha)


# ------------------------------------------------------------------ bad input
def test_bad_files_are_named_before_any_record(tmp_path):
    ids, adj = small_graph(5)
    speeds = np.full((200, 5), 50.0)
    d = tmp_path / "traffic-synthetic-metr-la"
    write_set(d, speeds, ids, adj, key="speed")
    with pytest.raises(ConfigError, match="no table under key 'df'.*speed"):
        traffic.load("synthetic", tmp_path)
    write_set(d, speeds[:, :4], ids[:4], adj[:4, :4])
    (d / "adj_mx.pkl").write_bytes(py2_pickle(ids, adj))
    with pytest.raises(ConfigError, match="4 sensor columns but the graph .* has 5"):
        traffic.load("synthetic", tmp_path)
    write_set(d, speeds, ids[::-1], adj)
    (d / "adj_mx.pkl").write_bytes(py2_pickle(ids, adj))
    with pytest.raises(ConfigError, match="sensor ids do not match"):
        traffic.load("synthetic", tmp_path)
    (d / "adj_mx.pkl").write_bytes(pickle.dumps({"not": "a triple"}, protocol=2))
    with pytest.raises(ConfigError, match="expected the triple"):
        traffic.read_adjacency(d / "adj_mx.pkl")
    (d / "adj_mx.pkl").write_bytes(pickle.dumps([ids, {x: n for n, x in enumerate(ids)}, adj[:, :4]], protocol=2))
    with pytest.raises(ConfigError, match="must be square"):
        traffic.read_adjacency(d / "adj_mx.pkl")
    neg = adj.copy()
    neg[0, 1] = -0.5
    (d / "adj_mx.pkl").write_bytes(py2_pickle(ids, neg))
    with pytest.raises(ConfigError, match="negative"):
        traffic.read_adjacency(d / "adj_mx.pkl")
    with pytest.raises(ConfigError, match=r"lab fetch metr-la --from DIR"):
        traffic.load("metr-la", tmp_path)


@pytest.mark.parametrize(
    "args,message",
    [
        ({"horizon": 13}, "parameter 'horizon': must be in 1..12"),
        ({"seq_len": 0}, "parameter 'seq_len': must be in 1..12"),
        ({"gpus": 4, "gp": 3}, "parameter 'gp': 3 does not divide gpus=4"),
        ({"gpus": 256, "gp": 256, "batch": 256}, "parameter 'gp': 256 parts for 207 sensors"),
        ({"lr_milestones": "20,x"}, "parameter 'lr_milestones'"),
        ({"rnn_units": 0}, "parameter 'rnn_units'"),
    ],
)
def test_bad_parameters_are_refused_by_name(args, message):
    with pytest.raises(ConfigError, match=message):
        resolve({"workload": "dcrnn", **args})


def test_a_bad_set_fails_the_cli_before_a_record(tmp_path, capsys, monkeypatch):
    ids, adj = small_graph(5)
    write_set(tmp_path / "data" / "metr-la", np.full((200, 5), 50.0), ids, adj, h5="metr-la.h5")
    rc, _, err = cli_in_process(
        capsys,
        monkeypatch,
        "--workload",
        "dcrnn",
        "--dataset",
        "metr-la",
        "--data_dir",
        tmp_path / "data",
        "--results_dir",
        tmp_path / "runs",
    )
    assert rc == 2
    assert "metr-la.h5: shape (200, 5), but metr-la is (34272, 207)" in err
    assert not (tmp_path / "runs").exists()
    (tmp_path / "data" / "metr-la" / "adj_mx.pkl").unlink()
    rc, _, err = cli_in_process(
        capsys,
        monkeypatch,
        "--workload",
        "dcrnn",
        "--dataset",
        "metr-la",
        "--data_dir",
        tmp_path / "data",
        "--results_dir",
        tmp_path / "runs",
    )
    assert rc == 2 and "adj_mx.pkl, which is missing; run `lab fetch metr-la --from DIR" in err


@pytest.mark.integration
def test_fetch_from_a_directory_verifies_records_checksums_and_trains(tmp_path):
    ids = [str(773869 + k) for k in range(207)]
    rng = np.random.default_rng(2)
    adj = np.where(rng.random((207, 207)) < 0.04, rng.uniform(0.1, 1, (207, 207)), 0).astype(np.float32)
    np.fill_diagonal(adj, 1.0)
    src = tmp_path / "download"
    write_set(src, rng.uniform(0, 70, (34272, 207)), ids, adj, h5="metr-la.h5")
    p = subprocess.run(
        [sys.executable, "-m", "kernels.data.fetch", "metr-la", "--from", src, "--root", tmp_path / "data"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    assert "metr-la ready and verified" in p.stdout
    sums = json.loads((tmp_path / "data" / "metr-la" / "SHA256SUMS.json").read_text())
    assert {os.path.basename(k) for k in sums} == {"metr-la.h5", "adj_mx.pkl"}
    from kernels.data import check_dataset

    check_dataset("metr-la", tmp_path / "data")  # what every run checks before it starts
    p = run_cli(
        "--workload",
        "dcrnn",
        "--dataset",
        "metr-la",
        "--data_dir",
        tmp_path / "data",
        "--results_dir",
        tmp_path / "runs",
        "--run_id",
        "metr",
        "--rnn_units",
        "4",
        "--batch",
        "16",
        "--epochs",
        "1",
        "--train_samples",
        "32",
        "--test_samples",
        "16",
        "--log_every",
        "0",
        "--gpus",
        "2",
        "--gp",
        "2",
        "--comm_probe_steps",
        "0",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads((tmp_path / "runs" / "metr" / "summary.json").read_text())
    assert s["status"] == "complete" and s["workload"]["dataset_shape"] == [34272, 207]
    (tmp_path / "data" / "metr-la" / "adj_mx.pkl").write_bytes(py2_pickle(ids[:-1] + ["999"], adj))
    with pytest.raises(ConfigError, match="sensor ids do not match"):
        check_dataset("metr-la", tmp_path / "data")


def test_fetch_that_cannot_finish_starts_no_download_and_makes_no_folder(tmp_path):
    """`lab fetch metr-la --from DIR` with a folder that lacks metr-la.h5 (which needs a browser) first downloaded
    adj_mx.pkl over the network (offline: its error told the user to pass the --from they had passed); it now
    names the missing file before any copy or download, and leaves no folder behind."""
    from kernels.base.errors import ConfigError
    from kernels.data import traffic

    (tmp_path / "given").mkdir()
    with pytest.raises(ConfigError, match=r"^metr-la: metr-la.h5 is missing \(not in .*given\) and has no download"):
        traffic.fetch("metr-la", tmp_path / "data", from_dir=tmp_path / "given")
    assert not (tmp_path / "data").exists()
