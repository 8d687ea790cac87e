"""Smoke test of ``hpcps bench``: the whole suite on tiny sizes, real mpirun launches.

A measurement needs the full sizes (``hpcps bench``, ~10 min); this only proves that every
script still runs, reports its ratios with their goals, and that the runner writes its
results table — so the suite cannot rot between full runs.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.helpers import hpcps

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

# "hosts" (bench_hosts.py across 2 test hosts) is left out of this smoke test: its request/reply
# round trips between the namespaces take 7-25 ms, and its --quick run alone took over 4 min on
# a loaded 2-core machine; the test hosts are exercised by tests/multihost, its skip path by
# tests/unit/test_bench_report.py.
NAMES = ["kernels", "pushpull", "rma", "rma_fanin", "checkpoint", "e2e", "scaling", "recovery"]


def test_bench_quick_runs_every_script_and_writes_the_table(tmp_path):
    proc, seconds = hpcps(["bench", "--quick", "--out", tmp_path, "--only", *NAMES], timeout=840)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["quick"] is True and res["machine"]["cores"] >= 1 and "mpi" in res["machine"]
    assert [r["name"] for r in res["reports"]] == NAMES
    for r in res["reports"]:
        assert not r.get("failed"), r
        assert r["ratios"], f"{r['name']} reported no ratio"
        for x in r["ratios"]:
            assert x["what"] and (x["value"] is None or x["value"] == x["value"])   # not NaN
            assert x["met"] is None or x["met"] == (x["value"] >= x["goal"] if x["goal_text"].startswith(">=")
                                                    else x["value"] <= x["goal"])
    goals = {r["name"]: [x["goal"] for x in r["ratios"] if x["goal"] is not None] for r in res["reports"]}
    assert 5 in goals["kernels"] and 0.5 in goals["kernels"] and 0.8 in goals["pushpull"]
    assert 0.8 in goals["rma"] and 0.7 in goals["checkpoint"]
    assert 0.5 in goals["recovery"] and 2.0 in goals["recovery"]
    md = (tmp_path / "results.md").read_text()
    assert "| benchmark | ratio | measured | goal |" in md and "(--quick" in md
    for name in NAMES:
        assert f"| {name} |" in md
    # each script prints its headline ratio as its last line, and the runner shows it
    assert "(goal >= 0.7)" in proc.stdout and "raw / hpcps" in proc.stdout


HANG = '''\
import os, sys, time
from pathlib import Path
Path(sys.argv[1], f"{os.getpid()}").write_text(f"{os.getsid(0)}")
time.sleep(3600)
'''

DONE = '''\
import json, sys
json.dump({"name": "done", "ratios": [], "notes": []}, open(sys.argv[sys.argv.index("--json") + 1], "w"))
'''


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_step_that_times_out_is_killed_with_its_mpirun_and_ranks_and_the_next_runs(tmp_path):
    """A step that hangs under mpirun (2 ranks asleep): after ``--step-timeout`` every process
    of its session is gone (the old runner killed only mpirun and left the ranks running), the
    step is reported as failed ("timed out after N s") in results.json and results.md, and the
    next step still runs."""
    import io

    from hpcps.cli.bench import run_suite
    from tests.helpers import session_pids

    (tmp_path / "hang.py").write_text(HANG)
    (tmp_path / "done.py").write_text(DONE)
    pids = tmp_path / "pids"
    pids.mkdir()

    def steps(quick, tmp):
        return [{"name": "hang", "ranks": 2, "script": str(tmp_path / "hang.py"), "args": [str(pids)]},
                {"name": "done", "ranks": 0, "script": str(tmp_path / "done.py"),
                 "args": ["--json", str(tmp / "done.json")]}]

    out = io.StringIO()
    t0 = time.monotonic()
    rc = run_suite(quick=True, out_dir=tmp_path / "out", timeout=20, stream=out, steps=steps)
    seconds = time.monotonic() - t0
    ranks = {int(p.name): int(p.read_text()) for p in pids.iterdir()}
    assert len(ranks) == 2, f"the ranks did not start within the timeout: {out.getvalue()[-3000:]}"
    deadline = time.monotonic() + 5          # orphans are reaped by init
    while time.monotonic() < deadline and any(_alive(p) for p in ranks):
        time.sleep(0.1)
    left = [p for p in ranks if _alive(p)]
    for pid in left:                          # do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"ranks {left} still running after the step timed out"
    (sid,) = set(ranks.values())
    assert session_pids(sid) == [], "processes of the timed-out step's session are left"
    assert rc == 1 and seconds < 60, (rc, seconds)
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    hang, done = res["reports"]
    assert hang["failed"] and hang["timed_out"] and hang["exit"] == 124
    assert hang["error"].startswith("timed out after 20 s")
    assert done["name"] == "done" and not done.get("failed")
    assert "| hang | (failed: timed out after 20 s" in (tmp_path / "out" / "results.md").read_text()
    assert "=== hpcps bench: hang FAILED (timed out after 20 s" in out.getvalue()
