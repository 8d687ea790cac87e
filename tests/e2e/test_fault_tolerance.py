"""Continuous fault tolerance (``[fault_tolerance] mode = "continue"``, ULFM): real ranks,
real ``kill -9``, launched with ``hpcps run`` (which adds ``--with-ft ulfm``).

* a worker killed mid-epoch under BSP and under async: the job finishes without a restart,
  the servers applied every example of every epoch exactly once (their count), test AUC
  within 0.005 of the same job without a failure;
* a worker then a server, with ``on_server_loss = "restart"``: the worker is survived in
  place; the server's loss stops the job (its key range has no copy, and the job asks for a
  restart), which ``--max-restarts`` relaunches from the last checkpoint to the end.
"""

import json
import socket
import time

import pytest

from tests.helpers import DATA, hpcps, kill_rank, read_until, start_run

JOB = """
name = "{name}"
[cluster]
servers = {servers}
[data]
format = "adult_csv"
path = "{data}"
max_rows = {rows}
[model]
l2 = 1e-5
[train]
epochs = 2
batch_size = 32
progress_seconds = 0.000001
[consistency]
model = "{model}"
[checkpoint]
every_steps = {every}
[fault_tolerance]
mode = "continue"
on_server_loss = "{on_loss}"
[output]
dir = "{name}"
"""
ROWS = 12000


def write(tmp_path, name, model="bsp", every=0, servers=1, on_loss=None):
    p = tmp_path / f"{name}.toml"
    on_loss = on_loss or ("restart" if model == "async" else "reload")
    p.write_text(JOB.format(name=name, data=DATA, rows=ROWS, model=model, every=every,
                            servers=servers, on_loss=on_loss))
    return p


def metrics(tmp_path, name):
    return json.loads((tmp_path / name / "metrics.json").read_text())


def start(tmp_path, job, *extra):
    return start_run(tmp_path, job, 4, *extra)


@pytest.mark.parametrize("model", ["bsp", "async"])
def test_worker_killed_mid_epoch_job_finishes_every_example_once(tmp_path, model):
    ref = write(tmp_path, "ref", model)
    proc, _ = hpcps(["run", "-n", "4", ref], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--with-ft ulfm" in proc.stdout
    m_ref = metrics(tmp_path, "ref")
    n_train_epochs = m_ref["summary"]["servers"][0]["examples"]
    assert n_train_epochs == m_ref["summary"]["examples"] > 0

    job = write(tmp_path, "kill", model)
    p = start(tmp_path, job)
    lines: list = []
    read_until(p, "epoch 1/2  step 20/", lines)
    kill_rank(job, 2)                                  # worker 2, mid-epoch 1
    out, _ = p.communicate(timeout=300)
    out = "".join(lines) + out
    assert p.returncode == 0, out[-3000:]
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


def test_worker_then_server_lost_server_loss_restarts_from_checkpoint(tmp_path):
    job = write(tmp_path, "two", every=40, servers=2, on_loss="restart")
    p = start(tmp_path, job, "--max-restarts", "1")
    lines: list = []
    read_until(p, "epoch 1/2  step 20/", lines)
    kill_rank(job, 1)                                  # a worker: survived in place
    read_until(p, "worker(s) continue", lines)
    read_until(p, "epoch 2/2  step", lines)
    t_kill = time.time()
    kill_rank(job, 3)                                  # server 1: stop, relaunch, resume
    read_until(p, "ServerLost", lines)
    assert time.time() - t_kill < 60                   # no hang after the server's loss
    out, _ = p.communicate(timeout=300)
    out = "".join(lines) + out
    assert p.returncode == 0, out[-3000:]
    assert "restart 1/1" in out and "resumed from checkpoint step" in out, out[-3000:]
    m = metrics(tmp_path, "two")
    assert [r["epoch"] for r in m["epochs"]][-1] == 2 and m["epochs"][-1]["test_auc"] > 0.88
