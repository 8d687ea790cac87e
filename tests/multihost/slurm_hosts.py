"""A multi-node Slurm on the test hosts: munged and slurmctld on this machine (the controller
listens on the bridge's address), one slurmd per test host, started inside that host's
namespaces (``NodeName=hpcps-hK NodeAddr=10.213.7.K``). Same layout and conventions as the
one-node cluster of tests/slurm/conftest.py (its helpers are reused): one temporary directory,
free ports, daemons stopped by PID.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from tests.hosts import testhosts as th
from tests.slurm.conftest import Cluster, _find, _free_port, _start, _stop

CONF = """\
# written by tests/multihost/slurm_hosts.py: one node per test host
ClusterName=hpcpsmulti
SlurmctldHost={ctl}({ctl_addr})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={munge_socket},cred_expire=5
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
KillWait=30
SlurmdTimeout=10
SchedulerParameters=sched_interval=1
MinJobAge=600
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
DebugFlags=NO_CONF_HASH
{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def node_states(c: Cluster) -> dict:
    out = c.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def start_slurmd(c: Cluster, h) -> None:
    """Start ``h``'s slurmd inside its namespaces, with its own copy of slurm.conf and an
    mpi.conf that gives Slurm's PMIx plugin a directory of this node's own: the test hosts
    share one file system, and the plugin's default ``/tmp/spmix_appdir_<uid>_<job>.<step>``
    would be the same directory for every node ("File exists": srun --mpi=pmix failed)."""
    node_dir = c.dir / f"node-{h.name}"
    (node_dir / "pmix").mkdir(parents=True, exist_ok=True)
    conf = node_dir / "slurm.conf"
    conf.write_text(c.conf.read_text())
    (node_dir / "mpi.conf").write_text(f"PMIxCliTmpDirBase={node_dir / 'pmix'}\n")
    c.procs[f"slurmd-{h.name}"] = _start(f"slurmd.{h.name}", h.cmd(
        _find("slurmd"), "-D", "-N", h.name, "-f", conf), c.dir, c.env)


def start_multinode(d: Path, hosts, cpus: int = 2) -> Cluster:
    d = Path(d)
    for sub in ("munge", "state", "spool"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    for h in hosts:
        (d / "spool" / h.name).mkdir(exist_ok=True)
    os.chmod(d / "munge", 0o700)
    key = d / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    sockdir = d / "munge-run"
    sockdir.mkdir(exist_ok=True)
    os.chmod(sockdir, 0o755)
    sock = sockdir / "munge.socket"
    nodes = "\n".join(f"NodeName={h.name} NodeAddr={h.addr} CPUs={cpus} State=UNKNOWN" for h in hosts)
    conf = d / "slurm.conf"
    conf.write_text(CONF.format(d=d, munge_socket=sock, ctl=socket.gethostname(), ctl_addr=th.BRIDGE_ADDR,
                                ctld_port=_free_port(), slurmd_port=_free_port(), nodes=nodes,
                                names=",".join(h.name for h in hosts)))
    env = dict(os.environ, SLURM_CONF=str(conf))
    for k in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and k != "SLURM_CONF"]:
        del env[k]
    c = Cluster(d, conf, env)
    try:
        c.procs["munged"] = _start("munged", [
            _find("munged"), "-F", f"--key-file={key}", f"--socket={sock}",
            f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'munge' / 'munged.seed'}"], d, env)
        deadline = time.time() + 20
        while not sock.exists():
            if c.procs["munged"].poll() is not None or time.time() > deadline:
                raise RuntimeError("munged did not start")
            time.sleep(0.05)
        c.procs["slurmctld"] = _start("slurmctld", [_find("slurmctld"), "-D", "-f", conf], d, env)
        for h in hosts:
            start_slurmd(c, h)
        wait_idle(c, hosts, 60)
    except BaseException:
        stop_multinode(c)
        raise
    return c


def wait_idle(c: Cluster, hosts, timeout) -> None:
    deadline = time.time() + timeout
    while True:
        states = node_states(c)
        if all(states.get(h.name) == "idle" for h in hosts):
            return
        dead = [n for n, p in c.procs.items() if p.poll() is not None]
        if dead or time.time() > deadline:
            logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in c.dir.glob("*.log"))
            raise RuntimeError(f"nodes not idle ({states}; exited: {dead})\n{logs}")
        time.sleep(0.2)


def stop_multinode(c: Cluster) -> None:
    """Cancel what is left, then stop every slurmd, slurmctld and munged by PID."""
    if "slurmctld" in c.procs and c.procs["slurmctld"].poll() is None:
        c.run("scancel", "--full", "-u", str(os.getuid()), check=False, timeout=10)
        deadline = time.time() + 20
        while time.time() < deadline and c.run("squeue", "-h", check=False, timeout=10).strip():
            time.sleep(0.5)
    for name in [n for n in c.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]:
        if name in c.procs:
            _stop(c.procs[name])
