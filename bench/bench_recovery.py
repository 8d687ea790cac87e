"""Continuous fault tolerance: what a lost rank costs, and what replication costs.

Run it with plain ``python`` (it launches what it needs)::

    python bench/bench_recovery.py              # 3 workers + 3 servers, Adult, BSP float64

The job: Adult (12,000 rows, the quick-start features), 3 workers + 3 servers, BSP, float64,
batch 32, AdaGrad; every launch is ``mpirun --with-ft ulfm`` (``hpcps.runtime.launch``).

* **Throughput** (one launch, ``hpcps.runtime.job.run_job`` in the ranks, the variants interleaved and
  rotated, ``--reps`` times, medians): ``[fault_tolerance] mode = "restart"`` (no failure
  handling), ``"continue"`` with ``replicas = 1`` and with ``replicas = 2``. Ratios: examples/s
  with replicas = 2 / replicas = 1 (the cost of chain replication: one server-to-server round
  trip per clock on the critical path, the touched rows' values and optimizer state sent to the
  backup) and continue (replicas = 1) / restart (the cost of the waits that watch for failures
  and of the workers keeping their pushes until acknowledged).
* **Recovery time** (one launch per scenario and repetition): the chief kills one rank with
  ``SIGKILL`` at a fixed clock (from its step hook, after that step's gradient; the pids are
  gathered at start) and the job goes on. Reported from the chief's failure record: the gap from
  the last step it finished before the failure to the first step it finished after the
  recovery (the figure docs/fault_tolerance.md quotes), and from the kill to that first step. Scenarios:
  a worker lost (its rows are split over the survivors, who re-read the training split), a
  server lost with ``replicas = 2`` (its backup takes over), a server lost with ``replicas = 1``
  (the range is reloaded from the last checkpoint; the steps lost are reported), and
  ``mode = "restart"``: the job stops, is launched again and resumes from the last checkpoint
  (kill -> first step of the new launch, and the steps redone).

Run directories (checkpoints, metrics) are on tmpfs (``/dev/shm``) when there is one, so that
a slow ``fsync`` under other jobs' disk load does not enter the figures.

The last line is the replication ratio. ``--quick`` (a smoke test): 1 repetition, 3,000 rows,
one epoch (25 steps), the kills at clock 15, checkpoints every 10 steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

benchlib.ensure_importable()

HERE = Path(__file__).resolve().parent
RANKS = 6                  # 3 workers (ranks 0-2) + 3 servers (ranks 3-5)
WORKER1, SERVER1 = 1, 4    # the victims: worker 1, server 1
KILL_CLOCK = 60
EVERY = 40                 # checkpoint interval of the reload and restart scenarios
QUICK_KILL_CLOCK, QUICK_EVERY = 15, 10     # --quick: one epoch of 25 steps

JOB = """
name = "recovery"
seed = 3
[cluster]
servers = 3
[data]
format = "adult_csv"
path = "{data}"
max_rows = {rows}
[model]
dtype = "float64"
l2 = 1e-5
[train]
epochs = {epochs}
batch_size = 32
progress_seconds = 1000.0
[consistency]
model = "bsp"
[checkpoint]
every_steps = 0
at_end = false
[fault_tolerance]
mode = "continue"
[output]
dir = "{out}"
"""


def write_job(d: Path, rows: int, epochs: int) -> Path:
    p = d / "recovery.toml"
    p.write_text(JOB.format(data=benchlib.ROOT / "data" / "adult.csv.gz", rows=rows,
                            epochs=epochs, out=d / "runs"))
    return p


def variant(base, name: str, out_dir: Path, every: int = EVERY):
    """The job of one variant: fault-tolerance mode, replicas, checkpoints (every ``every``
    steps in the scenarios that reload or resume)."""
    ft = base.fault_tolerance
    ck = base.checkpoint
    if name == "restart":
        ft = dataclasses.replace(ft, mode="restart", replicas=1)
    elif name in ("replicas 1", "server lost, replicas 1"):
        ft = dataclasses.replace(ft, replicas=1, on_server_loss="reload")
    else:
        ft = dataclasses.replace(ft, replicas=2)
    if name in ("server lost, replicas 1", "restart kill", "restart resume"):
        ck = dataclasses.replace(ck, every_steps=every, keep=10)
    if name in ("restart kill", "restart resume"):
        ft = dataclasses.replace(ft, mode="restart", replicas=1)
    return dataclasses.replace(base, fault_tolerance=ft, checkpoint=ck,
                               output=dataclasses.replace(base.output, dir=out_dir))


# ------------------------------------------------------------------------- MPI part

def mpi_throughput(args) -> int:
    """Every rank: run each variant ``reps`` times, interleaved. Collective over the world."""
    from bench_e2e import _cache_data

    from hpcps.comm.core import abort_on_error, world
    from hpcps.config import load_job
    from hpcps.runtime.job import run_job

    _cache_data()
    comm = world()
    base = load_job(args.job)
    names = ["restart", "replicas 1", "replicas 2"]
    results = {n: [] for n in names}
    for rep in range(args.reps):
        for name in benchlib.rotate(names, rep):
            cfg = variant(base, name, base.output.dir / f"{name.replace(' ', '_')}-{rep}")
            with abort_on_error(comm):
                s = run_job(cfg, comm, out=io.StringIO(), resume="never")
            if comm.Get_rank() == 0:
                results[name].append({"examples_per_second": s["examples_per_second"],
                                      "train_seconds": s["train_seconds"],
                                      "examples": s["examples"],
                                      "replication_bytes": s.get("replication_bytes", 0)})
    if comm.Get_rank() == 0:
        Path(args.mpi_out).write_text(json.dumps(results))
    return 0


def mpi_kill(args) -> int:
    """Every rank: run one scenario; the chief kills rank ``--victim`` at clock ``--at``."""
    from hpcps.comm.core import abort_on_error, world
    from hpcps.config import load_job
    from hpcps.runtime.job import run_job

    comm = world()
    pids = comm.allgather(os.getpid())           # start-up only, not the measured path
    base = load_job(args.job)
    cfg = variant(base, args.scenario, Path(args.run_dir), args.every)
    marks = {}

    def hook(worker, clock):
        if worker != 0 or comm.Get_rank() != 0:
            return
        if "first" not in marks:
            marks["first"] = time.time()
        if args.victim >= 0 and clock == args.at and "kill" not in marks:
            marks["kill"] = time.time()
            Path(args.mpi_out + ".kill").write_text(str(marks["kill"]))
            os.kill(pids[args.victim], signal.SIGKILL)

    resume = "auto" if args.scenario == "restart resume" else "never"
    with abort_on_error(comm):
        s = run_job(cfg, comm, out=io.StringIO(), resume=resume, step_hook=hook)
    if comm.Get_rank() == 0:
        Path(args.mpi_out).write_text(json.dumps({"summary": {
            k: s[k] for k in ("failures", "ranges", "examples_per_second", "train_seconds")
            if k in s}, "marks": marks}))
    sys.stdout.flush()
    if s and s.get("skip_finalize"):
        os._exit(0)
    return 0


# ------------------------------------------------------------------------- driver

def launch_mpi(program: list, timeout: float = 600,
               ulfm: bool = True) -> subprocess.CompletedProcess:
    """Launch ``program`` on :data:`RANKS` ranks as ``hpcps run`` would: with ``--with-ft
    ulfm`` for continue-mode jobs (``ulfm``), without it for restart-mode ones (a lost rank
    then ends the launch at once; under ULFM the runtime leaves that to the ranks, and
    PRRTE was seen to hang with two dead ranks left unreaped)."""
    from hpcps.runtime import launch

    mpirun = launch.find_mpirun()
    cmd, env = launch.build_launch(RANKS, program, mpirun=mpirun,
                                   flavour=launch.mpi_flavour(mpirun), ulfm=ulfm)
    return subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout)


def kill_scenario(d: Path, job: Path, scenario: str, victim: int, rep: int,
                  at: int = KILL_CLOCK, every: int = EVERY) -> dict:
    """One launch of ``scenario`` (two for "restart kill"): rank ``victim`` killed at clock
    ``at``, checkpoints every ``every`` steps where the scenario takes them."""
    out = d / f"{scenario.replace(' ', '_').replace(',', '')}-{rep}.json"
    run_dir = d / "runs" / out.stem
    p = launch_mpi([sys.executable, str(HERE / "bench_recovery.py"), "--mpi-kill",
                    "--job", str(job), "--scenario", scenario, "--victim", str(victim),
                    "--at", str(at), "--every", str(every), "--run-dir", str(run_dir),
                    "--mpi-out", str(out)],
                   ulfm=scenario != "restart kill")
    if scenario == "restart kill":
        t_kill = float(Path(str(out) + ".kill").read_text())
        out2 = d / f"restart-resume-{rep}.json"
        p2 = launch_mpi([sys.executable, str(HERE / "bench_recovery.py"), "--mpi-kill",
                         "--job", str(job), "--scenario", "restart resume", "--victim", "-1",
                         "--at", "0", "--every", str(every), "--run-dir", str(run_dir),
                         "--mpi-out", str(out2)],
                        ulfm=False)
        if p2.returncode != 0:
            sys.stderr.write(p2.stdout[-3000:] + p2.stderr[-3000:])
            raise SystemExit("bench_recovery.py: the restarted run failed")
        r = json.loads(out2.read_text())
        first = r["marks"]["first"]
        return {"kill_to_step": first - t_kill, "gap": first - t_kill,
                "steps_redone": at - at // every * every, "exit": p.returncode}
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-20000:])
        raise SystemExit(f"bench_recovery.py: scenario {scenario!r} failed")
    r = json.loads(out.read_text())
    ev = r["summary"]["failures"][0]
    first_after = ev["last_step_time"] + ev["gap_seconds"]
    return {"gap": ev["gap_seconds"], "kill_to_step": first_after - r["marks"]["kill"],
            "agreement": ev["recovery_seconds"],
            "lost_steps": sum(ev.get("lost_steps", {}).values()),
            "examples_reassigned": ev.get("examples_reassigned", 0)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each measurement")
    ap.add_argument("--rows", type=int, default=12000)
    ap.add_argument("--epochs", type=int, default=3, help="epochs of the throughput runs")
    ap.add_argument("--mpi-throughput", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mpi-kill", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mpi-out", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--scenario", help=argparse.SUPPRESS)
    ap.add_argument("--victim", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--at", type=int, default=KILL_CLOCK, help=argparse.SUPPRESS)
    ap.add_argument("--every", type=int, default=EVERY, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    benchlib.add_common_args(ap)
    args = ap.parse_args(argv)
    if args.mpi_throughput:
        return mpi_throughput(args)
    if args.mpi_kill:
        return mpi_kill(args)
    at, every, kill_epochs = KILL_CLOCK, EVERY, 2
    if args.quick:
        args.reps, args.rows, args.epochs = 1, 3000, 1
        at, every, kill_epochs = QUICK_KILL_CLOCK, QUICK_EVERY, 1
    rep = benchlib.Report("recovery")
    scenarios = [("worker lost", WORKER1), ("server lost, replicas 2", SERVER1),
                 ("server lost, replicas 1", SERVER1), ("restart kill", SERVER1)]
    # run directories on tmpfs when there is one: the chief's fsync of metrics.json at each
    # epoch's end (which every BSP worker waits for) took up to 29 s here under other jobs'
    # disk load, and would dominate the ratios
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="hpcps-bench-recovery-", dir=shm) as d:
        d = Path(d)
        tjob = write_job(d, args.rows, args.epochs)
        out = d / "throughput.json"
        print(f"recovery: throughput, {args.reps} repetition(s) of 3 variants", flush=True)
        p = launch_mpi([sys.executable, str(HERE / "bench_recovery.py"), "--mpi-throughput",
                        "--job", str(tjob), "--mpi-out", str(out), "--reps", str(args.reps)])
        if p.returncode != 0:
            sys.stderr.write(p.stdout[-3000:] + p.stderr[-20000:])
            raise SystemExit("bench_recovery.py: the throughput runs failed")
        thr = json.loads(out.read_text())
        (d / "k").mkdir()
        kjob = write_job(d / "k", args.rows, kill_epochs)
        kills = {name: [] for name, _ in scenarios}
        for r in range(args.reps):
            for name, victim in benchlib.rotate(scenarios, r):
                print(f"recovery: {name}, repetition {r + 1}", flush=True)
                kills[name].append(kill_scenario(d, kjob, name, victim, r, at, every))
    med = {n: benchlib.median([x["examples_per_second"] for x in v]) for n, v in thr.items()}
    rows = {}
    for name, runs in kills.items():
        rows[name] = {k: benchlib.median([x[k] for x in runs]) for k in runs[0] if k != "exit"}
    rep.details.update({"throughput": thr, "throughput_median": med, "recovery": kills,
                        "recovery_median": rows, "kill_clock": at,
                        "checkpoint_every": every, "ranks": RANKS, "rows": args.rows})
    print(f"Adult {args.rows} rows, 3 workers + 3 servers, BSP float64, batch 32; "
          f"{args.reps} repetition(s), medians")
    for n, v in med.items():
        print(f"  {n:<12} {v:>10,.0f} examples/s")
    print(f"  {'scenario':<26} {'last step -> first step':>24} {'kill -> first step':>19}  other")
    for name, r in rows.items():
        other = ", ".join(f"{k} {v:g}" for k, v in r.items() if k not in ("gap", "kill_to_step"))
        print(f"  {name:<26} {r['gap']:>22.2f} s {r['kill_to_step']:>17.2f} s  {other}")
    rep.ratio("recovery: server lost, replicas 2, last step -> first step after, s",
              rows["server lost, replicas 2"]["gap"], 2.0, higher_is_better=False, unit=" s")
    rep.ratio("recovery: worker lost, last step -> first step after, s",
              rows["worker lost"]["gap"], None, unit=" s")
    rep.ratio("recovery: server lost, replicas 1 (reload), last step -> first step after, s",
              rows["server lost, replicas 1"]["gap"], None, unit=" s")
    rep.ratio("recovery: restart mode, kill -> first step of the relaunch, s",
              rows["restart kill"]["kill_to_step"], None, unit=" s")
    rep.ratio("recovery: continue (replicas 1) / restart mode, examples/s",
              med["replicas 1"] / med["restart"], 0.8)
    rep.ratio("recovery: replicas 2 / replicas 1, examples/s", med["replicas 2"] / med["replicas 1"],
              0.5, headline=True)
    rep.write(args.json)
    print(rep.last_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
