"""Stop signals: any rank's SIGTERM/SIGUSR1 makes every worker checkpoint within one step and
the job exit with status 75 (requeue); the next launch resumes from that checkpoint."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from hpcps import checkpoint as ck
from tests.e2e.test_restart import rank_pids
from tests.helpers import hpcps, mpi_env, write_job

JOB = """
name = "sig"
seed = 2
[data]
format = "adult_csv"
path = "@DATA@"
max_rows = 20000
hash_bits = 14
[model]
dtype = "float64"
[train]
epochs = 2
batch_size = 16
progress_seconds = 0.5
[output]
dir = "out"
"""


def start(tmp_path):
    job = write_job(tmp_path / "sig.toml", JOB)
    p = subprocess.Popen([sys.executable, "-m", "hpcps", "run", "-n", "4", str(job)], cwd=tmp_path,
                         env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in p.stdout:                      # wait until training runs
        lines.append(line)
        if line.startswith("epoch 1/2  step"):
            break
    return job, p, lines


@pytest.mark.parametrize("how", ["SIGTERM to hpcps run", "SIGUSR1 to worker rank 1",
                                 "SIGTERM to the server rank"])
def test_stop_signal_checkpoints_exits_75_and_resumes(tmp_path, how):
    job, p, lines = start(tmp_path)
    if how.startswith("SIGTERM to hpcps"):
        p.send_signal(signal.SIGTERM)
    elif "worker" in how:
        os.kill(rank_pids(job)[1], signal.SIGUSR1)
    else:                                      # a server's signal is not seen by the workers
        os.kill(rank_pids(job)[3], signal.SIGTERM)
        os.kill(rank_pids(job)[2], signal.SIGTERM)
    t0 = time.time()
    out = "".join(lines) + p.communicate(timeout=300)[0]
    assert p.returncode == 75, out[-3000:]
    assert time.time() - t0 < 60
    m = re.search(r"stop requested by signal at clock (\d+)", out)
    assert m, out[-3000:]
    clock = int(m.group(1))
    assert ck.list_steps(tmp_path / "out")[-1] == clock
    assert ck.verify(ck.step_dir(tmp_path / "out", clock))["step"] == clock
    proc, _ = hpcps(["run", "-n", "4", job], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"resumed from checkpoint step {clock} " in proc.stdout
