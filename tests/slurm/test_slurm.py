"""slurm/train.sbatch against a real Slurm (the ``slurm`` fixture of conftest.py).

One small job (Adult subset, float64, BSP, a checkpoint every 10 steps) is run uninterrupted
once; then the same job is requeued by Slurm (``scontrol requeue``), stopped by a signal to
the batch shell (``scancel --signal=USR1 --batch``) and hit by the loss of a rank
(``kill -9``). Each interrupted run must come back by itself (requeue), resume from a
checkpoint and end with a model bit-identical to the uninterrupted one: every step applied
exactly once. The scripts tested are the ones in ``slurm/``, submitted as users would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.helpers import DATA, ROOT, rank_pids

TRAIN = ROOT / "slurm" / "train.sbatch"
MULTI = ROOT / "slurm" / "multinode.sbatch"
STEPS_PER_EPOCH = 50          # 4800 training rows / (3 workers x 32 rows)
EPOCHS = 2
EVERY = 10

JOB = f"""
name = "slurmjob"
seed = 7
[data]
format = "adult_csv"
path = "{DATA}"
max_rows = 6000
hash_bits = 14
[model]
dtype = "float64"
l2 = 0.001
[train]
epochs = {EPOCHS}
batch_size = 32
progress_seconds = 1.0
[checkpoint]
every_steps = {EVERY}
keep = 3
"""
TOTAL = EPOCHS * STEPS_PER_EPOCH
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE", "PREEMPTED")


def client_env(slurm) -> dict:
    """What a user's shell would have: the venv first on PATH, no test-only MPI settings."""
    env = {k: v for k, v in slurm.env.items() if not k.startswith(("OMPI_", "PRTE_", "PMIX_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


class Submitted:
    def __init__(self, slurm, workdir: Path, jobid: str):
        self.slurm, self.dir, self.id = slurm, workdir, jobid
        self.out = workdir / f"hpcps-{jobid}.out"
        self.job_file = workdir / "job.toml"
        self.run_dir = workdir / "runs" / "slurmjob"

    def info(self) -> dict:
        return self.slurm.job(self.id)

    def text(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def wait_for(self, what, pred, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if pred():
                return
            info = self.info()
            if info.get("JobState") in FINAL_STATES and not pred():
                break
            time.sleep(0.2)
        raise AssertionError(f"job {self.id}: timed out waiting for {what} (state "
                             f"{self.info().get('JobState')})\n{self.text()[-4000:]}\n{self.slurm.logs()}")

    def wait_done(self, timeout=180) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            info = self.info()
            if info.get("JobState") in FINAL_STATES:
                return info
            time.sleep(0.5)
        raise AssertionError(f"job {self.id} not done after {timeout} s: {self.info()}\n"
                             f"{self.text()[-4000:]}\n{self.slurm.logs()}")

    def cancel(self):
        if self.info().get("JobState") not in FINAL_STATES:
            self.slurm.run("scancel", "--full", self.id, check=False)
            deadline = time.time() + 60
            while self.info().get("JobState") not in FINAL_STATES and time.time() < deadline:
                time.sleep(0.5)


def submit(slurm, workdir: Path, script=TRAIN, *extra) -> Submitted:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "job.toml").write_text(JOB)
    # 4 tasks (3 workers + 1 server) on a 2-CPU node: --overcommit
    p = subprocess.run(["sbatch", "--parsable", "--overcommit", "--ntasks=4", *extra, str(script),
                        "job.toml"], cwd=workdir, env=client_env(slurm), capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return Submitted(slurm, workdir, p.stdout.strip().split(";")[0])


def model(run_dir: Path):
    with h5py.File(run_dir / "model.h5", "r") as f:
        return f["weights"][()], f["bias"][()], dict(f.attrs)


def newest_checkpoint(run_dir: Path) -> int:
    steps = [int(d.name.split("-")[1]) for d in (run_dir / "ckpt").glob("step-*")
             if (d / "manifest.h5").exists()]
    return max(steps, default=-1)


def check_every_step_once(sub: Submitted, reference, resumed_at: int):
    """The run ended completed, resumed at ``resumed_at``, and matches the reference exactly."""
    text = sub.text()
    metrics = json.loads((sub.run_dir / "metrics.json").read_text())
    s = metrics["summary"]
    # the last launch ran the steps after the checkpoint, and only those
    assert s["steps"] + resumed_at == TOTAL, (s["steps"], resumed_at, text[-3000:])
    assert s["epochs"] == EPOCHS
    epochs = [e["epoch"] for e in metrics["epochs"]]
    assert epochs == sorted(set(epochs)) and epochs[-1] == EPOCHS, epochs
    assert metrics["epochs"][-1]["clock"] == TOTAL
    w, b, attrs = model(sub.run_dir)
    assert int(attrs["step"]) == TOTAL
    rw, rb, _ = reference
    assert np.array_equal(w, rw) and np.array_equal(b, rb), \
        f"not bit-identical to the uninterrupted run: max |diff| {np.abs(w - rw).max()}"
    assert text.count("finished; outputs in") == 1, text[-3000:]


@pytest.fixture(scope="module")
def reference(slurm, tmp_path_factory):
    """The uninterrupted run: (Submitted, final job info, (weights, bias, attrs), seconds)."""
    t0 = time.time()
    sub = submit(slurm, tmp_path_factory.mktemp("reference"))
    try:
        info = sub.wait_done(180)
    finally:
        sub.cancel()
    return sub, info, model(sub.run_dir) if (sub.run_dir / "model.h5").exists() else None, \
        time.time() - t0


@pytest.mark.timeout(240)
def test_train_sbatch_completes_with_output_and_model(reference):
    sub, info, mdl, seconds = reference
    text = sub.text()
    assert info["JobState"] == "COMPLETED", f"{info}\n{text[-4000:]}"
    assert info["Restarts"] == "0" and info["ExitCode"] == "0:0", info
    assert "launcher mpirun:" in text and "--bind-to none" in text    # the Open MPI wheel path
    assert f"run directory {sub.run_dir}" in text
    assert "finished; outputs in" in text and f"done: {EPOCHS} epoch(s)" in text, text[-3000:]
    assert mdl is not None, text[-3000:]
    w, b, attrs = mdl
    assert w.shape == (2**14, 1) and b.shape == (1, 1) and np.isfinite(w).all()
    assert int(attrs["step"]) == TOTAL and int(attrs["epoch"]) == EPOCHS
    metrics = json.loads((sub.run_dir / "metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == list(range(1, EPOCHS + 1))
    assert metrics["summary"]["steps"] == TOTAL
    assert metrics["epochs"][-1]["test_auc"] > 0.85
    # periodic checkpoints, the newest kept ones only
    assert newest_checkpoint(sub.run_dir) == TOTAL
    print(f"reference run: {seconds:.1f} s from sbatch to COMPLETED")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["scontrol requeue", "scancel --signal=USR1 --batch"])
def test_preempted_job_checkpoints_requeues_resumes_every_step_once(slurm, reference, tmp_path, how):
    if reference[1].get("JobState") != "COMPLETED" or reference[2] is None:
        pytest.fail("the uninterrupted reference run failed (see test_train_sbatch_completes...)")
    t0 = time.time()
    sub = submit(slurm, tmp_path)
    try:
        # training is under way: the first periodic checkpoint exists, the job is far from done
        sub.wait_for("the first checkpoint", lambda: newest_checkpoint(sub.run_dir) >= EVERY, 120)
        if how == "scontrol requeue":
            slurm.run("scontrol", "requeue", sub.id)
        else:
            slurm.run("scancel", "--signal=USR1", "--batch", sub.id)
        info = sub.wait_done(240)
        text = sub.text()
        assert info["JobState"] == "COMPLETED", f"{info}\n{text[-4000:]}"
        assert info["Restarts"] == "1", info
        m = re.search(r"stop requested by signal at clock (\d+)", text)
        assert m, text[-4000:]
        clock = int(m.group(1))
        assert EVERY <= clock < TOTAL
        # one checkpoint at the signal, the job ended with 75, and came back from that step
        assert "exit status 75 asks the batch script to requeue" in text
        assert "launcher exited with status 75" in text, text[-4000:]
        if how == "scontrol requeue":
            assert "got SIGTERM" in text and "it requeues it or not, this script does not" in text
        else:
            assert "got SIGUSR1" in text and "stopped by signal after a checkpoint: requeueing job" in text
        assert "restart 1 of at most" in text
        assert f"resumed from checkpoint step {clock} " in text, text[-4000:]
        check_every_step_once(sub, reference[2], clock)
    finally:
        sub.cancel()
    print(f"{how}: {time.time() - t0:.1f} s from sbatch to COMPLETED")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("victim", [3], ids=["server-rank-3"])   # workers: tests/e2e/test_restart.py
def test_lost_rank_requeues_and_finishes_from_last_checkpoint(slurm, reference, tmp_path, victim):
    if reference[1].get("JobState") != "COMPLETED" or reference[2] is None:
        pytest.fail("the uninterrupted reference run failed (see test_train_sbatch_completes...)")
    t0 = time.time()
    sub = submit(slurm, tmp_path)
    try:
        sub.wait_for("the second checkpoint", lambda: newest_checkpoint(sub.run_dir) >= 2 * EVERY, 120)
        pids = rank_pids(sub.job_file)
        assert victim in pids, f"rank {victim} not found running: {pids}"
        os.kill(pids[victim], signal.SIGKILL)
        killed_after = newest_checkpoint(sub.run_dir)
        info = sub.wait_done(240)
        text = sub.text()
        assert info["JobState"] == "COMPLETED", f"{info}\n{text[-4000:]}"
        assert info["Restarts"] == "1", info
        assert "the launch failed (a rank died?): requeueing job" in text, text[-4000:]
        assert "stop requested by signal" not in text
        m = re.search(r"resumed from checkpoint step (\d+) ", text)
        assert m, text[-4000:]
        step = int(m.group(1))
        # the newest complete checkpoint at the kill (one more may have been finished meanwhile)
        assert step % EVERY == 0 and killed_after <= step <= killed_after + EVERY, (step, killed_after)
        check_every_step_once(sub, reference[2], step)
    finally:
        sub.cancel()
    print(f"kill -9 rank {victim}: {time.time() - t0:.1f} s from sbatch to COMPLETED")


def _slurm_pmix_usable() -> bool:
    # Slurm's mpi/pmix plugin dlopens the unversioned libpmix.so (Debian: libpmix-dev)
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return False
    return "libpmix.so " in out


@pytest.mark.timeout(240)
def test_srun_path_forwards_usr1_requeues_and_resumes(slurm, tmp_path):
    """The srun launcher (srun --mpi=pmix, 2 tasks: the Open MPI wheel's limit under srun)."""
    if not _slurm_pmix_usable():
        msg = "libpmix.so missing: Slurm's mpi/pmix cannot load (apt-get install libpmix-dev)"
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail("CI is set but " + msg)
        pytest.skip(msg)
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "job.toml").write_text(JOB)
    p = subprocess.run(["sbatch", "--parsable", "--overcommit", "--ntasks=2",
                        "--export=ALL,HPCPS_LAUNCHER=srun-pmix,HPCPS_MAX_RESTARTS=1", str(TRAIN),
                        "job.toml"], cwd=tmp_path, env=client_env(slurm), capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    sub = Submitted(slurm, tmp_path, p.stdout.strip())
    total = EPOCHS * 150                       # one worker: 4800 rows / 32
    try:
        sub.wait_for("the first checkpoint", lambda: newest_checkpoint(sub.run_dir) >= EVERY, 120)
        slurm.run("scancel", "--signal=USR1", "--batch", sub.id)
        info = sub.wait_done(180)
        text = sub.text()
        assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", f"{info}\n{text[-4000:]}"
        assert "launcher srun-pmix: srun -n 2 --kill-on-bad-exit=1 --mpi=pmix" in text
        m = re.search(r"stop requested by signal at clock (\d+)", text)
        assert m, text[-4000:]
        clock = int(m.group(1))
        assert "launcher exited with status 75" in text, text[-4000:]
        assert f"resumed from checkpoint step {clock} " in text, text[-4000:]
        s = json.loads((sub.run_dir / "metrics.json").read_text())["summary"]
        assert s["steps"] + clock == total, (s["steps"], clock)
        assert int(model(sub.run_dir)[2]["step"]) == total
    finally:
        sub.cancel()


CRASH = """
import os
import signal

from hpcps.models.logistic import LogisticRegression


class Crash(LogisticRegression):
    \"\"\"Logistic regression whose worker 0 is killed (SIGKILL) at its first step: a lost rank.\"\"\"

    def load(self, split, part, n_parts):
        self.part = part
        return super().load(split, part, n_parts)

    def loss_grad(self, X, y, keys, params):
        if self.part == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().loss_grad(X, y, keys, params)
"""


def _sbatch(slurm, tmp_path, job_text, max_restarts=1):
    (tmp_path / "job.toml").write_text(job_text)
    p = subprocess.run(["sbatch", "--parsable", "--overcommit", "--ntasks=2",
                        f"--export=ALL,HPCPS_MAX_RESTARTS={max_restarts}", str(TRAIN), "job.toml"],
                       cwd=tmp_path, env=client_env(slurm), capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return Submitted(slurm, tmp_path, p.stdout.strip())


def test_max_restarts_bounds_requeues(slurm, tmp_path):
    """A rank that dies at every launch (a lost rank: restartable) is requeued
    HPCPS_MAX_RESTARTS times, then the job is left FAILED."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "crash.py").write_text(CRASH)
    sub = _sbatch(slurm, tmp_path, JOB.replace("[model]\n", '[model]\ntype = "crash:Crash"\n'))
    try:
        info = sub.wait_done(180)
        text = sub.text()
        assert info["JobState"] == "FAILED" and info["Restarts"] == "1", f"{info}\n{text[-3000:]}"
        assert "requeueing job" in text and "not requeueing: 1 restart(s) already" in text, text[-3000:]
    finally:
        sub.cancel()


def test_bad_data_is_not_requeued(slurm, tmp_path):
    """Bad data fails every launch the same way: exit 65, never requeued (it was, up to
    HPCPS_MAX_RESTARTS times)."""
    tmp_path.mkdir(exist_ok=True)
    # the data file exists (the job file passes the script's check) but is not Adult data
    (tmp_path / "bad.csv").write_text("not,a,csv\n1,2,3\n")
    sub = _sbatch(slurm, tmp_path, JOB.replace(f'path = "{DATA}"', f'path = "{tmp_path / "bad.csv"}"'),
                  max_restarts=3)
    try:
        info = sub.wait_done(120)
        text = sub.text()
        assert info["JobState"] == "FAILED" and info["Restarts"] == "0", f"{info}\n{text[-3000:]}"
        assert info["ExitCode"] == "65:0", info
        assert "status 65): not requeueing" in text and "requeueing job" not in text, text[-3000:]
    finally:
        sub.cancel()


# ---------------------------------------------------------------- the scripts themselves


def _body(path: Path) -> str:
    text = path.read_text()
    marker = "# ---------------------------------------------------------------- the rest is slurm/common.sh,\n"
    assert marker in text, path
    return text.split(marker, 1)[1]


def test_train_and_multinode_scripts_share_their_body():
    """Both scripts end by sourcing slurm/common.sh, the same way (their #SBATCH headers and
    SITE lines differ); the common part is not copied into either."""
    assert _body(TRAIN) == _body(MULTI)
    assert '. "$HPCPS_COMMON"' in _body(TRAIN) and "scontrol requeue" not in _body(TRAIN)
    assert "scontrol requeue" in (ROOT / "slurm" / "common.sh").read_text()


@pytest.mark.parametrize("script", [TRAIN, MULTI], ids=["train", "multinode"])
def test_scripts_have_the_requeue_directives(script):
    text = script.read_text()
    for d in ("#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=B:USR1@",
              "#SBATCH --output=%x-%j.out"):
        assert d in text, d
    assert "# SITE:" in text and "module load" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def _dry_run(tmp_path, script, servers, **env):
    (tmp_path / "j.toml").write_text(JOB.replace("[data]", f"[cluster]\nservers = {servers}\n[data]"))
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PRTE_"))}
    e.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}", HPCPS_DRY_RUN="1",
             SLURM_SUBMIT_DIR=str(tmp_path), **env)
    p = subprocess.run(["bash", str(script), "j.toml"], cwd=tmp_path, env=e, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@pytest.mark.parametrize("launcher, want", [
    ("auto", "--map-by node"), ("srun-pmix", "--mpi=pmix --distribution=cyclic"),
    ("srun-pmi2", "--mpi=pmi2 --distribution=cyclic")])
def test_multinode_places_one_server_per_node(tmp_path, launcher, want):
    # the script's own arithmetic for 4 nodes x 8 tasks (no allocation needed for a dry run)
    out = _dry_run(tmp_path, MULTI, 4, HPCPS_LAUNCHER=launcher, SLURM_NTASKS="32",
                   SLURM_JOB_NUM_NODES="4", SLURM_CPUS_ON_NODE="8")
    assert "4 server(s) (ranks 28..31) on node index(es): 0 1 2 3; placement spread" in out, out
    assert want in out, out
    assert f"run directory {tmp_path / 'runs' / 'slurmjob'}" in out


def test_mpirun_oversubscribes_only_beyond_the_cpus(tmp_path):
    out = _dry_run(tmp_path, TRAIN, 1, SLURM_NTASKS="4", SLURM_JOB_NUM_NODES="1", SLURM_CPUS_ON_NODE="2")
    assert "--bind-to none --map-by slot:OVERSUBSCRIBE" in out, out
    out = _dry_run(tmp_path, TRAIN, 1, SLURM_NTASKS="4", SLURM_JOB_NUM_NODES="1", SLURM_CPUS_ON_NODE="4")
    assert "--bind-to none --map-by slot " in out and "OVERSUBSCRIBE" not in out, out
