"""Slow, lossy links and one-sided pulls across the test hosts.

* ``tc netem`` on every host's link (delay with jitter, packet loss, a rate limit): TCP
  retransmits and reorders nothing MPI sees, so BSP training ends bit-identical to the
  no-fault run. A kernel without ``sch_netem`` (this machine's 6.18 "fc" kernel: "Specified
  qdisc kind is unknown", and no classifiers or ``gact`` to drop packets either) gets the rate
  limit alone, from ``tbf``; the test says which it applied;
* ``pull = "rma"`` across hosts (Open MPI 5's ``osc/rdma`` over the TCP BTL): the same weights
  as p2p pulls. It hangs today (xfail, strict): a server waits for ever in the exclusive
  ``Lock`` on its own window (``hpcps/comm/rma.py`` ``exclusive``, from ``_advance``) while the
  workers poll with shared locks (also with ``--mca btl tcp,self``, no shared memory at all);
  one host (``osc/sm``) is fine, and a plain mpi4py Lock/Get/Unlock across the hosts works.
"""

import subprocess

import pytest

from tests.multihost.conftest import RANKS, same_weights, start_on_hosts, wait, weights, write_job

NETEM = ["netem", "delay", "2ms", "1ms", "loss", "0.5%", "rate", "50mbit"]
TBF = ["tbf", "rate", "20mbit", "burst", "32kbit", "latency", "400ms"]


def shape_links(hosts) -> str:
    """netem on every host's link (the bridge side's egress: every packet to a host crosses
    one), else a tbf rate limit; returns what ``tc qdisc show`` says for the first."""
    kind = NETEM
    probe = subprocess.run(["tc", "qdisc", "replace", "dev", hosts[0].veth, "root", *NETEM],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        assert "unknown" in probe.stderr, probe.stderr
        kind = TBF
    for h in hosts:
        subprocess.run(["tc", "qdisc", "replace", "dev", h.veth, "root", *kind], check=True)
    return subprocess.run(["tc", "qdisc", "show", "dev", hosts[0].veth], capture_output=True,
                          text=True).stdout


def test_netem_delay_loss_rate_train_bit_identical(tmp_path, hosts, reference):
    shown = shape_links(hosts)
    print("links:", shown)
    assert ("netem" in shown and "loss 0.5%" in shown) or ("tbf" in shown and "20Mbit" in shown), shown
    job = write_job(tmp_path, "netem")
    p = start_on_hosts(tmp_path, hosts, RANKS, job)
    out = wait(p, timeout=400)
    assert p.returncode == 0, out[-4000:]
    drops = subprocess.run(["tc", "-s", "qdisc", "show", "dev", hosts[0].veth], capture_output=True,
                           text=True).stdout
    assert same_weights(weights(tmp_path / "netem"), reference[0]), drops


@pytest.mark.xfail(strict=True, reason="osc/rdma over TCP: a server's exclusive self-Lock never "
                   "returns while workers poll with shared locks (hangs)")
def test_rma_pulls_across_hosts_give_the_p2p_model(tmp_path, hosts, reference):
    job = write_job(tmp_path, "rma", pull="rma")
    p = start_on_hosts(tmp_path, hosts, RANKS, job)
    out = wait(p, timeout=45)
    assert p.returncode == 0, out[-4000:]
    assert "RMA pulls" in out or "rma" in out.lower(), out[-3000:]
    assert same_weights(weights(tmp_path / "rma"), reference[0])
