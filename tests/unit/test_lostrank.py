"""What ``hpcps run`` says after a lost rank ended the launch (:mod:`hpcps.runtime.lostrank`;
no MPI: mpirun is a stand-in script). Found by a scale trial: a rank killed (``kill -9``)
during the final checkpoint ended ``hpcps run`` with Open MPI's message alone."""

import os
import shutil
import stat
import sys
import time
import types
from pathlib import Path

from hpcps.cli.main import main
from hpcps.runtime import launch, lostrank
from tests.helpers import write_job

FORMAT1 = Path(__file__).resolve().parent.parent / "data" / "ckpt_format1" / "step-00000007"

#: Open MPI 5.0's message (help-prun.txt, prun:proc-aborted-strsignal), as prterun prints it
PRTERUN = """--------------------------------------------------------------------------
prterun noticed that process rank 3 with PID 12825 on node vm exited on
signal 9 (Killed).
--------------------------------------------------------------------------
"""
NONZERO = """--------------------------------------------------------------------------
prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-4242@1,2]
   Exit code:    1
--------------------------------------------------------------------------
"""
HYDRA = """===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   RANK 1 PID 777 RUNNING AT node7
=   KILLED BY SIGNAL: 9 (Killed)
===================================================================================
"""


def test_the_rank_mpirun_saw_end_is_read_from_its_message():
    assert lostrank.find_lost(f"other lines\n{PRTERUN}") == lostrank.Lost(3, signal=9, host="vm",
                                                                         pid=12825)
    assert lostrank.find_lost(NONZERO) == lostrank.Lost(2, status=1)
    assert lostrank.find_lost(HYDRA) == lostrank.Lost(1, signal=9, host="node7", pid=777)
    assert lostrank.find_lost("MPI_ABORT was invoked on rank 0\n") is None
    assert lostrank.Lost(3, signal=9, host="vm").how() == "killed by signal 9 (SIGKILL) on host vm"


def _cfg(mode="ps", servers=1, epochs=2, out=None):
    return types.SimpleNamespace(
        cluster=types.SimpleNamespace(mode=mode, servers=servers),
        train=types.SimpleNamespace(epochs=epochs), output=types.SimpleNamespace(dir=out),
        fault_tolerance=types.SimpleNamespace(mode="restart"))


def test_role_of_a_rank_in_each_mode():
    ps = _cfg(servers=2)
    assert [lostrank.role_of(ps, 5, r) for r in range(5)] == [
        "worker 0, the chief", "worker 1", "worker 2", "server 0", "server 1"]
    assert lostrank.role_of(_cfg("allreduce"), 3, 2) == "worker 2"
    sb = _cfg("sandblaster", servers=1)
    assert [lostrank.role_of(sb, 4, r) for r in range(4)] == [
        "the coordinator", "worker 0", "worker 1", "server 0"]


def _run_dir(tmp_path, epochs_done):
    """A run directory as a loss in the final checkpoint leaves it: a whole checkpoint of step
    7 (an earlier one), the final one of step 9 half written, ``metrics.json`` with
    ``epochs_done`` epochs, both written by "this launch"."""
    run = tmp_path / "run"
    shutil.copytree(FORMAT1, run / "ckpt" / "step-00000007")
    old = time.time() - 600
    for p in (run / "ckpt" / "step-00000007").iterdir():
        os.utime(p, (old, old))
    half = run / "ckpt" / "step-00000009"
    half.mkdir()
    (half / "shard-0001.h5").write_bytes(b"\0" * 64)
    (half / ".shard-0000.h5.ab12cd34.tmp").write_bytes(b"\0" * 64)
    (run / "metrics.json").write_text('{"epochs": [%s]}' % ", ".join(["{}"] * epochs_done))
    return run


def test_a_loss_in_the_final_checkpoint_names_the_rank_the_step_and_the_resume(tmp_path):
    run = _run_dir(tmp_path, epochs_done=2)
    since = time.time() - 60
    text = lostrank.explain(_cfg(epochs=2, out=run), 4, 137, PRTERUN, since,
                            "hpcps run -n 4 job.toml")
    assert text == (
        "hpcps run: rank 3 (server 0) was lost: killed by signal 9 (SIGKILL) on host vm, during "
        "the final checkpoint of step 9 (after the last epoch, 2 of 2); a lost rank stops the "
        "job in restart mode ([fault_tolerance] mode = \"restart\", the default).\n"
        "hpcps run: Checkpoint step-00000009 is incomplete (no manifest.h5 written; "
        ".shard-0000.h5.ab12cd34.tmp left by an interrupted write) and will be skipped; the run "
        f"resumes from checkpoint step-00000007, the newest whole one (in {run / 'ckpt'}), with:\n"
        "hpcps run:   hpcps run -n 4 job.toml\n"), text
    # hpcps run --max-restarts relaunches it itself
    text = lostrank.explain(_cfg(epochs=2, out=run), 4, 137, PRTERUN, since, "x", "restart 1/2")
    assert text.endswith("newest whole one (in %s): relaunching it now (restart 1/2).\n"
                         % (run / "ckpt")), text
    # the periodic checkpoint of a step inside the last epoch is not the final one
    text = lostrank.explain(_cfg(epochs=3, out=run), 4, 137, PRTERUN, since, "x")
    assert "during the checkpoint of step 9; a lost" in text, text


def test_a_loss_during_training_or_without_a_message(tmp_path):
    run = _run_dir(tmp_path, epochs_done=1)
    shutil.rmtree(run / "ckpt" / "step-00000009")
    since = time.time() - 60
    text = lostrank.explain(_cfg(epochs=3, out=run), 4, 137, PRTERUN, since, "hpcps run j.toml")
    assert "rank 3 (server 0) was lost: killed by signal 9 (SIGKILL) on host vm, during " \
           "training (epoch 2 of 3);" in text, text
    assert "hpcps run: The run resumes from checkpoint step-00000007" in text, text
    # a half-written checkpoint of an earlier launch is not this launch's
    text = lostrank.explain(_cfg(epochs=3, out=run), 4, 137, "", since, "x")
    assert text.startswith("hpcps run: a rank was lost (mpirun exited with status 137: a "
                           "process was killed by signal 9 (SIGKILL)), during training"), text
    # no message and no signal's status: nothing to say (the ranks said why they stopped)
    assert lostrank.explain(_cfg(out=run), 4, 1, "", since, "x") is None
    shutil.rmtree(run / "ckpt")
    text = lostrank.explain(_cfg(out=tmp_path / "none"), 4, 137, PRTERUN, since, "x")
    assert "No whole checkpoint in" in text and "the run starts afresh, with:" in text, text


def test_run_passes_mpiruns_stderr_on_and_keeps_its_end(capfd):
    code = "import sys; sys.stderr.write('a' * 100000 + 'THE END\\n'); raise SystemExit(5)"
    assert launch.run([sys.executable, "-c", code], {}) == 5
    assert launch.last["stderr"].endswith("a" * 100 + "THE END\n")
    assert len(launch.last["stderr"]) == launch.STDERR_TAIL_BYTES and launch.last["abort"] is None
    assert capfd.readouterr().err == "a" * 100000 + "THE END\n"


def test_hpcps_run_explains_a_rank_killed_in_the_final_checkpoint(tmp_path, capfd):
    """The whole launcher path with an mpirun stand-in that prints Open MPI's message and
    exits 137, as prterun does when a rank is killed (before: that message alone)."""
    run = _run_dir(tmp_path, epochs_done=1)
    job = write_job(tmp_path / "j.toml", f"""
name = "j"
[data]
format = "adult_csv"
path = "@DATA@"
max_rows = 500
[train]
epochs = 1
[output]
dir = "{run}"
""")
    fake = tmp_path / "mpirun"
    fake.write_text(f"#!{sys.executable}\nimport sys\nif '--version' in sys.argv:\n"
                    "    print('mpirun (Open MPI) 5.0.0'); sys.exit(0)\n"
                    f"sys.stderr.write({PRTERUN!r}); sys.exit(137)\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert main(["run", "-n", "4", "--mpirun", str(fake), str(job)]) == 137
    err = capfd.readouterr().err
    assert err.startswith(PRTERUN), err
    assert ("hpcps run: rank 3 (server 0) was lost: killed by signal 9 (SIGKILL) on host vm, "
            "during the final checkpoint of step 9 (after the last epoch, 1 of 1)") in err, err
    assert "Checkpoint step-00000009 is incomplete" in err and "will be skipped" in err, err
    assert f"hpcps run:   hpcps run -n 4 --mpirun {fake} {job}\n" in err, err
