"""A real Slurm with three nodes, one per test host (tests/multihost/slurm_hosts.py):
``slurm/multinode.sbatch`` and ``slurm/train.sbatch`` submitted with ``--nodes=3``.

* both complete, one server per node, with weights bit-identical to the 6 ranks on one host;
* ``scontrol requeue`` mid-run: the job is requeued and resumes from its checkpoint,
  bit-identical;
* a node lost: its slurmd and its ranks killed (``kill -9``) at once; the job fails, the
  batch script requeues it; the node comes back (its slurmd restarted, as after a reboot)
  and the job resumes, bit-identical.

The launcher is the Open MPI wheel's ``mpirun --bind-to none`` (it starts its daemons on the
other nodes with ``srun``), with TCP restricted to the hosts' subnet (``HPCPS_MPIRUN_ARGS``);
``multinode.sbatch`` also with ``srun --mpi=pmix`` (``HPCPS_LAUNCHER=srun-pmix``), which needs
each node's PMIx directory apart (slurm_hosts.start_slurmd: the hosts share /tmp).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, rank_pids
from tests.hosts import testhosts as th
from tests.multihost.conftest import hosts_line, same_weights, weights, write_job
from tests.multihost.slurm_hosts import start_multinode, start_slurmd, stop_multinode, wait_idle
from tests.slurm.conftest import missing_tools

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE", "PREEMPTED"}
TCP = (f"--mca pml ob1 --mca btl tcp,self,sm --mca btl_tcp_if_include {th.SUBNET} "
       f"--mca oob_tcp_if_include {th.SUBNET}")


@pytest.fixture(scope="module")
def cluster(_hosts_session):
    missing = missing_tools()
    if missing:
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail(f"CI is set but Slurm is missing ({', '.join(missing)})", pytrace=False)
        pytest.skip(f"Slurm is not installed (missing: {', '.join(missing)})")
    hs = th.up(3)
    d = Path(tempfile.mkdtemp(prefix="hpcps-mslurm-"))
    os.chmod(d, 0o755)
    c = start_multinode(d, hs)
    try:
        yield c, hs
    finally:
        stop_multinode(c)
        if os.environ.get("HPCPS_KEEP_SLURM_DIR"):
            print("slurm dir:", d)
        else:
            shutil.rmtree(d, ignore_errors=True)


def submit(c, tmp_path, script, name, every=10, extra=(), launcher="mpirun") -> str:
    job = write_job(tmp_path, name, every=every)
    env = dict(c.env, HPCPS_MPIRUN_ARGS=TCP, HPCPS_MAX_RESTARTS="2", HPCPS_LAUNCHER=launcher,
               OMPI_MCA_pml="ob1", OMPI_MCA_btl="tcp,self,sm", OMPI_MCA_btl_tcp_if_include=str(th.SUBNET))
    p = subprocess.run(["sbatch", "--parsable", "--nodes=3", "--ntasks=6", "--ntasks-per-node=2", "--overcommit",
                        f"--output={tmp_path / name}.out", *extra, str(ROOT / "slurm" / script), str(job)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


def state(c, jobid) -> dict:
    info = {}
    for tok in c.run("scontrol", "show", "job", "-o", jobid, check=False).split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            info.setdefault(k, v)
    return info


def wait_done(c, jobid, timeout=400) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        info = state(c, jobid)
        if info.get("JobState") in FINAL:
            return info
        time.sleep(0.5)
    raise AssertionError(f"job {jobid} not done after {timeout} s: {state(c, jobid)}")


def wait_for(path: Path, timeout=240):
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"{path} did not appear"
        time.sleep(0.1)


def out(tmp_path, name) -> str:
    p = tmp_path / f"{name}.out"
    return p.read_text(errors="replace") if p.exists() else ""


@pytest.mark.parametrize("script,launcher", [("multinode.sbatch", "mpirun"), ("train.sbatch", "mpirun"),
                                             ("multinode.sbatch", "srun-pmix")])
def test_sbatch_on_three_nodes_completes_bit_identical(cluster, tmp_path, reference, script, launcher):
    c, hs = cluster
    name = script.split(".")[0]
    jobid = submit(c, tmp_path, script, name, launcher=launcher)
    info = wait_done(c, jobid)
    text = out(tmp_path, name)
    assert info["JobState"] == "COMPLETED", text[-4000:]
    assert hosts_line(text) == ("hosts: hpcps-h1: server 0, worker 0; hpcps-h2: server 1, "
                                "worker 1; hpcps-h3: server 2, worker 2"), text[-4000:]
    assert same_weights(weights(tmp_path / name), reference[0])


def test_scontrol_requeue_resumes_bit_identical(cluster, tmp_path, reference):
    c, hs = cluster
    jobid = submit(c, tmp_path, "multinode.sbatch", "rq")
    wait_for(tmp_path / "rq" / "ckpt" / "step-00000010" / "manifest.h5")
    c.run("scontrol", "requeue", jobid)
    info = wait_done(c, jobid)
    text = out(tmp_path, "rq")
    assert info["JobState"] == "COMPLETED" and int(info.get("Restarts", 0)) >= 1, text[-4000:]
    assert "resumed from checkpoint step" in text, text[-4000:]
    assert same_weights(weights(tmp_path / "rq"), reference[0])


def test_node_loss_requeues_and_resumes_bit_identical(cluster, tmp_path, reference):
    c, hs = cluster
    jobid = submit(c, tmp_path, "multinode.sbatch", "lost")
    job = tmp_path / "lost.toml"
    wait_for(tmp_path / "lost" / "ckpt" / "step-00000010" / "manifest.h5")
    on = set(th.pids_on(hs[1]))
    victims = [pid for pid in rank_pids(job).values() if pid in on]
    slurmd = c.procs[f"slurmd-{hs[1].name}"]
    assert len(victims) == 2, victims
    for pid in [slurmd.pid, *victims]:                 # the node dies: its slurmd and ranks
        os.kill(pid, signal.SIGKILL)
    slurmd.wait(10)
    time.sleep(3)
    start_slurmd(c, hs[1])                             # ... and comes back
    info = wait_done(c, jobid)
    text = out(tmp_path, "lost")
    assert info["JobState"] == "COMPLETED" and int(info.get("Restarts", 0)) >= 1, text[-4000:]
    assert "resumed from checkpoint step" in text, text[-4000:]
    assert same_weights(weights(tmp_path / "lost"), reference[0])
    wait_idle(c, hs, 60)
