"""A real Slurm cluster on loopback: one controller and two emulated nodes.

Used by the tests (session fixture `slurm` in conftest.py) and by hand:

    python tests/slurm_cluster.py start [DIR]    # prints the SLURM_CONF to export
    python tests/slurm_cluster.py stop  [DIR]

Needs root and Debian's slurmctld, slurmd, slurm-client and munge. Each node
has placeholder GPUs (GRES with files that are not devices), so `#SBATCH
--gpus-per-node=2` is accepted and SLURM_GPUS_ON_NODE is set, while the ranks
themselves run on the CPU with gloo. Two partitions share the nodes:
`debug` (the default) lets jobs use 2 CPUs of a node, as many as this machine
has cores; `quad` is shaped like a EuroHPC booster partition (4 GPUs and 32
cores a node), so the README's 4-GPU-node command runs here as written.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

NODES = ("n1", "n2")
CPUS = 2  # CPUs a node gives jobs of the default partition (the machine's cores)
QUAD_CPUS = 32  # what each node declares, for the 'quad' partition (slurmd believes the config)
GPUS = 4  # placeholder GPUs per node


def available() -> str | None:
    """None if a cluster can be started here, else the reason it cannot."""
    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "srun", "munged") if not shutil.which(b)]
    if missing:
        return f"Slurm/munge not installed ({', '.join(missing)} missing; .ci/run installs them)"
    if os.geteuid() != 0:
        return "starting slurmd needs root"
    return None


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def write_config(base: Path) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    for d in ("state", "spool/n1", "spool/n2", "log", "gres"):
        (base / d).mkdir(parents=True, exist_ok=True)
    for i in range(GPUS):
        (base / "gres" / f"gpu{i}").touch()
    ctld_port, n1_port, n2_port = _free_ports(3)
    host = socket.gethostname().split(".")[0]
    conf = f"""ClusterName=lab
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={base}/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
MinJobAge=3600
KillWait=5
InactiveLimit=0
GresTypes=gpu
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
SlurmdParameters=config_overrides
NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={n1_port} CPUs={QUAD_CPUS} Gres=gpu:{GPUS} State=UNKNOWN
NodeName=n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={n2_port} CPUs={QUAD_CPUS} Gres=gpu:{GPUS} State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE MaxCPUsPerNode={CPUS} State=UP
PartitionName=quad Nodes=n[1-2] MaxTime=INFINITE State=UP
"""
    (base / "slurm.conf").write_text(conf)
    gres = "AutoDetect=off\n" + "".join(f"NodeName={n} Name=gpu File={base}/gres/gpu[0-{GPUS - 1}]\n" for n in NODES)
    (base / "gres.conf").write_text(gres)
    return base / "slurm.conf"


def _munge_running() -> bool:
    return subprocess.run(["munge", "-n"], capture_output=True).returncode == 0 if shutil.which("munge") else False


def start(base: Path, timeout: float = 60) -> dict:
    """Start munge (if needed), slurmctld and two slurmd; wait until both nodes are idle."""
    reason = available()
    if reason:
        raise RuntimeError(reason)
    conf = write_config(base)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    if not _munge_running():
        subprocess.run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", "/run/munge"], check=True)
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
    subprocess.run(["slurmctld", "-f", str(conf)], env=env, check=True)
    for n in NODES:
        subprocess.run(["slurmd", "-f", str(conf), "-N", n], env=env, check=True)
    deadline = time.time() + timeout
    state = ""
    while time.time() < deadline:
        p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True)
        state = p.stdout.strip()
        lines = {tuple(ln.split()) for ln in state.splitlines()}  # a node is listed once per partition
        if len(lines) == len(NODES) and all(s == "idle" for _, s in lines):
            return {"SLURM_CONF": str(conf)}
        time.sleep(0.5)
    stop(base)
    raise RuntimeError(f"Slurm nodes did not become idle within {timeout} s: {state!r}; logs in {base}/log")


def stop(base: Path) -> None:
    conf = base / "slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
    for pidfile in [base / "slurmctld.pid", *[base / f"slurmd-{n}.pid" for n in NODES]]:
        try:
            pid = int(pidfile.read_text().strip())
            for _ in range(50):
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, 9)
        except (OSError, ValueError):
            pass


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "start"
    base = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/lab-slurm")
    if cmd == "start":
        print(f"export SLURM_CONF={start(base)['SLURM_CONF']}")
    else:
        stop(base)
