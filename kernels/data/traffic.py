"""Traffic sensor graphs for DCRNN: the real METR-LA / PEMS-BAY formats, windows, splits, a generator.

Formats, as distributed with the original implementation (liyaguang/DCRNN):
- speeds: a pandas HDF5 file (PyTables), one DataFrame, rows 5-minute timestamps,
  columns sensor ids, values in mph, 0 = missing reading. metr-la.h5 under key `df`
  (34,272 x 207), pems-bay.h5 under key `speed` (52,116 x 325);
- graph: adj_mx.pkl / adj_mx_bay.pkl, a Python-2 pickle (read with encoding='latin1') of
  [sensor_ids, sensor_id_to_ind, adj_mx], adj_mx a float32 N x N weighted adjacency;
- the graph is built from a distances CSV (from,to,distance rows; with the header from,to,cost
  of distances_la_2012.csv, or none as distances_bay_2017.csv) and the sensor id list by
  `build_adjacency` (the original gen_adj_mx: distances start at inf, sigma = std of every
  finite entry, W = exp(-(d / sigma)^2), entries < 0.1 set to 0, no symmetrisation):

    python -m kernels.data.traffic adjacency --distances CSV --sensor-ids FILE --out PKL
    python -m kernels.data.traffic generate --shape metr-la [--root data]   # the synthetic set
    python -m kernels.data.traffic info metr-la                             # what a set holds

Windows, as the original generate_training_data.py: inputs at offsets -11..0, targets at
1..12, channels speed and time of day in [0, 1); S = T - 23 windows, split 70/10/20 in time
order (test = round(0.2 S), train = round(0.7 S), validation the rest); one scalar mean and
standard deviation of the speed channel of the training input windows (zeros included, each
time step weighted by the number of windows it appears in, as the original's
x_train[..., 0].mean()) normalise channel 0 only.

The synthetic set (`dataset=synthetic` for DCRNN) is written in the same two formats: a
road-like directed graph (highways of sensors in both directions, ramps between them), a
daily and weekly rhythm of congestion, incidents whose congestion diffuses upstream along the
edges, sensor noise and missing readings (outages and dropped samples, stored as 0).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kernels.base import files, safe_pickle
from kernels.data.download import sha256sum
from kernels.base.errors import ConfigError, exit_status
from kernels.base.files import PROJECT_ROOT
from kernels.base.sysinfo import short_of_room

SEQ_LEN = HORIZON = 12
STEP_MIN = 5
WEEK = 7 * 24 * 60 // STEP_MIN  # 2016 five-minute slots


@dataclass(frozen=True)
class TrafficSet:
    name: str
    directory: str
    h5: str
    key: str
    pkl: str
    shape: tuple[int, int]  # (time steps, sensors) as distributed
    title: str
    urls: dict  # file -> URL where one is reachable without a login


SETS = {
    "metr-la": TrafficSet(
        "metr-la",
        "metr-la",
        "metr-la.h5",
        "df",
        "adj_mx.pkl",
        (34272, 207),
        "METR-LA (207 loop detectors, Los Angeles highways, March-June 2012)",
        {"adj_mx.pkl": "https://raw.githubusercontent.com/liyaguang/DCRNN/master/data/sensor_graph/adj_mx.pkl"},
    ),
    "pems-bay": TrafficSet(
        "pems-bay",
        "pems-bay",
        "pems-bay.h5",
        "speed",
        "adj_mx_bay.pkl",
        (52116, 325),
        "PEMS-BAY (325 sensors, Bay Area, January-May 2017)",
        {"adj_mx_bay.pkl": "https://raw.githubusercontent.com/liyaguang/DCRNN/master/data/sensor_graph/adj_mx_bay.pkl"},
    ),
}
H5_SOURCE = (
    "the original DCRNN repository's data links (github.com/liyaguang/DCRNN, README 'Data Preparation': "
    "Google Drive or Baidu Yun, which need a browser)"
)

# the synthetic set's shapes: (time steps, sensors). The large one is PeMS-like (~11,000 sensors,
# four weeks) for graph-parallel scaling runs.
SYNTHETIC_SHAPES = {"metr-la": (34272, 207), "pems-bay": (52116, 325), "large": (8064, 11160)}


# ------------------------------------------------------------------ readers
def read_speeds(path: Path, key: str):
    """(speeds float32 (T, N), timestamps DatetimeIndex, sensor ids as str) from a pandas HDF5 file."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file")
    refused: list[str] = []  # what PyTables was refused while reading (it hides the error for attributes)
    try:
        with safe_pickle.guarded_pytables() as refused, pd.HDFStore(path, mode="r") as store:
            keys = [k.lstrip("/") for k in store.keys()]
            if key not in keys:
                raise ConfigError(
                    f"{path}: no table under key '{key}' (it holds {', '.join(keys) or 'none'}); "
                    f"metr-la.h5 keeps its speeds under 'df', pems-bay.h5 under 'speed'"
                )
            _refuse_object_nodes(path, store.get_node(key))
            df = store[key]
    except ConfigError:
        raise
    except Exception as e:  # not HDF5, or not a pandas store, or pandas choking on what was refused
        if isinstance(e, safe_pickle.RefusedPickle):
            refused.append(e.name)
        if not refused:
            raise ConfigError(f"{path}: not a pandas HDF5 file ({type(e).__name__}: {e})") from None
    if refused:
        raise ConfigError(
            f"{path}: refused: an HDF5 attribute asks for {refused[0]}, which is not data (a pickle "
            f"naming a function can run any code). A speeds file holds numbers, sensor ids and "
            f"timestamps only; fetch the original again"
        )
    if not isinstance(df, pd.DataFrame) or df.ndim != 2 or df.shape[0] < 2 or df.shape[1] < 1:
        raise ConfigError(f"{path}: key '{key}' is not a (time x sensors) table")
    if not isinstance(df.index, pd.DatetimeIndex):
        raise ConfigError(f"{path}: the rows must be timestamps (a DatetimeIndex), got {type(df.index).__name__}")
    values = df.to_numpy(dtype=np.float32)
    if not np.isfinite(values).all():
        raise ConfigError(
            f"{path}: {int((~np.isfinite(values)).sum())} values are NaN or infinite; missing "
            f"readings are stored as 0 in this format"
        )
    return values, df.index, [str(c) for c in df.columns]


def _refuse_object_nodes(path: Path, group) -> None:
    """An object-typed array (a pickle per row, which PyTables would unpickle as it reads) under the key, named
    before anything under it is read."""
    for node in group._f_walknodes("Leaf"):
        atom, dtype = getattr(node, "atom", None), getattr(node, "dtype", None)
        if (atom is not None and atom.kind == "object") or (dtype is not None and dtype.kind == "O"):
            raise ConfigError(
                f"{path}: refused: {node._v_pathname} is an object-typed array (pickled Python "
                f"objects, which could run code when read); a speeds file holds numbers, sensor ids "
                f"and timestamps only"
            )


def read_adjacency(path: Path):
    """(sensor_ids list[str], sensor_id_to_ind dict, adj float32 N x N) from an adj_mx pickle."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file")
    try:
        with open(path, "rb") as f:
            obj = safe_pickle.load(f, encoding="latin1")  # Python-2 pickles keep str as bytes
    except safe_pickle.RefusedPickle as e:
        raise ConfigError(
            f"{path}: refused: {e}. adj_mx.pkl holds [sensor_ids, sensor_id_to_ind, adj_mx] and "
            f"nothing else; fetch the original again"
        ) from None
    except Exception as e:
        raise ConfigError(
            f"{path}: not a readable pickle ({type(e).__name__}: {e}); a file converted to CRLF "
            f"line endings is damaged (keep *.pkl binary)"
        ) from None
    if not isinstance(obj, (list, tuple)) or len(obj) != 3:
        raise ConfigError(
            f"{path}: expected the triple [sensor_ids, sensor_id_to_ind, adj_mx], "
            f"got {type(obj).__name__}" + (f" of length {len(obj)}" if hasattr(obj, "__len__") else "")
        )
    ids, to_ind, adj = obj
    ids = [_as_str(i) for i in ids]
    if not isinstance(to_ind, dict):
        raise ConfigError(f"{path}: the second element must be the dict sensor_id_to_ind, got {type(to_ind).__name__}")
    to_ind = {_as_str(k): int(v) for k, v in to_ind.items()}
    adj = np.asarray(adj)
    if adj.ndim != 2 or adj.shape[0] != adj.shape[1]:
        raise ConfigError(f"{path}: adj_mx must be square, got shape {adj.shape}")
    if adj.shape[0] != len(ids):
        raise ConfigError(f"{path}: adj_mx is {adj.shape[0]} x {adj.shape[1]} but there are {len(ids)} sensor ids")
    if not np.isfinite(adj).all() or (adj < 0).any():
        raise ConfigError(f"{path}: adj_mx has negative or non-finite weights; weights are exp(-(d/sigma)^2) in [0, 1]")
    bad = [i for n, i in enumerate(ids) if to_ind.get(i) != n]
    if bad:
        raise ConfigError(f"{path}: sensor_id_to_ind disagrees with the order of sensor_ids (first: {bad[0]})")
    return ids, to_ind, adj.astype(np.float32)


def _as_str(v) -> str:
    return v.decode("latin1") if isinstance(v, bytes) else str(v)


def write_adjacency(path: Path, ids: list[str], adj: np.ndarray) -> None:
    """The original's layout: pickle protocol 2 of [sensor_ids, sensor_id_to_ind, adj_mx float32]."""
    _atomic(
        Path(path),
        lambda f: pickle.dump([list(ids), {s: i for i, s in enumerate(ids)}, adj.astype(np.float32)], f, protocol=2),
    )


def write_speeds(path: Path, key: str, values: np.ndarray, start: str, ids: list[str]) -> None:
    import pandas as pd

    index = pd.date_range(start, periods=values.shape[0], freq=f"{STEP_MIN}min")
    df = pd.DataFrame(values, index=index, columns=list(ids))
    with files.replacing(Path(path)) as tmp:
        df.to_hdf(tmp, key=key, mode="w")  # fixed format, as the distributed files


def _atomic(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with files.create(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)


# ---------------------------------------------------------- the graph builder
def read_sensor_ids(path: Path) -> list[str]:
    """Sensor ids one per line or comma-separated (graph_sensor_ids.txt is one comma-separated line)."""
    text = Path(path).read_text()
    ids = [t.strip() for t in text.replace("\n", ",").split(",") if t.strip()]
    if not ids:
        raise ConfigError(f"--sensor-ids: {path} holds no ids")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"--sensor-ids: {path} lists an id twice")
    return ids


def build_adjacency(distances, sensor_ids: list[str], normalized_k: float = 0.1) -> np.ndarray:
    """The original gen_adj_mx: W = exp(-(d / sigma)^2) over the listed pairs, < normalized_k -> 0.

    distances: rows (from, to, distance); pairs naming an id not in sensor_ids are skipped.
    sigma is the standard deviation of every finite entry of the distance matrix (the
    self-distances 0 of the CSV included); no symmetrisation.
    """
    n = len(sensor_ids)
    index = {s: i for i, s in enumerate(sensor_ids)}
    dist = np.full((n, n), np.inf, dtype=np.float32)
    for a, b, d in distances:
        a, b = str(a), str(b)
        if a in index and b in index:
            dist[index[a], index[b]] = d
    finite = dist[~np.isinf(dist)].flatten()
    if finite.size == 0:
        raise ConfigError("--distances: no pair of listed sensor ids has a distance")
    std = finite.std()
    if std == 0:
        raise ConfigError("--distances: every distance is the same; sigma would be 0")
    adj = np.exp(-np.square(dist / std))
    adj[adj < normalized_k] = 0
    return adj.astype(np.float32)


def read_distances(path: Path) -> list[tuple[str, str, float]]:
    """Rows (from, to, distance) of a distances CSV, read as the original files are published.

    The original repository's distances_la_2012.csv starts with the header `from,to,cost`; its
    distances_bay_2017.csv has no header (its first line, `400001,400001,0.0`, is already a pair);
    the lab's synthetic sets write `from,to,distance`. The original gen_adj_mx takes the columns by
    position, so the third is the distance whatever it is called (cost, distance, or nothing).
    """
    import csv

    path = Path(path)
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r and any(c.strip() for c in r)]
    if not rows:
        raise ConfigError(f"--distances: {path} is empty; give the distances CSV (from,to,distance per line)")
    first = 1
    if not _number(rows[0][2] if len(rows[0]) > 2 else ""):  # a header line
        names = [c.strip().lower() for c in rows[0]]
        if len(names) < 3 or names[:2] != ["from", "to"] or names[2] not in ("cost", "distance", ""):
            raise ConfigError(
                f"--distances: {path} starts with {','.join(rows[0])!r}, neither a header "
                f"from,to,cost / from,to,distance nor a pair of sensor ids and a distance"
            )
        rows, first = rows[1:], 2
    out = []
    for line, r in enumerate(rows, start=first):
        if len(r) < 3 or not _number(r[2]):
            raise ConfigError(f"--distances: {path} line {line}: expected from,to,distance, got {','.join(r)!r}")
        out.append((r[0].strip(), r[1].strip(), float(r[2])))
    return out


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- the data set
@dataclass
class Series:
    """A traffic data set read and checked: speeds, time of day, graph, windows and the scaler."""

    name: str
    speeds: np.ndarray  # float32 (T, N), mph, 0 = missing
    time_of_day: np.ndarray  # float32 (T,), in [0, 1)
    slot_of_week: np.ndarray  # int64 (T,), five-minute slot of the week
    sensor_ids: list
    adj: np.ndarray  # float32 (N, N)
    files: dict  # file -> size, for the record

    @property
    def num_steps(self) -> int:
        return self.speeds.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.speeds.shape[1]

    @property
    def num_windows(self) -> int:
        return self.num_steps - SEQ_LEN - HORIZON + 1

    def splits(self) -> dict[str, range]:
        """Window start indices of train / val / test, in time order (the original's rounding)."""
        s = self.num_windows
        test, train = round(s * 0.2), round(s * 0.7)
        val = s - test - train
        return {"train": range(0, train), "val": range(train, train + val), "test": range(s - test, s)}

    def scaler(self) -> tuple[float, float]:
        """Mean and std of channel 0 over the training input windows (each step weighted by its windows)."""
        train = len(self.splits()["train"])
        w = np.zeros(self.num_steps, dtype=np.float64)  # how many training windows hold input step t
        cover = np.convolve(np.ones(train), np.ones(SEQ_LEN))  # steps 0 .. train + 10
        w[: cover.size] = cover
        x = self.speeds.astype(np.float64)
        wsum = w.sum()
        mean = float((w @ x.sum(1)) / (wsum * self.num_nodes))
        var = float((w @ np.square(x - mean).sum(1)) / (wsum * self.num_nodes))
        return mean, float(np.sqrt(var))

    def historical_average(self) -> np.ndarray:
        """The historical-average forecast of every step: the mean non-missing reading of the same sensor at the
        same five-minute slot of the week over the rows that training windows cover (the sensor's overall mean
        where a slot has none). One forecast per step, whatever the horizon."""
        last = len(self.splits()["train"]) + SEQ_LEN + HORIZON - 1  # rows 0 .. last-1 belong to training windows
        x, slots = self.speeds[:last].astype(np.float64), self.slot_of_week[:last]
        seen = x != 0
        sums = np.zeros((WEEK, self.num_nodes))
        counts = np.zeros((WEEK, self.num_nodes))
        np.add.at(sums, slots, x)
        np.add.at(counts, slots, seen)
        overall = x.sum(0) / np.maximum(seen.sum(0), 1)
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), overall[None, :])
        return mean[self.slot_of_week].astype(np.float32)

    def inputs(self, mean: float, std: float) -> np.ndarray:
        """(T, N, 2) float32: normalised speed, time of day."""
        out = np.empty((self.num_steps, self.num_nodes, 2), dtype=np.float32)
        out[..., 0] = (self.speeds - mean) / std
        out[..., 1] = self.time_of_day[:, None]
        return out


def directory(name: str, root: Path, synthetic_shape: str = "metr-la") -> Path:
    if name == "synthetic":
        return Path(root) / f"traffic-synthetic-{synthetic_shape}"
    return Path(root) / SETS[name].directory


def files_of(name: str, root: Path, synthetic_shape: str = "metr-la") -> tuple[Path, str, Path]:
    """(h5 path, key, pickle path) of a set."""
    d = directory(name, root, synthetic_shape)
    if name == "synthetic":
        return d / "speeds.h5", "df", d / "adj_mx.pkl"
    s = SETS[name]
    return d / s.h5, s.key, d / s.pkl


def missing_hint(name: str, root: Path, synthetic_shape: str) -> str:
    if name == "synthetic":
        return f"python -m kernels.data.traffic generate --shape {synthetic_shape} --root {root}"
    return f"lab fetch {name} --from DIR (a directory holding {SETS[name].h5} and {SETS[name].pkl})"


def load(name: str, root: Path, synthetic_shape: str = "metr-la") -> Series:
    """Read and check a set; any disagreement is a ConfigError naming the file."""
    import pandas as pd

    h5, key, pkl = files_of(name, root, synthetic_shape)
    for f in (h5, pkl):
        if not f.exists():
            raise ConfigError(
                f"parameter 'dataset': {name} needs {f}, which is missing; run "
                f"`{missing_hint(name, root, synthetic_shape)}`"
            )
    speeds, index, columns = read_speeds(h5, key)
    ids, _, adj = read_adjacency(pkl)
    if speeds.shape[1] != len(ids):
        raise ConfigError(
            f"{h5}: {speeds.shape[1]} sensor columns but the graph {pkl} has {len(ids)} sensors; "
            f"the two files must describe the same sensors"
        )
    if columns != ids:
        diff = next(i for i, (a, b) in enumerate(zip(columns, ids)) if a != b)
        raise ConfigError(
            f"{h5}: sensor ids do not match {pkl} (column {diff} is '{columns[diff]}', the graph says "
            f"'{ids[diff]}'); the columns must be the graph's sensors in the graph's order"
        )
    if name in SETS and speeds.shape != SETS[name].shape:
        raise ConfigError(
            f"{h5}: shape {speeds.shape}, but {name} is {SETS[name].shape} as distributed; is it the right file?"
        )
    if speeds.shape[0] < 2 * (SEQ_LEN + HORIZON) + 10:
        raise ConfigError(f"{h5}: {speeds.shape[0]} time steps are too few for windows of {SEQ_LEN}+{HORIZON}")
    if (speeds < 0).any():
        raise ConfigError(f"{h5}: negative speeds; 0 marks a missing reading")
    step = np.diff(index.values).astype("timedelta64[s]").astype(np.int64)
    if not (step == STEP_MIN * 60).all():
        raise ConfigError(
            f"{h5}: rows must be consecutive {STEP_MIN}-minute timestamps "
            f"({int((step != STEP_MIN * 60).sum())} gaps or repeats)"
        )
    day = (index.values - index.values.astype("datetime64[D]")) / np.timedelta64(1, "D")
    minutes = (index.day_of_week.values * 24 + index.hour.values) * 60 + index.minute.values
    del pd
    return Series(
        name,
        speeds,
        day.astype(np.float32),
        (minutes // STEP_MIN).astype(np.int64),
        ids,
        adj,
        {str(h5): h5.stat().st_size, str(pkl): pkl.stat().st_size},
    )


def check(name: str, root: Path, synthetic_shape: str = "metr-la") -> None:
    load(name, root, synthetic_shape)


# -------------------------------------------------------------- fetch (real sets)
def fetch(name: str, root: Path, from_dir: Path | None = None, force: bool = False) -> Path:
    """Copy METR-LA / PEMS-BAY from a directory, or download the graph where it is reachable; verify both."""

    from kernels.data.download import download

    spec = SETS[name]
    d = directory(name, root)
    where = f" (not in {from_dir})" if from_dir is not None else ""
    wanted = [f for f in (spec.pkl, spec.h5) if force or not (d / f).exists()]
    given = [f for f in wanted if from_dir is not None and (Path(from_dir) / f).exists()]
    for fname in wanted:  # before any copy or download: a fetch that cannot finish starts nothing
        if fname not in given and fname not in spec.urls:
            raise ConfigError(
                f"{name}: {fname} is missing{where} and has no download that works without a browser; "
                f"get it from {H5_SOURCE} and run `lab fetch {name} --from DIR`"
            )
    d.mkdir(parents=True, exist_ok=True)
    for fname in wanted:
        if fname in given:
            files.copy_file(Path(from_dir) / fname, d / fname, "--root")
        else:
            download(
                spec.urls[fname],
                d / fname,
                f"{name} {fname}",
                f"copy {fname} from the DCRNN repository into {from_dir or 'a directory'} and pass --from DIR",
            )
    series = load(name, root)
    manifest = {f: {"bytes": Path(f).stat().st_size, "sha256": sha256sum(Path(f))} for f in series.files}
    files.atomic_write_text(d / "SHA256SUMS.json", json.dumps(manifest, indent=1) + "\n", "--root")
    return d


# ---------------------------------------------------------------- the generator
def road_graph(n: int, rng: np.random.Generator):
    """Highways of sensors in both directions with ramps between them.

    Returns (sensor ids, positions (n, 2) in miles, directed road links [(a, b, miles)]): a link a -> b means
    traffic flows from sensor a to sensor b.
    """
    per_road = 25
    roads = max(1, n // (2 * per_road))
    links, pos = [], np.zeros((n, 2))
    node = 0
    lanes = []  # list of node-index lists, each a directed chain
    for r in range(roads):
        if node >= n:
            break
        horizontal = r % 2 == 0
        offset = rng.uniform(0, 30)
        length = min(per_road, (n - node) // 2) if r < roads - 1 else (n - node) // 2
        if length < 2:
            break
        gaps = rng.uniform(0.3, 1.2, length)
        along = np.cumsum(gaps) + rng.uniform(0, 5)
        for direction in (0, 1):
            chain = list(range(node, node + length))
            for i, k in enumerate(chain):
                a = along[i] if direction == 0 else along[::-1][i]
                xy = (a, offset + 0.02 * direction) if horizontal else (offset + 0.02 * direction, a)
                pos[k] = xy
            for i in range(length - 1):
                links.append(
                    (
                        chain[i],
                        chain[i + 1],
                        float(
                            abs(along[i + 1] - along[i]) if direction == 0 else abs(along[::-1][i + 1] - along[::-1][i])
                        ),
                    )
                )
            lanes.append(chain)
            node += length
    for k in range(node, n):  # leftovers: a short connector road
        pos[k] = rng.uniform(0, 30, 2)
        if k > node:
            links.append((k - 1, k, float(np.linalg.norm(pos[k] - pos[k - 1]))))
    # ramps: where two roads pass near each other, link the nearest sensors both ways
    chains = [c for c in lanes]
    for i in range(len(chains)):
        for j in range(i + 1, len(chains)):
            a, b = np.array(chains[i]), np.array(chains[j])
            d = np.linalg.norm(pos[a][:, None, :] - pos[b][None, :, :], axis=2)
            if d.min() < 1.5 and not (len(a) == len(b) and abs(a[0] - b[0]) == len(a)):
                x, y = np.unravel_index(int(d.argmin()), d.shape)
                links.append((int(a[x]), int(b[y]), float(max(d[x, y], 0.1))))
                links.append((int(b[y]), int(a[x]), float(max(d[x, y], 0.1))))
    # an interchange in the middle of each road joins its two directions
    for c0, c1 in zip(chains[0::2], chains[1::2]):
        a, b = c0[len(c0) // 2], c1[len(c1) - 1 - len(c0) // 2]
        links += [(a, b, 0.1), (b, a, 0.1)]
    # roads that never come near each other: a connector from each stray component to the nearest other sensor
    parent = list(range(n))

    def root(u: int) -> int:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    for a, b, _ in links:
        parent[root(a)] = root(b)
    while len({root(k) for k in range(n)}) > 1:
        comp = np.array([root(k) for k in range(n)])
        first, rest = np.flatnonzero(comp == comp[0]), np.flatnonzero(comp != comp[0])
        d = np.linalg.norm(pos[first][:, None, :] - pos[rest][None, :, :], axis=2)
        x, y = np.unravel_index(int(d.argmin()), d.shape)
        a, b = int(first[x]), int(rest[y])
        links += [(a, b, float(max(d[x, y], 0.1))), (b, a, float(max(d[x, y], 0.1)))]
        parent[root(a)] = root(b)
    ids = [str(700000 + 37 * k) for k in range(n)]
    return ids, pos, links


def road_distances(n: int, links, max_hops: int = 3) -> list[tuple[int, int, float]]:
    """Road distances from each sensor to those reachable within max_hops downstream, and 0 to itself (as the
    distributed distances CSV lists each sensor's distance to itself)."""
    out_links: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for a, b, d in links:
        out_links[a].append((b, d))
    rows = []
    for s in range(n):
        best = {s: 0.0}
        frontier = [(s, 0.0)]
        for _ in range(max_hops):
            nxt = []
            for u, du in frontier:
                for v, d in out_links[u]:
                    if du + d < best.get(v, np.inf):
                        best[v] = du + d
                        nxt.append((v, du + d))
            frontier = nxt
        rows += [(s, v, d) for v, d in best.items()]
    return rows


def generate(shape: str, root: Path, seed: int = 0, force: bool = False, progress=print) -> Path:
    """Write the synthetic set of `shape` (metr-la, pems-bay or large) into <root>/traffic-synthetic-<shape>/:
    speeds.h5 (key df), adj_mx.pkl, distances.csv and graph_sensor_ids.txt. Deterministic from `seed`."""
    if shape not in SYNTHETIC_SHAPES:
        raise ConfigError(f"parameter 'synthetic_shape': unknown shape '{shape}'; choose {', '.join(SYNTHETIC_SHAPES)}")
    d = directory("synthetic", root, shape)
    h5, _, pkl = files_of("synthetic", root, shape)
    if (d / "GENERATED.json").exists() and h5.exists() and pkl.exists() and not force:
        return d
    t_steps, n = SYNTHETIC_SHAPES[shape]
    return write_synthetic(d, t_steps, n, seed, float32=shape == "large", progress=progress, label=shape)


def write_synthetic(
    d: Path, t_steps: int, n: int, seed: int = 0, float32: bool = False, progress=print, label: str = ""
) -> Path:
    """Generate a synthetic set of t_steps x n into directory d (speeds.h5, adj_mx.pkl, distances.csv,
    graph_sensor_ids.txt, GENERATED.json). Any size: the tests write small ones."""
    import scipy.sparse as sp

    label = label or f"{t_steps}x{n}"
    d = Path(d)
    h5, pkl, done = d / "speeds.h5", d / "adj_mx.pkl", d / "GENERATED.json"
    short = short_of_room(d, t_steps * n * (4 if float32 else 8) + (n * n * 4) + (64 << 20))
    if short:
        _, has, needs = short
        raise ConfigError(
            f"--root: {d} has {has} free, the {label} set needs about {needs} (the speeds as "
            f"{'float32' if float32 else 'float64'}, the adjacency and 64 MiB of working room); free "
            f"space there or choose another --root"
        )
    why = files.cannot_write(d)  # before minutes of generation, not after
    if why:
        raise ConfigError(
            f"--root: cannot write the {label} set in {d} ({why}); pass a data root you can write (data_dir= for a run)"
        )
    shape = label
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    ids, pos, links = road_graph(n, rng)
    dist_rows = road_distances(n, links)
    adj = build_adjacency([(ids[a], ids[b], dv) for a, b, dv in dist_rows], ids)
    progress(
        f"synthetic {shape}: graph of {n} sensors, {len(links)} road links, "
        f"{int((adj > 0).sum()) - n} weighted edges ({time.perf_counter() - t0:.1f} s)"
    )

    # Speed = free flow - the daily and weekly rhythm of congestion - incidents + sensor noise (mph). An
    # incident's congestion spills upstream along the road links and decays (half-life about 1.5 h):
    # inc_t = 0.96 * (0.6 inc_{t-1} + 0.4 P inc_{t-1}) + shocks_t, P the row-normalised reverse road graph.
    w = sp.csr_matrix(adj.T - np.diag(np.diag(adj)))
    rowsum = np.asarray(w.sum(1)).ravel()
    p = sp.diags(1.0 / np.maximum(rowsum, 1e-9)) @ w
    free_flow = rng.uniform(58, 70, n)
    peak_am, peak_pm = rng.uniform(0.2, 1.0, n), rng.uniform(0.4, 1.2, n)
    start = np.datetime64("2012-03-01T00:00")
    minutes = (np.arange(t_steps) * STEP_MIN) % (24 * 60)
    weekday = ((np.arange(t_steps) * STEP_MIN) // (24 * 60) + 3) % 7  # 2012-03-01 is a Thursday (dayofweek 3)
    scale = 25.0 * (0.35 + 0.65 * (weekday < 5))
    am = np.exp(-0.5 * ((minutes - 8 * 60) / 50.0) ** 2)
    pm = np.exp(-0.5 * ((minutes - 17.5 * 60) / 70.0) ** 2)
    ar, inc = np.zeros(n), np.zeros(n)
    speeds = np.empty((t_steps, n), dtype=np.float32 if float32 else np.float64)
    # how heavy each day's rush hours are, per sensor (weather, events): recent readings reveal it, the
    # historical average cannot
    days = t_steps // 288 + 1
    day_scale = rng.uniform(0.6, 1.4, days)[:, None] * rng.uniform(0.85, 1.15, (days, n))
    shocks = rng.random(t_steps) < min(0.9, 0.02 * n / 207)  # about six incidents a day per 207 sensors
    report = max(1, t_steps // 10)
    for t in range(t_steps):
        inc = 0.96 * (0.6 * inc + 0.4 * (p @ inc))
        if shocks[t]:
            inc[int(rng.integers(n))] += rng.uniform(15, 35)
        ar = 0.9 * ar + rng.normal(0, 1.2, n)
        v = free_flow - scale[t] * day_scale[t // 288] * (peak_am * am[t] + peak_pm * pm[t]) - inc + ar
        speeds[t] = np.clip(v, 3.0, 80.0)
        if (t + 1) % report == 0:
            progress(f"synthetic {shape}: {t + 1:,}/{t_steps:,} steps ({time.perf_counter() - t0:.1f} s)")
    # missing readings: sensor outages of 1 to 12 hours and single dropped samples, stored as 0 (METR-LA: ~8 %)
    outages = rng.random((t_steps // 288 + 1, n)) < 0.2
    for day, k in zip(*np.nonzero(outages)):
        s = day * 288 + int(rng.integers(288))
        speeds[s : s + int(rng.integers(12, 145)), k] = 0
    speeds[rng.random(speeds.shape) < 0.01] = 0

    d.mkdir(parents=True, exist_ok=True)
    write_speeds(h5, "df", speeds, str(start), ids)
    write_adjacency(pkl, ids, adj)
    files.atomic_write_text(d / "graph_sensor_ids.txt", ",".join(ids))
    rows = (f"{ids[a]},{ids[b]},{dv * 1609.34:.1f}\n" for a, b, dv in dist_rows)  # metres, as the CSV
    files.atomic_write_text(d / "distances.csv", "from,to,distance\n" + "".join(rows))
    files.atomic_write_text(
        done,
        json.dumps(
            {
                "shape": label,
                "seed": seed,
                "time_steps": t_steps,
                "sensors": n,
                "missing_frac": round(float((speeds == 0).mean()), 4),
                "sha256": {f.name: sha256sum(f) for f in (h5, pkl)},
            },
            indent=1,
        )
        + "\n",
    )
    progress(
        f"synthetic {shape}: {t_steps:,} x {n} written to {d} ({time.perf_counter() - t0:.1f} s, "
        f"{100 * float((speeds == 0).mean()):.1f} % missing)"
    )
    return d


# --------------------------------------------------------------------- the CLI
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.data.traffic", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("adjacency", help="build adj_mx.pkl from a distances CSV and the sensor ids (gen_adj_mx)")
    a.add_argument(
        "--distances",
        type=Path,
        required=True,
        help="CSV of from,to,distance rows, as published (header from,to,cost or from,to,distance, or none)",
    )
    a.add_argument("--sensor-ids", type=Path, required=True, help="sensor ids, one per line or comma-separated")
    a.add_argument("--normalized-k", type=float, default=0.1, help="weights below this become 0 (default 0.1)")
    a.add_argument("--out", type=Path, required=True, help="the pickle to write")
    g = sub.add_parser("generate", help="write the synthetic set in the METR-LA formats")
    g.add_argument("--shape", default="metr-la", choices=list(SYNTHETIC_SHAPES))
    g.add_argument("--root", type=Path, default=PROJECT_ROOT / "data")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--force", action="store_true", help="generate again even if present")
    i = sub.add_parser("info", help="read, check and describe a set")
    i.add_argument("dataset", choices=["synthetic", *SETS])
    i.add_argument("--shape", default="metr-la", choices=list(SYNTHETIC_SHAPES), help="synthetic: which shape")
    i.add_argument("--root", type=Path, default=PROJECT_ROOT / "data")
    args = p.parse_args(argv)

    def body() -> None:
        if args.cmd == "adjacency":
            ids = read_sensor_ids(args.sensor_ids)
            if not args.distances.exists():
                raise ConfigError(f"--distances: {args.distances}: no such file")
            adj = build_adjacency(read_distances(args.distances), ids, args.normalized_k)
            write_adjacency(args.out, ids, adj)
            print(f"{args.out}: {len(ids)} sensors, {int((adj > 0).sum())} non-zero weights")
        elif args.cmd == "generate":
            print(generate(args.shape, args.root, args.seed, args.force))
        else:
            s = load(args.dataset, args.root, args.shape)
            sp_ = {k: len(v) for k, v in s.splits().items()}
            mean, std = s.scaler()
            print(
                f"{args.dataset}: {s.num_steps:,} steps x {s.num_nodes} sensors, "
                f"{100 * float((s.speeds == 0).mean()):.2f} % missing, {int((s.adj > 0).sum())} non-zero weights; "
                f"{s.num_windows:,} windows (train {sp_['train']:,}, val {sp_['val']:,}, test {sp_['test']:,}); "
                f"speed mean {mean:.3f} std {std:.3f}"
            )

    return exit_status(body)


if __name__ == "__main__":
    sys.exit(main())
