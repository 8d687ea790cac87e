"""End to end on the Adult job: hpcps (BSP, async) vs a torch.distributed.rpc parameter
server (``bench_torch_ps.py``) and vs the AllReduce baseline, with the same ranks.

Run it with plain ``python`` (it launches what it needs)::

    python bench/bench_e2e.py                 # 3 workers + 1 server, 2 epochs

* **hpcps**: an ``mpirun`` of ``workers + 1`` ranks runs this script's MPI part, which trains
  the job under each variant in turn (``hpcps.runtime.job.run_job``, the code ``hpcps train`` runs;
  the order rotates from one launch to the next). The data is featurized once per rank and
  reused by every variant (the featurizer is not what is measured; the training loop and its
  per-epoch evaluations are).
* **Interleaving**: ``--reps`` rounds, each one torch run and one hpcps launch, in the order
  torch, hpcps, hpcps, torch, ... so that both sides see the same drift in the machine's load;
  every row reports the median over its runs.
* **AllReduce** (``[cluster] mode = "allreduce"``): the same ranks, all workers, gradients
  summed with ``MPI.Allreduce``; included when this hpcps implements the mode, otherwise the
  row says so.
* **torch RPC PS**: ``bench_torch_ps.py`` with ``workers`` trainers + 1 server process, in its
  BSP and its async mode (sparse rows only, one fused push-pull RPC per step, torch threads
  set to each process's share of the cores), each compared with hpcps's mode of the same name
  (skipped with a message when torch is not installed); a note says when its final test AUC
  is more than the job's ``max_auc_gap`` from hpcps's.

The job: ``jobs/adult_lr.toml`` (2^20 hashed features with crosses, AdaGrad lr 0.1, batch 256
per worker) with ``l2 = 0`` (the torch model has no L2 term), no checkpoints, no scikit-learn
fit. Reported per system: examples/s over the training loop, the test log-loss after each
epoch, and the time from the start of training to the end of the first epoch whose test
log-loss is at most ``--target``, its evaluation included for every system (hpcps: the epoch
record's ``evaluated_seconds``; before 2026-12-04 its ``seconds``, the end of the epoch's
steps, which left hpcps's evaluation out; "not reached" otherwise).

Ratios: hpcps examples/s / torch examples/s and torch time-to-target / hpcps time-to-target
(goal >= 5 for both), for BSP and async; hpcps BSP / AllReduce examples/s (goal >= 1) and, with
``--baseline-commit C``, hpcps BSP / hpcps BSP of commit C built in a temporary directory and
run in the same rounds (issue 20: C = aa75ea0, goal >= 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import benchlib

benchlib.ensure_importable()

#: Runs of each variant at the start of every hpcps launch (this build's and the baseline
#: commit's alike) that are not reported: a launch's first run pays what a job pays once —
#: shared-memory connections made at the first message between two ranks, first touches of the
#: tables and buffers — and a run here trains for only ~0.3 s, so that cost cut the rate of
#: whichever variant ran first (the baseline commit's BSP, always first in its launch): commit
#: 3c84fa6 as the baseline ran at 64,088 examples/s cold (2026-12-03 13:27) and at 172,537
#: with this warm-up (13:37). The torch trainers' clocks start after their first RPC, once
#: connected.
WARMUP = 1
TARGET_LOGLOSS = 0.34      # reached by every system within 2 epochs here (docs/benchmarks.md)
HERE = Path(__file__).resolve().parent


def allreduce_supported() -> bool:
    """Whether this hpcps trains ``[cluster] mode = "allreduce"`` (not only parses it)."""
    import hpcps

    pkg = Path(hpcps.__file__).parent
    for p in pkg.rglob("*.py"):
        if p.name == "config.py":
            continue
        text = p.read_text(errors="replace")
        if '"allreduce"' in text and "mode" in text:
            return True
    return False


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def write_job(d: Path, epochs: int, quick: bool) -> Path:
    """The benchmark's job file: the quick-start job without L2, checkpoints or baseline."""
    text = (benchlib.ROOT / "jobs" / "adult_lr.toml").read_text()
    data = benchlib.ROOT / "data" / "adult.csv.gz"
    lines = []
    section = ""
    for line in text.splitlines():
        s = line.split("#", 1)[0].strip()
        if s.startswith("["):
            section = s
        key = s.split("=", 1)[0].strip() if "=" in s else ""
        if key == "path" and section == "[data]":
            line = f'path = "{data}"'
        elif key == "max_rows" and quick:
            line = "max_rows = 4000"
        elif key == "l2":
            line = "l2 = 0.0"
        elif key == "epochs":
            line = f"epochs = {epochs}"
        elif key == "at_end":
            line = "at_end = false"
        elif key == "sklearn_baseline":
            line = "sklearn_baseline = false"
        elif key == "progress_seconds":
            line = "progress_seconds = 1000.0"
        elif key == "dir" and section == "[output]":
            line = f'dir = "{d / "runs"}"'
        lines.append(line)
    job = d / "bench_e2e.toml"
    job.write_text("\n".join(lines) + "\n")
    return job


# ------------------------------------------------------------------------- MPI part

def mpi_part(args) -> int:
    """Every rank: train each variant ``reps`` times (collective over the world)."""
    from hpcps.comm.core import abort_on_error, world
    from hpcps.config import ConsistencyConfig, load_job
    from hpcps.runtime.job import run_job

    _cache_data()
    comm = world()
    base = load_job(args.job)
    variants = {"hpcps BSP": dict(consistency=ConsistencyConfig(model="bsp")),
                "hpcps async": dict(consistency=ConsistencyConfig(model="async"))}
    if "fuse_steps" in {f.name for f in dataclasses.fields(base.comm)}:
        # issue 20's fused step against the two requests per step it replaced, same build
        variants["BSP pulls apart"] = dict(consistency=ConsistencyConfig(model="bsp"),
                                           comm=dataclasses.replace(base.comm, fuse_steps=False))
    if args.allreduce:
        variants["AllReduce"] = dict(cluster=dataclasses.replace(base.cluster, mode="allreduce"))
    results = {v: [] for v in variants}
    for rep in range(args.reps):
        for name in benchlib.rotate(variants, rep + args.rotate):
            out_dir = base.output.dir / f"{name.replace(' ', '_')}-{rep}"
            cfg = dataclasses.replace(base, output=dataclasses.replace(base.output, dir=out_dir),
                                      **variants[name])
            with abort_on_error(comm):
                s = run_job(cfg, comm, out=io.StringIO(), resume="never")
            if comm.Get_rank() == 0:
                m = json.loads((out_dir / "metrics.json").read_text())
                results[name].append({"examples_per_second": s["examples_per_second"],
                                      "train_seconds": s["train_seconds"],
                                      "examples": s["examples"],
                                      # every request a server handled (evaluation and
                                      # final model included) per training step
                                      "server_requests_per_step": [
                                          d["requests"] / s["steps"] for d in s["servers"]]
                                      if s.get("servers") and s["steps"] else None,
                                      # time to target: once the epoch's test metrics are
                                      # known (its evaluation included, as the torch peer's);
                                      # "seconds" alone ends with its steps (a commit before
                                      # evaluated_seconds: that)
                                      "epochs": [{"epoch": e["epoch"],
                                                  "seconds": e.get("evaluated_seconds",
                                                                   e["seconds"]),
                                                  "test_logloss": e["test_logloss"],
                                                  "test_auc": e["test_auc"]} for e in m["epochs"]]})
    if comm.Get_rank() == 0:
        Path(args.mpi_out).write_text(json.dumps(results))
    return 0


def _run_or_exit(cmd, env, what: str) -> None:
    """Run ``cmd`` with ``env`` added; on a non-zero exit print its output's tail and stop
    the benchmark saying ``what``."""
    p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise SystemExit(f"bench_e2e.py: {what}")


def _cache_data():
    """Featurize each split once per rank and reuse it in every variant (bench only): wraps
    ``hpcps.data.source.load_split`` where the model and the job look it up."""
    from hpcps.data import source

    orig = source.load_split
    memo = {}

    def load_split(data_cfg, split, part, n_parts, **kw):
        key = (repr(data_cfg), split, part, n_parts)
        if key not in memo:
            memo[key] = orig(data_cfg, split, part, n_parts, **kw)
        return memo[key]

    source.load_split = load_split
    for mod in ("hpcps.models.logistic", "hpcps.worker.trainer", "hpcps.runtime.job"):
        try:
            m = __import__(mod, fromlist=["load_split"])
        except ImportError:
            continue
        if hasattr(m, "load_split"):
            m.load_split = load_split


# ------------------------------------------------------------------------- driver

def base_python(src: Path) -> tuple[str, dict]:
    """The interpreter and environment that run commit tree ``src``: the base interpreter of
    a virtual environment (its editable install of this checkout would fill in modules the
    commit does not have) with ``PYTHONPATH`` = ``src``, then the environment's
    site-packages (numpy, mpi4py, Cython, ...: the base interpreter has none of them; a
    ``PYTHONPATH`` entry's ``.pth`` files, the editable install's finder among them, are not
    run)."""
    import site

    py = getattr(sys, "_base_executable", None) or sys.executable
    path = [str(src)] + [p for p in site.getsitepackages() if Path(p).is_dir()]
    return py, {"PYTHONPATH": os.pathsep.join(path)}


def build_commit(commit: str, d: Path) -> Path:
    """The source tree of ``commit`` of this repository in ``d``, its kernels built in place
    (with this interpreter); returns the directory to put on ``PYTHONPATH``, or None (with a
    message) when the repository does not have the commit."""
    root = HERE.parent
    src = d / f"hpcps-{commit}"
    src.mkdir()
    got = subprocess.run(["git", "-C", str(root), "archive", commit], capture_output=True)
    if got.returncode != 0:
        print(f"e2e: commit {commit} is not in {root} (not a git clone with that history?): "
              "no baseline row", flush=True)
        return None
    arch = got.stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=arch, check=True)
    print(f"e2e: building the kernels of {commit} in {src}", flush=True)
    py, env = base_python(src)
    missing = subprocess.run([py, "-c", "import Cython, setuptools, numpy"],
                             env={**os.environ, **env}, capture_output=True, text=True)
    if missing.returncode != 0:
        raise SystemExit(f"bench_e2e.py: building commit {commit} needs Cython, setuptools and "
                         f"numpy in this environment ({missing.stderr.strip().splitlines()[-1]});"
                         " pip install -e '.[test]' installs them")
    p = subprocess.run([py, "setup.py", "-q", "build_ext", "--inplace"], cwd=src,
                       env={**os.environ, **env}, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise SystemExit(f"bench_e2e.py: building commit {commit} failed")
    return src


#: A run slower than this fraction of its row's median is reported with its epochs' times.
STALLED = 0.5


def time_to(epochs, target):
    for e in epochs:
        if e["test_logloss"] <= target:
            return e["seconds"]
    return None


def summarize(runs, target, unreached_as_bound=False):
    """Median examples/s and time-to-target over repetitions.

    A run that never reached ``target`` makes the row's time None (n/a), or, with
    ``unreached_as_bound`` (the torch baseline, whose asynchronous runs sometimes end just
    above the target), counts with its whole training time: a lower bound of its time to the
    target, so the ratio hpcps is compared with is a lower bound too (``unreached`` says how
    many runs)."""
    eps = benchlib.median([r["examples_per_second"] for r in runs])
    tts = [time_to(r["epochs"], target) for r in runs]
    reached = [t for t in tts if t is not None]
    unreached = len(tts) - len(reached)
    if unreached and unreached_as_bound:
        tt = benchlib.median([t if t is not None else r["epochs"][-1]["seconds"]
                              for t, r in zip(tts, runs)])
    else:
        tt = benchlib.median(reached) if not unreached else None
    req = [r["server_requests_per_step"] for r in runs if r.get("server_requests_per_step")]
    return {"examples_per_second": eps, "time_to_target": tt, "unreached": unreached,
            "server_requests_per_step": ([benchlib.median([q[i] for q in req])
                                          for i in range(len(req[0]))] if req else None),
            "examples_per_second_runs": [r["examples_per_second"] for r in runs],
            # each run's epochs (seconds since its start): places a stall in one run
            "epoch_seconds_runs": [[round(e["seconds"], 3) for e in r["epochs"]] for r in runs],
            "final_logloss": benchlib.median([r["epochs"][-1]["test_logloss"] for r in runs]),
            "final_auc": benchlib.median([r["epochs"][-1]["test_auc"] for r in runs]),
            "logloss_by_epoch": [benchlib.median([r["epochs"][i]["test_logloss"] for r in runs])
                                 for i in range(min(len(r["epochs"]) for r in runs))],
            "reps": len(runs)}


def stalled_runs(rows) -> list[str]:
    """A line for each run slower than :data:`STALLED` of its row's median examples/s (rows of
    :func:`summarize`), with the times its epochs ended."""
    out = []
    for name, r in rows.items():
        for i, (v, ep) in enumerate(zip(r["examples_per_second_runs"], r["epoch_seconds_runs"])):
            if v < STALLED * r["examples_per_second"]:
                out.append(f"{name}: run {i + 1} of {r['reps']} ran at {v:,.0f} examples/s, under "
                           f"{STALLED:g} of the median (a stall); its epochs ended at "
                           f"{', '.join(f'{x:.2f}' for x in ep)} s")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2,
                    help="rounds: one torch run and one hpcps launch (every variant) each")
    ap.add_argument("--rotate", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--target", type=float, default=TARGET_LOGLOSS, help="test log-loss to reach")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--mpi-part", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mpi-out", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--allreduce", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--baseline-commit", metavar="COMMIT",
                    help="also run hpcps BSP of this commit of the repository (issue 20: "
                         "aa75ea0), built in a temporary directory, in the same rounds")
    benchlib.add_common_args(ap)
    args = ap.parse_args(argv)
    if args.mpi_part:
        return mpi_part(args)
    from hpcps.config import load_job
    from hpcps.runtime import launch

    if args.quick:
        args.epochs, args.reps, args.workers = 1, 1, 2
        args.no_torch = True         # starting torch processes alone takes ~30 s here
    rep = benchlib.Report("e2e")
    ar = allreduce_supported()
    with tempfile.TemporaryDirectory(prefix="hpcps-bench-e2e-") as d:
        d = Path(d)
        job = write_job(d, args.epochs, args.quick)
        gap = load_job(job).evaluate.max_auc_gap
        mpirun = launch.find_mpirun()
        out = d / "hpcps.json"
        base_dir = build_commit(args.baseline_commit, d) if args.baseline_commit else None

        def baseline_cmd(i):
            # the commit's own bench_e2e.py MPI part and hpcps (base_python)
            py, penv = base_python(base_dir)
            cmd, env = launch.build_launch(args.workers + 1, [
                py, str(base_dir / "bench" / "bench_e2e.py"), "--mpi-part", "--job", str(job),
                "--mpi-out", str(d / "baseline.json"), "--reps", str(1 + WARMUP)],
                mpirun=mpirun, flavour=launch.mpi_flavour(mpirun))
            return cmd, {**env, **penv}

        def hpcps_cmd(i):
            return launch.build_launch(args.workers + 1, [
                sys.executable, str(HERE / "bench_e2e.py"), "--mpi-part", "--job", str(job),
                "--mpi-out", str(out), "--reps", str(1 + WARMUP), "--rotate", str(i)]
                + (["--allreduce"] if ar else []),
                mpirun=mpirun, flavour=launch.mpi_flavour(mpirun))

        def run_this(i):
            cmd, env = hpcps_cmd(i)
            print(f"e2e: hpcps run {i + 1}/{rounds}: {' '.join(cmd)}", flush=True)
            _run_or_exit(cmd, env, "the hpcps runs failed")
            for name, runs in json.loads(out.read_text()).items():
                hp.setdefault(name, []).extend(runs[WARMUP:])

        def run_base(i):
            cmd, env = baseline_cmd(i)
            print(f"e2e: hpcps {args.baseline_commit} run {i + 1}/{rounds}", flush=True)
            _run_or_exit(cmd, env, "the baseline commit's runs failed")
            runs = json.loads((d / "baseline.json").read_text())["hpcps BSP"]
            hp.setdefault(f"BSP {args.baseline_commit}", []).extend(runs[WARMUP:])

        torch_runs = {"BSP": [], "async": []}
        torch_cmd = [sys.executable, str(HERE / "bench_torch_ps.py"), str(job), "--workers",
                     str(args.workers), "--epochs", str(args.epochs), "--json", str(d / "torch.json")]
        skipped = args.no_torch
        if not skipped and _has_torch():
            # featurize once for the torch processes (hpcps featurizes once per rank)
            from adultdata import save_npz

            save_npz(job, d / "data.npz")
            torch_cmd += ["--data-npz", str(d / "data.npz")]
        hp: dict = {}
        rounds = max(1, args.reps)
        for i in range(rounds):
            # torch, hpcps, hpcps, torch, ...: both sides see the same drift of the load
            for side in (("torch", "hpcps") if i % 2 == 0 else ("hpcps", "torch")):
                for mode in (("bsp", "async") if side == "torch" and not skipped else ()):
                    print(f"e2e: torch rpc PS ({mode}) run {i + 1}/{rounds}", flush=True)
                    p = subprocess.run(torch_cmd + ["--mode", mode], capture_output=True, text=True)
                    if p.returncode != 0:
                        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
                        raise SystemExit("bench_e2e.py: the torch rpc PS run failed")
                    t = json.loads((d / "torch.json").read_text())
                    if t["details"].get("skipped"):
                        skipped = True
                        print(p.stdout.strip().splitlines()[-1])
                        break
                    torch_runs["BSP" if mode == "bsp" else "async"].append(t["details"])
                if side == "hpcps":
                    # this hpcps and the baseline commit's, in alternating order by round
                    for which in (("this", "base") if i % 2 == 0 else ("base", "this")):
                        if which == "this":
                            run_this(i)
                        elif base_dir is not None:
                            run_base(i)
    rows = {name: summarize(runs, args.target) for name, runs in hp.items()}
    for mode, runs in torch_runs.items():
        if runs:
            tr = [{"examples_per_second": t["examples_per_second"], "epochs": t["epochs"]} for t in runs]
            rows[f"torch PS {mode}"] = summarize(tr, args.target, unreached_as_bound=True)
            rows[f"torch PS {mode}"]["torch"] = runs[0]["torch"]
    rep.details.update({"rows": rows, "target_logloss": args.target, "workers": args.workers,
                        "servers": 1, "epochs": args.epochs, "allreduce_available": ar,
                        "torch_skipped": skipped})
    print(f"Adult, {args.workers} workers + 1 server ({args.workers + 1} ranks), {args.epochs} epochs; "
          f"target test log-loss {args.target}")
    print(f"{'system':<16} {'ex/s':>10} {'to target s':>11} {'final logloss':>13} {'AUC':>7}  log-loss by epoch")
    for name, r in rows.items():
        tt = ("not reached" if r["time_to_target"] is None else
              (">= " if r.get("unreached") else "") + f"{r['time_to_target']:.2f}")
        req = r.get("server_requests_per_step")
        print(f"{name:<16} {r['examples_per_second']:>10,.0f} {tt:>11} {r['final_logloss']:>13.4f} "
              f"{r['final_auc']:>7.4f}  {' '.join(f'{v:.4f}' for v in r['logloss_by_epoch'])}"
              + (f"  server requests/step {', '.join(f'{q:.2f}' for q in req)}" if req else ""))
    for text in stalled_runs(rows):
        print(text)
        rep.note(text)
    if not ar:
        print("AllReduce: not available in this hpcps ([cluster] mode = \"allreduce\" is not "
              "implemented yet): no row")
        rep.note("AllReduce baseline: not implemented in this hpcps yet (hole)")
    for mode in ("BSP", "async"):
        tp = rows.get(f"torch PS {mode}")
        if tp and tp["unreached"]:
            rep.note(f"torch rpc PS {mode}: {tp['unreached']} of {tp['reps']} runs ended above log-loss "
                     f"{args.target}; their whole training time counts as their time to it (a lower "
                     "bound), so the time-to-target ratio is a lower bound")
    # the peer trains the same model: its final test AUC within the job's max_auc_gap of hpcps's
    for name in ("hpcps BSP", "hpcps async"):
        tp = rows.get("torch PS " + name.split()[1])
        if tp and abs(tp["final_auc"] - rows[name]["final_auc"]) > gap:
            rep.note(f"torch rpc PS {name.split()[1]}: final test AUC {tp['final_auc']:.4f}, "
                     f"{name} {rows[name]['final_auc']:.4f}: more than max_auc_gap {gap} apart "
                     "(not the same model?)")
    for name in ("hpcps BSP", "hpcps async"):
        h = rows[name]
        tp = rows.get("torch PS " + name.split()[1])
        if tp:
            rep.ratio(f"e2e {name} / torch rpc PS {name.split()[1]}, examples/s",
                      h["examples_per_second"] / tp["examples_per_second"],
                      5, headline=name == "hpcps async")
            v = (tp["time_to_target"] / h["time_to_target"]
                 if tp["time_to_target"] and h["time_to_target"] else None)
            rep.ratio(f"e2e torch rpc PS {name.split()[1]} / {name}, time to log-loss {args.target}", v, 5,
                      headline=name == "hpcps async")
        else:
            rep.ratio(f"e2e {name} / torch rpc PS, examples/s", None, 5, headline=name == "hpcps async")
    if not any(torch_runs.values()):
        rep.note("the torch rpc PS comparison was skipped (" + ("--quick" if args.quick else
                 "--no-torch" if args.no_torch else "torch is not installed") + ")")
    if "AllReduce" in rows:
        for name in ("hpcps BSP", "hpcps async"):
            rep.ratio(f"e2e {name} / AllReduce, examples/s",
                      rows[name]["examples_per_second"] / rows["AllReduce"]["examples_per_second"],
                      1.0 if name == "hpcps BSP" else None)
    if "BSP pulls apart" in rows:
        rep.ratio("e2e hpcps BSP / hpcps BSP with the pulls apart ([comm] fuse_steps = false), "
                  "examples/s", rows["hpcps BSP"]["examples_per_second"]
                  / rows["BSP pulls apart"]["examples_per_second"], None)
    old = rows.get(f"BSP {args.baseline_commit}") if args.baseline_commit else None
    if old:
        rep.ratio(f"e2e hpcps BSP / hpcps BSP at commit {args.baseline_commit} (same run), "
                  "examples/s", rows["hpcps BSP"]["examples_per_second"] / old["examples_per_second"],
                  2.0)
    rep.write(args.json)
    print(rep.last_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
