"""Continue mode through the loss of a server (``[fault_tolerance] mode = "continue"``, ULFM):
real ``mpirun --with-ft ulfm`` launches, real ``kill -9``, 3 workers + 3 servers.

* ``replicas = 2``, deterministic BSP in float64: a server killed mid-epoch (at clock 40,
  while every worker waits: :func:`tests.helpers.kill_while_paused`, as every kill here);
  its backup takes the key range over; the final model and the final checkpoint (rows and
  optimizer state) are bit-identical to an uninterrupted run;
* a worker, then a server: both survived; every key range applied every training example of
  every epoch exactly once (the ranges' own counts);
* a server, then 2 workers added: the added workers learn where each key range lives, and
  every range still applies every example once;
* ``replicas = 1``: the lost range is reloaded from the last checkpoint; every worker waits at
  a known clock while the server is killed, so the steps lost are known exactly:
  ``kill clock - checkpoint step``, and the range's example count is short by exactly the
  examples of those steps.
"""

import json
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.helpers import finish, kill_while_paused, start_run, write_continue_job

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

RANKS = 6                      # 3 workers (ranks 0-2) + 3 servers (ranks 3-5)
EXAMPLES = 2 * 9600            # 2 epochs of the 9600 training rows (80 % of 12000)
STEP_EXAMPLES = 3 * 32         # every step is full: 3200 rows per worker, batch 32
SERVER1 = 4                    # world rank of server 1


def write(tmp_path, name, replicas=2, every=0, extra=""):
    return write_continue_job(tmp_path, name, servers=3, every=every, seed=3, dtype="float64",
                              fault_tolerance=f"replicas = {replicas}", extra=extra)


def metrics(tmp_path, name):
    return json.loads((tmp_path / name / "metrics.json").read_text())


def paused(tmp_path, job, kills):
    """:func:`tests.helpers.kill_while_paused` on this file's 6 ranks: (exit status, output)."""
    code, out, _ = kill_while_paused(tmp_path, job, RANKS, kills)
    return code, out


def arrays(run_dir: Path) -> dict:
    """Every table of the model file and every dataset of the final checkpoint's shards."""
    out = {}
    with h5py.File(run_dir / "model.h5", "r") as f:
        for k in f:
            out[f"model/{k}"] = f[k][()]
    steps = sorted((run_dir / "ckpt").glob("step-*"))
    for shard in sorted(steps[-1].glob("shard-*.h5")):
        with h5py.File(shard, "r") as f:
            f.visititems(lambda n, o: out.__setitem__(f"{shard.name}/{n}", o[()])
                         if isinstance(o, h5py.Dataset) else None)
    return out


def check_every_example_once(s, run_dir=None):
    """Every key range applied each training example of each epoch once (its own count); with
    ``run_dir``, every shard of the last checkpoint keeps that per epoch too (the attribute a
    resumed launch counts on from: a range taken over by its backup restarted it at the
    takeover, found while checking a trial's report)."""
    assert [r["examples"] for r in s["ranges"]] == [EXAMPLES] * 3, s["ranges"]
    assert [r["lost_steps"] for r in s["ranges"]] == [0, 0, 0]
    if run_dir is not None:
        last = sorted((run_dir / "ckpt").glob("step-*"))[-1]
        for shard in sorted(last.glob("shard-*.h5")):
            with h5py.File(shard, "r") as f:
                got = json.loads(f.attrs["examples_per_epoch"])
            assert got == {"0": EXAMPLES // 2, "1": EXAMPLES // 2}, (shard.name, got)


@pytest.mark.timeout(600)
def test_server_killed_backup_takes_over_bit_identical(tmp_path):
    ref = write(tmp_path, "ref")
    p = start_run(tmp_path, ref, RANKS, "--resume", "never")
    out = finish(p)
    assert p.returncode == 0, out[-3000:]
    assert "--with-ft ulfm" in out
    check_every_example_once(metrics(tmp_path, "ref")["summary"])

    job = write(tmp_path, "kill")
    code, out = paused(tmp_path, job, [(40, SERVER1, 3)])      # server 1 at clock 40
    assert code == 0, out[-3000:]
    assert "server(s) 1 (rank(s) 4) lost" in out, out[-3000:]
    assert "key range 1 taken over by server 2 from its backup copy" in out
    assert "restart" not in out
    s = metrics(tmp_path, "kill")["summary"]
    (event,) = s["failures"]
    assert event["dead_servers"] == [1] and event["dead_workers"] == []
    assert event["ranges_moved"] == {"1": 2} and event["ranges_reloaded"] == []
    # server 2 serves ranges 1 and 2 (backed up by server 0), server 0 range 0 (backed up by 2)
    assert event["backups"] == {"0": 2, "1": 0, "2": 0}
    assert 0 < event["recovery_seconds"] <= event["gap_seconds"] < 60
    assert [r["server"] for r in s["ranges"]] == [0, 2, 2]
    check_every_example_once(s, tmp_path / "kill")
    a, b = arrays(tmp_path / "ref"), arrays(tmp_path / "kill")
    assert sorted(a) == sorted(b) and len(a) > 10
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
    assert a["model/weights"].dtype == np.float64 and np.count_nonzero(a["model/weights"]) > 1000


@pytest.mark.timeout(600)
def test_worker_then_server_killed_every_example_once(tmp_path):
    job = write(tmp_path, "two")
    # worker 1 at clock 20 (epoch 1), then server 1 at clock 200: epoch 2 (with 2 workers
    # the rest of epoch 1 ends at clock 20 + 7680 / 64 = 140)
    code, out = paused(tmp_path, job, [(20, 1, 3), (200, SERVER1, 2)])
    assert code == 0, out[-3000:]
    assert "key range 1 taken over by server 2" in out, out[-3000:]
    m = metrics(tmp_path, "two")
    s = m["summary"]
    first, second = s["failures"]
    # (how many of its rows were reassigned depends on how far the worker got before the kill
    # landed: test_fault_tolerance.py checks the reassignment itself)
    assert first["dead_workers"] == [1] and first["dead_servers"] == []
    assert second["dead_workers"] == [] and second["dead_servers"] == [1]
    assert second["epoch"] == 2 and second["survivors"] == 2
    check_every_example_once(s, tmp_path / "two")
    assert [r["epoch"] for r in m["epochs"]] == [1, 2] and m["epochs"][-1]["test_auc"] > 0.88


@pytest.mark.timeout(600)
def test_server_killed_then_workers_added_every_example_once(tmp_path):
    """Growth after a server loss: the added workers learn from the join plan which rank
    holds each key range (server 2 holds ranges 1 and 2), and every range still applies every
    example of every epoch once."""
    job = write(tmp_path, "grow", extra="[elastic]\nadd_workers = 2\nat_step = 60\n")
    code, out = paused(tmp_path, job, [(30, SERVER1, 3)])
    assert code == 0, out[-3000:]
    assert "key range 1 taken over by server 2" in out, out[-3000:]
    assert "worker(s) added at clock 60" in out, out[-3000:]
    s = metrics(tmp_path, "grow")["summary"]
    (event,) = s["failures"]
    # the kill lands while every worker waits at clock 30; a worker notices it when a send of
    # that step fails or, since step 30's pushes leave with its CLOCK unanswered (step
    # folding), at the pull of step 31
    assert event["dead_servers"] == [1] and event["clock"] in (30, 31), event
    assert s["growth"][0]["workers"] == 5 and len(s["workers"]) == 5
    assert [r["server"] for r in s["ranges"]] == [0, 2, 2]
    check_every_example_once(s)
    # the summary repeats the loss and the growth (a trial: their lines had scrolled away)
    assert "  failures: 1 survived (continue mode, 2 copies of each key range; " in out, out[-3000:]
    assert re.search(r"    clock 3[01] \(epoch 1\): server 1 lost \(rank 4, on \S+\); key range 1 "
                     r"taken over by server 2 \(its backup copy\); recovered in \d", out), out[-3000:]
    assert "  growth: 1 growth, workers 3 -> 5 (metrics.json summary.growth)" in out
    assert "    clock 60 (epoch 1): 2 worker(s) added ([elastic] at_step): 3 -> 5 workers; " in out
    # the progress line goes on with the epoch's steps after the re-plan (it said "step 1/24")
    # and gives the rate since it
    assert re.search(r"epoch 1/2  step 61/84  clock 61 ", out), out[-3000:]
    assert "since the re-plan at clock 60)" in out


@pytest.mark.timeout(600)
def test_server_killed_without_replica_range_reloaded_steps_lost_reported(tmp_path):
    every, kill_clock = 20, 50
    job = write(tmp_path, "reload", replicas=1, every=every)
    code, out = paused(tmp_path, job, [(kill_clock, SERVER1, 3)])
    assert code == 0, out[-3000:]
    k = kill_clock // every * every                    # the newest checkpoint before the kill
    assert (tmp_path / "reload" / "ckpt" / f"step-{k:08d}" / "manifest.h5").exists()
    lost = kill_clock - k
    assert (f"key range 1 had no copy left: reloaded from checkpoint step {k} onto server 2; "
            f"{lost} step(s) of updates to that range lost (steps {k}..{kill_clock - 1}), it "
            f"resumes at clock {kill_clock}") in out, out[-3000:]
    s = metrics(tmp_path, "reload")["summary"]
    (event,) = s["failures"]
    assert event["reload_step"] == k and event["ranges_reloaded"] == [1]
    assert event["lost_steps"] == {"1": lost} and event["resumed_at"] == {"1": kill_clock}
    # the summary repeats it, with the steps lost
    assert re.search(rf"    clock {event['clock']} \(epoch 1\): server 1 lost \(rank 4, on \S+\); "
                     rf"key range 1 reloaded from checkpoint step {k}, {lost} steps of its "
                     r"updates lost; recovered in ", out), out[-3000:]
    assert [r["lost_steps"] for r in s["ranges"]] == [0, lost, 0]
    # range 1 misses exactly the examples of the lost steps; the others have every example
    assert [r["examples"] for r in s["ranges"]] == [EXAMPLES, EXAMPLES - lost * STEP_EXAMPLES,
                                                    EXAMPLES]
    assert metrics(tmp_path, "reload")["epochs"][-1]["test_auc"] > 0.88
