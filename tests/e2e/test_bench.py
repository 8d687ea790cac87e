"""Smoke test of ``hpcps bench``: the whole suite on tiny sizes, real mpirun launches.

A measurement needs the full sizes (``hpcps bench``, ~10 min); this only proves that every
script still runs, reports its ratios with their goals, and that the runner writes its
results table — so the suite cannot rot between full runs.
"""

import json
import os
import signal
import time

import pytest

from tests.helpers import alive, hpcps

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

# a step deaf to SIGTERM, with a child deaf to it too: only the kill of the session ends them
STUBBORN = '''\
import os, signal, subprocess, sys, time
from pathlib import Path
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"])
for pid in (os.getpid(), child.pid):
    Path(sys.argv[1], str(pid)).write_text(str(os.getsid(0)))
time.sleep(3600)
'''

DONE = '''\
import json, sys
json.dump({"name": "done", "ratios": [], "notes": []}, open(sys.argv[sys.argv.index("--json") + 1], "w"))
'''


def test_a_step_that_times_out_is_killed_with_its_mpirun_and_ranks_and_the_next_runs(tmp_path, monkeypatch):
    """A step that hangs under mpirun (2 ranks asleep) and one deaf to SIGTERM (and its
    child): after ``--step-timeout`` every process of their sessions is gone (the old runner
    killed only its direct child and left mpirun's ranks running), each is reported as failed
    ("timed out after N s") in results.json and results.md, and the next step still runs."""
    import io

    from hpcps.cli import bench
    from tests.helpers import session_pids

    monkeypatch.setattr(bench, "TERM_GRACE", 3.0)      # the stubborn step ignores it anyway
    for name, text in (("hang", HANG), ("stubborn", STUBBORN), ("done", DONE)):
        (tmp_path / f"{name}.py").write_text(text)
    pids = {name: tmp_path / f"pids-{name}" for name in ("hang", "stubborn")}
    for d in pids.values():
        d.mkdir()

    def steps(quick, tmp):
        return [{"name": "hang", "ranks": 2, "script": str(tmp_path / "hang.py"), "args": [str(pids["hang"])]},
                {"name": "stubborn", "ranks": 0, "script": str(tmp_path / "stubborn.py"),
                 "args": [str(pids["stubborn"])]},
                {"name": "done", "ranks": 0, "script": str(tmp_path / "done.py"),
                 "args": ["--json", str(tmp / "done.json")]}]

    out = io.StringIO()
    t0 = time.monotonic()
    rc = bench.run_suite(quick=True, out_dir=tmp_path / "out", timeout=20, stream=out, steps=steps)
    seconds = time.monotonic() - t0
    procs = {int(p.name): int(p.read_text()) for d in pids.values() for p in d.iterdir()}
    assert len(procs) == 4, f"the steps did not start within the timeout: {out.getvalue()[-3000:]}"
    deadline = time.monotonic() + 5          # orphans are reaped by init
    while time.monotonic() < deadline and any(alive(p) for p in procs):
        time.sleep(0.1)
    left = [p for p in procs if alive(p)]
    for pid in left:                          # do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes {left} still running after their step timed out"
    sessions = set(procs.values())
    assert len(sessions) == 2 and all(session_pids(sid) == [] for sid in sessions), \
        "processes of a timed-out step's session are left"
    assert rc == 1 and seconds < 90, (rc, seconds)
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    hang, stubborn, done = res["reports"]
    for r in (hang, stubborn):
        assert r["failed"] and r["timed_out"] and r["exit"] == 124
        assert r["error"].startswith("timed out after 20 s")
    assert done["name"] == "done" and not done.get("failed")
    assert "| hang | (failed: timed out after 20 s" in (tmp_path / "out" / "results.md").read_text()
    assert "=== hpcps bench: hang FAILED (timed out after 20 s" in out.getvalue()
