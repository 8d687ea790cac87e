#!/usr/bin/env python3
"""Run the whole hpcps test suite: the README's test command (``python tests/run.py``).

1. unit tests in one pytest process, then each end-to-end file (``tests/e2e/test_*.py``, which
   launch real ``mpirun`` jobs) in its own, then ``tests/slurm`` (a real one-node Slurm, started
   by its fixture), then ``tests/multihost`` (3 test hosts made of namespaces on this machine:
   tests/hosts/README.md), each with a timeout;
2. every ``tests/mpi/test_*.py`` under ``mpirun -n K python -m pytest --with-mpi`` for each K
   listed in its ``# mpi-ranks: ...`` line, each launch in its own process with a timeout so
   that one hang cannot eat the budget.

Launcher settings that only a test machine needs (run-as-root, oversubscription) are set here,
for these launches only. Prints one closing line ``N passed, N failed``; exits non-zero if
anything failed or timed out.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.helpers import run_in_session, session_dir_base  # noqa: E402  (the checkout, not an installed copy)

ROOT = Path(__file__).resolve().parent.parent
SKIPPED: list = []
TIMEOUT = int(os.environ.get("HPCPS_TEST_TIMEOUT", "900"))


def mpi_env() -> dict:
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    # more ranks than cores on small test machines (Open MPI 5 / PRRTE)
    env.setdefault("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    return env


def with_session_dir(env: dict) -> dict:
    """``env`` with a private base for Open MPI's session directories, new for each launch
    (tests.helpers.session_dir_base: a directory left by a killed mpirun whose pid is reused
    makes the new mpirun exit with status 213)."""
    return dict(env, PRTE_MCA_prte_tmpdir_base=session_dir_base())


def counts(text: str) -> tuple[int, int]:
    tail = text.strip().splitlines()[-1:] or [""]
    line = tail[0]
    p = sum(int(m) for m in re.findall(r"(\d+) passed", line))
    SKIPPED.append(sum(int(m) for m in re.findall(r"(\d+) skipped", line)))
    f = sum(int(m) for m in re.findall(r"(\d+) (?:failed|error|errors)\b", line))
    return p, f


def run(cmd, env, label) -> tuple[int, int, int]:
    print(f"\n=== {label}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    try:
        proc = run_in_session(cmd, cwd=ROOT, env=env, errors="replace", timeout=TIMEOUT)
        out = proc.stdout + proc.stderr
        rc = proc.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or "") + (e.stderr or "")
        out += f"\nTIMEOUT after {TIMEOUT} s\n"
        rc = 124
    sys.stdout.write(out[-20000:])
    p, f = counts(proc.stdout if rc != 124 else "")
    if rc == 5 and p == 0 and f == 0:
        pass                                   # nothing collected (e.g. -k matched nothing)
    elif rc != 0 and f == 0:
        f = 1
    print(f"=== {label}: exit {rc}, {p} passed, {f} failed, {time.time() - t0:.1f} s", flush=True)
    return rc, p, f


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", help="pytest -k expression for the serial part")
    ap.add_argument("--no-mpi", action="store_true", help="skip the multi-rank files")
    ap.add_argument("--only-mpi", action="store_true", help="only the multi-rank files")
    args = ap.parse_args()
    env = mpi_env()
    py = sys.executable
    total_p = total_f = 0
    if not args.only_mpi:
        # unit tests in one process; each end-to-end file (real mpirun launches) in its own
        e2e = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "e2e").glob("test_*.py"))
        # tests/slurm starts a private one-node Slurm (skips without Slurm unless CI is set)
        for target in ["tests/unit"] + e2e + ["tests/slurm", "tests/multihost"]:
            cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no", target]
            if args.k:
                cmd += ["-k", args.k]
            _, p, f = run(cmd, with_session_dir(env), target)
            total_p += p
            total_f += f
    if not args.no_mpi:
        mpirun = str(Path(py).parent / "mpirun") if (Path(py).parent / "mpirun").exists() else "mpirun"
        for path in sorted((ROOT / "tests" / "mpi").glob("test_*.py")):
            m = re.search(r"^# mpi-ranks:\s*([\d ]+)$", path.read_text(), re.M)
            for k in (m.group(1).split() if m else ["2"]):
                cmd = [mpirun, "-n", k, py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no",
                       "--with-mpi", str(path.relative_to(ROOT))]
                _, p, f = run(cmd, with_session_dir(env), f"{path.name} on {k} ranks")
                # every rank prints its own summary line; count rank 0's (the last line seen)
                total_p += p
                total_f += f
    skipped = sum(SKIPPED)
    print(f"\n{total_p} passed, {total_f} failed" + (f", {skipped} skipped" if skipped else ""))
    return 1 if total_f else 0


if __name__ == "__main__":
    sys.exit(main())
