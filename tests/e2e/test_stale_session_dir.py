"""A session directory left by a killed ``mpirun`` (Open MPI 5): the cause of the exit status
213 that once failed a test launch in CI, and ``hpcps run``'s removal of such directories
(:func:`hpcps.runtime.launch.clear_stale_session_dir`).

Real launches: an ``mpirun`` is killed with SIGKILL and leaves its session directory with its
PMIx rendezvous files; those files are then put where a new ``mpirun`` looks for its own,
which is what a reused process id does.
"""

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcps.runtime import launch
from tests.helpers import kill_session, mpi_env, mpirun

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

#: Writes the old mpirun's files under its own pid, then execs mpirun (which keeps the pid).
SHIM = r"""
import os, shutil, sys
src, old_pid, base = sys.argv[1:4]
d = os.path.join(base, f"ompi.{os.getpid()}")
os.makedirs(d)
for name in os.listdir(src):
    shutil.copyfile(os.path.join(src, name), os.path.join(d, name.replace(old_pid, str(os.getpid()))))
os.execv(sys.argv[4], sys.argv[4:])
"""


@pytest.fixture
def leftovers(tmp_path):
    """(base, a copy of the rendezvous files a SIGKILLed mpirun left in BASE/ompi.<pid>, pid)."""
    base = tmp_path / "base"
    base.mkdir()
    env = mpi_env(PRTE_MCA_prte_tmpdir_base=str(base))
    p = subprocess.Popen([mpirun(), "-n", "1", "sleep", "60"], env=env, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    d = base / f"ompi.{p.pid}"
    try:
        deadline = time.time() + 60
        while len(list(d.glob("pmix.vm.tool*"))) < 3 and time.time() < deadline:
            time.sleep(0.05)
    finally:
        kill_session(p.pid)
        p.wait()
    tools = sorted(d.glob("pmix.vm.tool*"))
    assert len(tools) == 3, sorted(d.iterdir()) if d.exists() else "no session directory"
    saved = tmp_path / "left"
    saved.mkdir()
    for f in tools:
        shutil.copy(f, saved / f.name)
    shutil.rmtree(d)
    return base, saved, p.pid


def mpirun_cmd():
    return [mpirun(), "-n", "2", sys.executable, "-c", "pass"]


@pytest.mark.timeout(300)
def test_leftover_session_dir_of_a_reused_pid_makes_mpirun_exit_213_once(leftovers):
    base, saved, old_pid = leftovers
    env = mpi_env(PRTE_MCA_prte_tmpdir_base=str(base))
    p = subprocess.run([sys.executable, "-c", SHIM, str(saved), str(old_pid), str(base),
                        *mpirun_cmd()], env=env, timeout=120, capture_output=True, text=True)
    assert p.returncode == 213, p.stdout + p.stderr
    assert "listener thread failed to start" in p.stdout + p.stderr
    assert list(base.iterdir()) == []        # the failed mpirun removed it: one failure only


def next_pids(k: int) -> list:
    """The ``k`` process ids Linux hands out next (when nothing else starts meanwhile)."""
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    top = int(Path("/proc/sys/kernel/pid_max").read_text())
    out, p = [], last
    for _ in range(k):
        p = p + 1 if p + 1 < top else 301            # ids wrap past the kernel's first 300
        out.append(p)
    return out


@pytest.mark.timeout(300)
def test_hpcps_run_removes_a_leftover_under_its_pid_before_mpirun_starts(leftovers, capfd):
    base, saved, old_pid = leftovers
    # the leftover under every process id the launch may get (this machine starts a few
    # hundred processes a second at most)
    pids = next_pids(5000)
    for pid in pids:
        d = base / f"ompi.{pid}"
        d.mkdir()
        for f in saved.iterdir():
            shutil.copyfile(f, d / f.name.replace(str(old_pid), str(pid)))
    rc = launch.run(mpirun_cmd(), mpi_env(PRTE_MCA_prte_tmpdir_base=str(base)))
    err = capfd.readouterr().err
    gone = [pid for pid in pids if not (base / f"ompi.{pid}").exists()]
    if not gone and rc == 213:
        pytest.fail(f"mpirun stopped on a leftover that hpcps run did not remove:\n{err}")
    if not gone:
        pytest.skip("the launch's process id was outside the 5000 prepared (a busy machine)")
    assert rc == 0, err
    assert len(gone) == 1, gone
    assert f"hpcps run: removed {base / f'ompi.{gone[0]}'}, left by an earlier mpirun" in err
