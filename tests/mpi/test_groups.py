# mpi-ranks: 4 5
"""``[comm] aggregate = "node"``: a group's leader sends its members' BSP steps (real MPI
ranks, real Adult rows, the whole job through :func:`hpcps.runtime.job.run_job`).

One server; the other ranks are workers, split into groups of ``group_workers`` (all on this
host): 3 workers in groups [2, 1], 4 in [2, 2].
"""

import io
import math
import sys

import numpy as np
import pytest
from mpi4py import MPI

from hpcps.config import parse_job
from hpcps.core.signals import StopRequest
from hpcps.runtime.job import run_job
from hpcps.runtime.output import read_model

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_bsp_equivalence import JOB  # noqa: E402

ROWS = 600


def _job(mpi_tmp_path, name, batch, group_workers=None, epochs=2, servers=1):
    from pathlib import Path

    data = Path(__file__).resolve().parents[2] / "data" / "adult.csv.gz"
    text = JOB.format(servers=servers, data=data, rows=ROWS, l2=0.01, out=mpi_tmp_path / name)
    text = text.replace("batch_size = 64", f"batch_size = {batch}")
    text = text.replace("epochs = 2", f"epochs = {epochs}")
    if group_workers is not None:
        text += f'[comm]\naggregate = "node"\ngroup_workers = {group_workers}\n'
    return parse_job(text, mpi_tmp_path / f"{name}.toml")


def _weights(cfg):
    m = read_model(cfg.output.dir / "model.h5")
    return m["tables"]["weights"][:, 0], m["tables"]["bias"][0, 0]


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("batch, servers", [(1, 1), (32, 1), (8, 2)])
def test_groups_train_the_same_model_bit_for_bit_with_fewer_server_requests(mpi_tmp_path,
                                                                             batch, servers):
    """Batch 1: one-message steps (the server's compiled loop); batch 32: several messages;
    2 servers: each owned by another member of a group, one of them not by the chief (whose
    final requests to it must be answered before its owners stop it). The server sums the
    group's concatenated gradients in the members' order, so the model is the one the
    workers' own pushes give, bit for bit; the server handles about one request per group
    and step instead of one per worker."""
    comm = MPI.COMM_WORLD
    workers = comm.size - servers
    groups = math.ceil(workers / 2)
    null = open("/dev/null", "w")
    off = run_job(_job(mpi_tmp_path, "off", batch, servers=servers), comm, out=null)
    cfg = _job(mpi_tmp_path, "groups", batch, group_workers=2, servers=servers)
    text = io.StringIO()
    on = run_job(cfg, comm, out=text)
    comm.Barrier()
    if comm.rank == 0:
        assert (f"{groups} group(s) of the {workers} workers send their steps together; each "
                f"server gets {groups} request(s) per step") in text.getvalue()
        w_off, b_off = _weights(_job(mpi_tmp_path, "off", batch, servers=servers))
        w, b = _weights(cfg)
        assert np.abs(w_off).max() > 1e-3                   # the model did move
        np.testing.assert_array_equal(w, w_off)
        assert b == b_off
        assert on["steps"] == off["steps"]
        assert on["examples"] == off["examples"]            # every member's rows counted once
        steps = off["steps"]
        for s_off, s_on in zip(off["servers"], on["servers"]):
            # per step: one request per worker, or per group (+ evaluation pulls, stops)
            r_off, r_on = s_off["requests"], s_on["requests"]
            assert r_off >= workers * steps
            assert groups * steps <= r_on < r_off * groups / workers + 4 * workers * cfg.train.epochs


@pytest.mark.mpi(min_size=4)
def test_a_group_job_stopped_by_a_member_resumes_to_the_same_model(mpi_tmp_path):
    """A stop request that reaches a member (not a leader) stops every worker after the same
    step; the checkpoint it writes resumes, with the groups formed again, to the model of a
    run without stop or groups."""
    comm = MPI.COMM_WORLD
    null = open("/dev/null", "w")
    run_job(_job(mpi_tmp_path, "ref", 16), comm, out=null)
    cfg = _job(mpi_tmp_path, "stopped", 16, group_workers=2)
    stop = StopRequest()

    def hook(worker, clock):
        if worker == 1 and clock == 7:
            stop.signum = 15                   # as the handler of a SIGTERM sets it

    first = run_job(cfg, comm, out=null, step_hook=hook, stop=stop)
    assert first["stopped_by_signal"]
    second = run_job(cfg, comm, out=null, resume="require", stop=StopRequest())
    comm.Barrier()
    if comm.rank == 0:
        assert "steps" in second                      # the chief's summary: it finished
        assert second["steps"] > 0                   # steps of this launch
        w_ref, b_ref = _weights(_job(mpi_tmp_path, "ref", 16))
        w, b = _weights(cfg)
        np.testing.assert_array_equal(w, w_ref)
        assert b == b_ref


@pytest.mark.mpi(min_size=1)
def test_a_grow_request_to_a_group_job_is_refused(mpi_tmp_path):
    """``hpcps grow`` cannot add workers to groups formed at the start: the chief answers the
    request "refused" with the reason (``Elastic.poll_request``) instead of acting on it."""
    from hpcps.comm.membership import Membership
    from hpcps.resilience.elastic import Elastic

    grouped = Elastic(_job(mpi_tmp_path, "grow", 16, group_workers=2), Membership(specs=[]))
    plain = Elastic(_job(mpi_tmp_path, "grow", 16), Membership(specs=[]))
    assert "aggregate = 'node'" in grouped.unavailable
    assert plain.unavailable is None or "aggregate" not in plain.unavailable


@pytest.mark.mpi(min_size=1)
def test_the_cost_model_with_groups_charges_a_server_one_request_per_group():
    """bench_scaling.predict with groups of g workers: a server's per-request term is paid
    once per group, its per-key term is unchanged (the same keys arrive), and a worker sends
    only its servers' requests (S / g), moves K keys on average and pays the collectives."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import bench_scaling

    group = {"a_group_us": 10.0, "c_group_ns": 10.0, "members": 2, "pair_us": 1.0}
    one = bench_scaling.predict(1024, 128, 2650, 20.0, 5.0)
    grouped = bench_scaling.predict(1024, 128, 2650, 20.0, 5.0, g=32, group=group)
    per_key = 1024 * 2650 / 128 * 5.0e-6                          # ms, the same in both
    assert one["server_ms"] == pytest.approx(1024 * 20e-3 + per_key)
    assert grouped["server_ms"] == pytest.approx(32 * 20e-3 + per_key)
    assert grouped["worker_ms"] == pytest.approx(4 * 20e-3 + 2650 * 15.0e-6 + 10e-3
                                                 + 3 * 30 * 1.0e-3)
    assert grouped["bytes_per_server_step"] < one["bytes_per_server_step"]
    assert bench_scaling.predict(64, 8, 2650, 20.0, 5.0, g=1) == bench_scaling.predict(
        64, 8, 2650, 20.0, 5.0)
    # with the worker's own work fitted at 1 + 1 (a_worker + K c_worker; found 2026-12-04:
    # without it the model said 0.12 ms for a 0.37 ms step once the server's per-key cost
    # fell), plus a request for each further server it sends to
    own = bench_scaling.predict(1, 1, 2650, 20.0, 5.0, a_worker_us=30.0, c_worker_ns=20.0)
    assert own["worker_ms"] == pytest.approx(30e-3 + 2650 * 20e-6)
    assert own["server_ms"] == bench_scaling.predict(1, 1, 2650, 20.0, 5.0)["server_ms"]
    wide = bench_scaling.predict(1024, 128, 2650, 20.0, 5.0, g=32, group=group,
                                 a_worker_us=30.0, c_worker_ns=20.0)
    assert wide["worker_ms"] == pytest.approx(30e-3 + 3 * 20e-3 + 2650 * 20e-6 + 10e-3
                                              + 2650 * 10e-6 + 3 * 30 * 1.0e-3)


@pytest.mark.mpi(min_size=4)
def test_groups_with_a_dynamic_table_train_the_same_model(mpi_tmp_path):
    """A hash table (raw 64-bit keys routed by hash, issue 18) under groups: the same keys
    stored and the same rows bit for bit as without groups."""
    comm = MPI.COMM_WORLD
    null = open("/dev/null", "w")
    dyn = '[tables.weights]\nstorage = "hash"\n'
    cfgs = []
    for name, gw in (("dyn_off", None), ("dyn_groups", 2)):
        cfg = _job(mpi_tmp_path, name, 16, group_workers=gw, servers=2)
        cfg = parse_job(cfg.text + dyn, mpi_tmp_path / f"{name}.toml")
        run_job(cfg, comm, out=null)
        cfgs.append(cfg)
    comm.Barrier()
    if comm.rank == 0:
        a, b = (read_model(c.output.dir / "model.h5")["tables"] for c in cfgs)
        assert a["weights_keys"].size > 100
        np.testing.assert_array_equal(a["weights_keys"], b["weights_keys"])
        np.testing.assert_array_equal(a["weights"], b["weights"])
        np.testing.assert_array_equal(a["bias"], b["bias"])
