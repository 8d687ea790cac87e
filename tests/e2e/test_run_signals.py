"""``hpcps run`` and its mpirun (issues 22.2, 22.3): Ctrl-C (SIGINT) says the job was
interrupted and exits 130 after the ranks checkpointed; killing ``hpcps run`` — by SIGKILL,
while it relaunches — takes its mpirun and every rank down with it."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpcps import checkpoint as ck
from tests.helpers import kill_session, mpi_env, rank_pids, read_until, write_job

JOB = """
name = "runsig"
seed = 2
[data]
format = "adult_csv"
path = "@DATA@"
max_rows = 20000
hash_bits = 14
[train]
epochs = 200
batch_size = 16
progress_seconds = 0.3
[output]
dir = "out"
"""


def _start(tmp_path, job, *extra):
    return subprocess.Popen([sys.executable, "-m", "hpcps", "run", "-n", "3", *extra, str(job)],
                            cwd=tmp_path, env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1,
                            start_new_session=True)


def _job_pids(job) -> list:
    """PIDs of live processes (mpirun/prterun and ranks) whose command line names ``job``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if str(job).encode() in (d / "cmdline").read_bytes().split(b"\0") and \
                    (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                pids.append(int(d.name))
        except (OSError, IndexError):
            continue
    return pids


def test_sigint_to_hpcps_run_checkpoints_says_interrupted_and_exits_130(tmp_path):
    job = write_job(tmp_path / "runsig.toml", JOB)
    p = _start(tmp_path, job)
    lines = []
    try:
        read_until(p, "  step ", lines, timeout=240)
        p.send_signal(signal.SIGINT)
        t0 = time.time()
        out = "".join(lines) + p.communicate(timeout=240)[0]
        assert p.returncode == 130, out[-3000:]
        assert time.time() - t0 < 90
        assert "hpcps run: interrupted (SIGINT)" in out, out[-3000:]
        m = re.search(r"stop requested by signal at clock (\d+)", out)
        assert m, out[-3000:]
        assert ck.list_steps(tmp_path / "out")[-1] == int(m.group(1))
        assert "restart 1/" not in out
    finally:
        kill_session(p.pid)
        p.communicate()


def test_sigkill_of_hpcps_run_while_it_relaunches_takes_mpirun_down(tmp_path):
    """A rank is killed, ``hpcps run --max-restarts 2`` relaunches; once the new launch runs,
    ``hpcps run`` is killed with SIGKILL: its new mpirun and ranks must be gone within
    seconds (before: the mpirun went on without a parent)."""
    job = write_job(tmp_path / "runsig.toml", JOB)
    p = _start(tmp_path, job, "--max-restarts", "2")
    lines = []
    try:
        read_until(p, "  step ", lines, timeout=240)
        os.kill(rank_pids(job)[1], signal.SIGKILL)
        read_until(p, "restart 1/2", lines, timeout=120)
        deadline = time.time() + 120
        while len(rank_pids(job)) < 3 and time.time() < deadline:
            time.sleep(0.2)                         # the relaunch's ranks are up
        assert len(rank_pids(job)) == 3, "".join(lines)[-3000:]
        os.kill(p.pid, signal.SIGKILL)
        deadline = time.time() + 30
        while _job_pids(job) and time.time() < deadline:
            time.sleep(0.2)
        left = _job_pids(job)
        assert not left, f"still running after hpcps run was killed: {left}"
    finally:
        kill_session(p.pid)
        p.communicate()
