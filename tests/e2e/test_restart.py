"""Checkpoint/restart with real mpirun launches, real kills and real HDF5 files.

Under deterministic BSP (float64) a run that is killed and resumed — on the same or another
number of servers — must end with weights bit-identical to an uninterrupted run. (Resumes
with RMA pulls, async, mid-epoch on fewer workers and the handling of damaged, finished and
used run directories: tests/e2e/test_resume.py; two files, so neither comes near the suite's
per-file timeout on a loaded machine.)
"""

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

from hpcps import checkpoint as ck
from tests.e2e.restart_jobs import assert_identical, job, weights
from tests.helpers import hpcps, kill_session, launch, mpi_env, rank_pids

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

#: the kill test's job: 12,000 rows (9,600 train), 3 workers, batch 16: 200 steps an epoch,
#: 400 in all; the kill comes right after the checkpoint at step 50 (every 25), 350 steps
#: before the end
KILL = dict(rows=12000, batch=16, epochs=2, every=25)
KILL_STEPS = 2 * (12000 * 8 // 10 // 3 // 16)


@pytest.fixture(scope="module")
def kill_ref(tmp_path_factory):
    """``get(opt)``: the weights of the kill test's job run without a kill (``hpcps run -n
    4``), trained once per optimizer for the cases that share it."""
    cache = {}

    def get(opt):
        if opt not in cache:
            d = tmp_path_factory.mktemp(f"kill-ref-{opt}")
            proc, _ = hpcps(["run", "-n", "4", job(d, "ref", opt=opt, **KILL)], cwd=d)
            assert proc.returncode == 0, proc.stderr[-2000:]
            cache[opt] = weights(d / "ref")
        return cache[opt]
    return get


@pytest.mark.parametrize("victim,opt", [("worker", "adagrad"), ("server", "adagrad"),
                                        ("server", "adam")])
def test_kill_9_a_rank_then_resume_is_bit_identical(tmp_path, kill_ref, victim, opt):
    """(With Adam, the killed server's moments and per-row step counts come back from the
    checkpoint: one step count off would change every later update of that row.)"""
    want = kill_ref(opt)
    killed = job(tmp_path, "killed", opt=opt, **KILL)
    p = subprocess.Popen([sys.executable, "-m", "hpcps", "run", "-n", "4", "--max-restarts", "2",
                          str(killed)], cwd=tmp_path, env=mpi_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    rank = 3 if victim == "server" else random.Random(victim).choice([0, 1, 2])
    deadline = time.time() + 120
    first = ck.step_dir(tmp_path / "killed", 50) / ck.MANIFEST
    while not first.exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.01)
    pids = rank_pids(killed)
    assert rank in pids, f"rank {rank} not found running ({pids})"
    os.kill(pids[rank], signal.SIGKILL)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out[-3000:]
    assert "restart 1/2" in out and "resumed from checkpoint step" in out, out[-3000:]
    assert_identical(weights(tmp_path / "killed"), want)
    # issue 22.5: the whole run and each restart are reported, not the relaunch's steps only
    s = json.loads((tmp_path / "killed" / "metrics.json").read_text())["summary"]
    first, last = s["launches"][0], s["launches"][-1]
    assert s["run_steps"] == KILL_STEPS and s["restarts"] == len(s["launches"]) - 1 >= 1, s["launches"]
    assert last["restart"] == s["restarts"] and last["after_status"] != 0
    assert first["resumed_from_step"] is None and first["steps_kept"] > 0
    assert last["resumed_from_step"] + last["steps"] == KILL_STEPS == s["steps"] + last["resumed_from_step"]
    assert f"done: 2 epoch(s), {KILL_STEPS} steps in all ({s['steps']:,} in this launch, restart " in out, \
        out[-3000:]
    # the summary lists the launches, with the restart and the status it followed
    n = s["restarts"]
    assert (f"  launches: {len(s['launches'])} ({n} restart{'s' if n > 1 else ''} by hpcps run "
            "--max-restarts; metrics.json summary.launches)") in out, out[-3000:]
    assert (f": restart {n} after exit status {last['after_status']}, resumed at step "
            f"{last['resumed_from_step']:,} (this launch)") in out, out[-3000:]
    # hpcps run says which rank was lost and where the relaunch resumes (before: Open MPI's
    # message alone)
    role = "server 0" if victim == "server" else f"worker {rank}" + (", the chief" if rank == 0 else "")
    assert (f"hpcps run: rank {rank} ({role}) was lost: killed by signal 9 (SIGKILL) on host "
            in out and ", during training" in out), out[-3000:]
    assert "the newest whole one" in out and "relaunching it now (restart 1/2)." in out, out[-3000:]


#: ``sitecustomize`` of the ranks of
#: :func:`test_rank_killed_in_the_final_checkpoint_is_explained_and_resumed`:
#: the chief, about to write the final checkpoint's manifest (the servers' shards are written),
#: creates ``$FINAL_FLAG`` and waits there; ``hpcps run`` itself is left alone
SLOW_FINAL = '''
import os, time
if os.environ.get("OMPI_COMM_WORLD_RANK") is not None and os.environ.get("FINAL_FLAG"):
    from hpcps import checkpoint as ckpt
    _write_manifest = ckpt.write_manifest
    def write_manifest(directory, **k):
        if ckpt.finished(k, int(os.environ["FINAL_EPOCHS"])):
            open(os.environ["FINAL_FLAG"], "w").close()
            time.sleep(300)
        return _write_manifest(directory, **k)
    ckpt.write_manifest = write_manifest
'''


@pytest.mark.parametrize("victim", [3, 1])
def test_rank_killed_in_the_final_checkpoint_is_explained_and_resumed(tmp_path, victim):
    """Found by a scale trial: a rank killed (``kill -9``) while the job wrote its final
    checkpoint ended ``hpcps run`` with Open MPI's message alone. Now ``hpcps run`` says which
    rank was lost, in the final checkpoint of which step, that this checkpoint is incomplete
    and skipped, and the command that resumes; it exits within seconds, non-zero, and that
    command finishes the run from the checkpoint before."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_FINAL)
    flag = tmp_path / "in-final-checkpoint"
    end = job(tmp_path, "end", epochs=1, every=10)      # 4,800 train rows: 25 steps of 64
    env = mpi_env(FINAL_FLAG=str(flag), FINAL_EPOCHS="1",
                  PYTHONPATH=os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])))
    p = subprocess.Popen([sys.executable, "-m", "hpcps", "run", "-n", "4", str(end)], cwd=tmp_path,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        deadline = time.time() + 180
        while not flag.exists() and time.time() < deadline and p.poll() is None:
            time.sleep(0.02)
        assert flag.exists(), p.communicate(timeout=60)[0][-3000:]
        os.kill(rank_pids(end)[victim], signal.SIGKILL)
        t_kill = time.time()
        out, _ = p.communicate(timeout=120)
        waited = time.time() - t_kill
    finally:
        if p.poll() is None:
            kill_session(p.pid)
            p.wait()
    steps = ck.list_steps(tmp_path / "end")
    final, before = steps[-1], steps[-2]
    assert p.returncode == 128 + signal.SIGKILL and waited < 30, (p.returncode, waited, out[-3000:])
    role = "server 0" if victim == 3 else "worker 1"
    assert (f"hpcps run: rank {victim} ({role}) was lost: killed by signal 9 (SIGKILL) on host "
            f"{socket.gethostname()}, during the final checkpoint of step {final} (after the last "
            "epoch, 1 of 1)") in out, out[-3000:]
    name, whole = ck.step_dir(tmp_path, final).name, ck.step_dir(tmp_path, before).name
    assert (f"hpcps run: Checkpoint {name} is incomplete (no manifest.h5 written" in out
            and f"will be skipped; the run resumes from checkpoint {whole}, the newest whole one"
            in out), out[-3000:]
    command = f"hpcps run -n 4 {end}"
    assert f"hpcps run:   {command}\n" in out, out[-3000:]
    # that command (without the slow hook) skips the half-written checkpoint and finishes
    proc, _ = hpcps(command.split()[1:], cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    both = proc.stdout + proc.stderr
    assert f"skipping checkpoint {name}: no manifest.h5" in both, both[-3000:]
    assert f"resumed from checkpoint step {before} " in both, both[-3000:]
    assert ck.verify(ck.step_dir(tmp_path / "end", final))["step"] == final


def test_resume_on_fewer_and_more_servers_is_bit_identical(tmp_path):
    ref = job(tmp_path, "ref", servers=3)
    proc, _ = launch(5, ["train", ref], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = weights(tmp_path / "ref")
    first = job(tmp_path, "first", servers=3, epochs=1)     # stops after epoch 1 (checkpoint at end)
    proc, _ = launch(5, ["train", first], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for servers in (2, 4):
        out = tmp_path / f"s{servers}"
        shutil.copytree(tmp_path / "first", out)
        j = job(tmp_path, f"s{servers}", servers=servers, epochs=2, out=out)
        proc, _ = launch(2 + servers, ["train", j], cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "written by 2 worker(s) and 3 server(s)" in proc.stdout
        assert_identical(weights(out), want)


@pytest.mark.parametrize("opt,servers", [("adam", 2), ("ftrl", 4)])
def test_adam_and_ftrl_resume_on_another_server_count_is_bit_identical(tmp_path, opt, servers):
    """Every slot (Adam: m, v, step; FTRL: z, n) is saved, restored and re-sharded by name:
    3 servers -> ``servers`` at the end of epoch 1 gives the weights of an uninterrupted run."""
    ref = job(tmp_path, "ref", servers=3, opt=opt)
    proc, _ = launch(5, ["train", ref], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = weights(tmp_path / "ref")
    first = job(tmp_path, "first", servers=3, epochs=1, opt=opt)
    proc, _ = launch(5, ["train", first], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = ck.verify(ck.step_dir(tmp_path / "first", ck.list_steps(tmp_path / "first")[-1]))
    assert m["partition"]["weights"]["slots"] == sorted({"adam": ["m", "v", "step"],
                                                         "ftrl": ["z", "n"]}[opt])
    out = tmp_path / f"s{servers}"
    shutil.copytree(tmp_path / "first", out)
    j = job(tmp_path, f"s{servers}", servers=servers, epochs=2, out=out, opt=opt)
    proc, _ = launch(2 + servers, ["train", j], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "written by 2 worker(s) and 3 server(s)" in proc.stdout
    assert_identical(weights(out), want)
    # the same checkpoint is refused by a job with another optimizer: every rank stops (status
    # 2), and the refusal, rank 0's decision (a ResumeError), is printed once, not once per
    # rank; each other rank says it stopped for it (a trial: ranks 1-5 exited silently)
    other = job(tmp_path, "other", servers=3, epochs=2, out=tmp_path / "first",
                opt="adagrad" if opt == "ftrl" else "ftrl")
    proc, _ = launch(5, ["train", other], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert proc.stderr.count("was another optimizer used?") == 1, proc.stderr[-2000:]
    for r in range(1, 5):
        assert (f"rank {r}: error: stopped: rank 0 refused to resume from the checkpoint"
                in proc.stderr), proc.stderr[-2000:]


def to_format1(directory) -> None:
    """Rewrite a checkpoint's manifest as manifest format 1 wrote it: ``format``
    "hpcps-checkpoint-1" and ``shards/sha256`` (SHA-256 of each file) instead of
    ``shards/checksum`` and ``shards/digest`` (the only differences between the two formats)."""
    d = Path(directory)
    with h5py.File(d / ck.MANIFEST, "r+") as f:
        sh = f["shards"].attrs
        files = [ck.attr_value(x) for x in sh["files"]]
        f.attrs["format"] = "hpcps-checkpoint-1"
        del sh["checksum"], sh["digest"]
        sh["sha256"] = [hashlib.sha256((d / n).read_bytes()).hexdigest() for n in files]


def test_resume_from_a_format1_checkpoint_is_bit_identical(tmp_path):
    """A checkpoint whose manifest records SHA-256 (format 1, before the XXH3-128 checksum) is
    verified with SHA-256 and resumed; a flipped bit in one of its shards is still caught."""
    ref = job(tmp_path, "ref", servers=2)
    proc, _ = launch(4, ["train", ref], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = weights(tmp_path / "ref")
    old = job(tmp_path, "old", servers=2, epochs=1, keep=1)    # one checkpoint, end of epoch 1
    proc, _ = launch(4, ["train", old], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (step,) = ck.list_steps(tmp_path / "old")
    to_format1(ck.step_dir(tmp_path / "old", step))
    bad = tmp_path / "bad"
    shutil.copytree(tmp_path / "old", bad)
    shard = ck.step_dir(bad, step) / "shard-0001.h5"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ck.CheckpointError, match="sha256 checksum does not match"):
        ck.verify(ck.step_dir(bad, step))
    j = job(tmp_path, "old", servers=2, epochs=2)
    proc, _ = launch(4, ["train", j], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"resumed from checkpoint step {step}" in proc.stdout, proc.stdout[-2000:]
    assert_identical(weights(tmp_path / "old"), want)
    # the checkpoints written after the resume are format 2
    m = ck.verify(ck.step_dir(tmp_path / "old", ck.list_steps(tmp_path / "old")[-1]))
    assert m["format"] == ck.FORMAT and m["shards"]["checksum"] == "xxh3_128"
