"""An input error found by one rank while the job runs is reported on every rank (real mpirun
ranks, real files; :mod:`hpcps.comm.notices`).

The rank that finds it prints the error once, with its full message, as before; every other
rank then prints one line naming itself and the origin (``hpcps: rank 2 on HOST: stopped:
rank 1 on HOST found an input error: <first line>``), so that a per-rank log says why that
rank stopped; the job exits with the origin's status (65) within seconds of the error line,
and the checkpoints written before the error are intact and load.

Two origins: a worker reading a streamed Criteo file with a bad line in the middle, and a
server whose dynamic table exceeds its ``max_keys`` with eviction off; 1 server and 2 workers
each, launched with ``hpcps run``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from hpcps import checkpoint as ck
from tests.helpers import kill_session, log_lines, mpi_env

pytestmark = pytest.mark.slow      # launches mpirun

#: Seconds from the origin's error line to the end of the job (abort, every rank's line).
BOUND = 30.0
RANKS = 3                          # 1 server, 2 workers

ORIGIN = re.compile(r"^hpcps: rank (\d+) on (\S+): (\w*Error: .*)$")
NOTICE = re.compile(r"^hpcps: rank (\d+) on (\S+): stopped: rank (\d+) on (\S+) found an "
                    r"input error: (.*)$")


def run_timed(args, cwd, timeout=300):
    """``python -m hpcps ARGS`` with stdout and stderr in one pipe, each line with the
    monotonic time it arrived; the launch is killed (its whole session) after ``timeout``.
    Returns ``(status, [(time, line)], end time)``."""
    p = subprocess.Popen([sys.executable, "-m", "hpcps", *map(str, args)], cwd=cwd,
                         env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    killer = threading.Timer(timeout, kill_session, args=(p.pid,))
    killer.daemon = True
    killer.start()
    lines = []
    try:
        for line in p.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))
        p.wait()
    finally:
        killer.cancel()
    return p.returncode, lines, time.monotonic()


def check_every_rank(status, lines, t_end, want):
    """One origin line containing ``want``, a notice line from every other rank naming the
    origin and the first line of its message, exit status 65, the job over within
    ``BOUND`` s of the origin's line. Returns the origin's rank."""
    text = "\n".join(ln for _, ln in lines)
    tail = text[-4000:]
    plain = [(t, log_lines(ln)[0] if ln else "") for t, ln in lines]
    origins = [(t, m) for t, ln in plain if (m := ORIGIN.match(ln))]
    assert len(origins) == 1, tail
    t_err, m = origins[0]
    origin, origin_host, message = int(m.group(1)), m.group(2), m.group(3)
    assert want in message, tail
    heard = {}
    for t, ln in plain:
        n = NOTICE.match(ln)
        if n:
            r = int(n.group(1))
            assert r not in heard, f"rank {r} printed the notice twice\n{tail}"
            assert (int(n.group(3)), n.group(4)) == (origin, origin_host), ln
            assert n.group(5) == message.splitlines()[0], (ln, message)
            assert t >= t_err, ln
            heard[r] = t
    assert sorted(heard) == sorted(set(range(RANKS)) - {origin}), tail
    assert status == 65, (status, tail)
    took = t_end - t_err
    assert took < BOUND, (took, tail)
    print(f"\norigin rank {origin}; every other rank's line within "
          f"{max(heard.values()) - t_err:.2f} s of the error line; job over after {took:.2f} s")
    return origin


def check_checkpoints(run_dir):
    """Every checkpoint written before the error verifies, the newest loads (``hpcps
    inspect``, and its rows read back) and none is incomplete. Returns the newest step."""
    steps = sorted((run_dir / "ckpt").glob("step-*"))
    assert steps, f"no checkpoint under {run_dir}"
    for d in steps:
        if (d / ck.MANIFEST).exists():
            ck.verify(d)                     # raises on a damaged or incomplete checkpoint
    found = ck.latest_valid(run_dir)
    assert found is not None
    newest, manifest = found
    proc = subprocess.run([sys.executable, "-m", "hpcps", "inspect", str(run_dir)],
                          env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert newest.name in proc.stdout, proc.stdout[-2000:]
    print(f"checkpoints: {', '.join(d.name for d in steps)}; newest valid {newest.name}")
    return int(manifest["step"])


CRITEO = """
name = "badline"
seed = 2
[cluster]
servers = 1
[data]
format = "criteo"
path = "{data}/part-0000[0-1]*"
test_path = "{data}/part-00002.tsv"
hash_bits = 14
stream = true
shuffle_buffer = 200
prefetch = 2
[optimizer]
name = "adagrad"
learning_rate = 0.05
[train]
epochs = 1
batch_size = 32
[checkpoint]
every_steps = 10
keep = 50
[output]
dir = "run"
"""


def test_bad_streamed_line_is_reported_on_every_rank_and_checkpoints_survive(tmp_path):
    """A Criteo line of 3 fields in the second half of a streamed file (1 server, 2
    workers): the worker that reads it prints ``FILE:LINE``, the server and the other worker
    each print why they stop, exit 65 within the bound; the checkpoints written before load."""
    d = tmp_path / "criteo"
    subprocess.run([sys.executable, "-m", "hpcps", "data", "generate", "criteo-like", "--rows",
                    "9000", "--files", "3", "--seed", "7", "--out", str(d)],
                   check=True, env=mpi_env(), capture_output=True)
    part = d / "part-00001.tsv"            # rows 3000-5999: worker 1 reads this file
    lines = part.read_bytes().split(b"\n")
    lines[2500] = b"1\t2\t3"               # 3 fields, not 40: after ~78 steps of 32 rows
    part.write_bytes(b"\n".join(lines))
    (tmp_path / "bad.toml").write_text(CRITEO.format(data=d))
    status, out, t_end = run_timed(["run", "-n", RANKS, "bad.toml"], tmp_path)
    check_every_rank(status, out, t_end, f"{part}:2501: ")
    step = check_checkpoints(tmp_path / "run")
    assert step >= 10


DYN = """
name = "maxkeys"
[cluster]
servers = 1
[data]
format = "svmlight"
path = "{d}/train.svm"
test_path = "{d}/train.svm"
index_base = 0
[tables.weights]
storage = "hash"
max_keys = {max_keys}
[train]
epochs = 1
batch_size = 8
[checkpoint]
every_steps = 2
keep = 50
[output]
dir = "run"
"""


def test_max_keys_exceeded_on_a_server_is_reported_on_every_rank(tmp_path):
    """Each row brings 3 new raw ids, 2 workers of 8 rows a step: 48 new keys a step, so a
    table of max_keys = 200 (eviction off) overflows at step 5 on the server, after the
    checkpoints of steps 2 and 4. The server prints the error naming the table; both workers
    print why they stop; exit 65 within the bound; the checkpoints load."""
    rng = np.random.default_rng(3)
    ids = rng.choice(1 << 40, size=(160, 3), replace=False)
    text = "".join(f"{i % 2} " + " ".join(f"{k}:1" for k in sorted(row)) + "\n"
                   for i, row in enumerate(ids))
    (tmp_path / "train.svm").write_text(text)
    (tmp_path / "dyn.toml").write_text(DYN.format(d=tmp_path, max_keys=200))
    status, out, t_end = run_timed(["run", "-n", RANKS, "dyn.toml"], tmp_path)
    origin = check_every_rank(status, out, t_end,
                              "dynamic table 'weights' holds 240 keys, more than its "
                              "max_keys = 200 per server, and eviction is off")
    assert origin == RANKS - 1                  # the server (the last rank)
    assert check_checkpoints(tmp_path / "run") >= 2
