#!/usr/bin/env python3
"""Run the whole hpcps test suite: the README's test command (``python tests/run.py``).

The suite is a list of groups (``GROUPS``), run in order, each a list of launches:

1. ``unit``: ``tests/unit`` in one pytest process;
2. ``e2e``: each end-to-end file (``tests/e2e/test_*.py``, which launch real ``mpirun`` jobs)
   in its own pytest process, ``--jobs`` (2) of them side by side, longest first: most of an
   end-to-end test's time is start-up, timeouts and failure detection, not CPU (each launch's
   line gives its CPU seconds, the closing lines each group's wall and CPU time);
3. ``slurm``: ``tests/slurm`` (a real one-node Slurm, started by its fixture);
4. ``multihost``: ``tests/multihost`` (test hosts made of namespaces on this machine), if present;
   these two mostly wait (daemons, detection timeouts): with ``--jobs`` > 1 they run one after
   the other in a thread beside the other groups, from the start;
5. ``mpi``: every ``tests/mpi/test_*.py`` under ``mpirun -n K python -m pytest --with-mpi``
   for each K listed in its ``# mpi-ranks: ...`` line (two sizes where that tests more).

Each launch runs in its own session with a timeout (``HPCPS_TEST_TIMEOUT``, 900 s), so one
hang cannot eat the budget, and its output is streamed as it comes, each line prefixed with the
launch's label (pytest's progress dots, then its skip reasons: ``-rfEs``). Counts come from
pytest's JUnit XML (``--junitxml``; one file per rank under mpirun, a test failing on any rank
counts as failed), not from its text. A launch that exits non-zero with no failed test counts
as one failure, except exit status 5 with nothing run (nothing collected, e.g. ``-k``).

Every launch shares one cache directory (``HPCPS_CACHE_DIR``, a temporary directory of the run
unless set by the caller: :func:`suite_cache_dir`), so featurized data is made once per run.

Launcher settings that only a test machine needs (run-as-root, oversubscription) are set here,
for these launches only. Ends with the skip reasons, the wall time of each group and one
closing line ``N passed, N failed[, N skipped]``; exits non-zero if anything failed or timed out.

To add a group, append a :class:`Group` to ``GROUPS`` (``mpi = True`` if ``--no-mpi`` should
leave it out and ``--only-mpi`` keep it).
"""

from __future__ import annotations

import argparse
import atexit
import codecs
import os
import re
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.helpers import kill_session, session_dir_base  # noqa: E402  (the checkout, not an installed copy)

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = int(os.environ.get("HPCPS_TEST_TIMEOUT", "900"))
PYTEST = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "--color=no"]


_CACHE = {}
_CACHE_LOCK = threading.Lock()


def suite_cache_dir() -> str:
    """One cache directory for the whole run (``HPCPS_CACHE_DIR`` of every launch, removed at
    exit): the featurized Adult splits (:mod:`hpcps.data.featcache`) and scikit-learn baselines
    are made once per run and shared by every launch and rank, and the run never writes into
    the user's ``~/.cache/hpcps``. A ``HPCPS_CACHE_DIR`` set by the caller is used instead
    (e.g. a directory kept between CI runs; ``off`` disables the cache)."""
    with _CACHE_LOCK:
        if "dir" not in _CACHE:
            _CACHE["dir"] = tempfile.mkdtemp(prefix="hpcps-cache-")
            atexit.register(shutil.rmtree, _CACHE["dir"], ignore_errors=True)
        return _CACHE["dir"]


def mpi_env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")       # progress as it comes, also under mpirun
    if "HPCPS_CACHE_DIR" not in env:
        env["HPCPS_CACHE_DIR"] = suite_cache_dir()
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    # more ranks than cores on small test machines (Open MPI 5 / PRRTE)
    env.setdefault("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    # Open MPI's TCP transport on loopback only: the multi-host group runs beside the others
    # and makes and removes network interfaces; a spawned worker that saw one of them at
    # start-up and found it gone when it connected failed with "bind on local address ...
    # failed" and the growth hung until join_timeout (CI, stop 27). The multi-host tests drop
    # it (tests.helpers.mpi_env(local=False)) and name their subnet.
    if "OMPI_MCA_btl_tcp_if_exclude" not in env:
        env.setdefault("OMPI_MCA_btl_tcp_if_include", "lo")
    return env


def with_session_dir(env: dict) -> dict:
    """``env`` with a private base for Open MPI's session directories, new for each launch
    (tests.helpers.session_dir_base: a directory left by a killed mpirun whose pid is reused
    makes the new mpirun exit with status 213)."""
    return dict(env, PRTE_MCA_prte_tmpdir_base=session_dir_base())


# ---------------------------------------------------------------------------------------------
# counting from JUnit XML


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    skips: list = field(default_factory=list)          # (test id, reason)
    fails: list = field(default_factory=list)          # (test id, the message: see fail_message)
    cpu: float = 0.0                                   # CPU seconds of the launch(es)

    def add(self, other: "Counts") -> None:
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped
        self.skips += other.skips
        self.fails += other.fails
        self.cpu += other.cpu


FAIL_TAIL_LINES = 25


def fail_message(message, text) -> str:
    """What the summary prints of a failed test: the first line of the failure's message and
    the last ``FAIL_TAIL_LINES`` lines of the message (an assertion's text often carries the
    tail of a run's output, whose end says what went wrong), else of the traceback; lines cut
    at 200 characters. Only the first line, as before, did not tell a clean-clone CI failure
    apart from another."""
    lines = (message or "").strip().splitlines() or (text or "").strip().splitlines() or [""]
    head, tail = lines[0], lines[1:][-FAIL_TAIL_LINES:]
    return "\n".join([head[:200]] + ["      " + line[:200] for line in tail])


def junit_counts(paths) -> Counts:
    """Outcomes of the test cases in the JUnit XML files ``paths`` (one per rank of a launch).

    A test case is failed if it failed or errored on any rank, skipped if skipped on every
    rank that ran it, passed otherwise. Files that do not exist (a rank that died) are ignored.
    """
    outcome: dict = {}
    reasons: dict = {}
    messages: dict = {}
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError):
            continue
        for case in root.iter("testcase"):
            key = (case.get("classname", ""), case.get("name", ""))
            tags = {child.tag for child in case}
            if tags & {"failure", "error"}:
                o = "failed"
                bad = case.find("failure") if case.find("failure") is not None else case.find("error")
                messages.setdefault(key, fail_message(bad.get("message"), bad.text))
            elif "skipped" in tags:
                o = "skipped"
                reasons[key] = case.find("skipped").get("message", "")
            else:
                o = "passed"
            prev = outcome.get(key)
            if prev == "failed" or o == "failed":
                outcome[key] = "failed"
            elif prev == "passed" or o == "passed":
                outcome[key] = "passed"
            else:
                outcome[key] = o
    c = Counts()
    for key, o in outcome.items():
        setattr(c, o, getattr(c, o) + 1)
        name = f"{key[0]}::{key[1]}" if key[0] else key[1]
        if o == "skipped":
            c.skips.append((name, reasons.get(key, "")))
        elif o == "failed":
            c.fails.append((name, messages.get(key, "")))
    return c


# ---------------------------------------------------------------------------------------------
# one launch, streamed


@dataclass
class Launch:
    label: str
    cmd: list                       # without --junitxml
    env: dict
    ranks: int = 0                  # 0: one pytest process; K: mpirun -n K (one XML per rank)


#: one writer at a time: launches of a parallel group print whole lines, each with its label
_OUT = threading.Lock()


def _say(text: str) -> None:
    with _OUT:
        sys.stdout.write(text)
        sys.stdout.flush()


def stream(cmd, env, label: str, timeout: float) -> tuple[int, float]:
    """Run ``cmd`` in its own session, copying its output (stdout and stderr) to ours line by
    line as it comes, each line prefixed with ``label``; on timeout kill every process of the
    session. Returns (the exit status, 124 on timeout; the CPU seconds, user + system, of the
    command and every descendant it waited for: ``os.wait4``)."""
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    fd = p.stdout.fileno()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")   # a character split between reads
    deadline = time.monotonic() + timeout
    partial = ""
    rc = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            kill_session(p.pid)
            _say((f"[{label}] {partial}\n" if partial else "") + f"[{label}] TIMEOUT after {timeout:.0f} s\n")
            partial = ""
            rc = 124
            break
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        text = partial + decoder.decode(chunk).replace("\x00", "")   # pytest-mpi prints MPI's NUL-ended version
        *lines, partial = text.split("\n")
        if lines:
            _say("".join(f"[{label}] {line}\n" if line else "\n" for line in lines))
    if partial:
        _say(f"[{label}] {partial}\n")
    p.stdout.close()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return (p.returncode if rc is None else rc), usage.ru_utime + usage.ru_stime


def run(launch: Launch, workdir: Path) -> Counts:
    """Run one launch; count its tests from its JUnit XML; apply the exit-status rules."""
    xml = workdir / (re.sub(r"[^\w.-]+", "_", launch.label) + ("-{rank}.xml" if launch.ranks else ".xml"))
    cmd = launch.cmd + [f"--junitxml={xml}"]
    _say(f"\n=== {launch.label}: {shlex.join(map(str, cmd))}\n")
    t0 = time.time()
    rc, cpu = stream(cmd, launch.env, launch.label, TIMEOUT)
    files = ([Path(str(xml).replace("{rank}", str(r))) for r in range(launch.ranks)]
             if launch.ranks else [xml])
    c = junit_counts(files)
    if rc == 5 and c.passed == 0 and c.failed == 0:
        pass                                   # nothing collected (e.g. -k matched nothing)
    elif rc != 0 and c.failed == 0:
        c.failed = 1                           # died, timed out, or a rank's XML is missing
        c.fails.append(("(the launch)", f"exit status {rc} with no failed test in its XML"))
    c.cpu = cpu
    _say(f"=== {launch.label}: exit {rc}, {c.passed} passed, {c.failed} failed, "
         f"{c.skipped} skipped, {time.time() - t0:.1f} s, cpu {cpu:.0f} s\n")
    return c


# ---------------------------------------------------------------------------------------------
# the groups


def unit(args) -> list[Launch]:
    return [Launch("tests/unit", PYTEST + ["tests/unit"] + k_option(args), with_session_dir(mpi_env()))]


#: End-to-end files that take longest (about 1.5-5 min each on a 2-core machine): started first, so
#: that the lanes of the e2e group end together (longest first). Others follow in name order.
E2E_LONGEST = ["test_resume.py", "test_elastic.py", "test_restart.py", "test_streaming.py",
               "test_bad_inputs.py", "test_signals.py", "test_server_loss.py",
               "test_dynamic_tables.py", "test_cli.py", "test_fault_tolerance.py"]


def e2e(args) -> list[Launch]:
    # each end-to-end file (real mpirun launches) in its own process, with its own pytest base
    # temporary directory (pytest prunes old numbered ones: lanes must not share them)
    files = sorted((p.relative_to(ROOT) for p in (ROOT / "tests" / "e2e").glob("test_*.py")),
                   key=lambda p: (E2E_LONGEST.index(p.name) if p.name in E2E_LONGEST else len(E2E_LONGEST),
                                  p.name))
    base = Path(tempfile.mkdtemp(prefix="hpcps-e2e-"))
    atexit.register(shutil.rmtree, base, ignore_errors=True)
    return [Launch(str(f), PYTEST + [str(f), f"--basetemp={base / f.stem}"] + k_option(args),
                   with_session_dir(mpi_env())) for f in files]


def slurm(args) -> list[Launch]:
    # tests/slurm starts a private one-node Slurm (skips without Slurm unless CI is set)
    return [Launch("tests/slurm", PYTEST + ["tests/slurm"] + k_option(args), with_session_dir(mpi_env()))]


def multihost(args) -> list[Launch]:
    # tests/multihost: test hosts made of namespaces on this machine (tests/hosts/README.md)
    if not (ROOT / "tests" / "multihost").is_dir():
        return []
    return [Launch("tests/multihost", PYTEST + ["tests/multihost"] + k_option(args),
                   with_session_dir(mpi_env()))]


def mpi_sizes(path: Path) -> list[str]:
    """The world sizes of a multi-rank file: its ``# mpi-ranks: K [K2 ...]`` line (default 2)."""
    m = re.search(r"^# mpi-ranks:\s*([\d ]+)$", path.read_text(), re.M)
    return m.group(1).split() if m else ["2"]


def mpi(args) -> list[Launch]:
    py = sys.executable
    mpirun = str(Path(py).parent / "mpirun") if (Path(py).parent / "mpirun").exists() else "mpirun"
    launches = []
    for path in sorted((ROOT / "tests" / "mpi").glob("test_*.py")):
        for k in mpi_sizes(path):
            cmd = [mpirun, "-n", k] + PYTEST + ["--with-mpi", str(path.relative_to(ROOT))]
            launches.append(Launch(f"{path.name} on {k} ranks", cmd, with_session_dir(mpi_env()), int(k)))
    return launches


def k_option(args) -> list[str]:
    return ["-k", args.k] if args.k else []


@dataclass
class Group:
    name: str
    launches: Callable              # args -> list[Launch]
    mpi: bool = False               # left out by --no-mpi, the only one run by --only-mpi
    parallel: bool = False          # its launches may run side by side (--jobs)
    waiting: bool = False           # mostly waits (daemons, timeouts), little CPU: with --jobs > 1
                                    # it runs beside the other groups, not after them


GROUPS = [Group("unit", unit), Group("e2e", e2e, parallel=True),
          Group("slurm", slurm, waiting=True), Group("multihost", multihost, waiting=True),
          Group("mpi", mpi, mpi=True)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", help="pytest -k expression for the serial part")
    ap.add_argument("--no-mpi", action="store_true", help="skip the multi-rank groups")
    ap.add_argument("--only-mpi", action="store_true", help="only the multi-rank groups")
    ap.add_argument("--group", action="append", choices=[g.name for g in GROUPS],
                    help="run only this group (repeatable)")
    ap.add_argument("--file", help="only the launches whose label contains this (e.g. test_rma.py)")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("HPCPS_TEST_JOBS", "2")),
                    help="launches of the e2e group run side by side (default 2, or "
                         "$HPCPS_TEST_JOBS): most of an end-to-end test's time is waiting "
                         "(start-up, timeouts, detection), not CPU")
    args = ap.parse_args()
    total = Counts()
    walls = []
    lock = threading.Lock()
    selected = [g for g in GROUPS if not ((args.no_mpi and g.mpi) or (args.only_mpi and not g.mpi)
                                          or (args.group and g.name not in args.group))]
    # groups that mostly wait (slurm: 9 s CPU in 241 s; multihost: 83 s in 437 s, full run
    # 2026-12-03) run one after the other in a thread beside the rest, when lanes are allowed
    side = [g for g in selected if g.waiting] if args.jobs > 1 else []
    main_groups = [g for g in selected if g not in side] if len(side) < len(selected) else selected
    side = [g for g in side if g not in main_groups]

    def run_group(group: Group, tmp: Path) -> None:
        launches = [x for x in group.launches(args) if not args.file or args.file in x.label]
        if not launches:
            return
        t0 = time.time()
        lanes = max(1, args.jobs) if group.parallel else 1
        with ThreadPoolExecutor(max_workers=lanes) as pool:
            results = list(pool.map(lambda launch: run(launch, tmp), launches))
        cpu = 0.0
        with lock:
            for launch, c in zip(launches, results):
                c.skips = [(launch.label, t, r) for t, r in c.skips]
                c.fails = [(launch.label, t, r) for t, r in c.fails]
                cpu += c.cpu
                total.add(c)
            walls.append((group.name, len(launches), time.time() - t0, cpu, lanes))

    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="hpcps-junit-") as tmp:
        beside = threading.Thread(target=lambda: [run_group(g, Path(tmp)) for g in side],
                                  daemon=True)
        beside.start()
        for group in main_groups:
            run_group(group, Path(tmp))
        beside.join()
    elapsed = time.time() - t_start
    if not walls:          # nothing selected: say so, not "0 passed" and success
        print(f"tests/run.py: no launch matches (--group {args.group or 'all'}, --file "
              f"{args.file!r}): --file matches a launch's label, a file of tests/mpi or "
              "tests/e2e; the unit tests are one launch, select them with --group unit -k "
              "EXPR", file=sys.stderr)
        return 5
    if total.skips:
        print(f"\nskipped ({total.skipped}):")
        for label, test, reason in total.skips:
            print(f"  [{label}] {test}: {reason}")
    if total.fails:
        print(f"\nfailed ({total.failed}):")
        for label, test, message in total.fails:
            print(f"  [{label}] {test}: {message}")
    print("\nwall time per group: " + ", ".join(
        f"{name} {s:.0f} s ({n} launch{'es' if n > 1 else ''}"
        + (f" in {lanes} lanes" if lanes > 1 else "") + f", cpu {cpu:.0f} s)"
        for name, n, s, cpu, lanes in walls)
        + (f" ({', '.join(g.name for g in side)} beside the others)" if side else "")
        + f"; total {elapsed:.0f} s")
    print(f"\n{total.passed} passed, {total.failed} failed"
          + (f", {total.skipped} skipped" if total.skipped else ""), flush=True)
    return 1 if total.failed else 0


if __name__ == "__main__":
    sys.exit(main())
