"""Resumes with real mpirun launches and real HDF5 files, beyond tests/e2e/test_restart.py:
RMA pulls and async (bit-identical), mid-epoch on fewer workers (every row once), and the run
directory's cases: a damaged newest or every checkpoint damaged, a checkpoint of another
model shape, a server killed while writing its shard, checkpoints by time, ``--resume
never`` in a used directory, a finished run launched again.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from hpcps import checkpoint as ck
from tests.e2e.restart_jobs import JOB, assert_identical, job, weights
from tests.helpers import hpcps, launch, log_lines, mpi_env, rank_pids, write_job

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """A finished one-epoch run of ``job(epochs=1, every=10, keep=2)`` (25 steps: checkpoints
    20 and 25 kept), its output directory relative (``run``), trained once: the tests that
    start from such a run copy it with :func:`copy_run`."""
    d = tmp_path_factory.mktemp("one-epoch")
    j = job(d, "run", epochs=1, every=10, keep=2, out="run")
    proc, _ = launch(4, ["train", j], cwd=d)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return d


def copy_run(one_epoch, tmp_path):
    """The finished one-epoch run copied into ``tmp_path`` (``run.toml``, ``run/``): the same
    job text (relative output directory), so launched in ``tmp_path`` it is the same job."""
    shutil.copytree(one_epoch / "run", tmp_path / "run")
    shutil.copy(one_epoch / "run.toml", tmp_path / "run.toml")
    return tmp_path / "run.toml", tmp_path / "run"


def test_resume_mid_epoch_on_fewer_workers_reads_every_row_once(tmp_path):
    a = job(tmp_path, "a", epochs=1, every=7, keep=100)        # its checkpoint at step 14 is used
    proc, _ = launch(4, ["train", a], cwd=tmp_path)                    # 3 workers
    assert proc.returncode == 0, proc.stderr[-2000:]
    src = ck.step_dir(tmp_path / "a", 14)
    m = ck.verify(src)
    assert (m["epoch"], m["step_in_epoch"], m["n_workers"]) == (0, 14, 3)
    b = job(tmp_path, "b")
    proc, _ = launch(3, ["train", b, "--resume", src], cwd=tmp_path)  # 2 workers
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "b" / "metrics.json").read_text())["summary"]
    n_train = 4800                                   # 6000 rows, 20 % test
    read_before = 3 * 14 * 64                        # 3 workers x 14 steps x 64 rows (1600 each)
    assert summary["examples"] == (n_train - read_before) + n_train


def test_corrupt_newest_checkpoint_falls_back_with_a_warning(tmp_path, one_epoch):
    j, run = copy_run(one_epoch, tmp_path)
    steps = ck.list_steps(run)
    newest = ck.step_dir(run, steps[-1]) / "shard-0000.h5"
    newest.write_bytes(newest.read_bytes()[:1000])
    proc, _ = launch(4, ["train", j], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"skipping checkpoint step-{steps[-1]:08d}" in proc.stdout
    assert f"resumed from checkpoint step {steps[-2]}" in proc.stdout


def test_checkpoint_of_another_model_shape_is_refused(tmp_path, one_epoch):
    j, _ = copy_run(one_epoch, tmp_path)
    other = write_job(tmp_path / "m2.toml", j.read_text().replace("hash_bits = 14", "hash_bits = 13"))
    proc, secs = launch(4, ["train", other], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "table 'weights' has shape (16384, 1) in the checkpoint but (8192, 1)" in proc.stderr


def test_server_killed_while_writing_its_shard_restarts_from_previous_checkpoint(tmp_path):
    """A 2^22-row table makes each shard write take a while; SIGKILL the server as soon as
    its temporary shard file of the second checkpoint appears."""
    j = write_job(tmp_path / "w.toml", JOB.format(servers=1, opt="adagrad", rows=4000, epochs=2, batch=64,
                                                 every=10, keep=5, out=tmp_path / "w")
                  .replace("hash_bits = 14", "hash_bits = 22"))
    p = subprocess.Popen([sys.executable, "-m", "hpcps", "run", "-n", "4", "--max-restarts", "1", str(j)],
                         cwd=tmp_path, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    second = ck.step_dir(tmp_path / "w", 20)
    deadline = time.time() + 180
    tmp_files = []
    while time.time() < deadline and p.poll() is None:
        if second.is_dir():
            tmp_files = list(second.glob(".shard-*.tmp"))
            if tmp_files:
                break
        time.sleep(0.002)
    assert tmp_files, "never saw the second checkpoint's shard being written"
    os.kill(rank_pids(j)[3], signal.SIGKILL)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out[-3000:]
    assert "resumed from checkpoint step 10 " in out, out[-3000:]
    assert ck.verify(ck.step_dir(tmp_path / "w", ck.list_steps(tmp_path / "w")[-1]))["step"] >= 20


def test_checkpoint_every_seconds(tmp_path):
    # 150 steps and an interval of 0.01 s: at least two checkpoints however fast the machine
    # (CI of d90699d: 100 steps took ~0.1 s, and with 0.05 s counted from the first step and
    # from each write's end only one was written; here 5-9 at 0.05 s, 28-44 at 0.01 s)
    j = write_job(tmp_path / "t.toml", JOB.format(servers=1, opt="adagrad", rows=6000, epochs=3, batch=32,
                                                 every=0, keep=100, out=tmp_path / "t")
                  .replace("keep = 100\n", "keep = 100\nevery_seconds = 0.01\nat_end = false\n"))
    proc, _ = launch(4, ["train", j], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = ck.list_steps(tmp_path / "t")
    assert len(steps) >= 2 and all(ck.verify(ck.step_dir(tmp_path / "t", s)) for s in steps)


def test_resume_with_rma_windows_is_bit_identical_and_ssp_resumes(tmp_path):
    """Restored rows must land in the RMA windows the workers read (BSP + rma: identical);
    an SSP(2) + rma job resumes and finishes too."""
    rma = "[consistency]\npull = \"rma\"\n"
    ref = write_job(tmp_path / "ref.toml", job(tmp_path, "ref").read_text() + rma)
    assert launch(4, ["train", ref], cwd=tmp_path)[0].returncode == 0
    part = write_job(tmp_path / "p.toml", job(tmp_path, "p", epochs=1).read_text() + rma)
    assert launch(4, ["train", part], cwd=tmp_path)[0].returncode == 0
    full = write_job(tmp_path / "f.toml", job(tmp_path, "p").read_text() + rma)  # same run dir
    proc, _ = launch(4, ["train", full], cwd=tmp_path)
    assert proc.returncode == 0 and "resumed from checkpoint step" in proc.stdout, proc.stderr[-2000:]
    assert_identical(weights(tmp_path / "p"), weights(tmp_path / "ref"))
    ssp = rma.replace("[consistency]\n", "[consistency]\nmodel = \"ssp\"\nstaleness = 2\n")
    s1 = write_job(tmp_path / "s1.toml", job(tmp_path, "s", epochs=1).read_text() + ssp)
    assert launch(4, ["train", s1], cwd=tmp_path)[0].returncode == 0
    s2 = write_job(tmp_path / "s2.toml", job(tmp_path, "s").read_text() + ssp)
    proc, _ = launch(4, ["train", s2], cwd=tmp_path)
    assert proc.returncode == 0 and "resumed from checkpoint step" in proc.stdout, proc.stderr[-2000:]
    assert json.loads((tmp_path / "s" / "metrics.json").read_text())["epochs"][-1]["epoch"] == 2


def test_async_resume_with_one_worker_is_bit_identical(tmp_path):
    """With one worker Downpour is deterministic, so an async run resumed at an epoch boundary
    must equal an uninterrupted one (restored rows, AdaGrad state and versions; n_fetch/n_push
    > 1). (With the push filter, the residual flushed at the end of the *last* epoch differs
    between a 1-epoch and a 2-epoch run, so the filter is left out here.)"""
    extra = '[consistency]\nmodel = "async"\nn_fetch = 2\nn_push = 3\n'
    ref = write_job(tmp_path / "ref.toml", job(tmp_path, "ref", every=0).read_text() + extra)
    assert launch(2, ["train", ref], cwd=tmp_path)[0].returncode == 0
    a = write_job(tmp_path / "a.toml", job(tmp_path, "a", epochs=1, every=0).read_text() + extra)
    assert launch(2, ["train", a], cwd=tmp_path)[0].returncode == 0
    b = write_job(tmp_path / "b.toml", job(tmp_path, "a", every=0).read_text() + extra)
    proc, _ = launch(2, ["train", b], cwd=tmp_path)
    assert proc.returncode == 0 and "resumed from checkpoint step" in proc.stdout, proc.stderr[-2000:]
    assert_identical(weights(tmp_path / "a"), weights(tmp_path / "ref"))


def _damage(run_dir) -> list[str]:
    """Truncate a shard of the older checkpoint(s) and flip a data byte of the newest's."""
    steps = ck.list_steps(run_dir)
    for s in steps[:-1]:
        shard = ck.step_dir(run_dir, s) / "shard-0000.h5"
        shard.write_bytes(shard.read_bytes()[:1000])
    shard = ck.step_dir(run_dir, steps[-1]) / "shard-0000.h5"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    return [ck.step_dir(run_dir, s).name for s in steps]


def test_every_checkpoint_damaged_require_stops_and_auto_trains_afresh_saying_so(tmp_path,
                                                                                  one_epoch):
    """Issue 21.3: every checkpoint of the run directory damaged. ``--resume require`` exits
    2 naming each; ``--resume auto`` says so in one line and trains from scratch, and its new
    checkpoints survive pruning (a damaged step-25 used to count as newer: the new step-10 was
    deleted right after it was written and the chief died on its missing manifest)."""
    j, d = copy_run(one_epoch, tmp_path)                 # 25 steps: keeps 20 and 25
    names = _damage(d)
    assert names == ["step-00000020", "step-00000025"]
    proc, _ = launch(4, ["train", j, "--resume", "require"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [x for x in proc.stderr.splitlines() if "no valid checkpoint in" in x]
    assert len(lines) == 1, lines                 # rank 0's decision, printed once (not per rank)
    line = lines[0]
    assert all(n in line for n in names) and "--resume require" in line, line
    assert ck.list_steps(d) == [20, 25]                  # left as they were
    proc, _ = launch(4, ["train", j], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = [x for x in log_lines(proc.stdout) if "checkpoint" in x and "warning" in x]
    assert line.startswith("hpcps: warning: no valid checkpoint in") and "trains from scratch" \
        in line and "truncated" in line and "checksum does not match" in line, line
    assert "resumed from" not in proc.stdout
    assert ck.list_steps(d) == [20, 25]                  # this run's own
    for s in (20, 25):
        assert ck.verify(ck.step_dir(d, s))["step"] == s
    (aside,) = d.glob("ckpt.aside-*")
    assert sorted(p.name for p in aside.iterdir()) == names


def test_resume_never_in_a_used_run_directory_trains_the_new_job_through_a_restart(tmp_path):
    """Issue 23.3: ``--resume never`` where an earlier run of another job file finished. The
    earlier checkpoints (higher steps) used to count as newer: the fresh run's first
    checkpoint was pruned, the chief crashed, and the relaunch resumed the *old* run's final
    checkpoint ("already finished", exit 0, model.h5 with the old weights). Now they are moved
    aside and the result equals the new job run in an empty directory."""
    old = job(tmp_path, "old", epochs=2, keep=2, out=tmp_path / "u")
    assert launch(4, ["train", old], cwd=tmp_path)[0].returncode == 0
    new_text = job(tmp_path, "new", epochs=2, keep=2, out=tmp_path / "u").read_text() \
        .replace("l2 = 0.001", "l2 = 0.002")
    new = write_job(tmp_path / "new.toml", new_text)
    ref = write_job(tmp_path / "ref.toml", new_text.replace(str(tmp_path / "u"), str(tmp_path / "ref")))
    assert launch(4, ["train", ref], cwd=tmp_path)[0].returncode == 0
    proc, _ = hpcps(["run", "-n", "4", "--max-restarts", "1", "--resume", "never", new],
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "already finished" not in proc.stdout and "restart 1/1" not in proc.stdout, \
        proc.stdout[-3000:]
    assert "are moved to" in proc.stdout
    assert_identical(weights(tmp_path / "u"), weights(tmp_path / "ref"))
    # the old run's final checkpoint, of another job text, is never taken as "finished"
    (aside,) = (tmp_path / "u").glob("ckpt.aside-*")
    shutil.rmtree(tmp_path / "u" / "ckpt")
    aside.rename(tmp_path / "u" / "ckpt")
    proc, _ = launch(4, ["train", new], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "another job file" in proc.stderr, proc.stderr[-2000:]


def test_a_finished_run_launched_again_leaves_its_record_intact(tmp_path, one_epoch):
    """Issue 22.4: launching a finished job again trains nothing and used to overwrite
    metrics.json with an empty epoch (log-loss nan, 0 steps). Issue 21.4: with ckpt/ deleted,
    a new run over model.h5/metrics.json says it overwrites them."""
    j, run = copy_run(one_epoch, tmp_path)
    record, model = (run / "metrics.json").read_bytes(), (run / "model.h5").read_bytes()
    proc, _ = launch(4, ["train", j], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "this job already finished" in proc.stdout and "done:" not in proc.stdout
    assert (run / "metrics.json").read_bytes() == record
    assert (run / "model.h5").read_bytes() == model
    shutil.rmtree(run / "ckpt")
    proc, _ = launch(4, ["train", j], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "holds model.h5 and metrics.json of an earlier run" in proc.stdout \
        and "overwrites them" in proc.stdout, proc.stdout[-2000:]


def test_more_epochs_for_a_finished_run_keep_its_last_epoch_and_match_one_run(tmp_path, one_epoch):
    """Found by a trial (2026-12-04): a finished run launched again with more epochs resumed
    its end checkpoint inside the last epoch, which had no step left, so that epoch was
    evaluated again with no examples: its record in metrics.json got train log-loss null
    (0.3070 before). The closed epoch is now kept and training goes on with the next one,
    as one run of that many epochs does (bit-identical)."""
    j, run = copy_run(one_epoch, tmp_path)
    before = json.loads((run / "metrics.json").read_text())["epochs"]
    assert [r["epoch"] for r in before] == [1]
    j.write_text(j.read_text().replace("epochs = 1", "epochs = 2"))
    proc, _ = launch(4, ["train", j], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(the end of epoch 1; epoch 2 starts" in proc.stdout, proc.stdout[-2000:]
    assert "epoch 1:" not in proc.stdout, proc.stdout[-2000:]        # not evaluated again
    after = json.loads((run / "metrics.json").read_text())["epochs"]
    assert [r["epoch"] for r in after] == [1, 2], after
    assert after[0] == before[0]
    assert after[1]["train_logloss"] is not None and after[1]["train_logloss"] > 0, after[1]
    one = job(tmp_path, "one", epochs=2, every=10, keep=2)
    proc, _ = launch(4, ["train", one], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_identical(weights(run), weights(tmp_path / "one"))
