"""Elastic scale-out without MPI ranks: the re-plan of an epoch when workers are added, the
[elastic] keys, the run-directory protocol of ``hpcps grow``, and when a launch cannot spawn.
(The real spawns are in tests/e2e/test_elastic.py.)"""

import json
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcps.resilience import grow_request as G
from hpcps.config import ConfigError, parse_job
from hpcps.core.planning import epoch_order, epoch_rows

JOB = """
name = "e"
[data]
format = "adult_csv"
path = "{data}"
"""


def rows_read(sizes, plan, n_last, batch, seed=3, epoch=1, shuffle=True):
    """Every row the segments of ``plan`` read (the first ``done`` batches of each worker's
    list), then the whole lists of the last segment on ``n_last`` workers — as the trainer."""
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    lists = [offsets[w] + epoch_order(n, seed, w, epoch, shuffle) for w, n in enumerate(sizes)]
    seen = []
    for k, (n_k, done) in enumerate(plan):
        per = done if isinstance(done, list) else [done] * n_k
        seen += [r[: d * batch] for r, d in zip(lists, per)]
        nxt = plan[k + 1][0] if k + 1 < len(plan) else n_last
        lists = epoch_rows(sizes, plan[: k + 1], nxt, seed, epoch, shuffle, batch)
    return seen, lists


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(0, 60), min_size=1, max_size=4), add=st.integers(1, 5),
       done=st.integers(0, 10), batch=st.integers(1, 8), shuffle=st.booleans())
def test_growth_mid_epoch_every_row_once_and_new_workers_get_a_share(sizes, add, done, batch,
                                                                    shuffle):
    """n workers read ``done`` steps each, then n + add workers read the rest: every row of
    the epoch exactly once, and the unread rows are split evenly (to 1 row) over all."""
    n = len(sizes)
    done = min(done, max(1, -(-max(sizes) // batch)))          # within the epoch
    seen, rest = rows_read(sizes, [[n, done]], n + add, batch, shuffle=shuffle)
    allrows = np.concatenate(seen + rest)
    assert sorted(allrows.tolist()) == list(range(sum(sizes)))
    assert len(rest) == n + add
    counts = [r.size for r in rest]
    assert max(counts) - min(counts) <= 1                        # the added workers' share too
    unread = sum(max(0, s - done * batch) for s in sizes)
    assert sum(counts) == unread


def test_growth_twice_and_after_a_loss_in_one_epoch():
    """3 workers, one dies after uneven progress, 2 survivors go on, 3 workers are added, then
    2 more: four segments, every row once."""
    sizes = [50, 49, 49]
    batch = 4
    plan = [[3, [5, 3, 4]], [2, 2], [5, 1]]
    seen, rest = rows_read(sizes, plan, 7, batch)
    allrows = np.concatenate(seen + rest)
    assert sorted(allrows.tolist()) == list(range(148))
    assert len(rest) == 7 and all(r.size for r in rest)


def test_growth_at_the_end_of_an_epoch_leaves_nothing_to_replan():
    sizes = [10, 10]
    seen, rest = rows_read(sizes, [[2, 3]], 4, batch=4)          # 3 steps of 4 cover 10 rows
    assert [r.size for r in rest] == [0, 0, 0, 0]
    assert sorted(np.concatenate(seen).tolist()) == list(range(20))


# ------------------------------------------------------------------------------ config


def cfg(tmp_path, extra):
    data = tmp_path / "a.csv"
    data.write_text("39, State-gov, 77516\n")
    return parse_job(JOB.format(data=data) + extra, tmp_path / "e.toml")


def test_elastic_keys_parse(tmp_path):
    c = cfg(tmp_path, "[elastic]\nadd_workers = 2\nat_step = 40\noversubscribe = true\n")
    assert (c.elastic.add_workers, c.elastic.at_step, c.elastic.oversubscribe) == (2, 40, True)
    assert cfg(tmp_path, "").elastic.add_workers == 0


@pytest.mark.parametrize("extra, key, text", [
    ("[elastic]\nadd_workers = 2\n", "elastic.at_step", "required with add_workers = 2"),
    ("[elastic]\nadd_workers = 2\nat_step = 0\n", "elastic.at_step", "required"),
    ("[elastic]\nat_step = 5\n", "elastic.at_step", "only used with add_workers"),
    ("[elastic]\noversubscribe = true\n", "elastic.oversubscribe", "only used with add_workers"),
    ("[elastic]\nadd_workers = -1\nat_step = 3\n", "elastic.add_workers", "in [0, 4096], got -1"),
    ("[elastic]\nadd_workers = 5000\nat_step = 3\n", "elastic.add_workers", "got 5000"),
    ("[elastic]\nadd_workers = 2.5\nat_step = 3\n", "elastic.add_workers", "integer"),
    ("[elastic]\nadd_worker = 2\n", "elastic.add_worker", "did you mean 'add_workers'"),
    ("[cluster]\nmode = \"allreduce\"\n[elastic]\nadd_workers = 1\nat_step = 3\n",
     "elastic.add_workers", "parameter-server jobs only"),
])
def test_elastic_key_errors_name_file_and_key(tmp_path, extra, key, text):
    with pytest.raises(ConfigError) as e:
        cfg(tmp_path, extra)
    assert e.value.key == key and text in e.value.message, str(e.value)
    assert str(e.value).startswith(str(tmp_path / "e.toml"))


# ------------------------------------------------------------------ the launch can't spawn


# ------------------------------------------------------------------ hpcps grow: run dir


@pytest.fixture
def chief():
    """A live process whose command line names hpcps, standing in for a job's chief."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "hpcps"])
    for _ in range(500):                  # /proc/PID/cmdline is empty until the exec is done
        if b"hpcps" in open(f"/proc/{p.pid}/cmdline", "rb").read():
            break
        time.sleep(0.01)
    yield p.pid
    p.kill()
    p.wait()


def marker(d, **kw):
    info = {"job": "e", "pid": None, "host": socket.gethostname(), "started": 0,
            "mode": "ps", "workers": 2, "servers": 1, "can_grow": True, "why_not": ""}
    info.update(kw)
    (d / G.RUNNING).write_text(json.dumps(info))


def test_submit_request_and_answer(tmp_path, chief):
    marker(tmp_path, pid=chief)
    rid = G.submit_request(tmp_path, 2, oversubscribe=True)
    req = G.read_request(tmp_path / G.REQUEST)
    assert (req["id"], req["workers"], req["oversubscribe"]) == (rid, 2, True)
    with pytest.raises(G.GrowError, match="already pending"):
        G.submit_request(tmp_path, 1)
    assert G.wait_answer(tmp_path, rid, timeout=0.1) is None
    G.write_answer(tmp_path, "other", "grown", "not ours")
    assert G.wait_answer(tmp_path, rid, timeout=0.1) is None
    G.write_answer(tmp_path, rid, "refused", "no slot")
    assert G.wait_answer(tmp_path, rid, timeout=1)["message"] == "no slot"


@pytest.mark.parametrize("setup, text", [
    ("missing", "no such directory"),
    ("empty", "not an hpcps run directory"),
    ("finished", "the job has finished"),
    ("stopped", "no parameter-server job is running here"),
    ("dead", "is not running: its chief (pid"),
    ("cannot", "cannot add workers: started by srun"),
])
def test_grow_refused_for_runs_that_are_not_running(tmp_path, setup, text, chief):
    d = tmp_path / "run"
    if setup != "missing":
        d.mkdir()
    if setup == "finished":
        (d / "metrics.json").write_text(json.dumps({"epochs": [], "summary": {"examples": 1}}))
    elif setup == "stopped":
        (d / "metrics.json").write_text(json.dumps({"epochs": []}))
    elif setup == "dead":
        p = subprocess.Popen([sys.executable, "-c", "pass"])
        p.wait()                                            # a pid that has exited
        marker(d, pid=p.pid)
    elif setup == "cannot":
        marker(d, pid=chief, can_grow=False, why_not="started by srun")
    with pytest.raises(G.GrowError, match=text.replace("(", r"\(")):
        G.submit_request(d, 1)
    assert not (d / G.REQUEST).exists()


@pytest.mark.parametrize("body, text", [
    ("{", "not a readable JSON request"),
    ("[1]", "expected a JSON object"),
    ('{"workers": 0}', "workers: must be an integer in [1, 4096], got 0"),
    ('{"workers": true}', "must be an integer"),
    ('{"workers": 2, "oversubscribe": "yes"}', "oversubscribe: must be true or false"),
])
def test_bad_request_files_are_named(tmp_path, body, text):
    p = tmp_path / G.REQUEST
    p.write_text(body)
    with pytest.raises(G.GrowError) as e:
        G.read_request(p)
    assert str(p) in str(e.value) and text in str(e.value)


def test_grow_workers_out_of_range(tmp_path, chief):
    marker(tmp_path, pid=chief)
    for n in (0, -2, 5000):
        with pytest.raises(G.GrowError, match="--workers must be an integer"):
            G.submit_request(tmp_path, n)


def test_hpcps_grow_cli_on_finished_run_exits_2(tmp_path):
    """The command itself (no MPI needed): a clear error, exit status 2, nothing written."""
    (tmp_path / "metrics.json").write_text(json.dumps({"summary": {}}))
    proc = subprocess.run([sys.executable, "-m", "hpcps", "grow", str(tmp_path), "-w", "2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "the job has finished" in proc.stderr and "error" in proc.stderr
    assert not (tmp_path / G.REQUEST).exists()
