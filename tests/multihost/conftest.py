"""Three test hosts (tests/hosts/testhosts.py) for the multi-host tests, and launches across them.

The hosts are made once per session (after removing what a killed earlier session left) and
removed at its end, pass or fail; each test calls ``up`` again (idempotent, ~0.1 s) so that a
test that removed or cut something leaves the next one whole hosts. Without root, ``ip`` or
``nsenter`` the tests are skipped — unless ``CI`` is set, where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, kill_session, mpi_env
from tests.hosts import testhosts as th

N_HOSTS = 3


def _missing() -> str:
    if os.geteuid() != 0:
        return "the test hosts need root (network namespaces, a bridge)"
    tools = [t for t in ("ip", "nsenter", "unshare", "tc") if not shutil.which(t)]
    return f"missing {', '.join(tools)} (apt: iproute2 util-linux)" if tools else ""


def skip_or_fail(why: str) -> None:
    """Skip the test for ``why`` (something this machine lacks), or fail it under ``CI``,
    which installs everything."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        pytest.fail("CI is set but " + why, pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def _hosts_session():
    why = _missing()
    if why:
        skip_or_fail(why)
    th.down()                               # what a killed earlier session left
    shm_before = set(os.listdir("/dev/shm"))
    try:
        yield
    finally:
        th.down()
        left = set(os.listdir("/dev/shm")) - shm_before
        if left:                             # segments of ranks killed on purpose
            from tests.slurm.conftest import _shm_in_use
            for name in left - _shm_in_use():
                try:
                    os.unlink(os.path.join("/dev/shm", name))
                except OSError:
                    pass


@pytest.fixture
def hosts(_hosts_session):
    """The test hosts ``[Host(1), Host(2), Host(3)]``, whole (links up, no netem, no delay)."""
    hs = th.up(N_HOSTS)
    for h in hs:
        subprocess.run(["ip", "link", "set", h.veth, "up"], check=True)
        subprocess.run(["tc", "qdisc", "del", "dev", h.veth, "root"], capture_output=True)
    yield hs
    th.undelay(hs)
    for h in hs:
        subprocess.run(["ip", "link", "set", h.veth, "up"], capture_output=True)
        subprocess.run(["tc", "qdisc", "del", "dev", h.veth, "root"], capture_output=True)


def run_args(tmp_path: Path, hs, slots: int = 2) -> list[str]:
    """mpirun options (after ``hpcps run ... --``): one rank per host in turn (``--map-by
    node``: rank r on host r mod N, so the last N ranks, the servers, one per host)."""
    hf = th.hostfile(tmp_path / "hostfile", hs, slots)
    return ["--map-by", "node:OVERSUBSCRIBE", *th.mpirun_args(hf)]


def start_on_hosts(tmp_path: Path, hs, n: int, job: Path, *run_opts, mpirun_extra=(), env=None):
    """``hpcps run -n N [run_opts] JOB -- <mpirun options for the hosts>`` started on the first
    host (mpirun there, its daemons on the others through the rsh agent), in a session of its
    own; stdout+stderr piped, text, line-buffered."""
    cmd = hs[0].cmd(sys.executable, "-m", "hpcps", "run", "-n", str(n), *map(str, run_opts), str(job),
                    "--", *run_args(tmp_path, hs), *mpirun_extra)
    return subprocess.Popen(cmd, cwd=tmp_path, env=env or mpi_env(local=False), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)


def wait(p, timeout=300) -> str:
    """Output of ``p`` once it exits; on timeout its session is killed and AssertionError raised."""
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(p.pid)
        out, _ = p.communicate()
        raise AssertionError(f"no exit within {timeout} s:\n{out[-4000:]}")
    return out


# a small BSP float64 job (deterministic: the same weights bit for bit, wherever it runs)
JOB = """
name = "{name}"
seed = 3
[cluster]
servers = 3
[data]
format = "adult_csv"
path = "{data}"
max_rows = {rows}
hash_bits = 14
[model]
dtype = "float64"
l2 = 0.001
[train]
epochs = {epochs}
batch_size = 64
progress_seconds = 1.0
[consistency]
model = "bsp"
pull = "{pull}"
[checkpoint]
every_steps = {every}
keep = 3
[evaluate]
sklearn_baseline = false
{extra}
[output]
dir = "{out}"
"""

RANKS = 6            # 3 servers (one per host) + 3 workers


def write_job(tmp_path: Path, name: str, *, rows=6000, epochs=2, pull="p2p", every=10,
              extra="") -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(JOB.format(name=name, data=ROOT / "data" / "adult.csv.gz", rows=rows, epochs=epochs,
                            pull=pull, every=every, extra=extra, out=tmp_path / name))
    return p


def weights(run_dir):
    import h5py
    with h5py.File(Path(run_dir) / "model.h5", "r") as f:
        return f["weights"][()], f["bias"][()]


def hosts_line(out: str) -> str:
    """The run summary's ``hosts:`` line of ``out`` without each host's traffic, after
    checking that every host sent and received parameter-server bytes (``(sent X MB, received
    Y MB)``, or bytes below 100 kB, after its ranks); AssertionError naming the line otherwise."""
    import re

    (line,) = [ln[ln.index("  hosts: "):] for ln in out.splitlines() if "  hosts: " in ln] or [""]
    traffic = re.findall(r" \(sent ([\d,.]+) M?B, received ([\d,.]+) M?B\)", line)
    assert traffic and all(float(a.replace(",", "")) > 0 and float(b.replace(",", "")) > 0
                           for a, b in traffic), line
    return re.sub(r" \(sent [^)]*\)", "", line).strip()


def same_weights(a, b) -> bool:
    import numpy as np
    return bool(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]))


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """The job run uninterrupted on this machine alone (6 ranks, shared memory):
    ``(weights, output)``."""
    from tests.helpers import hpcps
    d = tmp_path_factory.mktemp("reference")
    job = write_job(d, "ref")
    proc, _ = hpcps(["run", "-n", str(RANKS), job], cwd=d, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return weights(d / "ref"), proc.stdout
