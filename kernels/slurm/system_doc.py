"""SYSTEM.md: the target systems, then the development machine.

    lab sysinfo                                   # SYSTEM.md: every target, and this machine
    lab sysinfo --merge results/system/*.json     # this machine's section from per-node files
    srun --ntasks-per-node=1 lab sysinfo --json --out-dir results/system/<profile>

A target system is a cluster profile (clusters/<profile>.yaml: partition, limits, modules, container, NCCL
interface) with the figures its site publishes (paper/systems.yaml, same key: GPU, links, software stack) and,
once measured, the facts of its nodes (results/system/<profile>/*.json, one file per node: driver, CUDA,
NCCL, torch). What is not measured yet says so, with the command that measures it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from kernels.base import sysinfo, yamlfile
from kernels.base.errors import ConfigError, exit_status
from kernels.base.files import PROJECT_ROOT, atomic_write_bytes, results_home
from kernels.slurm.clusters import load_cluster

SYSTEMS_FILE = PROJECT_ROOT / "paper" / "systems.yaml"
LOCAL = "local"  # the development machine's own two-node Slurm, not a target


def measured_nodes(profile: str, systems_dir: Path) -> list[dict]:
    """The node files `lab sysinfo --json` wrote on the target (systems_dir/<profile>/*.json)."""
    return [sysinfo.read_node(p, "--systems-dir") for p in sorted((systems_dir / profile).glob("*.json"))]


def _gpus(prof: dict, pub: dict) -> str:
    if pub:
        return f"{pub['gpu']}, {pub['gpus_per_node']} per node"
    if prof["gpus_per_node"]:
        return f"{prof['gpus_per_node']} per node (model not in paper/systems.yaml)"
    return f"none: CPU nodes, {prof['ranks_per_node'] or 1} ranks per node"


def _links(pub: dict) -> str:
    if not pub:
        return "not published in paper/systems.yaml"
    return (
        f"{pub['intranode_GBps']} GB/s per GPU inside a node, {pub['internode_GBps']} GB/s per node between "
        f"nodes ({pub['network']}); latencies assumed: {pub['intranode_latency_us']} and "
        f"{pub['internode_latency_us']} us"
    )


def _software(nodes: list[dict], profile: str) -> list[str]:
    """The rows a site's nodes answer: driver, CUDA, cuDNN, NCCL and torch, measured or how to measure them."""
    if not nodes:
        return [
            f"| driver, CUDA, NCCL, PyTorch | not measured yet: inside an allocation, "
            f"`srun --ntasks-per-node=1 lab sysinfo --json --out-dir results/system/{profile}`, then `lab sysinfo` |"
        ]
    first = nodes[0]
    sw, gpus = first["software"], first["gpus"]
    return [
        f"| GPU driver | {gpus[0]['driver'] if gpus and gpus[0].get('driver') else 'none'} |",
        f"| CUDA / cuDNN / NCCL | {sw['cuda'] or 'none'} / {sw['cudnn'] or 'none'} / {sw['nccl'] or 'none'} |",
        f"| PyTorch | {sw['torch']} |",
        f"| measured on | {len(nodes)} node(s): {sysinfo.host_names(nodes)} (tables below) |",
    ]


def target_section(prof: dict, pub: dict, nodes: list[dict]) -> list[str]:
    """One target system: its profile and published figures in one table, then its measured nodes."""
    name = prof["name"]
    modules = ", ".join(prof["modules"]) or (
        "none listed: the lab's Apptainer image brings PyTorch (and CUDA and NCCL on GPU nodes) "
        f"(list the site's in `modules:` of clusters/{name}.yaml to use them instead)"
    )
    slurm = (
        f"partition {prof['partition'] or 'default'}, QoS {prof['qos'] or 'default'}, up to {prof['max_nodes']} "
        f"nodes, time limit {prof['time']}, cores per task: {prof['cpus_per_task']}"
    )
    lines = [
        f"### {name}" + (f": {pub['name']}" if pub else ""),
        "",
        f"From clusters/{name}.yaml" + (" and paper/systems.yaml (the site's published figures)." if pub else "."),
        "",
        "| item | value |",
        "|---|---|",
        f"| GPUs | {_gpus(prof, pub)} |",
        f"| links | {_links(pub)} |",
        f"| NCCL interface | {prof['nccl_ifname'] or 'NCCL chooses'} |",
        f"| software stack | {pub['stack'] if pub else 'not published in paper/systems.yaml'} |",
        f"| modules | {modules} |",
        f"| container | {prof['container'] or 'not set yet (apptainer/run.sh build, then `container:` in it)'} |",
        f"| Slurm | {slurm} |",
        f"| account | {'set' if prof['account'] else 'not set (most sites refuse jobs without one)'} |",
        *_software(nodes, name),
        "",
    ]
    return lines + sysinfo.node_sections(nodes, heading="####")


def document(dev_nodes: list[dict], command: str, systems_dir: Path) -> str:
    """SYSTEM.md: one section per cluster profile, then the machine the lab is developed and tested on."""
    published = yamlfile.read(SYSTEMS_FILE, "systems file")
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# SYSTEM",
        "",
        f"Generated by `{command}` on {when} from the cluster profiles and {len(dev_nodes)} node(s) of the "
        f"development machine: {sysinfo.host_names(dev_nodes)}. Do not edit by hand.",
        "",
        "## Target systems",
        "",
    ]
    for path in sorted((PROJECT_ROOT / "clusters").glob("*.yaml")):
        prof = load_cluster(str(path), "clusters/")
        if prof["name"] != LOCAL:
            lines += target_section(prof, published.get(prof["name"]) or {}, measured_nodes(prof["name"], systems_dir))
    local = load_cluster(LOCAL)
    lines += [
        "## Development machine",
        "",
        "Where the lab is built and its tests run (`lab sysinfo --merge FILES` describes several nodes), with a "
        f"Slurm of {local['max_nodes']} emulated nodes of {local['ranks_per_node']} CPU ranks each "
        f"(clusters/{LOCAL}.yaml, partition {local['partition']}).",
        "",
        *sysinfo.node_sections(dev_nodes),
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="lab sysinfo", description="Describe the target systems and this machine in SYSTEM.md"
    )
    ap.add_argument("--json", action="store_true", help="this node's facts as JSON (stdout, or --out-dir)")
    ap.add_argument(
        "--out-dir",
        type=Path,
        help="with --json: write <out-dir>/<host>.json (one file per node when run under srun --ntasks-per-node=1; "
        "results/system/<profile> for a target system)",
    )
    ap.add_argument("--merge", nargs="+", type=Path, help="JSON files of several nodes: the development machine")
    ap.add_argument(
        "--systems-dir",
        type=Path,
        default=None,
        help="where the target systems' node files are (default: $LAB_RESULTS/system, else results/system)",
    )
    ap.add_argument(
        "--out",
        default=str(PROJECT_ROOT / "SYSTEM.md"),
        help="where the Markdown goes (default: SYSTEM.md of the repository; '-' prints it)",
    )
    a = ap.parse_args(argv)
    command = ("lab sysinfo " + " ".join(argv if argv is not None else sys.argv[1:])).strip()

    def body() -> None:
        if a.json:
            text = json.dumps(sysinfo.system_facts(), indent=2, default=str) + "\n"
            if a.out_dir:
                # the Slurm node name first: emulated or containerised nodes can share a host name
                path = a.out_dir / f"{os.environ.get('SLURMD_NODENAME') or sysinfo.host()}.json"
                _write(path, text, "--out-dir")
                print(f"wrote {path}")
            else:
                print(text, end="")
            return
        nodes = [sysinfo.read_node(p) for p in a.merge] if a.merge else [sysinfo.system_facts()]
        text = document(nodes, command, a.systems_dir or results_home() / "system")
        if a.out == "-":
            print(text, end="")
        else:
            _write(Path(a.out), text, "--out")  # never a half-written or empty SYSTEM.md
            print(f"wrote {a.out} ({len(nodes)} node(s) of this machine)")

    return exit_status(body)


def _write(path: Path, text: str, option: str) -> None:
    try:
        atomic_write_bytes(path, text.encode())
    except OSError as e:
        raise ConfigError(
            f"{option}: cannot write {path} ({os.strerror(e.errno) if e.errno else e}): the file or its folder is "
            f"read-only, immutable, full or not yours; pass another {option}"
        ) from None


if __name__ == "__main__":
    sys.exit(main())
