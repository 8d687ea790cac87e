"""Continuous fault tolerance (``[fault_tolerance] mode = "continue"``, ULFM): real ranks,
real ``kill -9``, under ``mpirun --with-ft ulfm`` (the reference runs and the relaunch with
``hpcps run``, which adds it).

* a worker killed mid-epoch under BSP and under async: the job finishes without a restart,
  the servers applied every example of every epoch exactly once (their count), test AUC
  within 0.005 of the same job without a failure;
* a worker then a server, with ``on_server_loss = "restart"``: the worker is survived in
  place; the server's loss stops the job (its key range has no copy, and the job asks for a
  restart) with a status that ``--max-restarts`` relaunches, and a relaunch resumes from the
  last checkpoint and runs to the end.

Every kill lands at a known clock while the workers wait (``tests/tools/pause_driver.py``,
:func:`tests.helpers.kill_while_paused`): a kill sent when a line of the piped output shows up
can land after the last step of a fast run.
"""

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcps import checkpoint as ckpt
from hpcps.core.exitcodes import restartable
from tests.helpers import (ROOT, finish, hpcps, kill_rank, kill_session, kill_while_paused,
                           mpi_env, mpirun, wait_paused, write_continue_job)

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

RANKS = 4


def write(tmp_path, name, model="bsp", every=0, servers=1, on_loss=None):
    on_loss = on_loss or ("restart" if model == "async" else "reload")
    return write_continue_job(tmp_path, name, servers=servers, consistency=model, every=every,
                              fault_tolerance=f'on_server_loss = "{on_loss}"')


def metrics(tmp_path, name):
    return json.loads((tmp_path / name / "metrics.json").read_text())


@pytest.mark.parametrize("model", ["bsp", "async"])
def test_worker_killed_mid_epoch_job_finishes_every_example_once(tmp_path, model):
    ref = write(tmp_path, "ref", model)
    proc, _ = hpcps(["run", "-n", str(RANKS), ref], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--with-ft ulfm" in proc.stdout
    m_ref = metrics(tmp_path, "ref")
    n_train_epochs = m_ref["summary"]["servers"][0]["examples"]
    assert n_train_epochs == m_ref["summary"]["examples"] > 0

    job = write(tmp_path, "kill", model)
    # worker 2 (rank 2) at clock 20 of epoch 1's 100, while every worker waits
    code, out, _ = kill_while_paused(tmp_path, job, RANKS, [(20, 2, 3)])
    assert code == 0, out[-3000:]
    assert "worker(s) 2 (rank(s) 2) lost" in out and "2 worker(s) continue" in out, out[-3000:]
    assert "restart" not in out
    m = metrics(tmp_path, "kill")
    s = m["summary"]
    # the servers applied every example of both epochs exactly once (nothing lost, nothing twice)
    assert s["servers"][0]["examples"] == n_train_epochs
    (event,) = s["failures"]
    assert event["dead_workers"] == [2] and event["failed_ranks"] == [2]
    assert event["examples_reassigned"] > 0 and event["survivors"] == 2
    assert event["failed_hosts"] == [socket.gethostname()]       # one node: the host of rank 2
    # the run's count is the servers' (the survivors alone did not see the dead worker's steps)
    assert s["examples"] == n_train_epochs
    assert 0 < s["examples_counted_by_surviving_workers"] < n_train_epochs
    # last step before the failure -> first step after the recovery (on the chief)
    assert 0 < event["recovery_seconds"] <= event["gap_seconds"] < 120
    assert [r["epoch"] for r in m["epochs"]] == [1, 2]
    assert abs(m["epochs"][-1]["test_auc"] - m_ref["epochs"][-1]["test_auc"]) <= 0.005
    # the summary repeats the loss (a trial: the lines printed at the failure scrolled away)
    assert "  failures: 1 survived (continue mode; metrics.json summary.failures)" in out
    assert (f"): worker 2 lost (rank 2, on {socket.gethostname()}); 2 worker(s) continue, "
            f"{event['examples_reassigned']:,} unread example(s) of the epoch reassigned; "
            "recovered in ") in out, out[-3000:]
    # the progress lines after the re-plan go on with the epoch's steps (they restarted at
    # "step 1" of the rest of the epoch) and give the rate since it
    after = out[out.index("worker(s) 2 (rank(s) 2) lost"):]
    step = re.search(r"epoch 1/2  step (\d+)/(\d+)  clock", after)
    assert step and 20 < int(step.group(1)) < int(step.group(2)), after[:2000]
    assert f"since the re-plan at clock {event['clock']})" in after, after[:2000]


def test_worker_then_server_lost_server_loss_restarts_from_checkpoint(tmp_path):
    job = write(tmp_path, "two", every=40, servers=2, on_loss="restart")
    # worker 1 (rank 1) at clock 20: survived in place; worker 0 alone then ends epoch 1 at
    # clock 20 + (9600 - 20 * 64) / 32 = 280; server 1 (rank 3) at clock 300, in epoch 2
    code, out, kill_times = kill_while_paused(tmp_path, job, RANKS, [(20, 1, 2), (300, 3, 1)])
    assert time.time() - kill_times[-1] < 60           # no hang after the server's loss
    assert "worker(s) 1 (rank(s) 1) lost" in out and "worker(s) continue" in out, out[-3000:]
    assert "ServerLost" in out, out[-3000:]
    # the job stopped for a restart: a status that `hpcps run --max-restarts` relaunches
    assert code != 0 and restartable(code), out[-3000:]
    proc, _ = hpcps(["run", "-n", str(RANKS), "--max-restarts", "1", job], cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "resumed from checkpoint step" in proc.stdout, proc.stdout[-3000:]
    # the summary lists the two launches (the relaunch resumed the first's checkpoint)
    assert "  launches: 2 (metrics.json summary.launches)" in proc.stdout, proc.stdout[-3000:]
    assert re.search(r"    launch 2 started [-\d]+ [:\d]+ UTC, resumed at step \d+ \(this "
                     r"launch\)", proc.stdout), proc.stdout[-3000:]
    m = metrics(tmp_path, "two")
    assert [r["epoch"] for r in m["epochs"]][-1] == 2 and m["epochs"][-1]["test_auc"] > 0.88


def _ulfm_driver(tmp_path, ranks: int, driver: str, args, during=None) -> str:
    """Launch ``tests/tools/DRIVER`` with ``args`` on ``ranks`` ranks under ``mpirun --with-ft
    ulfm`` in ``tmp_path``, call ``during(p)`` while it runs, and return its output (the
    launch must end with status 0 within 300 s; its processes are killed otherwise)."""
    cmd = [mpirun(), "-n", str(ranks), "--with-ft", "ulfm", sys.executable,
           str(ROOT / "tests" / "tools" / driver)] + [str(a) for a in args]
    p = subprocess.Popen(cmd, cwd=tmp_path, env=mpi_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        if during is not None:
            during(p)
        out = finish(p, timeout=300)
    finally:
        if p.poll() is None:
            kill_session(p.pid)
            p.wait()
    assert p.returncode == 0, out[-3000:]
    return out


def _replan_race(tmp_path, job, ranks: int, second_victim: int):
    """Run ``job`` on ``ranks`` ranks (4 workers first) under
    ``tests/tools/replan_race_driver.py``: worker 3 killed at clock 20, then world rank
    ``second_victim`` while survivor 2 waits inside its re-plan (workers 0 and 1 then have
    taken step 20). Returns the run's metrics summary (the job must end with status 0)."""
    flag = tmp_path / "go"

    def kills(p):
        for name, alive, victim in ((flag, 4, 3), (Path(f"{flag}-regroup"), 1, second_victim)):
            wait_paused(p, name, alive, f"at {name.name}")
            time.sleep(1.0)             # the others take their step and wait for the next pull
            kill_rank(job, victim, b"replan_race_driver.py")
            name.touch()

    _ulfm_driver(tmp_path, ranks, "replan_race_driver.py", [job, 20, 2, flag], during=kills)
    return metrics(tmp_path, job.stem)["summary"]


def test_second_worker_lost_while_a_survivor_is_still_replanning_every_example_once(tmp_path):
    """Two workers lost one after the other, the second while one survivor of the first is
    still inside the re-plan (``regroup``) and the others have taken the new segment's first
    step: every survivor must plan the rest of the epoch from the same steps done (in the
    clean-clone CI of 5c893d3 they did not: 10 examples of an epoch applied twice).
    ``tests/tools/replan_race_driver.py`` holds survivor 2 there."""
    # 4 workers (ranks 0-3) and the server (rank 4); the second loss: worker 1
    s = _replan_race(tmp_path, write(tmp_path, "race"), 5, 1)
    first, second = s["failures"]
    assert first["dead_workers"] == [3] and second["dead_workers"] == [1], s["failures"]
    # workers 0 and 1 took the segment's first step, survivor 2 none
    assert second["worker_steps_done"] == [1, 1, 0], second
    assert s["servers"][0]["examples_per_epoch"] == [9600, 9600]     # 12000 rows, 20% test


def test_server_lost_while_a_survivor_is_still_replanning_job_finishes_every_example_once(
        tmp_path):
    """A worker lost, then a server (replicas 2: its range goes on from its backup) while one
    survivor is still inside its re-plan and the others run the new segment: that survivor
    re-plans again and catches up with no collective of its own (before, it re-ran the
    re-plan's Allreduce while the others were in their per-step votes)."""
    job = write_continue_job(tmp_path, "srace", servers=2,
                             fault_tolerance='replicas = 2\non_server_loss = "restart"')
    # 4 workers (ranks 0-3), servers 0 and 1 (ranks 4, 5); the second loss: server 1
    s = _replan_race(tmp_path, job, 6, 5)
    first, second = s["failures"]
    assert first["dead_workers"] == [3] and second["dead_servers"] == [1], s["failures"]
    assert not second["dead_workers"]
    assert s["servers"][0]["examples_per_epoch"] == [9600, 9600]


def _lost_at_end(tmp_path, job, ranks: int, where: str, victim: int):
    """Run ``job`` on ``ranks`` ranks under ``tests/tools/end_loss_driver.py``: world rank
    ``victim`` killed after the last step, where it enters ``where``. Returns the run's
    metrics (the job must end with status 0) and its output."""
    out = _ulfm_driver(tmp_path, ranks, "end_loss_driver.py", [job, where, victim])
    return metrics(tmp_path, job.stem), out


@pytest.mark.parametrize("where,victim", [("finish", 2), ("finish", 0), ("report", 1)])
def test_worker_lost_after_the_last_step_job_finishes_from_the_survivors(tmp_path, where,
                                                                         victim):
    """A worker lost after the last step (found in the CI of 9a7fe05: MPI_ERR_PROC_FAILED out of
    the final checkpoint): while the survivors write the final checkpoint and add up the
    totals (``finish``; worker 0 is the chief, who writes it), or after every worker sent STOP
    while the ranks gather the report (``report``). The survivors recover and finish: status 0,
    every example of both epochs applied once, the final checkpoint and the model written."""
    job = write(tmp_path, f"end{where}{victim}")
    # 4 workers (ranks 0-3) and the server (rank 4)
    m, out = _lost_at_end(tmp_path, job, 5, where, victim)
    s = m["summary"]
    (event,) = s["failures"]
    assert event["dead_workers"] == [victim] and event["examples_reassigned"] == 0, event
    assert s["servers"][0]["examples_per_epoch"] == [9600, 9600]     # 12000 rows, 20% test
    assert s["examples"] == 19200 and s["steps"] == 2 * 75, s
    run = tmp_path / job.stem
    ckpt.verify(ckpt.step_dir(run, 150))              # the final checkpoint, complete
    assert ckpt.read_manifest(ckpt.step_dir(run, 150))["step"] == 150
    assert (run / "model.h5").is_file(), sorted(p.name for p in run.iterdir())
    assert [r["epoch"] for r in m["epochs"]] == [1, 2]


def test_server_lost_after_the_last_step_job_finishes_from_its_backup(tmp_path):
    """A server lost (replicas 2) after every worker sent STOP, while the ranks gather the
    report: its range goes on from its backup, the workers finish again on the survivors."""
    job = write_continue_job(tmp_path, "endsrv", servers=2,
                             fault_tolerance='replicas = 2\non_server_loss = "restart"')
    # 4 workers (ranks 0-3), servers 0 and 1 (ranks 4, 5)
    m, out = _lost_at_end(tmp_path, job, 6, "report", 5)
    s = m["summary"]
    (event,) = s["failures"]
    assert event["dead_servers"] == [1] and not event["dead_workers"], event
    assert s["servers"][0]["examples_per_epoch"] == [9600, 9600]
    assert (tmp_path / "endsrv" / "model.h5").is_file()


def test_compiled_request_notices_a_failed_server_and_abandons_its_buffers():
    """Continue mode runs the compiled request path (one call: pack, send, wait for the
    reply) with a wait that probes the watched communicator: a worker waiting there for a
    server that died raises a peer failure (the recovery's cue) within seconds instead of
    waiting for ever, and never reuses the buffers MPI may still hold."""
    driver = ROOT / "tests" / "tools" / "watched_request_driver.py"
    p = subprocess.run([mpirun(), "-n", "2", "--with-ft", "ulfm", sys.executable, str(driver)],
                       env=mpi_env(), capture_output=True, text=True, timeout=120)
    line = [x for x in p.stdout.splitlines() if x.startswith(("FAILED", "NO-FAILURE"))]
    assert line, (p.stdout + p.stderr)[-3000:]
    word, peer, seconds, fresh, orphans = line[0].split()
    assert word == "FAILED" and peer == "True", line
    assert float(seconds) < 30 and fresh == "True" and int(orphans) >= 1, line
