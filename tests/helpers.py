"""Helpers for tests that launch real MPI jobs (no fixtures here: plain functions)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "adult.csv.gz"


def mpirun() -> str:
    local = Path(sys.executable).parent / "mpirun"
    return str(local) if local.exists() else "mpirun"


def mpi_env(**extra) -> dict:
    """Environment for test launches: run-as-root (when root) and oversubscription."""
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")
    env.update(extra)
    return env


def _run(cmd, cwd, env, timeout):
    """Run ``cmd`` in its own session; on timeout kill the whole process group (mpirun *and*
    its ranks, which ``subprocess.run(timeout=...)`` would leave running) and re-raise."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(p)
        p.communicate()
        raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err), time.perf_counter() - t0


def kill_group(p: subprocess.Popen) -> None:
    """SIGKILL the process group of ``p`` (started with ``start_new_session=True``)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def launch(n: int, args, cwd=None, timeout=300, env=None):
    """``mpirun -n N python -m hpcps ARGS``; returns (CompletedProcess, seconds). On timeout
    every process of the launch is killed and ``subprocess.TimeoutExpired`` raised."""
    cmd = [mpirun(), "-n", str(n), sys.executable, "-m", "hpcps", *map(str, args)]
    return _run(cmd, cwd, env or mpi_env(), timeout)


def hpcps(args, cwd=None, timeout=600, env=None):
    """``python -m hpcps ARGS`` (no mpirun around it); killed with its children on timeout."""
    cmd = [sys.executable, "-m", "hpcps", *map(str, args)]
    return _run(cmd, cwd, env or mpi_env(), timeout)


def write_job(path: Path, body: str) -> Path:
    path.write_text(body.replace("@DATA@", str(DATA)))
    return path


def rank_pids(job_file: Path) -> dict:
    """{world rank: pid} of the MPI ranks running ``job_file``."""
    found = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
            if b"train" not in cmd or str(job_file).encode() not in cmd:
                continue
            env = dict(kv.split(b"=", 1) for kv in (p / "environ").read_bytes().split(b"\0") if b"=" in kv)
            for var in (b"OMPI_COMM_WORLD_RANK", b"PMIX_RANK", b"PMI_RANK", b"SLURM_PROCID"):
                if var in env:
                    found[int(env[var])] = int(p.name)
                    break
        except (OSError, ValueError):
            continue
    return found
