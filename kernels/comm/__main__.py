"""Command line of the communication lab (also `lab comm ...`):

python -m kernels.comm bench   [--backend gloo --gpus 4 --ops all_reduce ...]   collective microbenchmarks
python -m kernels.comm show    RECORD_DIR                                        print a record's tables
python -m kernels.comm fit     [--comm DIR]                                      alpha-beta fits of the records
python -m kernels.comm predict --run RUN_DIR --gpus 1,2,4 [--gpus_per_node 2]    data-parallel step prediction
python -m kernels.comm validate [--runs DIR --comm DIR --label L]               predicted vs measured steps
"""

from __future__ import annotations

import argparse
import sys

from kernels.base.errors import ConfigError, exit_status


def bench_parser() -> argparse.ArgumentParser:
    from kernels.comm.bench import PARAMS, __doc__ as doc

    ap = argparse.ArgumentParser(
        prog="lab comm bench",
        description=doc.split("\n")[0],
        allow_abbrev=False,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for p in PARAMS:
        choices = f" {{{','.join(p.choices)}}}" if p.choices else ""
        ap.add_argument(
            f"--{p.name}",
            dest=p.name,
            default=argparse.SUPPRESS,
            metavar=p.type.__name__.upper(),
            help=f"{p.doc}{choices} (default: {p.default!r})".replace("%", "%%"),
        )
    return ap


def bench(argv: list[str]) -> int:
    from kernels.comm import bench as b
    from kernels.launch.launchers import leave

    ap = bench_parser()
    known, rest = ap.parse_known_args(argv)
    if rest:
        from kernels.base.params import unknown_name_error

        raise unknown_name_error(
            rest[0].lstrip("-").split("=")[0], where=f" on the command line ({rest[0]})", known=list(b.BY_NAME)
        )
    cfg = b.resolve(vars(known))
    rc, run_dir = b.launch(cfg)
    if run_dir is None:  # this process was a rank: skip the interpreter's teardown of the process group
        leave(rc)
    return rc


def show(argv: list[str]) -> int:
    from pathlib import Path

    ap = argparse.ArgumentParser(prog="lab comm show", description="print a commbench record's tables")
    ap.add_argument("record", type=Path)
    a = ap.parse_args(argv)
    for name in ("commbench.txt", "osu.txt"):
        p = a.record / name
        if not p.exists():
            raise ConfigError(f"{p} not found; pass a commbench record directory (results/comm/<id>)")
        print(p.read_text())
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from kernels.comm import predict

    cmds = {
        "bench": bench,
        "show": show,
        "fit": predict.fit_main,
        "predict": predict.predict_main,
        "validate": predict.validate_main,
    }
    if not argv or argv[0] not in cmds:
        print(__doc__, file=sys.stderr if argv else sys.stdout)
        return 2 if argv else 0
    return exit_status(lambda: cmds[argv[0]](argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
