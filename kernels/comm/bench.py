"""Collective microbenchmarks in the layout of nccl-tests, over torch.distributed (nccl, gloo) or MPI (mpi4py).

    python -m kernels.comm bench --backend gloo --gpus 4 --ops all_reduce,all_gather --max_bytes 64M
    sbatch slurm/papermill_run.sbatch notebooks/03_commbench.ipynb -p backend gloo -p gpus 4

For every collective and dtype, sizes go from min_bytes to max_bytes by `factor` (nccl-tests'
-b/-e/-f); each size runs once and is checked element by element (#wrong), then warms up and
is timed over `iters` back-to-back calls, `repeats` times, out of place and in place where the
API has the form. On MPI the loop runs inside C (kernels/comm/mpi_loop.c, built with mpicc on first
use: kernels/comm/native.py), as nccl-tests and OSU time theirs; the record's `timed_by` says which
loop timed (a Python loop where mpicc is missing or LAB_MPI_LOOP=python). A loop's time is the mean
over ranks of each rank's average per call (min and max over ranks are kept, as OSU's -f prints
them); the table reports the loop with the median time and the CSV also keeps the fastest and slowest loop
(time_us_lo/hi), since shared machines
are noisy. Every run leaves a record in
results/comm/<id>/: config.json (parameters, ranks, hosts, devices, versions), results.csv
(one row per collective, dtype and size), summary.json (status, average bus bandwidth,
unsupported forms), commbench.txt (the nccl-tests table) and osu.txt (OSU-style latency).

Launchers: local (rank processes here; torch backends), mpirun (MPI, here or over the Slurm
allocation it runs in), srun (inside a Slurm allocation; MPI through srun --mpi=$LAB_SRUN_MPI,
default pmix), none (this process is one rank: under torchrun, srun or mpirun). auto picks none
inside a rank's environment, mpirun for MPI, srun inside an allocation, and local otherwise.
"""

from __future__ import annotations

import csv
import io
import os
import secrets
import shlex
import socket
import sys
import traceback
from datetime import datetime, timezone
from pathlib import Path

from kernels.base import files, sysinfo
from kernels.records import schema as records
from kernels.comm.collectives import DTYPES, FORMS, OPS, count_wrong
from kernels.comm.mpi_library import LIBRARIES as MPI_LIBRARIES
from kernels.base.errors import ConfigError
from kernels.base.files import results_home
from kernels.base.params import Param, coerce, unknown_name_error

RECORD_ROOM = 1 << 20  # a record's files: config, tables, the OSU-style text (tens of KiB for a whole sweep)

ALL_OPS = ",".join(OPS)
PARAMS: tuple[Param, ...] = (
    Param(
        "backend",
        str,
        "auto",
        "auto (nccl when GPUs are visible, else gloo), nccl, gloo or mpi (mpi4py)",
        ("auto", "nccl", "gloo", "mpi"),
        "commbench",
    ),
    Param("gpus", int, 2, "ranks (one per GPU; CPU processes on gloo and MPI)", (), "commbench"),
    Param("ops", str, ALL_OPS, "collectives to run, comma-separated: " + ", ".join(OPS), (), "commbench"),
    Param("dtypes", str, "fp32", "element types, comma-separated: fp32, bf16, fp16 (MPI: fp32 only)", (), "commbench"),
    Param(
        "min_bytes",
        str,
        "8",
        "smallest size in bytes, K/M/G suffixes in powers of 1024 (nccl-tests -b)",
        (),
        "commbench",
    ),
    Param("max_bytes", str, "16M", "largest size in bytes (nccl-tests -e)", (), "commbench"),
    Param("factor", int, 2, "size multiplier between steps (nccl-tests -f), at least 2", (), "commbench"),
    Param("warmup", int, 5, "untimed calls per size after the checked one (nccl-tests -w)", (), "commbench"),
    Param("iters", int, 20, "timed calls per size in one timed loop (nccl-tests -n)", (), "commbench"),
    Param(
        "repeats",
        int,
        3,
        "timed loops per size; the table reports the loop with the median time (noise)",
        (),
        "commbench",
    ),
    Param("check", bool, True, "check every result element by element (#wrong; nccl-tests -c)", (), "commbench"),
    Param("root", int, 0, "root rank of broadcast, reduce, gather and scatter", (), "commbench"),
    Param(
        "timeout_min",
        float,
        5.0,
        "process-group timeout in minutes (a collective that hangs fails after this)",
        (),
        "commbench",
    ),
    Param(
        "results_dir",
        str,
        "",
        "where records go (empty: $LAB_RESULTS/comm, else <project>/results/comm)",
        (),
        "commbench",
    ),
    Param("label", str, "", "free-form label added to the record id", (), "commbench"),
    Param("run_id", str, "", "record directory name (empty: generated)", (), "commbench"),
    Param(
        "launcher",
        str,
        "auto",
        "auto, local (rank processes here), mpirun (MPI here), srun (inside an "
        "allocation) or none (this process is one rank)",
        ("auto", "local", "mpirun", "srun", "none"),
        "commbench",
    ),
    Param(
        "mpi_library",
        str,
        "auto",
        "backend=mpi: auto (the mpirun on PATH), openmpi or mpich where both are installed "
        "(kernels/comm/mpi_library.py)",
        MPI_LIBRARIES,
        "commbench",
    ),
)
BY_NAME = {p.name: p for p in PARAMS}
UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


class CommConfig:
    """Resolved benchmark parameters as attributes; `replace` re-validates."""

    def __init__(self, values: dict):
        self.__dict__["_v"] = dict(values)

    def __getattr__(self, name):
        try:
            return self.__dict__["_v"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        raise AttributeError("CommConfig is immutable; use replace()")

    def to_dict(self) -> dict:
        return dict(self._v)

    def replace(self, **changes) -> "CommConfig":
        return resolve({**self._v, **changes})

    def cli_args(self) -> list[str]:
        return [a for k, v in self._v.items() for a in (f"--{k}", str(v).lower() if isinstance(v, bool) else str(v))]

    @property
    def op_list(self) -> list[str]:
        return self.ops.split(",")

    @property
    def dtype_list(self) -> list[str]:
        return self.dtypes.split(",")

    @property
    def results_root(self) -> Path:
        return Path(self.results_dir) if self.results_dir else results_home() / "comm"

    @property
    def sizes(self) -> list[int]:
        lo, hi, out = parse_size(self.min_bytes, "min_bytes"), parse_size(self.max_bytes, "max_bytes"), []
        s = lo
        while s <= hi:
            out.append(s)
            s *= self.factor
        return out


def parse_size(text, name: str) -> int:
    t = str(text).strip().upper().removesuffix("B")
    unit = t[-1:] if t[-1:] in UNITS and t[-1:] else ""
    try:
        v = int(float(t[:-1] if unit else t) * UNITS[unit])
    except ValueError:
        raise ConfigError(f"parameter '{name}': {text!r} is not a size; give bytes such as 8, 64K, 16M or 1G") from None
    if v < 1:
        raise ConfigError(f"parameter '{name}': {text!r} is below 1 byte")
    return v


def _list(value: str, known, name: str) -> list[str]:
    items = [x.strip() for x in str(value).split(",") if x.strip()]
    if not items:
        raise ConfigError(f"parameter '{name}': empty; give one or more of {', '.join(known)}")
    for x in items:
        if x not in known:
            import difflib

            close = difflib.get_close_matches(x, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ConfigError(f"parameter '{name}': unknown {name[:-1]} '{x}'; {hint}choose from {', '.join(known)}")
    if len(set(items)) != len(items):
        raise ConfigError(f"parameter '{name}': lists a value twice ({value})")
    return items


def resolve(raw: dict) -> CommConfig:
    """Defaults + raw, typed and checked against everything that does not need the machine."""
    for k in raw:
        if k not in BY_NAME:
            raise unknown_name_error(k, where=" of the communication benchmark", known=list(BY_NAME))
    v = {}
    for p in PARAMS:
        val = coerce(p, raw[p.name]) if p.name in raw and raw[p.name] is not None else p.default
        if p.choices and val not in p.choices:
            raise ConfigError(f"parameter '{p.name}': {val!r} is not one of {', '.join(p.choices)} ({p.doc})")
        v[p.name] = val
    v["ops"] = ",".join(_list(v["ops"], list(OPS), "ops"))
    v["dtypes"] = ",".join(_list(v["dtypes"], list(DTYPES), "dtypes"))
    lo, hi = parse_size(v["min_bytes"], "min_bytes"), parse_size(v["max_bytes"], "max_bytes")
    if lo > hi:
        raise ConfigError(
            f"parameters 'min_bytes' and 'max_bytes': sizes out of order ({v['min_bytes']} > "
            f"{v['max_bytes']}); min_bytes must not exceed max_bytes"
        )
    if v["factor"] < 2:
        raise ConfigError(f"parameter 'factor': {v['factor']}; sizes grow by an integer factor of at least 2")
    if v["gpus"] < 1:
        raise ConfigError(f"parameter 'gpus': {v['gpus']}; at least 1 rank")
    if v["iters"] < 1 or v["warmup"] < 0 or v["repeats"] < 1:
        raise ConfigError("parameters 'iters', 'warmup' and 'repeats': need iters >= 1, warmup >= 0 and repeats >= 1")
    if not 0 <= v["root"] < v["gpus"]:
        raise ConfigError(f"parameter 'root': {v['root']} is not a rank of gpus={v['gpus']} (0..{v['gpus'] - 1})")
    if v["backend"] == "mpi":
        bad = [d for d in v["dtypes"].split(",") if d != "fp32"]
        if bad:
            raise ConfigError(
                f"parameter 'dtypes': MPI has no standard {bad[0]} datatype; use dtypes=fp32 with "
                f"backend=mpi (bf16/fp16 run on nccl and gloo)"
            )
    return CommConfig(v)


# ------------------------------------------------------------------ checks against this machine
def load_mpi():
    """mpi4py's MPI module without initialising MPI; a clear error when mpi4py or the MPI library is missing."""
    try:
        import mpi4py
    except ImportError:
        raise ConfigError(
            "parameter 'backend': mpi needs mpi4py (pip install mpi4py) and an MPI library "
            "(Debian: apt-get install openmpi-bin libopenmpi-dev; or the cluster's `module load` MPI)"
        ) from None
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    try:
        from mpi4py import MPI
    except (ImportError, OSError, RuntimeError) as e:  # the fix first, then mpi4py's words on one line
        why = " ".join(str(e).split())
        raise ConfigError(
            f"parameter 'backend': mpi needs an MPI library that loads: install one (Debian: apt-get "
            f"install openmpi-bin libopenmpi-dev) or `module load` the cluster's MPI; mpi4py is "
            f"installed and said: {why}"
        ) from None
    return MPI


def check_machine(cfg: CommConfig, launcher: str) -> CommConfig:
    """Resolve backend=auto and refuse what this machine cannot run, before any process or file."""
    if cfg.backend in ("auto", "nccl"):  # MPI runs never import torch: its import is seconds on a small CPU
        import torch
    if cfg.backend == "auto":
        cfg = cfg.replace(backend="nccl" if torch.cuda.is_available() else "gloo")
    if cfg.backend == "nccl":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"parameter 'backend': nccl needs GPUs and none is visible on {socket.gethostname()} "
                f"(torch {torch.__version__}); use backend=gloo (CPU) or backend=mpi"
            )
        if launcher == "local" and cfg.gpus > torch.cuda.device_count():
            raise ConfigError(
                f"parameter 'gpus': {cfg.gpus} ranks but {torch.cuda.device_count()} GPU(s) on "
                f"{socket.gethostname()}; nccl needs one GPU per rank here"
            )
    if cfg.backend == "mpi":
        from kernels.comm.native import requested_loop

        requested_loop()  # a bad LAB_MPI_LOOP is named here, before any rank starts
        if launcher == "local":
            raise ConfigError(
                "parameter 'launcher': local starts torch ranks; MPI ranks start with launcher=mpirun "
                "(here) or srun (in an allocation), or auto"
            )
        load_mpi()  # after the checks of what was asked: a mistake in it is named even where no MPI library loads
        if launcher == "mpirun":
            from kernels.comm.mpi_library import mpirun_path

            mpirun_path(cfg.mpi_library)  # installed, and the library asked for
    elif cfg.mpi_library != "auto":
        raise ConfigError(f"parameter 'mpi_library': {cfg.mpi_library} serves backend=mpi only (not {cfg.backend})")
    if launcher == "mpirun" and cfg.backend != "mpi":
        raise ConfigError(
            f"parameter 'launcher': mpirun starts MPI ranks; backend={cfg.backend} uses local, srun or "
            f"torchrun (launcher none)"
        )
    if launcher == "srun":
        from kernels.launch.launchers import check_allocation

        check_allocation(cfg.gpus)
    return cfg


def make_run_id(cfg: CommConfig, env=None) -> str:
    env = os.environ if env is None else env
    if cfg.run_id:
        return cfg.run_id
    parts = [datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"), "comm", cfg.backend, f"g{cfg.gpus}"]
    if env.get("SLURM_JOB_ID"):
        parts.append(
            f"j{env.get('SLURM_ARRAY_JOB_ID', env['SLURM_JOB_ID'])}"
            + (f"_{env['SLURM_ARRAY_TASK_ID']}" if env.get("SLURM_ARRAY_TASK_ID") else "")
        )
    if cfg.label:
        parts.append(cfg.label)
    return "-".join(parts + [secrets.token_hex(2)])


# ------------------------------------------------------------------ output in nccl-tests' layout
FORM_NAMES = {"out": "out-of-place", "in": "in-place"}


def header() -> list[str]:
    return [
        "#",
        "#                                                              out-of-place                       in-place",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
        "busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
        "(GB/s)       ",
    ]


def row_line(r: dict) -> str:
    out = f"{r['size_bytes']:>12}  {r['count']:>12}  {DTYPES[r['dtype']][0]:>8}  {r['redop']:>6}  {r['root']:>6}"
    for f in ("out", "in"):
        if r.get(f"time_us_{f}") is None:
            out += f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>5}"
        else:
            wrong = "N/A" if r[f"wrong_{f}"] is None else str(r[f"wrong_{f}"])
            out += f"  {_time(r[f'time_us_{f}']):>7}  {r[f'algbw_{f}']:>6.2f}  {r[f'busbw_{f}']:>6.2f}  {wrong:>5}"
    return out


def _time(us: float) -> str:
    return f"{us:.1f}" if us >= 1e4 else f"{us:.2f}"


def avg_busbw(rows: list[dict]) -> float | None:
    vals = [r[f"busbw_{f}"] for r in rows for f in ("out", "in") if r.get(f"busbw_{f}") is not None]
    return sum(vals) / len(vals) if vals else None


def footer(rows: list[dict]) -> list[str]:
    wrong = sum(r.get(f"wrong_{f}") or 0 for r in rows for f in ("out", "in"))
    bw = avg_busbw(rows)
    return [
        f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}",
        f"# Avg bus bandwidth    : {bw:.6g} " if bw is not None else "# Avg bus bandwidth    : N/A",
        "#",
    ]


def osu_block(op: str, dtype: str, rows: list[dict], facts: dict) -> list[str]:
    o = OPS[op]
    form = "out" if any(r.get("time_us_out") is not None for r in rows) else "in"
    lines = [
        f"# OSU-style {o.title} Latency Test ({facts['backend']}, {facts['ranks']} ranks on {facts['nodes']} "
        f"node(s), {dtype}, {FORM_NAMES[form]})",
        f"# {'Size':<10}{'Avg Latency(us)':>18}{'Min Latency(us)':>18}{'Max Latency(us)':>18}{'Iterations':>12}",
    ]
    for r in rows:
        if r.get(f"time_us_{form}") is not None:
            lines.append(
                f"{r['size_bytes']:<12}{r[f'time_us_{form}']:>18.2f}{r[f'time_us_min_{form}']:>18.2f}"
                f"{r[f'time_us_max_{form}']:>18.2f}{r['iters']:>12}"
            )
    return lines + [""]


COLUMNS = [
    "op",
    "backend",
    "dtype",
    "ranks",
    "nodes",
    "placement",
    "size_bytes",
    "count",
    "redop",
    "root",
    "iters",
    "repeats",
] + [
    f"{k}_{f}"
    for f in ("out", "in")
    for k in ("time_us", "time_us_min", "time_us_max", "time_us_lo", "time_us_hi", "algbw", "busbw", "wrong")
]


def write_csv(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if r.get(k) is None else r[k] for k in COLUMNS})
    records.atomic_write_bytes(path, buf.getvalue().encode(), "results_dir")


# ------------------------------------------------------------------ one rank
def _versions(backend: str) -> dict:
    from kernels.base.sysinfo import software_versions

    v = software_versions(import_torch=backend != "mpi")
    if backend == "mpi":
        import mpi4py
        from mpi4py import MPI

        v["mpi4py"] = mpi4py.__version__
        # Open MPI ends the string with a NUL byte
        v["mpi_library"] = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
        v["mpi_standard"] = "%d.%d" % MPI.Get_version()
    return v


def _node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def worker(cfg: CommConfig) -> int:
    """This process is one rank: join the world, measure, and (rank 0) write the record."""
    if cfg.backend == "mpi":
        MPI = load_mpi()
        if not MPI.Is_initialized():  # as MPI_Init in C: one thread calls MPI here, and mpi4py's default
            MPI.Init()  # (THREAD_MULTIPLE) makes Open MPI lock around every call
        from kernels.comm.collectives import MpiRunner

        runner = MpiRunner(MPI.COMM_WORLD)
        try:
            return _measure(cfg, runner, "cpu")
        finally:
            if not MPI.Is_finalized():
                MPI.Finalize()
    from kernels.comm.collectives import TorchRunner
    from kernels.base.dist import process_group, rank_env, select_device

    renv = rank_env()
    if renv.world_size != cfg.gpus:
        raise ConfigError(
            f"parameter 'gpus': {cfg.gpus}, but this rank was started in a world of "
            f"{renv.world_size} ({renv.source}); start gpus ranks"
        )
    device = select_device("cuda" if cfg.backend == "nccl" else "cpu", renv.local_rank)
    with process_group(renv, device, cfg.timeout_min, startup_timeout_min=min(5.0, cfg.timeout_min)):
        return _measure(cfg, TorchRunner(device, renv.global_rank, renv.world_size), device)


def _placement(cfg: CommConfig, runner, device) -> tuple[list[dict], str, list[str], dict]:
    """Where the ranks run: each rank's facts, rank 0's run id for everyone, the hosts and the run's facts."""
    from kernels.base.sysinfo import device_name

    n, rank = runner.n, runner.rank
    if n != cfg.gpus:
        raise ConfigError(f"parameter 'gpus': {cfg.gpus}, but {n} ranks were started; start gpus ranks")
    me = {
        "rank": rank,
        "host": _node_name(),
        "pid": os.getpid(),
        "device": device_name(device),
        "local_rank": int(
            os.environ.get("LOCAL_RANK")
            or os.environ.get("SLURM_LOCALID")
            or os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK")
            or 0
        ),
    }
    ranks = runner.gather_object(me)
    run_id = runner.gather_object(make_run_id(cfg))[0]  # rank 0's id for everyone
    hosts = sorted({r["host"] for r in ranks})
    facts = {
        "backend": cfg.backend,
        "ranks": n,
        "nodes": len(hosts),
        "placement": "intra-node" if len(hosts) == 1 else "inter-node",
        "ranks_per_node": max(sum(1 for r in ranks if r["host"] == h) for h in hosts),
        "timed_by": runner.loop,
    }
    return ranks, run_id, hosts, facts


def _measure(cfg: CommConfig, runner, device) -> int:
    """Every rank: measure; rank 0 writes the record (config.json, summary.json, then the results)."""
    ranks, run_id, hosts, facts = _placement(cfg, runner, device)
    run_dir = cfg.results_root / run_id
    is0 = runner.rank == 0
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    summary = {
        "run_id": run_id,
        "kind": "commbench",
        "status": "running",
        "error": None,
        "started_utc": started,
        "finished_utc": None,
        **facts,
    }
    lines: list[str] = []

    def emit(line: str = "") -> None:
        if is0:
            print(line, flush=True)
            lines.append(line)

    if is0:
        from kernels.base.sysinfo import git_info, slurm_ids

        records.ensure_not_complete(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        records.write_json(
            run_dir / "config.json",
            {
                "kind": "commbench",
                "params": cfg.to_dict(),
                **facts,
                "rank_list": ranks,
                "hosts": hosts,
                "versions": _versions(cfg.backend),
                "git": git_info(),
                "slurm": slurm_ids(),
                "command": shlex.join([sys.executable, "-m", "kernels.comm", "bench", *cfg.cli_args()]),
            },
        )
        records.write_json(run_dir / "summary.json", summary)
    try:
        rows, unsupported = _run_all(cfg, runner, facts, emit)
    except BaseException as e:
        if is0:
            summary.update(
                status="failed",
                error=f"{type(e).__name__}: {str(e).strip()[:400]}",
                finished_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            )
            records.write_json(run_dir / "summary.json", summary)
            traceback.print_exc()
        raise
    return _write_results(cfg, run_dir, rows, unsupported, lines, facts, summary) if is0 else 0


def _write_results(cfg: CommConfig, run_dir, rows, unsupported, lines, facts, summary) -> int:
    """Rank 0: the log, the OSU-style tables, results.csv and the final summary; 1 when any result was wrong."""
    files.atomic_write_text(run_dir / "commbench.txt", "\n".join(lines) + "\n", "results_dir")
    osu = []
    for op in cfg.op_list:
        for dt in cfg.dtype_list:
            sel = [r for r in rows if r["op"] == op and r["dtype"] == dt]
            if sel:
                osu += osu_block(op, dt, sel, facts)
    files.atomic_write_text(run_dir / "osu.txt", "\n".join(osu), "results_dir")
    write_csv(run_dir / "results.csv", rows)
    per = {}
    for r in rows:
        per.setdefault(f"{r['op']}/{r['dtype']}", []).append(r)
    wrong = sum(r.get(f"wrong_{f}") or 0 for r in rows for f in ("out", "in"))
    summary.update(
        status="complete" if wrong == 0 else "failed",
        error=None if wrong == 0 else f"{wrong} wrong result element(s): see results.csv",
        finished_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        avg_busbw_gbs={k: round(avg_busbw(v), 6) for k, v in per.items() if avg_busbw(v) is not None},
        wrong=wrong,
        unsupported=unsupported,
        sizes=len(cfg.sizes),
        notes=(
            [
                "gloo runs reduce_scatter as an all_reduce of the whole buffer: its busbw is not "
                "comparable with nccl's or MPI's"
            ]
            if cfg.backend == "gloo"
            else []
        ),
    )
    records.write_json(run_dir / "summary.json", summary)
    print(f"record: {run_dir}", flush=True)
    return 0 if wrong == 0 else 1


def _probe(cfg: CommConfig, runner, op: str, dtype: str) -> str | None:
    """None when `op` on `dtype` works here (a tiny call on every rank, checked), else why not."""
    o = OPS[op]
    if op == "send_recv" and runner.n < 2:
        return "needs at least 2 ranks"
    if dtype not in runner.dtypes:
        return f"{runner.api} has no {dtype} type here"
    bad = ""
    try:
        form = FORMS[runner.api][op][0]
        runner.prepare(o, form, 2, dtype, cfg.root)
        runner.run()
        runner.sync()
        if count_wrong(runner, o, 2, cfg.root):
            bad = "wrong results on a probe of 2 elements"
    except Exception as e:  # noqa: BLE001 - an unsupported op raises whatever its backend raises
        bad = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    flags = runner.gather_object(bad)
    return next((f for f in flags if f), None)


def _run_all(cfg: CommConfig, runner, facts: dict, emit) -> tuple[list[dict], dict]:
    n, rows, unsupported = runner.n, [], {}
    sizes = cfg.sizes
    emit(
        f"# commbench (kernels/comm): backend {cfg.backend}, {n} rank(s) on {facts['nodes']} node(s) "
        f"({facts['placement']}), minBytes {sizes[0]} maxBytes {sizes[-1]} step: {cfg.factor}(factor) "
        f"warmup iters: {cfg.warmup} iters: {cfg.iters} x {cfg.repeats} loops (median reported) "
        f"validation: {int(cfg.check)} timed by: {runner.loop}"
    )
    for op in cfg.op_list:
        o = OPS[op]
        for dtype in cfg.dtype_list:
            why = _probe(cfg, runner, op, dtype)
            if why:
                unsupported[f"{op}/{dtype}"] = why
                emit(f"# {op} {dtype}: unsupported on {cfg.backend} ({why})")
                continue
            itemsize = DTYPES[dtype][1]
            emit(
                f"# collective {op}  dtype {dtype}"
                + (
                    "  (gloo: emulated by all_reduce, busbw not comparable)"
                    if cfg.backend == "gloo" and op == "reduce_scatter"
                    else ""
                )
            )
            for line in header():
                emit(line)
            block = []
            for size in sizes:
                count, nbytes = o.counts(size, n, itemsize)
                if count == 0:
                    continue
                r = {
                    "op": op,
                    "backend": cfg.backend,
                    "dtype": dtype,
                    "ranks": n,
                    "nodes": facts["nodes"],
                    "placement": facts["placement"],
                    "size_bytes": nbytes,
                    "count": count,
                    "redop": "sum" if o.reduces else "none",
                    "root": cfg.root if o.rooted else -1,
                    "iters": cfg.iters,
                    "repeats": cfg.repeats,
                }
                for form in ("out", "in"):
                    if form in FORMS[runner.api][op]:
                        r.update(_time_one(cfg, runner, o, form, count, dtype, nbytes, n))
                block.append(r)
                emit(row_line(r))
            for line in footer(block):
                emit(line)
            rows += block
    return rows, unsupported


def _time_one(cfg: CommConfig, runner, o, form: str, count: int, dtype: str, nbytes: int, n: int) -> dict:
    runner.prepare(o, form, count, dtype, cfg.root)
    runner.run()
    runner.sync()
    wrong = runner.sum_int(count_wrong(runner, o, count, cfg.root)) if cfg.check else None
    if cfg.warmup:
        runner.timed(cfg.warmup)
    loops = []
    for _ in range(cfg.repeats):
        runner.barrier()
        loops.append(runner.reduce_times(runner.timed(cfg.iters) / cfg.iters))  # (mean, min, max) over ranks
    loops.sort()
    mean, lo, hi = loops[len(loops) // 2]
    algbw, busbw = bandwidths(o, nbytes, mean, n)
    return {
        f"time_us_{form}": round(mean * 1e6, 3),
        f"time_us_min_{form}": round(lo * 1e6, 3),
        f"time_us_max_{form}": round(hi * 1e6, 3),
        f"time_us_lo_{form}": round(loops[0][0] * 1e6, 3),
        f"time_us_hi_{form}": round(loops[-1][0] * 1e6, 3),
        f"algbw_{form}": float(f"{algbw:.6g}"),
        f"busbw_{form}": float(f"{busbw:.6g}"),
        f"wrong_{form}": wrong,
    }


def bandwidths(o, nbytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes) as nccl-tests defines them: size / time, times the op's factor."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * o.factor(n)


# ------------------------------------------------------------------ the driver
def launch(cfg: CommConfig, stdout=None) -> tuple[int, Path]:
    """Validate, then start the ranks with the chosen launcher. Returns (exit status, record directory)."""
    from kernels.comm import mpi_library
    from kernels.launch.launchers import RankJob, choose_launcher, run_srun, spawn_local, srun_command

    stdout = stdout or sys.stdout
    launcher = choose_launcher(cfg.launcher, cfg.gpus, mpi=cfg.backend == "mpi")
    cfg = check_machine(cfg, launcher)
    if launcher == "none":
        return worker(cfg), None
    cfg = cfg.replace(run_id=make_run_id(cfg), results_dir=str(cfg.results_root), launcher="none")
    run_dir = cfg.results_root / cfg.run_id
    records.ensure_not_complete(run_dir)
    records.refuse_foreign(cfg.results_root, run_dir)  # before any rank starts, as a training run's launcher does
    short = sysinfo.short_of_room(run_dir, RECORD_ROOM)
    if short:  # a full disk found by rank 0 after the sweep ends the other ranks in gloo's words
        probe, has, needs = short
        raise ConfigError(
            f"parameter 'results_dir': {probe} has {has} free, the record needs about {needs}; free space there "
            f"or pass results_dir=<a directory with room>"
        )
    why = files.cannot_write(run_dir)
    if why:
        raise ConfigError(
            f"parameter 'results_dir': cannot write in {cfg.results_root} ({why}): it is read-only, "
            f"immutable or not yours; pass results_dir=<a directory you own>"
        )
    argv = (sys.executable, "-m", "kernels.comm", "bench", *cfg.cli_args())
    job = RankJob(cfg.gpus, argv, run_dir, env=mpi_library.rank_env(cfg.mpi_library) if cfg.backend == "mpi" else {})
    print(
        f"commbench {cfg.run_id}: {cfg.gpus} rank(s), backend {cfg.backend}, via {launcher}; record in {run_dir}",
        file=stdout,
        flush=True,
    )
    if launcher == "local":
        return spawn_local(job, stdout), run_dir
    if launcher == "srun":
        extra = [f"--mpi={os.environ.get('LAB_SRUN_MPI', 'pmix')}"] if cfg.backend == "mpi" else []
        return run_srun(job, stdout, srun_command(job, extra=extra)), run_dir
    return run_srun(job, stdout, mpi_library.command(cfg.mpi_library, job.ranks, list(job.command))), run_dir


def read_record(run_dir: Path) -> dict:
    """{'config', 'summary', 'rows' (list of dicts, numbers typed)} of one commbench record."""
    run_dir = Path(run_dir)
    out = {
        "dir": str(run_dir),
        "config": records.read_json(run_dir / "config.json"),
        "summary": records.read_json(run_dir / "summary.json"),
        "rows": [],
    }
    p = run_dir / "results.csv"
    if p.exists():
        out["rows"] = records.read_csv_rows(p)
    if out["summary"].get("status") == "complete" and out["summary"].get("avg_busbw_gbs") and not out["rows"]:
        raise records.RecordError(
            f"{p}: {'missing' if not p.exists() else 'holds no rows'}, though the record's summary reports "
            f"{', '.join(out['summary']['avg_busbw_gbs'])}; the file is cut short or lost: restore it, or remove "
            f"the record {run_dir} and run again"
        )
    return out
