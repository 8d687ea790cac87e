"""A real single-node Slurm (munged + slurmctld + slurmd) on localhost for the test session.

Everything lives in one temporary directory: munge key and socket, ``slurm.conf``, state,
spool, pid and log files. The daemons are started in the foreground as children of the test
process and stopped by PID at the end. Ports are picked free, so that two sessions (or a site
Slurm on the default ports) do not collide.

Without ``slurmctld`` the tests are skipped with the reason — unless ``CI`` is set, where a
missing Slurm is a failure (``.ci/install-slurm.sh`` installs it).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "squeue", "sinfo", "scancel")


def _find(name: str) -> str | None:
    return shutil.which(name) or next((str(p) for p in (Path("/usr/sbin") / name, Path("/sbin") / name)
                                       if p.exists()), None)


def missing_tools() -> list[str]:
    return [n for n in DAEMONS + CLIENTS if _find(n) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SLURM_CONF = """\
# written by tests/slurm/conftest.py: a one-node test cluster on localhost
ClusterName=hpcpstest
SlurmctldHost=localhost
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
# requeued jobs become eligible a few seconds later: look for them every second
SchedulerParameters=sched_interval=1
MinJobAge=600
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


@dataclass
class Cluster:
    """A running test cluster: ``env`` has ``SLURM_CONF`` for the client commands."""

    dir: Path
    conf: Path
    env: dict
    procs: dict = field(default_factory=dict)

    def run(self, *args, timeout=30, check=True) -> str:
        """Run a Slurm client command against this cluster; return its stdout."""
        p = subprocess.run([_find(args[0]) or args[0], *map(str, args[1:])], env=self.env,
                           capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, args))}: exit {p.returncode}: {p.stderr.strip()}")
        return p.stdout

    def job(self, jobid) -> dict:
        """``scontrol show job`` as a dict (empty once the job is forgotten)."""
        p = subprocess.run([_find("scontrol"), "show", "job", "-o", str(jobid)], env=self.env,
                           capture_output=True, text=True, timeout=30)
        info = {}
        for tok in p.stdout.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                info.setdefault(k, v)
        return info

    def node_state(self) -> str:
        try:
            return self.run("sinfo", "-h", "-n", "localhost", "-o", "%T", check=False).strip()
        except subprocess.TimeoutExpired:
            return ""

    def logs(self) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            p = self.dir / name
            if p.exists():
                out.append(f"--- {name} (tail)\n" + "".join(p.read_text(errors="replace").splitlines(True)[-40:]))
        return "\n".join(out)


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the test process dies (Linux prctl)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _start(name, cmd, d, env) -> subprocess.Popen:
    # a pytest killed by a timeout must not leave the daemons running
    log = open(d / f"{name}.stdout", "wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=d,
                            start_new_session=True, preexec_fn=_die_with_parent)


def _stop(p: subprocess.Popen, timeout=15.0) -> None:
    if p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)


def start_cluster(d: Path, cpus: int | None = None) -> Cluster:
    """Write the config into ``d`` and start munged, slurmctld and slurmd; wait for an idle node."""
    d = Path(d)
    for sub in ("munge", "state", "spool"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(d / "munge", 0o700)
    key = d / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    sockdir = d / "munge-run"
    sockdir.mkdir(exist_ok=True)
    os.chmod(sockdir, 0o755)
    sock = sockdir / "munge.socket"
    conf = d / "slurm.conf"
    conf.write_text(SLURM_CONF.format(d=d, munge_socket=sock, cpus=cpus or os.cpu_count() or 1,
                                      ctld_port=_free_port(), slurmd_port=_free_port()))
    env = dict(os.environ, SLURM_CONF=str(conf))
    for k in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and k != "SLURM_CONF"]:
        del env[k]                     # e.g. when the tests themselves run inside a Slurm job
    c = Cluster(d, conf, env)
    try:
        c.procs["munged"] = _start("munged", [
            _find("munged"), "-F", f"--key-file={key}", f"--socket={sock}",
            f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'munge' / 'munged.seed'}"], d, env)
        deadline = time.time() + 20
        while not sock.exists():
            if c.procs["munged"].poll() is not None or time.time() > deadline:
                raise RuntimeError("munged did not start:\n" + (d / "munged.stdout").read_text(errors="replace")
                                   + c.logs())
            time.sleep(0.05)
        c.procs["slurmctld"] = _start("slurmctld", [_find("slurmctld"), "-D", "-f", conf], d, env)
        c.procs["slurmd"] = _start("slurmd", [_find("slurmd"), "-D", "-N", "localhost", "-f", conf], d, env)
        deadline = time.time() + 60
        while True:
            state = c.node_state()
            if state == "idle":
                break
            dead = [n for n, p in c.procs.items() if p.poll() is not None]
            if dead or time.time() > deadline:
                raise RuntimeError(f"Slurm node not idle (state {state!r}; exited: {dead})\n" + c.logs())
            time.sleep(0.2)
    except BaseException:
        stop_cluster(c)
        raise
    return c


def stop_cluster(c: Cluster) -> None:
    """Cancel what is left, then stop the daemons by PID (slurmd, slurmctld, munged)."""
    if "slurmctld" in c.procs and c.procs["slurmctld"].poll() is None:
        try:
            c.run("scancel", "--full", "-u", str(os.getuid()), check=False, timeout=10)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if not c.run("squeue", "-h", check=False, timeout=10).strip():
                    break
            except subprocess.TimeoutExpired:
                break
            time.sleep(0.5)
    for name in ("slurmd", "slurmctld", "munged"):
        if name in c.procs:
            _stop(c.procs[name])


def _shm_in_use() -> set[str]:
    used = set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            for line in (p / "maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    used.add(line.rsplit("/dev/shm/", 1)[1].split(" ")[0])
            for fd in (p / "fd").iterdir():
                t = os.readlink(fd)
                if t.startswith("/dev/shm/"):
                    used.add(t[len("/dev/shm/"):])
        except OSError:
            continue
    return used


@pytest.fixture(scope="session")
def slurm():
    """The running test cluster (:class:`Cluster`); ``slurm.env`` has ``SLURM_CONF``."""
    missing = missing_tools()
    if missing:
        msg = (f"Slurm is not installed (missing: {', '.join(missing)}); "
               "install it with .ci/install-slurm.sh (apt: slurm-wlm munge)")
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail("CI is set but " + msg, pytrace=False)
        pytest.skip(msg)
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    # not under pytest's basetemp: munged wants every directory above its socket open to all
    d = Path(tempfile.mkdtemp(prefix="hpcps-slurm-"))
    os.chmod(d, 0o755)
    c = start_cluster(d)
    try:
        yield c
    finally:
        stop_cluster(c)
        shutil.rmtree(d, ignore_errors=True)
        # segments left by ranks that were killed (ours: new, and mapped by no process)
        if shm_before or os.path.isdir("/dev/shm"):
            left = set(os.listdir("/dev/shm")) - shm_before
            if left:
                used = _shm_in_use()
                for name in left - used:
                    try:
                        os.unlink(os.path.join("/dev/shm", name))
                    except OSError:
                        pass
