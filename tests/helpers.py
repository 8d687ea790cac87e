"""Helpers for tests that launch real MPI jobs (no fixtures here: plain functions)."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcps.core.procs import kill_session, session_pids  # noqa: F401 (used by the tests)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "adult.csv.gz"


#: The rank and host in front of every line a rank of a job writes (hpcps.core.log.origin).
ORIGIN = re.compile(r"^\[(?:rank \d+@)?[^\]\s]+\] ")


def log_lines(text: str) -> list:
    """The lines of a job's output without the ``[rank R@HOST] `` in front of each
    (:mod:`hpcps.core.log`): the texts as hpcps wrote them."""
    return [ORIGIN.sub("", line) for line in text.splitlines()]


def mpirun() -> str:
    local = Path(sys.executable).parent / "mpirun"
    return str(local) if local.exists() else "mpirun"


def session_dir_base() -> str:
    """A new empty directory for Open MPI's session directories, removed (with whatever a
    killed launch left in it) when this process exits.

    Open MPI 5's mpirun (PRRTE) keeps its session directory in ``BASE/ompi.<its pid>``
    (``BASE``: ``PRTE_MCA_prte_tmpdir_base``, else ``$TMPDIR``, else ``/tmp``). An mpirun
    killed with SIGKILL leaves that directory behind, and a later mpirun that gets the same
    pid (pids wrap at 32768 here) finds the old PMIx rendezvous files (``pmix.vm.tool*``) in
    it and exits at once with status 213: "The PMIx server's listener thread failed to start".
    Test launches are killed often on a shared machine (timeouts, other sessions), so /tmp
    holds tens of such directories; one failed a CI run (a launch of test_server_loss.py that
    exited 213 within 50 ms). A private base per launch has none in the way.
    """
    path = tempfile.mkdtemp(prefix="hpcps-ompi-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def mpi_env(local: bool = True, **extra) -> dict:
    """Environment for test launches: run-as-root (when root), oversubscription, and a private
    base for Open MPI's session directories (:func:`session_dir_base`).

    ``local=False`` (the multi-host tests, which name their subnet): drop the loopback-only
    TCP setting that ``tests/run.py`` gives every group (:func:`tests.run.mpi_env`)."""
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")
    if not local and env.get("OMPI_MCA_btl_tcp_if_include") == "lo":
        del env["OMPI_MCA_btl_tcp_if_include"]
    env["PRTE_MCA_prte_tmpdir_base"] = session_dir_base()
    env.update(extra)
    return env


def run_in_session(cmd, cwd=None, env=None, timeout=None, **kw) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)`` in a new session; on timeout
    every process of that session is killed — mpirun *and* its ranks, which prterun puts in
    process groups of their own, so neither ``subprocess.run(timeout=...)`` nor ``killpg``
    reaches them — and ``subprocess.TimeoutExpired`` is raised with the output so far. Before
    the kill, the Python stacks of the session's processes (:func:`python_stacks`) and the tails
    of the output are printed: pytest shows them with the failure (a hang in CI is read there)."""
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = python_stacks(p.pid)
        kill_session(p.pid)
        out, err = p.communicate()
        print(f"=== {Path(str(cmd[0])).name} timed out after {timeout} s; stdout (tail):\n"
              f"{(out or '')[-4000:]}\n=== stderr (tail):\n{(err or '')[-4000:]}\n{stacks}")
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def py_spy() -> str | None:
    """The ``py-spy`` executable (the test extra installs it), or None."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return spy if Path(spy).exists() else None


def python_stacks(sid: int) -> str:
    """The ``py-spy dump`` of every Python process of session ``sid`` (each thread's stack,
    with locals), for a launch that hangs; a note instead where py-spy is missing or fails."""
    spy = py_spy()
    if spy is None:
        return "=== no py-spy: no stacks"
    parts = []
    for pid in session_pids(sid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not Path(cmdline[0].decode(errors="replace")).name.startswith("python"):
            continue
        try:
            r = subprocess.run([spy, "dump", "--locals", "--pid", str(pid)], capture_output=True,
                               text=True, timeout=30)
            text = r.stdout + r.stderr
        except (OSError, subprocess.TimeoutExpired) as e:
            text = f"py-spy failed: {e}"
        parts.append(f"=== stacks of pid {pid} ({b' '.join(cmdline[:6]).decode(errors='replace')}):\n{text}")
    return "\n".join(parts) or "=== no Python process left in the session"


def _run(cmd, cwd, env, timeout):
    t0 = time.perf_counter()
    proc = run_in_session(cmd, cwd=cwd, env=env, timeout=timeout)
    return proc, time.perf_counter() - t0


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie, killed and not reaped yet, does
    not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def launch(n: int, args, cwd=None, timeout=300, env=None):
    """``mpirun -n N python -m hpcps ARGS``; returns (CompletedProcess, seconds). On timeout
    every process of the launch is killed and ``subprocess.TimeoutExpired`` raised."""
    cmd = [mpirun(), "-n", str(n), sys.executable, "-m", "hpcps", *map(str, args)]
    return _run(cmd, cwd, env or mpi_env(), timeout)


def hpcps(args, cwd=None, timeout=600, env=None):
    """``python -m hpcps ARGS`` (no mpirun around it); killed with its children on timeout."""
    cmd = [sys.executable, "-m", "hpcps", *map(str, args)]
    return _run(cmd, cwd, env or mpi_env(), timeout)


def write_job(path: Path, body: str) -> Path:
    path.write_text(body.replace("@DATA@", str(DATA)))
    return path


def rank_pids(job_file: Path, marker: bytes = b"train") -> dict:
    """{world rank: pid} of the MPI ranks running ``job_file`` (command lines with an argument
    ``marker`` or ending in ``/marker``: ``hpcps train`` by default)."""
    found = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
            if (not any(c == marker or c.endswith(b"/" + marker) for c in cmd)
                    or str(job_file).encode() not in cmd):
                continue
            env = dict(kv.split(b"=", 1) for kv in (p / "environ").read_bytes().split(b"\0") if b"=" in kv)
            for var in (b"OMPI_COMM_WORLD_RANK", b"PMIX_RANK", b"PMI_RANK", b"SLURM_PROCID"):
                if var in env:
                    found[int(env[var])] = int(p.name)
                    break
        except (OSError, ValueError):
            continue
    return found


def start_run(tmp_path, job, n: int, *extra):
    """``python -m hpcps run -n N [extra] JOB`` in ``tmp_path``, output piped line by line."""
    return subprocess.Popen([sys.executable, "-m", "hpcps", "run", "-n", str(n), *extra, str(job)],
                            cwd=tmp_path, env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)


def read_until(p, text, lines, timeout=180):
    """Read the output of ``p`` (a Popen with text stdout) into ``lines`` until a line
    contains ``text``; AssertionError with the output's head and tail if it does not come."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return
    out = "".join(lines)
    shown = out if len(out) <= 4000 else f"{out[:1500]}\n[...]\n{out[-2500:]}"
    raise AssertionError(f"{text!r} not seen in {len(lines)} line(s) of output (head and "
                         f"tail):\n{shown}")


def kill_rank(job, rank, marker=b"train"):
    """``kill -9`` world rank ``rank`` of the job running ``job`` (see :func:`rank_pids`)."""
    pids = rank_pids(job, marker)
    assert rank in pids, f"rank {rank} not running ({pids})"
    os.kill(pids[rank], signal.SIGKILL)


# ------------------------------------------------ continue-mode jobs with kills at known clocks

CONTINUE_JOB = """
name = "{name}"
{seed}
[cluster]
servers = {servers}
[data]
format = "adult_csv"
path = "{data}"
max_rows = {rows}
[model]
l2 = 1e-5
{dtype}
[train]
epochs = 2
batch_size = 32
progress_seconds = 0.000001
[consistency]
model = "{consistency}"
[checkpoint]
every_steps = {every}
keep = 20
[fault_tolerance]
mode = "continue"
{fault_tolerance}
{extra}
[output]
dir = "{name}"
"""


def write_continue_job(tmp_path: Path, name: str, *, servers: int, consistency: str = "bsp",
                       every: int = 0, rows: int = 12000, seed: int | None = None,
                       dtype: str | None = None, fault_tolerance: str = "",
                       extra: str = "") -> Path:
    """``tmp_path/NAME.toml``: a 2-epoch continue-mode (ULFM) job on the first ``rows`` rows
    of UCI Adult, batch 32, checkpoints every ``every`` steps (0: none), its run directory
    ``NAME`` (relative to the launch directory). ``fault_tolerance``: more lines of that
    section (``replicas = 2``); ``extra``: more sections."""
    p = tmp_path / f"{name}.toml"
    p.write_text(CONTINUE_JOB.format(
        name=name, data=DATA, servers=servers, rows=rows, consistency=consistency, every=every,
        seed="" if seed is None else f"seed = {seed}",
        dtype="" if dtype is None else f'dtype = "{dtype}"',
        fault_tolerance=fault_tolerance, extra=extra))
    return p


def finish(p, lines=(), timeout=300) -> str:
    """Wait for ``p`` (a Popen with text stdout, started in a session of its own) and return
    its whole output (``lines`` read before, then the rest); on timeout every process of its
    session is killed (mpirun and its ranks) and AssertionError raised with the output's
    tail."""
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(p.pid)
        out, _ = p.communicate()
        raise AssertionError(f"no exit within {timeout} s:\n{(''.join(lines) + out)[-3000:]}")
    return "".join(lines) + out


def wait_paused(p, flag: Path, alive: int, where: str, timeout: float = 180) -> None:
    """Wait until ``alive`` ranks of the launch ``p`` (a Popen in a session of its own) have
    created ``FLAG.<index>`` (a test driver's pause, ``tests/tools``); on timeout or the
    launch's end every process of its session is killed and AssertionError raised with the
    output's tail."""
    deadline = time.time() + timeout
    while len(list(flag.parent.glob(f"{flag.name}.*"))) < alive:
        if time.time() > deadline or p.poll() is not None:
            kill_session(p.pid)
            raise AssertionError(f"the workers did not pause {where} (exit {p.poll()}):\n"
                                 f"{p.communicate()[0][-4000:]}")
        time.sleep(0.05)


def kill_while_paused(tmp_path: Path, job: Path, ranks: int, kills, timeout=300):
    """Run ``job`` on ``ranks`` ranks under ``mpirun --with-ft ulfm`` and
    ``tests/tools/pause_driver.py``: at each ``(clock, world rank, workers alive)`` of ``kills``
    every live worker waits (after that step's gradient, before its push), the rank is killed
    with SIGKILL, and the workers go on. Under BSP every key range has then applied exactly
    ``clock`` steps; under SSP/async each worker is at its own ``clock``. Either way the kill
    lands at a known clock, not wherever the run has got to when a line of its output is read
    (a fast run could be past its last step).

    Returns (exit status, output, the time.time() of each kill).
    """
    flag = tmp_path / "go"
    driver = ROOT / "tests" / "tools" / "pause_driver.py"
    cmd = [mpirun(), "-n", str(ranks), "--with-ft", "ulfm", sys.executable, str(driver),
           str(job), ",".join(str(c) for c, _, _ in kills), str(flag)]
    p = subprocess.Popen(cmd, cwd=tmp_path, env=mpi_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    times = []
    try:
        for i, (clock, victim, alive) in enumerate(kills):
            name = flag if i == 0 else Path(f"{flag}-{clock}")
            wait_paused(p, name, alive, f"at clock {clock}")
            time.sleep(0.5)                            # the servers apply the last CLOCKs
            kill_rank(job, victim, b"pause_driver.py")
            times.append(time.time())
            name.touch()
        out = finish(p, timeout=timeout)
    finally:
        if p.poll() is None:
            kill_session(p.pid)
            p.wait()
    return p.returncode, out, times
