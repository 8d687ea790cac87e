"""The ``hpcps`` command.

``hpcps train JOB``         run a job inside an MPI launch (every rank runs this)
``hpcps run [-n N] [JOB]``  start mpirun for JOB (default: the shipped quick-start job)
``hpcps check [JOB]``       run JOB and compare its test AUC with scikit-learn's
``hpcps grow RUN_DIR -w N`` add N workers to the job running in RUN_DIR (:mod:`hpcps.resilience.elastic`)
``hpcps info``              versions of hpcps, MPI, mpi4py, h5py
``hpcps data prepare NAME`` write a prepared data set (:mod:`hpcps.cli.data`)
``hpcps bench [--quick]``   run the benchmark suite in bench/ (hpcps.cli.bench)
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[2] / "jobs" / "adult_lr.toml"
QUICKSTART_WORKERS = 3


def _rank_label() -> str:
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return f"rank {os.environ[var]}: "
    return ""


def _fail(msg: str, code: int = 2) -> int:
    # one line per problem (a job file's errors are reported together), each with the prefix
    sys.stderr.write("".join(f"hpcps: {_rank_label()}error: {line}\n"
                             for line in str(msg).splitlines() or [""]))
    sys.stderr.flush()
    return code


def cmd_train(args) -> int:
    # Everything that can be checked without MPI traffic is checked first, on every rank.
    # The ranks then agree (one Allreduce) so that a bad job file — or a data path missing on
    # one node only — makes *every* rank print an error and exit 2 together, instead of the
    # first rank to exit getting the others killed before they said anything.
    from hpcps.core.signals import EXIT_REQUEUE, StopRequest

    stop = StopRequest().install()      # first: a stop signal may come during start-up
    # a rank that crashes (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL) prints every thread's
    # Python stack on stderr first (a segfault of one rank at exit was seen once in CI, with
    # nothing but its signal number to go on)
    faulthandler.enable(all_threads=True)
    from hpcps.config import ConfigError, check_output_writable, load_job
    from hpcps.core import log

    log.configure(args.verbosity)
    out = log.LineStream()              # every line of the job through the "hpcps" logger

    error = None
    try:
        cfg = load_job(args.job)
        check_output_writable(cfg)
    except ConfigError as e:
        error = str(e)
    from hpcps.checkpoint import ResumeError
    from hpcps.comm import core
    from hpcps.core.resources import ResourceError
    from hpcps.runtime.job import run_job

    world = core.world()
    log.set_rank(world.Get_rank())      # every line names its rank (and host)
    try:
        core.check_launch(world)
    except core.LaunchError as e:
        return _fail(str(e))
    if core.any_rank_failed(world, error is not None):
        _fail(error or "a job-file error was reported by another rank (see its message)")
        core.barrier_before_exit(world)
        return 2
    from hpcps.config import output_note

    note = output_note(cfg) if world.Get_rank() == 0 else None
    if note:
        out.write(f"hpcps: note: {note}\n")
    with core.abort_on_error(world, notify=True):
        try:
            res = run_job(cfg, world, out=out, resume=args.resume, stop=stop,
                          restart=args.restart)
            code = EXIT_REQUEUE if res and res.get("stopped_by_signal") else 0
            if res and res.get("skip_finalize"):
                # after surviving a lost rank, Open MPI's MPI_Finalize can wait forever for the
                # dead process (open-mpi/ompi#11404); the survivors have met in a barrier and
                # every output is written, so they leave without it
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            if code:
                return code
        except (ConfigError, core.LaunchError, ResumeError, ResourceError) as e:
            # raised identically on every rank before any parameter-server traffic; a
            # ResumeError carries rank 0's decision, so rank 0 alone prints it (once per job)
            # and every other rank one line saying so (a per-rank log is never silent)
            if not isinstance(e, ResumeError) or world.Get_rank() == 0:
                _fail(str(e))
            else:
                _fail("stopped: rank 0 refused to resume from the checkpoint (its error "
                      "says why)")
            core.barrier_before_exit(world)
            return 2
    return 0


def cmd_join(args) -> int:
    # started by MPI_Comm_spawn from a running job (hpcps.resilience.elastic), never by a user
    from hpcps.core.signals import EXIT_REQUEUE, StopRequest

    stop = StopRequest().install(ignore_sigterm=True)   # see StopRequest.install
    faulthandler.enable(all_threads=True)               # as hpcps train's ranks
    deadline = None
    if args.deadline is not None:    # before MPI_Init, which can wait forever (issue 22.1)
        from hpcps.core.procs import exit_after

        deadline = exit_after(args.deadline, f"added worker: not joined within {args.deadline:g} "
                              "s ([elastic] join_timeout; the job was aborted or a process "
                              "died); exiting")
    from hpcps.comm import core, spawn
    from hpcps.core import log
    from hpcps.runtime.job import join_job

    log.configure(args.verbosity)

    if spawn.parent() is None:
        return _fail("`hpcps join` is started by a running job to add workers to it (hpcps "
                     "grow, [elastic] add_workers); it cannot run by itself")
    with core.abort_on_error(core.world(), notify=True):
        res = join_job(out=log.LineStream(), stop=stop, deadline=deadline)
    return EXIT_REQUEUE if res.get("stopped_by_signal") else 0


def cmd_grow(args) -> int:
    from hpcps.resilience.grow_request import ANSWER, REQUEST, GrowError, running_job, submit_request, wait_answer

    run_dir = Path(args.run_dir)
    try:
        rid = submit_request(run_dir, args.workers, args.oversubscribe)
    except GrowError as e:
        return _fail(str(e))
    print(f"hpcps grow: asked the job in {run_dir} for {args.workers} more worker(s) "
          f"(request {rid[:8]} in {run_dir / REQUEST}); its chief reads it between two steps",
          flush=True)
    if args.wait <= 0:
        print(f"hpcps grow: not waiting; the answer will be in {run_dir / ANSWER}")
        return 0
    ans = wait_answer(run_dir, rid, args.wait)
    if ans is None:
        try:
            running_job(run_dir)
        except GrowError as e:
            return _fail(f"no answer: {e}", 1)
        return _fail(f"no answer within {args.wait:g} s; the request stays in {run_dir / REQUEST} "
                     "until the job's chief reads it", 1)
    print(f"hpcps grow: {ans.get('status')}: {ans.get('message')}", flush=True)
    return 0 if ans.get("status") == "grown" else 1


def _finished_anyway(cfg, since: float) -> str | None:
    """Why mpirun exited non-zero although this launch's job finished (``metrics.json`` has
    the summary, written after ``since``), or None. Open MPI's mpirun reports a process that
    did not end well even when the job did without it: the workers that ``MPI_Comm_spawn``
    could not start (status 213, "All nodes which are allocated for this job are already
    filled"), or added workers lost and survived in continue mode. Local."""
    from hpcps.runtime.rundir import RunDir

    path = RunDir(cfg.output.dir).metrics
    try:
        if path.stat().st_mtime < since:
            return None
        summary = json.loads(path.read_text()).get("summary", {})
    except (OSError, ValueError):
        return None
    if any(str(e.get("refused", "")).startswith("MPI_Comm_spawn")
           for e in summary.get("growth", [])):
        return "it could not start the workers the job asked for (see the MPI_Comm_spawn message above)"
    if summary.get("growth") and summary.get("failures"):
        return "a rank was lost (the job survived it in continue mode)"
    return None


def _unfinished(cfg, since: float) -> bool:
    """Whether this launch's job did not finish although mpirun exited 0: no ``metrics.json``
    with a summary written after ``since``. Open MPI 5's mpirun exits 0 after "PRTE has lost
    communication with a remote daemon" (a node's link cut: tests/multihost). Local.

    A finished run launched again trains nothing and leaves its ``metrics.json`` as it was:
    a summary of every epoch counts as finished, whenever it was written."""
    path = cfg.output.dir / "metrics.json"
    try:
        doc = json.loads(path.read_text())
        fresh = path.stat().st_mtime >= since
    except (OSError, ValueError):
        return True
    summary = doc.get("summary")
    return not isinstance(summary, dict) or (not fresh and summary.get("epochs", 0) < cfg.train.epochs)


def _default_job(job):
    if job:
        return job
    if not QUICKSTART.exists():
        raise SystemExit(_fail(f"no job file given and the quick-start job {QUICKSTART} is missing"))
    return str(QUICKSTART)


def cmd_run(args) -> int:
    from hpcps.runtime import launch
    from hpcps.config import ConfigError, load_job
    from hpcps.core.exitcodes import describe, restartable

    job = _default_job(args.job)
    try:
        cfg = load_job(job)
    except ConfigError as e:
        return _fail(str(e))
    if args.n:
        n = args.n
    elif cfg.cluster.mode == "allreduce":          # no servers: every rank is a worker
        n = QUICKSTART_WORKERS
    elif cfg.cluster.mode == "sandblaster":        # + the coordinator
        n = cfg.cluster.servers + QUICKSTART_WORKERS + 1
    else:
        n = cfg.cluster.servers + QUICKSTART_WORKERS
    # before launching: the rank count, the model's import, the memory (all ranks on this node)
    from hpcps.runtime.prelaunch import check_before_launch

    local = not args.mpirun_args and os.environ.get("SLURM_JOB_NUM_NODES", "1") in ("", "1")
    problems = check_before_launch(cfg, n, local)
    if problems:
        return _fail("\n".join(str(p) for p in problems))
    try:
        mpirun = launch.find_mpirun(args.mpirun)
    except FileNotFoundError as e:
        return _fail(str(e))
    cmd, env = launch.build_command(n, job, mpirun=mpirun, flavour=launch.mpi_flavour(mpirun),
                                    extra=args.mpirun_args,
                                    ulfm=cfg.fault_tolerance.mode == "continue",
                                    spare=cfg.elastic.add_workers)
    resume = args.resume or ("never" if args.func is cmd_check else "auto")
    if resume != "auto":
        cmd += ["--resume", resume]
    if args.verbosity:                  # -v / -q: for every rank's output
        cmd += ["-v" if args.verbosity > 0 else "-q"]
    shown = " ".join(f"{k}={v}" for k, v in env.items())
    print(f"hpcps run: {(shown + ' ') if shown else ''}{' '.join(cmd)}", flush=True)
    if args.dry_run:
        return 0
    from hpcps.runtime.rundir import RunDir

    run_dir = RunDir(cfg.output.dir)
    t_launch = time.time()
    rc = _checked(launch.run(cmd, env), cfg, t_launch, args)
    run_dir.clear_stale_running()           # an aborted job's chief could not remove it
    why = _finished_anyway(cfg, t_launch) if rc != 0 else None
    if why:
        print(f"hpcps run: mpirun exited with status {rc} because {why}; the job itself "
              "finished", flush=True)
        rc = 0
    _say_lost(cfg, n, rc, t_launch, args, 0)
    if rc and not restartable(rc) and args.max_restarts:
        print(f"hpcps run: mpirun exited with status {rc} ({describe(rc)}): not restarting, "
              "a relaunch would fail the same way", flush=True)
    restarts = 0
    # a job-file, data or disk error would fail again (hpcps.core.exitcodes); a forwarded signal
    # means stop
    while restartable(rc) and restarts < args.max_restarts and not launch.forwarded:
        restarts += 1
        print(f"hpcps run: mpirun exited with status {rc} ({describe(rc)}); restart "
              f"{restarts}/{args.max_restarts} (the job resumes from its newest valid checkpoint)",
              flush=True)
        for opt in ("--resume", "--restart"):  # a restart continues from the checkpoints
            if opt in cmd:
                i = cmd.index(opt)
                cmd = cmd[:i] + cmd[i + 2:]
        cmd += ["--restart", f"{restarts}:{rc}"]   # recorded in metrics.json (summary.launches)
        t_launch = time.time()
        rc = _checked(launch.run(cmd, env), cfg, t_launch, args)
        run_dir.clear_stale_running()
        _say_lost(cfg, n, rc, t_launch, args, restarts)
    return rc


def _say_lost(cfg, n: int, rc: int, since: float, args, restarts: int) -> None:
    """After a launch of ``n`` ranks (started at ``since``) that mpirun ended with ``rc``
    because a rank was lost (no rank aborted, no stop signal forwarded): say on stderr which
    rank, when in the run, and how the run resumes (:mod:`hpcps.runtime.lostrank`); mpirun's
    own message says only that a process ended. ``restarts``: relaunches done so far. Local."""
    from hpcps.core.exitcodes import restartable
    from hpcps.core.signals import EXIT_REQUEUE
    from hpcps.runtime import launch, lostrank

    if (rc == 0 or rc == EXIT_REQUEUE or not restartable(rc) or launch.forwarded
            or launch.last["abort"] is not None):
        return
    relaunch = f"restart {restarts + 1}/{args.max_restarts}" if restarts < args.max_restarts else None
    text = lostrank.explain(cfg, n, rc, launch.last["stderr"], since, _resume_command(args),
                            relaunch)
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()


def _resume_command(args) -> str:
    """The ``hpcps run`` command line that resumes the job of ``args`` (``hpcps run`` or
    ``check``) from its newest whole checkpoint: same ranks, job, mpirun and mpirun
    arguments; ``--resume`` left at ``auto``."""
    import shlex

    cmd = ["hpcps", "run"]
    if args.n:
        cmd += ["-n", str(args.n)]
    if args.mpirun:
        cmd += ["--mpirun", args.mpirun]
    if args.job:
        cmd.append(args.job)
    if args.mpirun_args:
        cmd += ["--", *args.mpirun_args]
    return shlex.join(cmd)


def _checked(rc: int, cfg, since: float, args) -> int:
    """``rc``, or 1 (a rank lost: restartable) when mpirun said 0 but the job did not finish."""
    from hpcps.runtime import launch

    if rc == 0 and not args.dry_run and not launch.forwarded and _unfinished(cfg, since):
        print("hpcps run: mpirun exited with status 0 but the job did not finish (no summary in "
              f"{cfg.output.dir / 'metrics.json'}; a node lost? see above): counted as status 1",
              flush=True)
        return 1
    return rc


def cmd_check(args) -> int:
    from hpcps.config import ConfigError, load_job

    rc = cmd_run(args)
    if rc != 0:
        return rc
    try:
        cfg = load_job(_default_job(args.job))
    except ConfigError as e:
        return _fail(str(e))
    from hpcps.runtime.rundir import RunDir

    metrics = json.loads(RunDir(cfg.output.dir).metrics.read_text())
    base = metrics.get("summary", {}).get("baseline")
    if not base or not metrics.get("epochs"):
        return _fail(f"{cfg.path}: set [evaluate] sklearn_baseline = true for hpcps check")
    ours = metrics["epochs"][-1]["test_auc"]
    gap = base["test_auc"] - ours
    ok = gap <= cfg.evaluate.max_auc_gap
    print(f"check: hpcps AUC {ours:.4f}  scikit-learn AUC {base['test_auc']:.4f}  "
          f"gap {gap:+.4f}  (allowed {cfg.evaluate.max_auc_gap})  {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


def cmd_info(args) -> int:
    import h5py
    import numpy

    from hpcps import __version__

    from hpcps.runtime import launch

    print(f"hpcps {__version__}; numpy {numpy.__version__}; h5py {h5py.__version__} "
          f"(HDF5 {h5py.version.hdf5_version})")
    try:
        mpirun = launch.find_mpirun()
        kind, major = launch.mpi_flavour(mpirun)
        print(f"mpirun: {mpirun} ({kind} {major or '?'})")
    except FileNotFoundError as e:
        print(e)
    from hpcps.comm.info import mpi_versions, request_path

    mpi4py_version, library = mpi_versions()
    print(f"mpi4py {mpi4py_version}")
    print(library)
    print(f"request path: {request_path()}")
    print(f"cores: {os.cpu_count()}")
    return 0


def _restart_arg(text: str):
    # "N:STATUS", given by `hpcps run` to a relaunch (hpcps.runtime.rundir.parse_restart)
    from hpcps.runtime.rundir import parse_restart

    try:
        return parse_restart(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N:STATUS, got {text!r}") from None


def _verbosity(p) -> None:
    """``-v`` / ``-q`` (:mod:`hpcps.core.log`) on a command that runs a job."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1, default=0,
                   help="show debug messages too (every line names its rank and host)")
    g.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1,
                   help="warnings and errors only (no progress lines, no summary)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpcps", description="An MPI parameter server for machine learning.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="run a job inside an MPI launch (every rank)")
    t.add_argument("job", help="TOML job file")
    t.add_argument("--resume", default="auto",
                   help="'auto' (default): resume from the newest valid checkpoint in the run "
                        "directory if there is one, else train afresh; 'require': resume from "
                        "it or exit with status 2; 'never': train afresh (earlier checkpoints "
                        "are moved to ckpt.aside-<time>/); or a checkpoint directory")
    t.add_argument("--restart", type=_restart_arg, default=None, help=argparse.SUPPRESS)
    _verbosity(t)
    t.set_defaults(func=cmd_train)
    about = {
        "run": "Launch mpirun for a job file: check the job, the rank count, the model's import "
               "and (all ranks on this node) the servers' memory first, then start the ranks "
               "(each runs `hpcps train`); resume from the run directory's newest valid "
               "checkpoint unless --resume says otherwise.",
        "check": "Train a job afresh (--resume never by default) and compare its test AUC with "
                 "scikit-learn's LogisticRegression on the same features: the job must set "
                 "[evaluate] sklearn_baseline = true; exit status 1 when the gap exceeds "
                 "[evaluate] max_auc_gap. Takes the same options as `hpcps run`.",
    }
    for name, func, hlp in (("run", cmd_run, "launch mpirun for a job"),
                            ("check", cmd_check, "run a job and compare its AUC with scikit-learn")):
        r = sub.add_parser(name, help=hlp, description=about[name])
        r.add_argument("job", nargs="?", help=f"TOML job file (default: {QUICKSTART.name}, 1 server + 3 workers)")
        r.add_argument("-n", type=int, default=0, help="number of ranks (default: servers + 3 workers; 3 for allreduce; "
                            "servers + 4 for sandblaster)")
        r.add_argument("--mpirun", help="mpirun to use (default: next to python, then PATH)")
        r.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
        r.add_argument("--resume", default=None,
                       help="passed to `hpcps train`: auto (default for run: continue from the "
                            "newest valid checkpoint, else train afresh), require (resume or "
                            "exit 2), never (default for check: train afresh, moving earlier "
                            "checkpoints aside), or a checkpoint directory; restarts after a "
                            "failure always resume")
        r.add_argument("--max-restarts", type=int, default=0, metavar="N",
                       help="relaunch mpirun up to N times after a failure (e.g. a rank was "
                            "killed); the job resumes from its newest valid checkpoint")
        _verbosity(r)
        r.set_defaults(func=func, mpirun_args=[])
        r.epilog = "Extra mpirun arguments go after --, e.g. `hpcps run -n 8 job.toml -- --host a,b`."
    g = sub.add_parser("grow", help="add workers to a running job (parameter-server mode)")
    g.add_argument("run_dir", help="the job's run directory ([output] dir, e.g. runs/adult_lr)")
    g.add_argument("-w", "--workers", type=int, required=True, help="workers to add (>= 1)")
    g.add_argument("--oversubscribe", action="store_true",
                   help="let the new workers share cores with running ranks (Open MPI: spawn "
                        "info map_by :OVERSUBSCRIBE, bind_to none); default: they need free slots")
    g.add_argument("--wait", type=float, default=120.0, metavar="SECONDS",
                   help="wait this long for the job's answer (default 120; 0: do not wait)")
    g.set_defaults(func=cmd_grow)
    j = sub.add_parser("join", help="(internal) a worker added to a running job; started by "
                                     "MPI_Comm_spawn, not by hand")
    _verbosity(j)
    j.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="exit unless joined within this time (the job's [elastic] join_timeout)")
    j.set_defaults(func=cmd_join)
    i = sub.add_parser("info", help="versions and the MPI in use")
    i.set_defaults(func=cmd_info)
    from hpcps.cli.analysis import register as register_analysis
    register_analysis(sub)  # inspect, eval, export, plot, diff (no MPI)
    from hpcps.cli.data import register as register_data
    register_data(sub)  # data prepare (no MPI)
    from hpcps.cli.bench import register as register_bench
    register_bench(sub)     # the benchmark suite (bench/)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list = []
    if argv and argv[0] in ("run", "check") and "--" in argv:
        # everything after the first -- goes to mpirun; hpcps options may come anywhere before
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args = build_parser().parse_args(argv)
    if hasattr(args, "mpirun_args"):
        args.mpirun_args = extra
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
