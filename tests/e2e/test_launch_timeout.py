"""A test launch that times out leaves no rank behind (tests/helpers.run_in_session): prterun
gives each rank its own process group, so killing mpirun's group used to orphan them."""

import subprocess
import sys
import time

import pytest

from tests.helpers import mpi_env, mpirun, run_in_session, session_pids

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)


def test_timed_out_launch_kills_every_rank(tmp_path, monkeypatch):
    cmd = [mpirun(), "-n", "2", sys.executable, "-c",
           "import time; from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); time.sleep(120)"]
    seen = []

    def spy(*a, **k):                       # remember the session (= the launcher's pid)
        p = real_popen(*a, **k)
        seen.append(p.pid)
        return p
    real_popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", spy)
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_session(cmd, cwd=tmp_path, env=mpi_env(), timeout=15)
    deadline = time.time() + 10
    while session_pids(seen[0]) and time.time() < deadline:
        time.sleep(0.2)
    assert session_pids(seen[0]) == []
