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
from tests.helpers import mpi_env, rank_pids, write_job

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

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
epochs = 200
batch_size = 16
progress_seconds = 0.3
[output]
dir = "out"
"""


def start(job, cwd, wait_for="  step "):
    """Launch the (long: 200 epochs) job; return once a line containing ``wait_for`` shows."""
    p = subprocess.Popen([sys.executable, "-m", "hpcps", "run", "-n", "4", str(job)], cwd=cwd,
                         env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in p.stdout:
        lines.append(line)
        if wait_for in line:
            break
    return p, lines


@pytest.mark.parametrize("how", ["SIGTERM to hpcps run", "SIGUSR1 to worker rank 1",
                                 "SIGTERM to the server rank"])
def test_stop_signal_checkpoints_exits_75_and_resumes(tmp_path, how):
    job = write_job(tmp_path / "sig.toml", JOB)
    p, lines = start(job, tmp_path)
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
    # the next launch resumes there; stop it again the same way
    p, lines = start(job, tmp_path, wait_for="resumed from checkpoint step")
    assert f"resumed from checkpoint step {clock} " in lines[-1], "".join(lines)[-3000:]
    p.send_signal(signal.SIGTERM)
    out = "".join(lines) + p.communicate(timeout=300)[0]
    assert p.returncode == 75, out[-3000:]


@pytest.mark.parametrize("model", ["ssp", "async"])
def test_stop_signal_under_ssp_and_async_without_lockstep(tmp_path, model):
    """Under SSP/async the workers vote without waiting for each other every step; a signal to
    one worker still stops all of them at one clock, with a checkpoint they resume from."""
    extra = {"ssp": 'model = "ssp"\nstaleness = 2\n', "async": 'model = "async"\n'}[model]
    job = write_job(tmp_path / "sig.toml", JOB + "[consistency]\n" + extra)
    p, lines = start(job, tmp_path)
    os.kill(rank_pids(job)[1], signal.SIGUSR1)
    out = "".join(lines) + p.communicate(timeout=300)[0]
    assert p.returncode == 75, out[-3000:]
    clock = int(re.search(r"stop requested by signal at clock (\d+)", out).group(1))
    # SSP: a clock cut; async: every push sent before the cut applied (push counts)
    assert ck.list_steps(tmp_path / "out")[-1] == clock
    m = ck.verify(ck.step_dir(tmp_path / "out", clock))
    if model == "async":
        assert min(m["workers"]["last_push_seq"]) > 0
    p, lines = start(job, tmp_path, wait_for="resumed from checkpoint step")
    assert f"resumed from checkpoint step {clock} " in lines[-1], "".join(lines)[-3000:]
    p.send_signal(signal.SIGTERM)
    out = "".join(lines) + p.communicate(timeout=300)[0]
    # status 1 once in the clean-clone CI of 6f59b37 (0 of 30 local runs): the output says why
    assert p.returncode == 75, out[-3000:]
