"""The run directory (hpcps.runtime.rundir): stale running.json, the launches of a run."""

import json
import socket
import subprocess
import sys
from pathlib import Path

from hpcps.runtime.rundir import Restore, RunDir, launch_phrase, launch_records, parse_restart


def test_a_running_json_whose_chief_is_gone_is_removed(tmp_path):
    """Issue 21.8: a worker's MPI_Abort kills the chief before it removes running.json."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = RunDir(tmp_path)
    run.running.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    assert run.clear_stale_running() and not run.running.exists()
    assert not run.clear_stale_running()                     # nothing there: nothing done
    run.running.write_text("{not json")
    assert run.clear_stale_running() and not run.running.exists()


def test_each_launch_of_a_run_is_recorded():
    """Issue 22.5: a relaunch after restart 1 (status 1) resumed at step 600 of a run whose
    first launch is in the checkpoint."""
    assert parse_restart("1:1") == (1, 1) and parse_restart(None) is None
    first, this = launch_records(None, None)
    assert first == [] and this["launch"] == 1 and this["resumed_from_step"] is None
    manifest = {"step": 600, "launches": json.dumps([this])}
    earlier, this2 = launch_records(Restore(Path("x"), manifest), (1, 1))
    assert earlier[0]["steps_kept"] == 600
    assert (this2["launch"], this2["restart"], this2["after_status"],
            this2["resumed_from_step"]) == (2, 1, 1, 600)
    this2["steps"] = 7560
    s = {"steps": 7560, "run_steps": 8160, "launches": earlier + [this2], "restarts": 1}
    assert launch_phrase(s) == (" in all (7,560 in this launch, restart 1 after status 1, "
                                "resumed at step 600; 2 launches, 1 restart(s))")
    # a checkpoint written before launches were recorded counts as one earlier launch
    earlier, this3 = launch_records(Restore(Path("x"), {"step": 40}), None)
    assert this3["launch"] == 2 and earlier[0]["steps_kept"] == 40


def test_the_epochs_record_is_not_fsynced_the_final_one_is(tmp_path, monkeypatch):
    """metrics.json was fsynced after every epoch (0.3-1.8 ms of each ~60 ms Adult epoch on
    a local disk, held by the chief): the per-epoch record is atomic only (checkpoints hold
    the epochs too), the finished run's record durable."""
    import os

    from hpcps.config import parse_job
    from hpcps.runtime.rundir import MetricsFile

    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    (tmp_path / "x.csv").write_text("")
    cfg = parse_job(f'name = "m"\n[data]\nformat = "adult_csv"\npath = "x.csv"\n'
                    f'[output]\ndir = "{tmp_path / "run"}"\n', tmp_path / "job.toml")
    mf = MetricsFile(cfg)
    mf.epochs([{"epoch": 1, "test_auc": 0.9}])
    assert json.loads(mf.path.read_text())["epochs"] == [{"epoch": 1, "test_auc": 0.9}]
    assert synced == []
    mf.final([{"epoch": 1, "test_auc": 0.9}], {"steps": 3})
    assert len(synced) == 1 and json.loads(mf.path.read_text())["summary"] == {"steps": 3}
    assert sorted(p.name for p in mf.path.parent.iterdir()) == ["metrics.json"]  # no temp left
