"""Push/pull and end to end across two test hosts over TCP, as ratios to raw mpi4py over the
same link in the same run (issue 17; part of ``hpcps bench`` as ``hosts``).

Needs root (it makes two test hosts with tests/hosts/testhosts.py, network and UTS namespaces
joined by a bridge, and removes them afterwards, also on failure; it takes the test hosts
over: hosts a concurrent multi-host test made are removed)::

    python bench/bench_hosts.py [--quick] [--json PATH] [--no-e2e]

Without root, ``ip``, ``nsenter`` or ``unshare`` it reports its ratios as n/a with the reason
(exit 0), so ``hpcps bench`` runs everywhere.

The worker runs on host 1 and the server on host 2; Open MPI uses its TCP BTL over the
hosts' veth link (``--mca pml ob1 --mca btl tcp,self``).

* **push/pull**: ``bench/bench_pushpull.py`` across the link; its ratios, raw time / hpcps time
  for the same messages (goal >= 0.8 for large messages), named "across 2 hosts".
* **end to end**: ``hpcps run`` of a small Adult job (BSP, 1 worker + 1 server, p2p pulls)
  across the link, then, in the same run and over the same link, raw mpi4py
  ``Send``/``Recv`` of the bytes the worker moved per step (pull request with its keys, the
  rows and the shard header back, the push), as many steps (``--raw-exchange``, median of 3).
  Ratio: raw seconds / the worker's communication seconds in hpcps (pull wait + push, which
  also include waiting for the server to apply the step); no goal (the job's messages are
  small: ~10-20 KB). The job's examples/s is reported too.
* **the cost model's network terms**: the job again over links shaped to ``--shape-mbit`` and
  half that (``tc`` tbf: bytes / bandwidth) and with every packet delayed by ``--delay-ms``
  and twice that (``testhosts.delay``, an NFQUEUE delay: this kernel has no netem; the
  latency); each pair's difference of training seconds against the model's (:func:`shaped`,
  :func:`delayed`).

On one machine the "link" is a veth pair through a bridge: kernel TCP, no wire, so the
figures say what hpcps adds to a TCP transport, not what a real network gives.

Each launch across the hosts runs in a session of its own with a time limit (``--timeout``,
per launch): one still running then is killed with every process of its session and every
process on the two hosts (mpirun, the daemon on the other host, the ranks) and the script fails with an error naming the launch
and the limit, instead of waiting for ever (a worker rank that raised once left the server
rank spinning in its receive for 40 min). SIGTERM (``hpcps bench`` at its step timeout) ends
the launches and removes the hosts before the script exits.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import benchlib  # noqa: E402

GOAL = 0.8
#: Seconds a launch across the hosts may take (``--timeout``; with ``--quick``: QUICK_TIMEOUT).
#: (One full run of the three launches took 258 s, docs/benchmarks.md.)
TIMEOUT = 900.0
QUICK_TIMEOUT = 300.0
HEADLINE = "push/pull across 2 hosts (TCP), large messages"
#: The stated rate of the shaped end-to-end runs (``--shape-mbit``; the second at half of it),
#: Mbit/s each way: slow links, so that bytes / rate dominate a step and the cost model's
#: network term shows.
SHAPE_MBIT = 50.0
#: The stated one-way delay of the delayed end-to-end runs (``--delay-ms``; the second at twice
#: it), ms per packet each way (tests/hosts/delay.py): the cost model's latency term.
DELAY_MS = 2.0

JOB = """
name = "hosts_e2e"
seed = 3
[cluster]
servers = 1
[data]
format = "adult_csv"
path = "{data}"
max_rows = {rows}
hash_bits = 16
[model]
dtype = "float32"
[train]
epochs = {epochs}
batch_size = 128
[consistency]
model = "bsp"
pull = "p2p"
[evaluate]
sklearn_baseline = false
[output]
dir = "{out}"
"""


def missing() -> str:
    """Why the test hosts cannot be made here ('' if they can)."""
    if os.geteuid() != 0:
        return "the test hosts need root (network namespaces, a bridge)"
    tools = [t for t in ("ip", "nsenter", "unshare") if not shutil.which(t)]
    return f"missing {', '.join(tools)} (apt: iproute2 util-linux)" if tools else ""


# ------------------------------------------------------------------ raw exchange (under mpirun)
def raw_exchange(steps: int, pull_up: int, pull_down: int, push_up: int, reps: int) -> int:
    """Rank 0 (worker) and rank 1 (server): ``steps`` times a pull request of ``pull_up``
    bytes, its reply of ``pull_down`` bytes and a push of ``push_up`` bytes, blocking
    ``Send``/``Recv``; rank 0 prints ``{"seconds": [...]}`` (one per repetition)."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    up, down, push = (np.zeros(max(1, n), np.uint8) for n in (pull_up, pull_down, push_up))
    ack = np.zeros(1, np.int64)
    times = []
    for _ in range(reps):
        comm.Barrier()
        t0 = MPI.Wtime()
        for _ in range(steps):
            if r == 0:
                comm.Send(up, 1, 1)
                comm.Recv(down, 1, 2)
                comm.Send(push, 1, 3)
            else:
                comm.Recv(up, 0, 1)
                comm.Send(down, 0, 2)
                comm.Recv(push, 0, 3)
        if r == 0:
            comm.Recv(ack, 1, 4)          # the last push has arrived
            times.append(MPI.Wtime() - t0)
        else:
            comm.Send(ack, 0, 4)
    if r == 0:
        print(json.dumps({"seconds": times}), flush=True)
    return 0


# ------------------------------------------------------------------ launches across the hosts
#: Sessions of the launches still running (ended by :func:`end_launches`).
_running: set = set()


class LaunchTimeout(RuntimeError):
    """A launch across the hosts did not finish within its time limit (it was killed)."""


def run_across(cmd, env: dict, cwd, timeout: float, what: str, hosts=(),
               capture: bool = False) -> subprocess.CompletedProcess:
    """Run ``cmd`` (a launch across ``hosts``) in a session of its own and wait at most
    ``timeout`` seconds; then kill every process of that session and every process running
    on ``hosts`` (Open MPI's daemon on another host detaches into a session of its own, with
    the ranks it starts), and raise :class:`LaunchTimeout` naming ``what`` and the limit
    (with the end of its output when ``capture``). ``capture``: stdout and stderr as text in
    the result; else they go to ours. The hosts must run nothing else.
    """
    from hpcps.core.procs import kill_session
    from tests.hosts import testhosts as th

    pipe = subprocess.PIPE if capture else None
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=pipe,
                         stderr=pipe, text=True, errors="replace", start_new_session=True)
    _running.add(p.pid)
    try:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            killed = set(kill_session(p.pid))
            for h in hosts:
                killed.update(th.kill_on(h))
            out, err = p.communicate()
            tail = ("; its output ended with:\n" + ((out or "") + (err or ""))[-3000:]
                    if capture else "")
            raise LaunchTimeout(f"{what} did not finish within {timeout:g} s (--timeout): "
                                f"killed its {len(killed)} processes (mpirun, the daemons, "
                                f"the ranks){tail}") from None
    finally:
        if p.poll() is None:              # an exception or a signal while it ran
            kill_session(p.pid)
            p.wait()
        _running.discard(p.pid)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def end_launches() -> None:
    """Kill every process of the launches still running (their sessions; what runs on the
    hosts goes with them, :func:`testhosts.down`). Local."""
    from hpcps.core.procs import kill_session

    for sid in list(_running):
        kill_session(sid)


def _terminated(signum, frame):
    raise SystemExit(128 + signum)        # the finally blocks end the launches, remove the hosts


# ------------------------------------------------------------------ the two parts
def _env(tmp: str) -> dict:
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                OMPI_MCA_osc="^ucx", PYTHONPATH=f"{ROOT / 'bench'}:{ROOT}",
                PRTE_MCA_prte_tmpdir_base=tmp)


def pushpull(rep, th, hs, mpirun, mca, env, args, tmp: Path) -> None:
    out = tmp / "pushpull.json"
    cmd = hs[0].cmd(mpirun, "-n", "2", "--map-by", "node", *mca, sys.executable,
                    str(ROOT / "bench" / "bench_pushpull.py"), "--json", str(out))
    if args.quick:
        cmd.append("--quick")
    if args.reps:
        cmd += ["--reps", str(args.reps)]
    print(f"bench_hosts: push/pull, worker on {hs[0].name} ({hs[0].addr}), server on "
          f"{hs[1].name} ({hs[1].addr}), TCP over a veth link", flush=True)
    p = run_across(cmd, env, ROOT, args.timeout, "bench_pushpull.py across the hosts",
                   hs)
    if p.returncode or not out.exists():
        raise RuntimeError(f"bench_pushpull.py across the hosts failed (exit {p.returncode})")
    pp = json.loads(out.read_text())
    rep.details["pushpull"] = pp["details"]
    for n in pp.get("notes", []):
        rep.note(f"across 2 hosts: {n}")
    for x in pp["ratios"]:
        if x["headline"]:
            continue
        rep.ratio(f"across 2 hosts: {x['what']}", x["value"], x["goal"],
                  higher_is_better=not (x["goal_text"] or ">=").startswith("<="), unit=x["unit"])
    head = next(x for x in pp["ratios"] if x["headline"])
    what = head["what"].split("(worst: ", 1)
    worst = f" (worst: {what[1].split(')')[0]})" if len(what) > 1 else ""
    rep.ratio(f"{HEADLINE}{worst}: raw / hpcps", head["value"], GOAL, headline=True)


def shape(hs, mbit: float) -> str:
    """Limit both directions of every test host's link to ``mbit`` Mbit/s with a token bucket
    (``tc`` tbf on the egress of the host's ``eth0`` and of its veth on the machine; removed
    with the hosts); '' or why it could not. Latency cannot be added here: this kernel has no
    netem."""
    if not shutil.which("tc"):
        return "no tc (apt: iproute2)"
    tbf = ["root", "tbf", "rate", f"{mbit:g}mbit", "burst", "4kb", "latency", "500ms"]
    for h in hs:
        for cmd in (h.cmd("tc", "qdisc", "replace", "dev", "eth0", *tbf),
                    ["tc", "qdisc", "replace", "dev", h.veth, *tbf]):
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode:
                return f"{' '.join(cmd[cmd.index('tc'):])}: {p.stderr.strip()}"
    return ""


def _skipped(rep, what: str, links: str, why: str) -> None:
    """Report the ratio ``what`` as not measured: the ``links`` could not be made (``why``)."""
    rep.ratio(what, None, None)
    rep.note(f"{links} links: skipped: {why}")
    print(f"bench_hosts: {links} links: skipped: {why}", flush=True)


def unshape(hs) -> None:
    """Remove :func:`shape`'s rate limits from every test host's link."""
    for h in hs:
        for cmd in (h.cmd("tc", "qdisc", "del", "dev", "eth0", "root"),
                    ["tc", "qdisc", "del", "dev", h.veth, "root"]):
            subprocess.run(cmd, capture_output=True)


def run_job(hs, mca, env, args, tmp: Path, rows: int, epochs: int, out: str, what: str):
    """``hpcps run`` of the e2e job across the hosts (worker on the first, server on the
    second); its metrics summary."""
    job = tmp / f"{out}.toml"
    job.write_text(JOB.format(data=ROOT / "data" / "adult.csv.gz", rows=rows, epochs=epochs,
                              out=tmp / out))
    print(f"bench_hosts: end to end{what}, hpcps run of {job.name} ({rows} rows, {epochs} "
          f"epoch(s), worker on {hs[0].name}, server on {hs[1].name})", flush=True)
    cmd = hs[0].cmd(sys.executable, "-m", "hpcps", "run", "-n", "2", str(job), "--",
                    "--map-by", "node", *mca)
    p = run_across(cmd, env, tmp, args.timeout, f"hpcps run across the hosts{what}", hs,
                   capture=True)
    print("\n".join(line for line in p.stdout.splitlines()
                    if line.startswith(("done:", "  workers:", "  hosts:"))), flush=True)
    metrics = tmp / out / "metrics.json"
    if p.returncode or not metrics.exists():
        raise RuntimeError(f"hpcps run across the hosts{what} failed (exit {p.returncode}):\n"
                           + (p.stdout + p.stderr)[-3000:])
    return json.loads(metrics.read_text())["summary"]


def moved_bytes(w: dict) -> int:
    """Bytes a worker's summary says it moved over its link: keys and rows each way."""
    return 8 * int(w["keys_pulled"]) + int(w["bytes_pulled"]) + int(w["bytes_pushed"])


def e2e(rep, th, hs, mpirun, mca, env, args, tmp: Path) -> None:
    rows, epochs = (2000, 1) if args.quick else (16000, 2)
    s = run_job(hs, mca, env, args, tmp, rows, epochs, "e2e", "")
    w = s["workers"][0]
    steps = int(s["steps"])
    comm_s = float(w["pull_seconds"]) + float(w["push_seconds"])
    pull_up = 64 + 8 * int(w["keys_pulled"]) // steps
    pull_down = int(w["bytes_pulled"]) // steps
    push_up = int(w["bytes_pushed"]) // steps
    cmd = hs[0].cmd(mpirun, "-n", "2", "--map-by", "node", *mca, sys.executable,
                    str(Path(__file__).resolve()), "--raw-exchange", str(steps), str(pull_up),
                    str(pull_down), str(push_up))
    p = run_across(cmd, env, ROOT, args.timeout, "the raw exchange across the hosts",
                   hs, capture=True)
    lines = [line for line in p.stdout.splitlines() if line.startswith('{"seconds"')]
    if p.returncode or not lines:
        raise RuntimeError(f"raw exchange across the hosts failed (exit {p.returncode}):\n"
                           + (p.stdout + p.stderr)[-3000:])
    raw_s = benchlib.median(json.loads(lines[-1])["seconds"])
    rep.details["e2e"] = {"steps": steps, "examples_per_second": s["examples_per_second"],
                          "train_seconds": s["train_seconds"], "worker_comm_seconds": comm_s,
                          "bytes_per_step": {"pull_up": pull_up, "pull_down": pull_down,
                                             "push_up": push_up},
                          "raw_seconds": raw_s}
    print(f"bench_hosts: end to end: {steps} steps, {s['examples_per_second']:,.0f} ex/s; worker "
          f"communication {comm_s:.3f} s in hpcps, {raw_s:.3f} s raw Send/Recv of the same bytes "
          f"per step ({pull_up:,} + {pull_down:,} + {push_up:,} B)", flush=True)
    rep.ratio(f"end to end across 2 hosts (Adult BSP, 1 worker + 1 server, {steps} steps of "
              f"~{(pull_down + push_up) // 1024} KiB): raw Send/Recv seconds / hpcps pull+push "
              "seconds", raw_s / comm_s if comm_s > 0 else None, None)
    rep.ratio("end to end across 2 hosts: examples/s", float(s["examples_per_second"]), None,
              unit=" ex/s")
    if args.shape_mbit > 0:
        shaped(rep, hs, mca, env, args, tmp, rows, epochs)
    if args.delay_ms > 0:
        delayed(rep, th, hs, mca, env, args, tmp, rows, epochs)


def shaped(rep, hs, mca, env, args, tmp: Path, rows: int, epochs: int) -> None:
    """The same job twice more over links limited (:func:`shape`, both directions of both
    links) to ``--shape-mbit`` and to half that rate, checked against the cost model's network
    term (docs/cost_model.md §3, assumption 4: every byte also costs ``1 / β`` on the link):
    the bytes the worker moved over the link times the difference of ``1 / β`` between the
    two rates, against the difference of the two runs' training seconds. The difference, not
    each run against the unshaped one: the training seconds also hold the ranks' compute and
    the link's latency, which the term does not describe and which a slow link's transfers
    partly hide."""
    mbit = float(args.shape_mbit)
    what = (f"end to end across 2 hosts at {mbit:g} and {mbit / 2:g} Mbit/s (tbf, both ways): "
            "cost model (bytes moved x (1/rate2 - 1/rate1)) / measured (training seconds at "
            "rate2 - at rate1)")
    runs = []
    for rate in (mbit, mbit / 2):
        why = shape(hs, rate)
        if why:
            unshape(hs)
            return _skipped(rep, what, "shaped", why)
        try:
            s = run_job(hs, mca, env, args, tmp, rows, epochs, f"e2e_{rate:g}mbit",
                        f" over links shaped to {rate:g} Mbit/s")
        finally:
            unshape(hs)            # the runs after this one (delayed links) at full rate
        runs.append({"mbit": rate, "bytes": moved_bytes(s["workers"][0]),
                     "train_seconds": float(s["train_seconds"]), "steps": int(s["steps"])})
    (r1, r2) = runs
    model = r2["bytes"] * 8 * (1 / (r2["mbit"] * 1e6) - 1 / (r1["mbit"] * 1e6))
    measured = r2["train_seconds"] - r1["train_seconds"]
    rep.details["e2e_shaped"] = {"runs": runs, "model_seconds": model,
                                 "measured_seconds": measured}
    print(f"bench_hosts: shaped links: {r1['bytes'] / 1e6:.2f} / {r2['bytes'] / 1e6:.2f} MB "
          f"over the link; training {r1['train_seconds']:.2f} s at {r1['mbit']:g} Mbit/s, "
          f"{r2['train_seconds']:.2f} s at {r2['mbit']:g}: {measured:.2f} s more, the model "
          f"says {model:.2f} s", flush=True)
    rep.ratio(what, model / measured if measured > 0 else None, None)


def delayed(rep, th, hs, mca, env, args, tmp: Path, rows: int, epochs: int) -> None:
    """The same job twice more with every packet delayed (``testhosts.delay``: both ways, no
    rate limit) by ``--delay-ms`` and by twice that, checked against the cost model's latency
    term (docs/cost_model.md §3, assumption 4: every message also costs ``α``, the link's
    one-way latency): a request the worker waits for is a round trip, two messages, so each
    costs ``2 x`` the added delay; the server's requests (each answered: the BSP steps'
    push-clock-pull requests and the evaluations' pulls) times that, against the difference of
    the two runs' training seconds (which cancels what the delaying process adds to every
    packet alike). Beside it, the same with ``α`` measured: plain TCP round trips between the
    hosts (:func:`testhosts.tcp_round_trip`) of a step's bytes (the worker's mean bytes up and
    down per request), whose cost grows by more than the two delays where a message is many
    TCP segments (the kernel's congestion control paces them)."""
    d = float(args.delay_ms)
    what = (f"end to end across 2 hosts at {d:g} and {2 * d:g} ms one-way delay: cost model "
            "(requests x 2 x added delay) / measured (training seconds at the larger - at the "
            "smaller)")
    what_tcp = (f"end to end across 2 hosts at {d:g} and {2 * d:g} ms one-way delay: requests "
                "x the added time of a plain TCP round trip of a request's bytes / measured")
    runs = []
    for ms in (d, 2 * d):
        why = th.delay(hs, ms)
        if why:
            return _skipped(rep, what, "delayed", why)
        try:
            s = run_job(hs, mca, env, args, tmp, rows, epochs, f"e2e_{ms:g}ms",
                        f" with a {ms:g} ms delay each way")
            n = int(s["servers"][0]["requests"])
            w = s["workers"][0]
            up = (8 * int(w["keys_pulled"]) + int(w["bytes_pushed"])) // n
            down = int(w["bytes_pulled"]) // n
            tcp = {b: th.tcp_round_trip(hs[0], hs[1], *b) for b in ((64, 64), (up, down))}
        finally:
            th.delay(hs, 0)
        runs.append({"ms": ms, "requests": n, "train_seconds": float(s["train_seconds"]),
                     "steps": int(s["steps"]), "request_bytes": [up, down],
                     "tcp_round_trip_64": tcp[(64, 64)], "tcp_round_trip": tcp[(up, down)]})
    (r1, r2) = runs
    model = r2["requests"] * 2 * (r2["ms"] - r1["ms"]) / 1e3
    model_tcp = r2["requests"] * (r2["tcp_round_trip"] - r1["tcp_round_trip"])
    measured = r2["train_seconds"] - r1["train_seconds"]
    rep.details["e2e_delayed"] = {"runs": runs, "model_seconds": model,
                                  "model_tcp_seconds": model_tcp, "measured_seconds": measured}
    print(f"bench_hosts: delayed links: {r2['requests']:,} requests; training "
          f"{r1['train_seconds']:.2f} s at {r1['ms']:g} ms, {r2['train_seconds']:.2f} s at "
          f"{r2['ms']:g} ms: {measured:.2f} s more, the model says {model:.2f} s; plain TCP "
          f"round trips, 64 B: {r1['tcp_round_trip_64'] * 1e3:.2f} / "
          f"{r2['tcp_round_trip_64'] * 1e3:.2f} ms, a request's {up:,} B up + {down:,} B down: "
          f"{r1['tcp_round_trip'] * 1e3:.2f} / {r2['tcp_round_trip'] * 1e3:.2f} ms "
          f"(requests x their difference: {model_tcp:.2f} s)", flush=True)
    rep.ratio(what, model / measured if measured > 0 else None, None)
    rep.ratio(what_tcp, model_tcp / measured if measured > 0 else None, None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    ap.add_argument("--json", metavar="PATH", help="the report as JSON (for hpcps bench)")
    ap.add_argument("--reps", type=int, default=None, help="bench_pushpull.py's --reps")
    ap.add_argument("--no-e2e", action="store_true", help="push/pull only")
    ap.add_argument("--shape-mbit", type=float, default=SHAPE_MBIT, metavar="MBIT",
                    help=f"also run the end-to-end job over links shaped to MBIT and MBIT/2 "
                         f"Mbit/s both ways (tc tbf), against the cost model's network term "
                         f"(default {SHAPE_MBIT:g}; 0: not)")
    ap.add_argument("--delay-ms", type=float, default=DELAY_MS, metavar="MS",
                    help=f"also run the end-to-end job with every packet delayed by MS and 2 x MS "
                         f"milliseconds each way (tests/hosts/delay.py: iptables and the "
                         f"NetfilterQueue package), against the cost model's latency term "
                         f"(default {DELAY_MS:g}; 0: not)")
    ap.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                    help=f"kill a launch across the hosts still running after SECONDS and fail "
                         f"(default {TIMEOUT:g}; {QUICK_TIMEOUT:g} with --quick)")
    ap.add_argument("--raw-exchange", nargs=4, type=int, metavar=("STEPS", "PULL_UP", "PULL_DOWN", "PUSH_UP"),
                    help=argparse.SUPPRESS)      # internal: the raw e2e exchange, under mpirun
    args = ap.parse_args(argv)
    if args.raw_exchange:
        return raw_exchange(*args.raw_exchange, reps=3)
    if args.timeout is None:
        args.timeout = QUICK_TIMEOUT if args.quick else TIMEOUT
    if not args.timeout > 0:
        ap.error(f"--timeout must be a positive number of seconds, not {args.timeout:g}")
    rep = benchlib.Report("hosts")
    why = missing()
    if why:
        rep.ratio(f"{HEADLINE}: raw / hpcps", None, GOAL, headline=True)
        rep.note(f"skipped: {why} (python bench/bench_hosts.py as root)")
        print(f"bench_hosts: skipped: {why}")
        rep.write(args.json)
        print(rep.last_line())
        return 0
    from tests.hosts import testhosts as th

    mpirun = Path(sys.executable).parent / "mpirun"
    mpirun = str(mpirun) if mpirun.exists() else "mpirun"
    t0 = time.perf_counter()
    signal.signal(signal.SIGTERM, _terminated)
    try:
        th.down()
        hs = th.up(2)
        with tempfile.TemporaryDirectory(prefix="hpcps-bench-hosts-") as d:
            tmp = Path(d)
            hf = th.hostfile(tmp / "hostfile", hs, 1)
            mca = th.mpirun_args(hf)
            mca[mca.index("tcp,self,sm")] = "tcp,self"
            env = _env(d)
            pushpull(rep, th, hs, mpirun, mca, env, args, tmp)
            if not args.no_e2e:
                e2e(rep, th, hs, mpirun, mca, env, args, tmp)
    except LaunchTimeout as e:
        print(f"bench_hosts: error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)     # nothing stops the clean-up now
        end_launches()
        th.down()
    rep.details["seconds"] = time.perf_counter() - t0
    rep.write(args.json)
    head = next(r for r in rep.ratios if r["headline"])
    print(f"bench_hosts: goal >= {GOAL:g} for large messages across 2 hosts: "
          + ("met" if head["met"] else "MISSED") + f" ({head['value']:.2f})")
    print(rep.last_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
