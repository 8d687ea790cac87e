"""bench/bench_hosts.py's guards: a launch across the hosts that hangs becomes a clear error
within its time limit, with nothing of it left on either host; ``hpcps bench`` ending the
``hosts`` step at its timeout leaves no process and no host behind.

(A worker rank of bench_pushpull.py across the hosts once raised while the server rank waited
in its receive: 40 min at ~93 % CPU, until someone noticed.)
"""

import io
import json
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, mpi_env, mpirun
from tests.hosts import testhosts as th

sys.path.insert(0, str(ROOT / "bench"))

HANG = '''\
import os, sys, time
from pathlib import Path
Path(sys.argv[1], str(os.getpid())).write_text(os.uname().nodename)
time.sleep(3600)
'''


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_launch_across_the_hosts_that_hangs_is_killed_on_both_hosts_with_a_clear_error(hosts, tmp_path):
    import bench_hosts

    hs = hosts[:2]
    (tmp_path / "hang.py").write_text(HANG)
    pids = tmp_path / "pids"
    pids.mkdir()
    hf = th.hostfile(tmp_path / "hostfile", hs, 1)
    cmd = hs[0].cmd(mpirun(), "-n", "2", "--map-by", "node", *th.mpirun_args(hf), sys.executable,
                    str(tmp_path / "hang.py"), str(pids))
    t0 = time.monotonic()
    with pytest.raises(bench_hosts.LaunchTimeout,
                       match=r"^the sleeping launch did not finish within 30 s \(--timeout\): killed its \d+ "
                             r"processes") as e:
        bench_hosts.run_across(cmd, mpi_env(local=False), tmp_path, 30, "the sleeping launch", hs, capture=True)
    seconds = time.monotonic() - t0
    ranks = {int(p.name): p.read_text() for p in pids.iterdir()}
    assert sorted(ranks.values()) == ["hpcps-h1", "hpcps-h2"], f"the ranks did not start: {e.value}"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in ranks):
        time.sleep(0.1)
    assert [p for p in ranks if _alive(p)] == [], "ranks left running after the launch timed out"
    assert [th.pids_on(h) for h in hs] == [[], []], "processes left on the hosts"
    assert seconds < 45, seconds
    assert not bench_hosts._running


def test_hpcps_bench_ending_the_hosts_step_at_its_timeout_leaves_no_process_and_no_host(_hosts_session, tmp_path):
    from hpcps.cli.bench import run_suite

    out = io.StringIO()
    t0 = time.monotonic()
    rc = run_suite(quick=True, out_dir=tmp_path, only=["hosts"], timeout=5, stream=out)
    seconds = time.monotonic() - t0
    text = out.getvalue()
    assert rc == 1, text[-3000:]
    (rep,) = json.loads((tmp_path / "results.json").read_text())["reports"]
    assert rep["timed_out"] and rep["error"].startswith("timed out after 5 s"), rep
    assert seconds < 30, (seconds, text[-3000:])          # SIGTERM: bench_hosts cleaned up at once
    assert th.existing() == [] and not Path("/sys/class/net/hpcps-br0").exists(), f"hosts left: {text[-3000:]}"
    left = []
    for d in Path("/proc").iterdir():                      # what bench_hosts launched: its temp dir
        try:
            if d.name.isdigit() and b"hpcps-bench-hosts-" in (d / "cmdline").read_bytes():
                left.append(d.name)
        except OSError:
            pass
    assert left == [], f"processes of bench_hosts left: {left}"
