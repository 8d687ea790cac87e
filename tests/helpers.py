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


def launch(n: int, args, cwd=None, timeout=300, env=None):
    """``mpirun -n N python -m hpcps ARGS``; returns (CompletedProcess, seconds)."""
    cmd = [mpirun(), "-n", str(n), sys.executable, "-m", "hpcps", *map(str, args)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env or mpi_env(), capture_output=True, text=True,
                          timeout=timeout)
    return proc, time.perf_counter() - t0


def hpcps(args, cwd=None, timeout=600, env=None):
    """``python -m hpcps ARGS`` (no mpirun around it)."""
    cmd = [sys.executable, "-m", "hpcps", *map(str, args)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env or mpi_env(), capture_output=True, text=True,
                          timeout=timeout)
    return proc, time.perf_counter() - t0


def write_job(path: Path, body: str) -> Path:
    path.write_text(body.replace("@DATA@", str(DATA)))
    return path


def rank_pids(job_file: Path, marker: bytes = b"train") -> dict:
    """{world rank: pid} of the MPI ranks running ``job_file`` (command lines with an argument
    ``marker`` or ending in ``/marker``: ``hpcps train`` by default)."""
    found = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
            if (not any(c == marker or c.endswith(b"/" + marker) for c in cmd)
                    or str(job_file).encode() not in cmd):
                continue
            env = dict(kv.split(b"=", 1) for kv in (p / "environ").read_bytes().split(b"\0") if b"=" in kv)
            for var in (b"OMPI_COMM_WORLD_RANK", b"PMIX_RANK", b"PMI_RANK", b"SLURM_PROCID"):
                if var in env:
                    found[int(env[var])] = int(p.name)
                    break
        except (OSError, ValueError):
            continue
    return found


def start_run(tmp_path, job, n: int, *extra):
    """``python -m hpcps run -n N [extra] JOB`` in ``tmp_path``, output piped line by line."""
    return subprocess.Popen([sys.executable, "-m", "hpcps", "run", "-n", str(n), *extra, str(job)],
                            cwd=tmp_path, env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)


def read_until(p, text, lines, timeout=180):
    """Read ``p``'s output into ``lines`` until a line contains ``text``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return
    raise AssertionError(f"{text!r} not seen:\n{''.join(lines)[-3000:]}")


def kill_rank(job, rank, marker=b"train"):
    """``kill -9`` world rank ``rank`` of the job running ``job`` (see :func:`rank_pids`)."""
    pids = rank_pids(job, marker)
    assert rank in pids, f"rank {rank} not running ({pids})"
    os.kill(pids[rank], signal.SIGKILL)
