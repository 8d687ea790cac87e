"""``hpcps bench``: run the benchmark suite in ``bench/`` and write its results table.

Runs each script of the suite in its own process — under ``mpirun`` (with what this machine
needs, from :mod:`hpcps.runtime.launch`) where it needs ranks — collects the JSON report each writes
(``--json``), and writes

* ``results.json``: date, machine (CPU, cores, memory, OS, Python, numpy, MPI, torch), load
  average before and after, and every script's ratios with their goals and details;
* ``results.md``: the table of ratios next to their goals, met or missed, with the date and
  machine, and each script's notes (what was skipped, why a goal is missed).

into ``bench/`` (full run) or a temporary directory (``--quick``, unless ``--out`` is given),
and nowhere else: the docs (``docs/benchmarks.md``) point to ``bench/results.md``.
``--quick`` uses tiny sizes: a smoke test that the suite runs, not a measurement.

The suite needs a source checkout: the ``bench/`` directory next to the ``hpcps`` package.
No MPI is imported here (the MPI library version is read through :mod:`hpcps.comm.info`).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


#: The commit whose hpcps BSP the e2e benchmark runs beside this one (issue 20's goal: >= 2x).
E2E_BASELINE_COMMIT = "aa75ea0"


def suite(quick: bool, tmp: Path) -> list[dict]:
    """The scripts of the suite in run order: name, ranks (0 = plain python), arguments."""
    q = ["--quick"] if quick else []
    j = lambda name: ["--json", str(tmp / f"{name}.json")]  # noqa: E731
    return [
        {"name": "kernels", "ranks": 0, "script": "bench_kernels.py", "args": q + j("kernels")},
        {"name": "pushpull", "ranks": 2, "script": "bench_pushpull.py", "args": q + j("pushpull")},
        {"name": "rma", "ranks": 2, "script": "bench_rma.py", "args": q + j("rma")},
        {"name": "rma_fanin", "ranks": 3 if quick else 5, "script": "bench_rma.py",
         "args": q + ["--fanin", "--reps", "4"] + j("rma_fanin")},
        # dynamic tables' update kernel vs the fixed array (issue 18), readers vs cat/zcat | wc
        # (issue 19)
        {"name": "hashtable", "ranks": 0, "script": "bench_hashtable.py", "args": q + j("hashtable")},
        {"name": "reader", "ranks": 0, "script": "bench_reader.py", "args": q + j("reader")},
        {"name": "checkpoint", "ranks": 0, "script": "bench_checkpoint.py",
         "args": q + ([] if quick else ["--run"]) + j("checkpoint")},
        # 4 rounds: with 2, identical suites read hpcps BSP / torch 3.74-4.90 (2026-12-04)
        {"name": "e2e", "ranks": 0, "script": "bench_e2e.py",
         "args": q + j("e2e") + ([] if quick else ["--reps", "4", "--baseline-commit",
                                                   E2E_BASELINE_COMMIT])},
        {"name": "scaling", "ranks": 0, "script": "bench_scaling.py",
         "args": q + j("scaling") + ["--pushpull-json", str(tmp / "pushpull.json")]},
        {"name": "recovery", "ranks": 0, "script": "bench_recovery.py",
         "args": q + ([] if quick else ["--reps", "2"]) + j("recovery")},
        # push/pull and end to end across 2 test hosts over TCP (root: network namespaces;
        # without it the script reports n/a with the reason)
        {"name": "hosts", "ranks": 0, "script": "bench_hosts.py", "args": q + j("hosts")},
    ]


#: The names of the suite's steps, in run order (``--only``).
STEP_NAMES = [step["name"] for step in suite(False, Path("."))]


def machine() -> dict:
    """What the results were measured on (local; no MPI started)."""
    info = {"hostname": platform.node(), "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        info["os"] = platform.freedesktop_os_release().get("PRETTY_NAME", "")
    except OSError:
        pass
    import numpy

    info["numpy"] = numpy.__version__
    try:
        from hpcps.comm.info import mpi_versions

        info["mpi4py"], info["mpi"] = mpi_versions()
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        info["mpi"] = f"unknown ({e})"
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        try:
            import importlib.metadata as md

            info["torch"] = md.version("torch")
        except Exception:  # noqa: BLE001
            info["torch"] = "installed"
    return info


def _command(step: dict, mpirun: str | None, flavour) -> tuple[list[str], dict]:
    program = [sys.executable, str(BENCH / step["script"]), *step["args"]]
    if not step["ranks"]:
        return program, {}
    from hpcps.runtime import launch

    return launch.build_launch(step["ranks"], program, mpirun=mpirun, flavour=flavour)


#: Seconds a step of the suite may run before it is killed (``--step-timeout``).
STEP_TIMEOUT = 900.0
#: Seconds a step that timed out has after SIGTERM before its session is killed.
TERM_GRACE = 15.0


def run_step(cmd, env: dict, timeout: float) -> tuple[str, int, bool]:
    """Run one step of the suite in a session of its own; on timeout kill every process of
    that session (``mpirun``, its ranks and whatever they started: killing only ``mpirun``
    left the ranks running, spinning), after SIGTERM to the step and ``TERM_GRACE`` seconds
    to clean up. Local.

    Returns
    -------
    text : str
        The step's stdout, and its stderr when it failed or timed out.
    rc : int
        Its exit status; 124 on timeout.
    timed_out : bool
    """
    from hpcps.core.procs import kill_session

    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace",
                         start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:                      # a chance to clean up (bench_hosts.py removes its hosts)
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=TERM_GRACE)
        except subprocess.TimeoutExpired:
            pass
        kill_session(p.pid)       # the session's id is the pid of its first process
        stdout, stderr = p.communicate()    # every writer of the pipes is gone now
        return stdout + stderr, 124, True
    return stdout + (stderr if p.returncode else ""), p.returncode, False


def run_suite(quick: bool = False, out_dir=None, only=None,
              mpirun: str | None = None, timeout: float = STEP_TIMEOUT, stream=None,
              steps=None) -> int:
    """Run the suite; write ``results.json`` and ``results.md``; return 0, or 1 if a script
    failed (its output is shown and the others still run).

    Parameters
    ----------
    quick : bool
        Tiny sizes (smoke test). Results go to a temporary directory unless ``out_dir``.
    out_dir : path-like or None
        Where the results go (default ``bench/`` for a full run).
    only : list of str or None
        Names of the scripts to run (``kernels``, ``pushpull``, ``rma``, ``rma_fanin``,
        ``checkpoint``, ``e2e``, ``scaling``, ``recovery``, ``hosts``).
    mpirun : str or None
        The ``mpirun`` to use (default: next to python, then ``PATH``).
    timeout : float
        Seconds each step may run. A step still running then is killed with every process
        of its session (``mpirun`` and its ranks), reported as failed ("timed out after N s")
        and the next step runs.
    stream : file-like or None
        Where the progress goes (default stdout).
    steps : callable or None
        Tests only: ``steps(quick, tmp)`` returns the steps to run instead of :func:`suite`'s
        (dicts with ``name``, ``ranks``, ``script`` — a path, relative to ``bench/`` — and
        ``args``).
    """
    from hpcps.runtime import launch

    out = stream or sys.stdout
    if not BENCH.is_dir():
        out.write(f"hpcps bench: no benchmark scripts at {BENCH}: the suite runs from a source "
                  "checkout of hpcps (the bench/ directory next to the package)\n")
        return 2
    if not timeout > 0:
        out.write(f"hpcps bench: --step-timeout must be a positive number of seconds, not "
                  f"{timeout!r}\n")
        return 2
    steps_of = steps or suite
    if out_dir is None:
        out_dir = Path(tempfile.mkdtemp(prefix="hpcps-bench-")) if quick else BENCH
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        mpirun = launch.find_mpirun(mpirun)
    except FileNotFoundError as e:
        out.write(f"hpcps bench: {e}\n")
        return 2
    flavour = launch.mpi_flavour(mpirun)
    started = _dt.datetime.now().astimezone()
    load0 = os.getloadavg()
    t_all = time.perf_counter()
    reports, failed = [], []
    with tempfile.TemporaryDirectory(prefix="hpcps-bench-json-") as tmp:
        tmp = Path(tmp)
        every = steps_of(quick, tmp)
        unknown = set(only or ()) - {s["name"] for s in every}
        if unknown:
            out.write(f"hpcps bench: unknown benchmark(s) {', '.join(sorted(unknown))}; valid: "
                      f"{', '.join(s['name'] for s in every)}\n")
            return 2
        for step in [s for s in every if not only or s["name"] in only]:
            cmd, env = _command(step, mpirun, flavour)
            out.write(f"\n=== hpcps bench: {step['name']}: {' '.join(cmd)}\n")
            out.flush()
            t0 = time.perf_counter()
            text, rc, timed_out = run_step(cmd, {**os.environ, **env}, timeout)
            seconds = time.perf_counter() - t0
            if text:
                out.write(text if text.endswith("\n") else text + "\n")
            path = tmp / f"{step['name']}.json"
            if rc != 0 or not path.exists():
                failed.append(step["name"])
                error = (f"timed out after {timeout:g} s (killed with its mpirun and ranks)"
                         if timed_out else f"exit {rc}")
                out.write(f"=== hpcps bench: {step['name']} FAILED ({error})\n")
                reports.append({"name": step["name"], "failed": True, "exit": rc,
                                "error": error, "timed_out": timed_out,
                                "seconds": seconds, "ratios": [], "notes": [], "details": {}})
                continue
            r = json.loads(path.read_text())
            r["seconds"] = seconds
            r["command"] = cmd
            reports.append(r)
    total = time.perf_counter() - t_all
    results = {"date": started.isoformat(timespec="seconds"), "quick": quick,
               "machine": machine(), "load_average_before": load0,
               "load_average_after": os.getloadavg(), "total_seconds": total,
               "reports": reports}
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    md = markdown(results)
    (out_dir / "results.md").write_text(md)
    out.write(f"\n{md}\nhpcps bench: {len(reports) - len(failed)} of {len(reports)} benchmarks ran "
              f"in {total:.0f} s; results in {out_dir / 'results.json'} and "
              f"{out_dir / 'results.md'}\n")
    return 1 if failed else 0


def _fmt(v, unit) -> str:
    if v is None:
        return "n/a"
    if unit == "x":
        return f"{v:.2f}x" if v < 100 else f"{v:,.0f}x"
    return f"{v:,.2f}{unit}" if abs(v) < 100 else f"{v:,.0f}{unit}"


def markdown(results: dict) -> str:
    """The results table (ratios next to their goals) with date, machine and notes."""
    m = results["machine"]
    la = results["load_average_before"]
    lines = [f"Measured {results['date'][:16].replace('T', ' ')} on {m.get('cpu', '?')}, "
             f"{m.get('cores', '?')} cores, {m.get('memory_gib', '?')} GiB, {m.get('os', '')}; "
             f"Python {m.get('python')}, numpy {m.get('numpy')}, {m.get('mpi', 'MPI ?')}"
             + (f", torch {m['torch']}" if m.get("torch") else "") + "; "
             f"load average {la[0]:.1f} at the start, {results['load_average_after'][0]:.1f} at "
             f"the end; suite {results['total_seconds']:.0f} s"
             + (" (--quick: tiny sizes, not a measurement)" if results["quick"] else "") + ".",
             "", "| benchmark | ratio | measured | goal | |", "|---|---|---|---|---|"]
    notes = []
    for r in results["reports"]:
        if r.get("failed"):
            lines.append(f"| {r['name']} | (failed: {r.get('error') or 'exit ' + str(r['exit'])}) "
                         "| | | |")
            continue
        for x in r["ratios"]:
            mark = ("disturbed: rerun" if x.get("disturbed") else
                    "" if x["met"] is None else ("met" if x["met"] else "**missed**"))
            lines.append(f"| {r['name']} | {x['what']} | {_fmt(x['value'], x['unit'])} | "
                         f"{x['goal_text'] or ''} | {mark} |")
        notes += [f"{r['name']}: {n}" for n in r.get("notes", [])]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def register(sub) -> None:
    """Add ``hpcps bench`` to the command-line parser's subcommands."""
    b = sub.add_parser("bench", help="run the benchmark suite (bench/) and write its results table")
    b.add_argument("--quick", action="store_true",
                   help="tiny sizes: a smoke test, not a measurement (about 1-2 min; 76 s in a "
                        "user's run)")
    b.add_argument("--only", nargs="+", metavar="NAME",
                   help="run only these: " + " ".join(STEP_NAMES)
                        + " (hosts: across 2 test hosts over TCP; needs root)")
    b.add_argument("--out", help="directory for results.json/.md (default: bench/, or a "
                                 "temporary one with --quick)")
    b.add_argument("--mpirun", help="mpirun to use (default: next to python, then PATH)")
    b.add_argument("--step-timeout", type=float, default=STEP_TIMEOUT, metavar="SECONDS",
                   help="kill a script still running after SECONDS, with its mpirun and ranks, "
                        "report it as failed and go on with the next (default: %(default)g)")
    b.set_defaults(func=lambda a: run_suite(quick=a.quick, out_dir=a.out, only=a.only,
                                            mpirun=a.mpirun, timeout=a.step_timeout))
