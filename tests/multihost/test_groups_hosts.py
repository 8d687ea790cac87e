"""``[comm] aggregate = "node"`` across the three test hosts: groups are a node's workers.

9 ranks with ``--map-by node`` (rank r on host r mod 3): 6 workers, two per host (workers
0 and 3 on the first, 1 and 4 on the second, 2 and 5 on the third) and the 3 servers, one per
host. ``MPI_COMM_TYPE_SHARED`` must give one group per host, each server one request per group
and step; the members of a group are not consecutive workers, so a server sums the same
gradient rows in another order than without groups: the model agrees up to rounding.
Small (1,500 rows, one epoch): its 9 ranks share the 2 cores with the other groups' tests.
"""

import re

import numpy as np

from tests.multihost.conftest import hosts_line, start_on_hosts, wait, weights, write_job

RANKS = 9


def test_a_group_per_host_trains_the_model_of_the_workers_own_steps(tmp_path, hosts):
    plain = wait(start_on_hosts(tmp_path, hosts, RANKS, write_job(tmp_path, "plain", rows=1500, epochs=1)))
    assert "done:" in plain, plain[-3000:]
    job = write_job(tmp_path, "grouped", rows=1500, epochs=1, extra='[comm]\naggregate = "node"')
    out = wait(start_on_hosts(tmp_path, hosts, RANKS, job))
    assert "done:" in out, out[-3000:]
    assert ("3 group(s) of the 6 workers send their steps together; each server gets 3 "
            "request(s) per step") in out, out[-3000:]
    assert hosts_line(out) == ("hosts: hpcps-h1: server 0, workers 0, 3; hpcps-h2: server 1, "
                               "workers 1, 4; hpcps-h3: server 2, workers 2, 5"), out[-3000:]
    (w, b), (w0, b0) = weights(tmp_path / "grouped"), weights(tmp_path / "plain")
    assert np.abs(w0).max() > 1e-3
    np.testing.assert_allclose(w, w0, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(b, b0, rtol=1e-9, atol=1e-12)

    def requests(text):     # the servers' request counts in the run summary
        return [int(n.replace(",", "")) for n in
                re.findall(r"server \d: .*?, ([\d,]+) requests", text)]

    r_plain, r_grouped = requests(plain), requests(out)
    assert len(r_plain) == len(r_grouped) == 3, (plain[-2000:], out[-2000:])
    steps = int(re.search(r"done: \d+ epoch\(s\), ([\d,]+) steps", out).group(1).replace(",", ""))
    # per server and step one request per group (3) instead of one per worker (6)
    assert all(p - g >= 3 * steps for g, p in zip(r_grouped, r_plain)), (steps, r_plain,
                                                                          r_grouped)
