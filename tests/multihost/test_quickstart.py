"""The quick-start job across three test hosts, one server per host, over TCP."""

import re

from tests.multihost.conftest import (RANKS, hosts_line, same_weights, start_on_hosts, wait,
                                      weights, write_job)


def auc(out: str) -> str:
    m = re.search(r"test AUC (\d\.\d+)", out)
    assert m, out[-3000:]
    return m.group(1)


def test_three_hosts_train_the_same_model_as_one(tmp_path, hosts, reference):
    job = write_job(tmp_path, "hosts")
    out = wait(start_on_hosts(tmp_path, hosts, RANKS, job))
    assert "done:" in out, out[-3000:]
    # the summary names each rank's host: a server and a worker on each
    assert hosts_line(out) == ("hosts: hpcps-h1: server 0, worker 0; hpcps-h2: server 1, "
                               "worker 1; hpcps-h3: server 2, worker 2"), out[-3000:]
    assert auc(out) == auc(reference[1])
    assert same_weights(weights(tmp_path / "hosts"), reference[0])
