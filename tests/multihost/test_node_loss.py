"""Node loss: every rank on one test host killed at once (``kill -9``), as when a node dies.

* restart mode under ``hpcps run --max-restarts``: the job is relaunched, resumes from its
  newest checkpoint and ends with weights bit-identical to an uninterrupted run (BSP, float64);
* continue mode with ``replicas = 2``: the job survives the loss of a server and a worker
  (the host's two ranks) without a restart, and its failure record names the host.
"""

import json
import os
import signal
import time

from hpcps import checkpoint as ck
from tests.helpers import rank_pids
from tests.hosts import testhosts as th
from tests.multihost.conftest import RANKS, same_weights, start_on_hosts, wait, weights, write_job


def ranks_on(job, host) -> dict:
    """{world rank: pid} of the job's ranks running on ``host``."""
    on = set(th.pids_on(host))
    return {r: pid for r, pid in rank_pids(job).items() if pid in on}


def kill_host_ranks(job, host, p, wait_for=None, timeout=120) -> dict:
    """Once ``wait_for`` (a path) exists and the host runs 2 ranks, SIGKILL them all at once."""
    deadline = time.time() + timeout
    while time.time() < deadline and p.poll() is None:
        if (wait_for is None or wait_for.exists()) and len(ranks_on(job, host)) == 2:
            break
        time.sleep(0.02)
    victims = ranks_on(job, host)
    assert len(victims) == 2, f"ranks on {host.name}: {victims}"
    for pid in victims.values():
        os.kill(pid, signal.SIGKILL)
    return victims


def test_node_loss_restart_mode_resumes_bit_identical(tmp_path, hosts, reference):
    job = write_job(tmp_path, "loss")
    p = start_on_hosts(tmp_path, hosts, RANKS, job, "--max-restarts", "2")
    victims = kill_host_ranks(job, hosts[1], p, ck.step_dir(tmp_path / "loss", 10) / ck.MANIFEST)
    assert sorted(victims) == [1, 4]                   # worker 1 and server 1 (map-by node)
    out = wait(p, timeout=400)
    assert p.returncode == 0, out[-4000:]
    assert "restart 1/2" in out and "resumed from checkpoint step" in out, out[-4000:]
    assert same_weights(weights(tmp_path / "loss"), reference[0])


def test_node_loss_continue_mode_with_replicas_finishes_without_restart(tmp_path, hosts):
    # enough epochs that the loss comes well inside the run: its first progress line comes
    # after 1 s, and 2 epochs took less than that once the hosts' MPI yields when idle
    epochs = 40
    job = write_job(tmp_path, "cont", every=0, epochs=epochs,
                    extra='[fault_tolerance]\nmode = "continue"\nreplicas = 2\n')
    p = start_on_hosts(tmp_path, hosts, RANKS, job)
    # after a few steps: the chief's progress line
    deadline = time.time() + 120
    lines = []
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "step" in line and "loss" in line:
            break
    t_kill = time.time()
    victims = kill_host_ranks(job, hosts[1], p)
    assert sorted(victims) == [1, 4]
    out = "".join(lines) + wait(p, timeout=300)
    assert p.returncode == 0, out[-4000:]
    assert "restart" not in out, out[-4000:]
    assert time.time() - t_kill < 240
    m = json.loads((tmp_path / "cont" / "metrics.json").read_text())
    events = m["summary"]["failures"]
    assert sorted(r for e in events for r in e["failed_ranks"]) == [1, 4], events
    assert {h for e in events for h in e["failed_hosts"]} == {"hpcps-h2"}, events
    assert [r["epoch"] for r in m["epochs"]][-1] == epochs and m["epochs"][-1]["test_auc"] > 0.85
