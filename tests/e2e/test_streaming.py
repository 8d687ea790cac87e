"""Streamed Criteo data with real mpirun launches: every row trained on exactly once per
epoch — by each row's identity, not only a count — under a restart from a checkpoint after a
``kill -9``, the ``kill -9`` of a worker in continue mode, and workers added to a running job.

The data is a small ``hpcps data generate criteo-like`` set in several plain and gzip files;
with ``HPCPS_ROW_IDENTITY=DIR`` every worker logs, after each clock, the count, the sum and
the sum of squares (mod 2**64) of the hashes of the rows it trained on
(:func:`hpcps.data.lines.row_hashes`); the test adds them up per epoch and compares them with
the same sums over the files read independently (:func:`hpcps.data.criteo.read_criteo_part`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hpcps import checkpoint as ck
from hpcps.data.criteo import read_criteo_part
from hpcps.data.lines import row_hashes
from tests.helpers import kill_while_paused, log_lines, mpi_env, rank_pids

pytestmark = pytest.mark.slow      # launches mpirun

JOB = """
name = "{name}"
seed = 2
[cluster]
servers = 1
[data]
format = "criteo"
path = "{data}/part-0000[0-2]*"
test_path = "{data}/part-00003.tsv"
hash_bits = 16
shuffle_buffer = 500
prefetch = 2
[model]
l2 = 1e-5
[optimizer]
name = "adagrad"
learning_rate = 0.05
[train]
epochs = 2
batch_size = 32
progress_seconds = 1.0
[consistency]
model = "{consistency}"
[checkpoint]
every_steps = {every}
keep = 50
{extra}
[output]
dir = "{name}"
"""
ROWS = 12000              # 4 files of 3000: 3 train (one gzip), 1 test
N_TRAIN = 9000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("criteo")
    env = dict(os.environ)
    run = [sys.executable, "-m", "hpcps", "data", "generate", "criteo-like", "--rows", str(ROWS),
           "--files", "4", "--seed", "7", "--out", str(d)]
    subprocess.run(run, check=True, env=env, capture_output=True)
    # part-00001 as gzip: a compressed file among plain ones
    import gzip

    src = d / "part-00001.tsv"
    (d / "part-00001.tsv.gz").write_bytes(gzip.compress(src.read_bytes()))
    src.unlink()
    X, y = read_criteo_part(str(d / "part-0000[0-2]*"), 0, 1, hash_bits=16)
    X.sort_indices()
    h = row_hashes(y, X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data)
    assert y.size == N_TRAIN
    with np.errstate(over="ignore"):
        want = (int(y.size), int(h.sum(dtype=np.uint64)), int((h * h).sum(dtype=np.uint64)))
    return d, want


def write(tmp_path, data, name, consistency="bsp", every=0, extra=""):
    p = tmp_path / f"{name}.toml"
    p.write_text(JOB.format(name=name, data=data, consistency=consistency, every=every,
                            extra=extra))
    return p


def identity(log_dir: Path, keep=lambda path, clock: True) -> dict:
    """epoch -> (rows, hash sum, hash sum of squares) over every worker's log."""
    tot: dict = {}
    for f in sorted(log_dir.glob("rows-*.txt")):
        for line in f.read_text().splitlines():
            e, clock, n, h, h2 = (int(v) for v in line.split())
            if not keep(f, clock):
                continue
            a = tot.setdefault(e, [0, 0, 0])
            a[0] += n
            a[1] = (a[1] + h) % (1 << 64)
            a[2] = (a[2] + h2) % (1 << 64)
    return {e: tuple(v) for e, v in tot.items()}


def env_with(log_dir):
    log_dir.mkdir()
    return mpi_env(HPCPS_ROW_IDENTITY=str(log_dir))


def test_restart_after_kill_9_reads_every_row_once(tmp_path, data):
    d, want = data
    job = write(tmp_path, d, "restart", every=40)
    logs = tmp_path / "logs"
    p = subprocess.Popen([sys.executable, "-m", "hpcps", "run", "-n", "4", "--max-restarts", "2",
                          str(job)], cwd=tmp_path, env=env_with(logs), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    first = ck.step_dir(tmp_path / "restart", 80) / ck.MANIFEST
    deadline = time.time() + 180
    while not first.exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.01)
    pids = rank_pids(job)
    assert 1 in pids, f"worker rank 1 not found running ({pids})"
    os.kill(pids[1], signal.SIGKILL)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out[-3000:]
    assert "restart 1/2" in out and "resumed from checkpoint step" in out, out[-3000:]
    s = json.loads((tmp_path / "restart" / "metrics.json").read_text())["summary"]
    resumed = s["launches"][-1]["resumed_from_step"]
    assert resumed >= 80 and len(s["launches"]) == 2
    # found by a trial: the run's examples per epoch over both launches (servers' counts up to
    # the checkpoint resumed, then the second launch's), not only the last launch's
    assert s["examples_per_epoch"] == [N_TRAIN, N_TRAIN]
    assert s["servers"][0]["examples_per_epoch"][0] < N_TRAIN
    # the first launch's rows count up to the checkpoint it resumed from (steps after it were
    # trained again by the second launch); each process logs to its own file
    first_launch = {f for f in logs.glob("rows-*.txt")
                    if int(f.read_text().split(None, 2)[1]) == 1}
    got = identity(logs, lambda f, clock: f not in first_launch or clock <= resumed)
    assert got == {0: want, 1: want}
    # the readers' line is this launch's (the first launch's counters died with it): its
    # training rows and 2 evaluations of the 3000 test lines, nothing read twice
    assert "readers (this launch):" in out and "bad line(s) skipped" in out
    assert sum(r["lines"] for r in s["reader"]) == s["examples"] + 2 * 3000
    assert sum(r["lines_again"] for r in s["reader"]) == 0
    # the checkpoint names each reader's position: file, line, the block's rows read
    m = ck.verify(ck.step_dir(tmp_path / "restart", 80))
    info = json.loads(m["stream"])
    assert info["lines"] == N_TRAIN and info["shuffle_buffer"] == 500
    p0 = info["positions"][0]             # worker 0 after 80 steps of 32 rows: 2560 of 3000
    assert p0["file"].endswith("part-00000.tsv") and p0["line"] == 2501
    assert p0["rows_read_in_block"] == 60 and p0["block_seed"] == [2, 0, 0]
    # resumed with another shuffle_buffer: refused naming the checkpoint's job, before the
    # files are indexed (a trial waited 31.6 s for a 3.5 GB line count first)
    other = tmp_path / "other.toml"
    other.write_text(job.read_text().replace("shuffle_buffer = 500", "shuffle_buffer = 400"))
    shutil.rmtree(tmp_path / "restart" / "line-index")
    proc = subprocess.run([sys.executable, "-m", "hpcps", "run", "-n", "4", "--resume",
                           str(ck.step_dir(tmp_path / "restart", 80)), str(other)],
                          cwd=tmp_path, env=mpi_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 65, proc.stderr[-3000:]
    assert ("[data] shuffle_buffer is 400 but checkpoint step 80 (job 'restart') was written "
            "with 500") in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "restart" / "line-index").exists()


def test_worker_killed_in_continue_mode_every_row_once(tmp_path, data):
    d, want = data
    job = write(tmp_path, d, "cont", extra='[fault_tolerance]\nmode = "continue"\n')
    logs = tmp_path / "logs"
    os.environ["HPCPS_ROW_IDENTITY"] = str(logs)
    logs.mkdir()
    try:
        code, out, _ = kill_while_paused(tmp_path, job, 4, [(30, 2, 3)])
    finally:
        del os.environ["HPCPS_ROW_IDENTITY"]
    assert code == 0, out[-3000:]
    assert "worker(s) 2 (rank(s) 2) lost" in out, out[-3000:]
    assert identity(logs) == {0: want, 1: want}
    s = json.loads((tmp_path / "cont" / "metrics.json").read_text())["summary"]
    assert s["servers"][0]["examples_per_epoch"] == [N_TRAIN, N_TRAIN]
    # found by a scale trial: the lines the survivors read ahead before the recovery and read
    # again after it were counted as new. Now named; with the lines worker 2 trained on
    # before it was lost (its reads are not counted) every line is read once per epoch and
    # evaluation: 2 * (9000 + 3000)
    rd, (ev,) = s["reader"], s["failures"]
    again = sum(r["lines_again"] for r in rd)
    assert again > 0 and f"{again:,} of them" in out and "read again after a recovery" in out
    assert "not counted: what the 1 lost worker(s) read" in out
    dead = ev["worker_steps_done"][2] * 32
    assert sum(r["lines"] for r in rd) - again + dead == 2 * (N_TRAIN + 3000)


@pytest.mark.parametrize("consistency", ["bsp", "async"])
def test_workers_added_every_row_once(tmp_path, data, consistency):
    d, want = data
    job = write(tmp_path, d, "grow", consistency=consistency,
                extra="[elastic]\nadd_workers = 2\nat_step = 40\n")
    logs = tmp_path / "logs"
    proc = subprocess.run([sys.executable, "-m", "hpcps", "run", "-n", "4", str(job)],
                          cwd=tmp_path, env=env_with(logs), capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "2 worker(s) added at clock 40 (epoch 1): 5 workers" in proc.stdout, proc.stdout[-3000:]
    assert identity(logs) == {0: want, 1: want}
    m = json.loads((tmp_path / "grow" / "metrics.json").read_text())
    # found by a scale trial: the readers replaced at the re-plan dropped out of the readers'
    # line, and the lines read ahead before it and read again after it counted as new. Every
    # line once per epoch and evaluation, the lines read again named apart
    rd = m["summary"]["reader"]
    again = sum(r["lines_again"] for r in rd)
    assert sum(r["lines"] for r in rd) - again == 2 * (N_TRAIN + 3000)
    assert again > 0 and f"{again:,} of them" in proc.stdout
    assert "read again after a growth" in proc.stdout
    assert m["epochs"][-1]["test_auc"] > 0.6


def test_bad_line_mid_stream_stops_the_job_naming_file_and_line(tmp_path, data):
    d, _ = data
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in d.glob("part-*"):
        (bad / f.name).write_bytes(f.read_bytes())
    lines = (bad / "part-00002.tsv").read_bytes().split(b"\n")
    lines[1234] = b"1\t2\t3"                                  # 3 fields, not 40
    (bad / "part-00002.tsv").write_bytes(b"\n".join(lines))
    job = write(tmp_path, bad, "bad")
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "hpcps", "run", "-n", "4", str(job)],
                          cwd=tmp_path, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert time.time() - t0 < 120
    assert "part-00002.tsv:1235: " in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    # with on_bad_line = "skip" the job finishes and counts the line
    job = write(tmp_path, bad, "skip")
    job.write_text(job.read_text().replace("prefetch = 2", 'prefetch = 2\non_bad_line = "skip"'))
    proc = subprocess.run([sys.executable, "-m", "hpcps", "run", "-n", "4", str(job)],
                          cwd=tmp_path, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    s = json.loads((tmp_path / "skip" / "metrics.json").read_text())["summary"]
    assert sum(r["skipped"] for r in s["reader"]) == 2          # once per epoch
    assert s["servers"][0]["examples_per_epoch"] == [N_TRAIN - 1, N_TRAIN - 1]


def test_eval_of_a_criteo_run_scores_the_data_it_is_given(tmp_path, data):
    """Found by a trial: ``hpcps eval RUN --data FILE`` of a Criteo job replaced only its
    ``path``, so the stored relative ``test_path`` was looked for beside the checkpoint (an
    error; with an absolute one the job's own test file would have been scored, not FILE);
    and a directory or glob, which a Criteo ``test_path`` may be, was refused."""
    from hpcps.analysis import offline as analysis

    d, _ = data
    (tmp_path / "crit").mkdir()
    for f in d.glob("part-*"):
        (tmp_path / "crit" / f.name).symlink_to(f)
    job = write(tmp_path, "crit", "rel")
    job.write_text(job.read_text().replace("epochs = 2", "epochs = 1"))
    proc = subprocess.run([sys.executable, "-m", "hpcps", "run", "-n", "4", str(job)],
                          cwd=tmp_path, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    test = tmp_path / "crit" / "part-00003.tsv"
    cli = subprocess.run([sys.executable, "-m", "hpcps", "eval", str(tmp_path / "rel"), "--data",
                          str(test)], cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert "(criteo, all rows): 3,000 rows" in cli.stdout, cli.stdout
    metrics = json.loads((tmp_path / "rel" / "metrics.json").read_text())
    auc = metrics["epochs"][-1]["test_auc"]
    assert f"AUC {auc:.6f}" in cli.stdout, (cli.stdout, metrics["epochs"])
    train = analysis.evaluate(tmp_path / "rel", tmp_path / "crit" / "part-00000.tsv")
    assert train["rows"] == 3000 and train["metrics"]["auc"] != auc
    assert analysis.evaluate(tmp_path / "rel", tmp_path / "crit")["rows"] == ROWS     # a directory
    assert analysis.evaluate(tmp_path / "rel", str(tmp_path / "crit" / "part-0000[0-2]*"))["rows"] == N_TRAIN
    with pytest.raises(analysis.AnalysisError, match="no file matches this pattern"):
        analysis.evaluate(tmp_path / "rel", str(tmp_path / "crit" / "nothing-*"))
    # the line index of streamed data is cached in the run's directory, not under the current
    # one (an eval from elsewhere left ./rel/line-index there)
    assert not (elsewhere / "rel").exists() and (tmp_path / "rel" / "line-index").is_dir()


def test_gzip_and_zstd_svmlight_stream_every_row_once(tmp_path):
    """svmlight through the same streaming path: compressed files stream without a key."""
    import gzip

    import zstandard

    rng = np.random.default_rng(0)
    lines = []
    for i in range(3000):
        cols = np.sort(rng.choice(50, 5, replace=False)) + 1
        lines.append(f"{1 if rng.random() < 0.5 else -1} " + " ".join(f"{c}:1" for c in cols))
    lines.insert(100, "# a comment line")
    text = ("\n".join(lines) + "\n").encode()
    d = tmp_path / "svmdata"
    d.mkdir()
    (d / "a.svm.gz").write_bytes(gzip.compress(text))
    (d / "b.svm.zst").write_bytes(zstandard.ZstdCompressor().compress(text))
    (tmp_path / "test.svm").write_bytes(text[:2000].rsplit(b"\n", 1)[0] + b"\n")
    job = tmp_path / "svm.toml"
    job.write_text(f"""
name = "svm"
[cluster]
servers = 1
[data]
format = "svmlight"
path = "{d}"
test_path = "{tmp_path / 'test.svm'}"
index_base = 1
n_features = 50
shuffle_buffer = 256
[train]
epochs = 2
batch_size = 32
[output]
dir = "svm"
""")
    proc = subprocess.run([sys.executable, "-m", "hpcps", "run", "-n", "4", str(job)],
                          cwd=tmp_path, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "6,002 train" in proc.stdout                # lines, the 2 comment lines included
    s = json.loads((tmp_path / "svm" / "metrics.json").read_text())["summary"]
    assert s["servers"][0]["examples_per_epoch"] == [6000, 6000]
    assert sum(r["lines"] for r in s["reader"]) > 2 * 6002


def test_one_gzip_file_banner_and_progress_name_the_reading_worker(tmp_path, data):
    """One gzip train file and 3 workers: the file is read whole by one worker (worker 1,
    the cuts move to the file's ends), so workers 0 and 2 have no rows. The banner says so
    and suggests more files; the chief's progress line does not print its own zero loss and
    0.0 MB/s as the job's, and the worker clocks it shows are not older than the clock
    without saying so (the chief, with no rows, reads no shard header during the epoch)."""
    import gzip
    import re

    d, _ = data
    g = tmp_path / "one"
    g.mkdir()
    text = b"".join(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
                    for p in sorted(d.glob("part-0000[0-2]*")))
    (g / "part-00000.tsv.gz").write_bytes(gzip.compress(text))
    (g / "part-00003.tsv").write_bytes((d / "part-00003.tsv").read_bytes())
    job = write(tmp_path, g, "onegz").read_text().replace("progress_seconds = 1.0",
                                                         "progress_seconds = 0.05")
    (tmp_path / "onegz.toml").write_text(job)
    proc = subprocess.run([sys.executable, "-m", "hpcps", "run", "-n", "4", "onegz.toml"],
                          cwd=tmp_path, env=mpi_env(), capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-3000:]
    steps = -(-N_TRAIN // 32)                           # 282: every row on one worker
    assert f"{steps} steps/epoch of 32 rows on 1 of 3 workers" in out, out[:2000]
    assert re.search(r"note: worker\(s\) 0, 2 have no training rows.*at least 3 files", out), out[:2000]
    lines = [ln for ln in log_lines(out) if re.match(r"epoch \d+/2 +step", ln)]
    assert lines, out
    for ln in lines:
        assert "loss(w0)" not in ln and "read(w0)" not in ln, ln
        assert "w0 has no rows" in ln, ln
        clock = int(re.search(r" clock (\d+)", ln).group(1))
        m = re.search(r"\(workers (\d+)(?:\.\.\d+)?( as of clock (\d+))?\)", ln)
        if m is None:                                    # no shard header read yet
            continue
        if m.group(2):                                   # labelled: read at an older clock
            assert int(m.group(3)) < clock - 1, ln
        else:                                            # unlabelled: current (BSP: >= clock - 1)
            assert int(m.group(1)) >= clock - 1, ln       # the slowest worker's clock
    s = json.loads((tmp_path / "onegz" / "metrics.json").read_text())["summary"]
    assert s["servers"][0]["examples_per_epoch"] == [N_TRAIN, N_TRAIN]
