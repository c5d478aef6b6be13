"""A real single-node Slurm on loopback, for tests: munged with its own key and socket, slurmctld
and slurmd from Debian's `slurm-wlm`, a generated slurm.conf, all in one temporary folder.

Settings that run in a container without systemd or cgroups: processes tracked through /proc
(proctrack/linuxproc), no task binding (task/none), no accounting. One node, `node1`, with this
machine's CPUs, in partition `debug`. Client commands (sbatch, squeue, scancel, srun) find it
through SLURM_CONF, which `start` returns in the environment to use.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel", "srun")
PARTITION = "debug"
NODE = "node1"


def missing_binaries() -> list[str]:
    """The Slurm and munge programs this machine lacks (`apt-get install slurm-wlm munge`)."""
    return [b for b in BINARIES if shutil.which(b) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Cluster:
    root: Path
    env: dict            # os.environ plus SLURM_CONF (and the munge socket) for client commands
    procs: list          # munged, slurmctld, slurmd
    partition: str = PARTITION

    def log_tail(self, lines: int = 30) -> str:
        """The daemons' logs, for a failure message."""
        parts = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log"):
            path = self.root / name
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
            parts.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(parts)

    def run(self, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def queue(self) -> list[str]:
        """Job ids (array tasks as 12_3) still queued or running."""
        out = self.run("squeue", "-h", "-r", "-o", "%i")
        return out.stdout.split()

    def stop(self) -> None:
        """Cancel every job, stop the daemons (slurmd first), remove the folder."""
        try:
            self.run("scancel", "--full", "-u", str(os.getuid()), timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)


def _conf(root: Path, *, host: str, cpus: int, ctld_port: int, slurmd_port: int) -> str:
    return f"""\
ClusterName=gradertest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
KillWait=10
InactiveLimit=0
MinJobAge=30
SchedulerType=sched/backfill
NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""


def start(*, timeout_s: float = 120) -> Cluster:
    """Start munged, slurmctld and slurmd; return once `sinfo` shows the node idle. RuntimeError
    (with the daemons' logs) if it does not come up in `timeout_s`."""
    root = Path(tempfile.mkdtemp(prefix="slurm-"))   # short: a socket path has 108 bytes
    os.chmod(root, 0o755)
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, host=host, cpus=os.cpu_count() or 1, ctld_port=_free_port(),
                          slurmd_port=_free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for var in list(env):   # a test run inside a Slurm job must not talk to that job's cluster
        if var.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and var != "SLURM_CONF":
            del env[var]
    cluster = Cluster(root=root, env=env, procs=[])
    log = open(root / "daemons.out", "ab")
    try:
        cluster.procs.append(subprocess.Popen(
            ["munged", "-F", "-f", f"--socket={root}/munge.socket", f"--key-file={key}",
             f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
             f"--seed-file={root}/munged.seed"], stdout=log, stderr=log, env=env))
        _wait(lambda: (root / "munge.socket").exists(), timeout_s, cluster, "munged's socket")
        cluster.procs.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)],
                                              stdout=log, stderr=log, env=env))
        _wait(lambda: cluster.run("sinfo", "-h").returncode == 0, timeout_s, cluster,
              "slurmctld to answer")
        cluster.procs.append(subprocess.Popen(["slurmd", "-D", "-N", NODE, "-f", str(conf)],
                                              stdout=log, stderr=log, env=env))
        _wait(lambda: cluster.run("sinfo", "-h", "-N", "-o", "%T").stdout.strip() == "idle",
              timeout_s, cluster, f"node {NODE} to be idle")
    except BaseException:
        cluster.stop()
        raise
    finally:
        log.close()
    return cluster


def _wait(ready, timeout_s: float, cluster: Cluster, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in cluster.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}) while waiting for "
                                   f"{what}\n{cluster.log_tail()}")
        try:
            if ready():
                return
        except (OSError, subprocess.SubprocessError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{cluster.log_tail()}")
