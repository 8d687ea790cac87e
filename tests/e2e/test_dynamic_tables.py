"""Dynamic (hash) tables in real jobs (issue 18): the raw 40-bit id of the issue trains with
``storage = "hash"`` and no ``n_features``; a checkpoint of 3 servers resumes on 2 and on 4
bit-identically; a checkpoint resumed with the other storage is refused, naming the table,
with a non-zero exit in seconds. Real mpirun launches, real HDF5 files."""

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcps import checkpoint as ck
from tests.helpers import hpcps, launch, write_job

pytestmark = pytest.mark.slow      # launches mpirun

BIG = 1_099_511_627_000            # the raw 40-bit feature id
SVM = f"1 1:1 {BIG}:1\n0 2:1 5:0.5\n1 7:1 {BIG}:2\n0 3:1 5:1\n"

JOB4 = """
name = "raw40"
[cluster]
servers = 1
[data]
format = "svmlight"
path = "{d}/train.svm"
test_path = "{d}/train.svm"
index_base = 1
[tables.weights]
storage = "hash"
[train]
epochs = 3
[output]
dir = "{d}/run"
"""


def test_raw_40bit_id_trains_with_a_dynamic_table_in_a_small_server(tmp_path):
    (tmp_path / "train.svm").write_text(SVM)
    j = write_job(tmp_path / "raw40.toml", JOB4.format(d=tmp_path))
    proc, secs = hpcps(["run", "-n", "2", j], cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with h5py.File(tmp_path / "run" / "model.h5", "r") as f:
        keys = f["weights_keys"][()]
        w = f["weights"][()]
    # every id of the file (minus index_base 1) is stored, the raw one included
    assert keys.tolist() == [0, 1, 2, 4, 6, BIG - 1]
    assert np.all(w != 0)
    s = json.loads((tmp_path / "run" / "metrics.json").read_text())["summary"]
    srv = s["servers"][0]
    assert srv["keys_stored"] == {"weights": 6}
    assert "weights 6 keys stored" in proc.stdout, proc.stdout
    # the table itself: its index and records (KiB), not 8 TiB of fixed rows
    assert srv["memory_bytes"] < 1 << 20, srv
    print(f"\nserver: table {srv['memory_bytes']:,} B, peak RSS "
          f"{srv['rss_peak_bytes'] / 2**20:.1f} MiB (the Python process), {secs:.1f} s")
    assert 0 < srv["rss_peak_bytes"] < 1 << 30
    # hpcps inspect of model.h5 shows the table as dynamic, its keys with it (a new user's
    # trial: weights_keys was listed as a table of its own, features as 2**63 - 1)
    proc, _ = hpcps(["inspect", tmp_path / "run" / "model.h5"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "weights: shape (6, 1) float32; dynamic (hash): 6 keys stored" in proc.stdout, proc.stdout
    assert "weights_keys:" not in proc.stdout and "any id below 2**63 - 1" in proc.stdout
    # hpcps eval scores the run's newest checkpoint as training scored its last epoch
    proc, _ = hpcps(["eval", tmp_path / "run", "--data", tmp_path / "train.svm"], cwd=tmp_path,
                    timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = json.loads((tmp_path / "run" / "metrics.json").read_text())["epochs"][-1]
    got = float(proc.stdout.split("log-loss ")[1].split()[0])
    assert got == pytest.approx(last["test_logloss"], rel=1e-5), (proc.stdout, last)
    # the same file as a fixed table needs n_features = 2**40: refused before launch
    fixed = write_job(tmp_path / "fixed.toml", JOB4.format(d=tmp_path).replace(
        '[tables.weights]\nstorage = "hash"\n', "").replace(
        "index_base = 1\n", f"index_base = 1\nn_features = {2**40}\n"))
    proc, _ = hpcps(["check", fixed], cwd=tmp_path, timeout=120)
    assert proc.returncode != 0 and "GiB" in proc.stderr, proc.stderr[-2000:]


JOB = """
name = "dynre"
seed = 5
[cluster]
servers = {servers}
[data]
format = "adult_csv"
path = "@DATA@"
max_rows = 2000
hash_bits = 14
[model]
dtype = "float64"
l2 = 0.001
storage = "{storage}"
[optimizer]
name = "{opt}"
[train]
epochs = {epochs}
batch_size = 64
[checkpoint]
every_steps = 10
keep = 2
[output]
dir = "{out}"
"""


def job(tmp_path, name, *, servers, epochs, out=None, storage="hash", opt="adagrad"):
    return write_job(tmp_path / f"{name}.toml", JOB.format(
        servers=servers, epochs=epochs, out=out or (tmp_path / name), storage=storage, opt=opt))


def model(run_dir):
    with h5py.File(Path(run_dir) / "model.h5", "r") as f:
        return f["weights_keys"][()], f["weights"][()], f["bias"][()]


def test_dynamic_checkpoint_of_3_servers_resumes_on_2_and_4_bit_identically(tmp_path):
    ref = job(tmp_path, "ref", servers=3, epochs=2)
    proc, _ = launch(4, ["train", ref], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = model(tmp_path / "ref")
    first = job(tmp_path, "first", servers=3, epochs=1)      # checkpoint at the end of epoch 1
    proc, _ = launch(4, ["train", first], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    step = ck.list_steps(tmp_path / "first")[-1]
    m = ck.verify(ck.step_dir(tmp_path / "first", step))
    assert m["format"] == "hpcps-checkpoint-3" and m["partition"]["weights"]["storage"] == "hash"
    # hpcps inspect shows the keys stored; export writes the keys beside the rows
    proc, _ = hpcps(["inspect", tmp_path / "first"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "dynamic (hash):" in proc.stdout and "keys stored, per server [" in proc.stdout, \
        proc.stdout
    proc, _ = hpcps(["export", tmp_path / "first", "-o", tmp_path / "x.npz"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    z = np.load(tmp_path / "x.npz", allow_pickle=False)
    assert z["weights_keys"].shape[0] == z["weights"].shape[0] == z["weights__accumulator"].shape[0]
    assert np.all(np.diff(z["weights_keys"]) > 0)
    for servers in (2, 4):
        out = tmp_path / f"s{servers}"
        shutil.copytree(tmp_path / "first", out)
        j = job(tmp_path, f"s{servers}", servers=servers, epochs=2, out=out)
        proc, _ = launch(1 + servers, ["train", j], cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "written by 1 worker(s) and 3 server(s)" in proc.stdout, proc.stdout[-2000:]
        got = model(out)
        for a, b in zip(got, want):
            assert np.array_equal(a, b), f"{servers} servers: differs from the uninterrupted run"


ADMIT = '[tables.weights]\nstorage = "hash"\nmin_count = 3\nmax_keys = {max_keys}\nevict = "lfu"\nttl_steps = 25\n'


def test_resume_with_admission_and_eviction_equals_the_uninterrupted_run(tmp_path):
    """min_count = 3, LFU eviction at max_keys and ttl_steps on 2 servers: a run resumed
    from its epoch-1 checkpoint admits and evicts as the uninterrupted run (the sketch, the
    per-key update counts and last-update clocks come back from the checkpoint), so the
    final model and the summary's counts are identical."""
    def admit_job(name, epochs, out=None):
        text = JOB.format(servers=2, epochs=epochs, out=out or (tmp_path / name),
                          storage="hash", opt="adagrad") + ADMIT.format(max_keys=60)
        return write_job(tmp_path / f"{name}.toml", text)

    def summary(run):
        s = json.loads((Path(run) / "metrics.json").read_text())["summary"]["servers"]
        return [(d["admitted"], d["rejected"], d["evicted"], d["keys_stored"],
                 d["hot_keys"]) for d in s]

    proc, _ = launch(3, ["train", admit_job("ref", 2)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want, want_s = model(tmp_path / "ref"), summary(tmp_path / "ref")
    assert all(d[0]["weights"] > 0 and d[1]["weights"] > 0 and d[2]["weights"] > 0
               for d in want_s), want_s            # admission and eviction both happened
    proc, _ = launch(3, ["train", admit_job("first", 1)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "again"
    shutil.copytree(tmp_path / "first", out)
    proc, _ = launch(3, ["train", admit_job("again", 2, out=out)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "written by 1 worker(s) and 2 server(s)" in proc.stdout, proc.stdout[-2000:]
    for a, b in zip(model(out), want):
        assert np.array_equal(a, b), "resumed run differs from the uninterrupted run"
    assert summary(out) == want_s


@pytest.mark.parametrize("saved,resumed", [("hash", "array"), ("array", "hash")])
def test_checkpoint_resumed_with_the_other_storage_is_refused(tmp_path, saved, resumed):
    a = job(tmp_path, "a", servers=1, epochs=1, storage=saved)
    proc, _ = launch(2, ["train", a], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    b = job(tmp_path, "b", servers=1, epochs=2, storage=resumed, out=tmp_path / "a")
    proc, secs = launch(2, ["train", b, "--resume", "require"], cwd=tmp_path, timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-2000:]
    kind = "a dynamic table" if saved == "hash" else "a fixed table"
    assert f"table 'weights' was checkpointed as {kind}" in text, text[-2000:]
    assert secs < 60, secs


def test_admission_counts_and_max_keys_without_eviction(tmp_path):
    """min_count = 2: an id is stored at its 2nd occurrence; the summary counts the keys
    admitted and the occurrences dropped before. max_keys = 3 with eviction off stops the
    job with an error naming the table, in seconds."""
    (tmp_path / "train.svm").write_text(SVM)
    text = JOB4.format(d=tmp_path).replace('storage = "hash"\n',
                                           'storage = "hash"\nmin_count = 2\n')
    j = write_job(tmp_path / "adm.toml", text)
    proc, _ = hpcps(["run", "-n", "2", j], cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    s = json.loads((tmp_path / "run" / "metrics.json").read_text())["summary"]["servers"][0]
    # a worker pushes each key of a step once (its gradients summed over the rows): one
    # step per epoch, so epoch 1 counts each of the 6 ids once (6 dropped), epoch 2 admits
    # them all, epoch 3 updates them again
    assert s["admitted"] == {"weights": 6} and s["rejected"] == {"weights": 6}, s
    assert s["evicted"] == {"weights": 0} and s["keys_stored"] == {"weights": 6}
    hot = dict(map(tuple, s["hot_keys"]["weights"]))
    assert hot == {k: 2 for k in (0, 1, 2, 4, 6, BIG - 1)}, hot   # epochs 2 and 3
    assert "hot keys of weights (updates)" in proc.stdout, proc.stdout
    proc, _ = hpcps(["inspect", tmp_path / "run"], cwd=tmp_path, timeout=120)
    assert "hot keys (updates): " in proc.stdout, proc.stdout

    text = JOB4.format(d=tmp_path).replace('storage = "hash"\n', 'storage = "hash"\nmax_keys = 3\n')
    j = write_job(tmp_path / "max.toml", text.replace(f'dir = "{tmp_path}/run"',
                                                      f'dir = "{tmp_path}/run2"'))
    proc, secs = hpcps(["run", "-n", "2", j], cwd=tmp_path, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert "dynamic table 'weights' holds 6 keys, more than its max_keys = 3" in out, out[-3000:]
    assert secs < 60, secs


NEG_MODEL = '''
import numpy as np
from hpcps.models.logistic import LogisticRegression


class NegativeIds(LogisticRegression):
    """Logistic regression whose weights keys are shifted below 0 (a user model's bug)."""

    def batch_keys(self, X):
        out = super().batch_keys(X)
        out["weights"] = out["weights"] - 3
        return out
'''


def test_a_key_outside_the_id_space_stops_the_job_naming_the_table(tmp_path):
    """A dynamic table takes non-negative int64 ids: a model that pushes key -3 stops the
    job with a DataError naming the table and the key, exit status 65 (an input error:
    ``hpcps run --max-restarts`` does not relaunch it), in seconds."""
    from tests.helpers import mpi_env

    (tmp_path / "train.svm").write_text(SVM)
    (tmp_path / "negmodel.py").write_text(NEG_MODEL)
    text = JOB4.format(d=tmp_path).replace("[tables.weights]",
                                           '[model]\ntype = "negmodel:NegativeIds"\n'
                                           "[tables.weights]")
    j = write_job(tmp_path / "neg.toml", text)
    env = mpi_env(PYTHONPATH=f"{tmp_path}:{Path(__file__).resolve().parents[2]}")
    proc, secs = launch(3, ["train", j], cwd=tmp_path, timeout=120, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert "DataError: table 'weights': key -3 is outside its id space " \
           "[0, 9223372036854775807)" in out, out[-3000:]
    assert secs < 60, secs
    # an error of the input (exit status 65): hpcps run does not relaunch it
    proc, secs = hpcps(["run", "-n", "3", "--max-restarts", "2", j], cwd=tmp_path,
                       timeout=180, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 65, (proc.returncode, out[-3000:])
    assert "not restarting, a relaunch would fail the same way" in out, out[-3000:]
    assert "table 'weights': key -3 is outside its id space" in out, out[-3000:]
    assert secs < 90, secs


@pytest.mark.parametrize("model", ["ssp", "async"])
def test_ssp_and_async_train_a_dynamic_table_and_checkpoint_it(tmp_path, model):
    """The clock paths of SSP and async (pushes applied on arrival, the async checkpoint
    cut) with a dynamic table: 2 workers, 2 servers; the model learns and the newest
    checkpoint holds every key the servers report."""
    text = JOB.format(servers=2, epochs=2, out=tmp_path / "run", storage="hash", opt="adagrad")
    text += f'[consistency]\nmodel = "{model}"\n' + ("staleness = 2\n" if model == "ssp" else "")
    j = write_job(tmp_path / "j.toml", text)
    proc, _ = launch(4, ["train", j], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["epochs"][-1]["test_auc"] > 0.8, m["epochs"]
    stored = sum(d["keys_stored"]["weights"] for d in m["summary"]["servers"])
    steps = ck.list_steps(tmp_path / "run")
    man = ck.verify(ck.step_dir(tmp_path / "run", steps[-1]))
    n = 0
    for f in man["shards"]["files"]:
        with h5py.File(ck.step_dir(tmp_path / "run", steps[-1]) / f, "r") as h:
            n += h["tables/weights/keys"].shape[0]
    assert stored == n > 1000, (stored, n)
    # the model export is counted apart from the training's pull replies (a trial at 32 M
    # keys: 72 % of a server's "sent" bytes and of worker 0's "bytes_pulled" were the export)
    s = m["summary"]
    export = sum(d["export_bytes"] for d in s["servers"])
    assert export == s["workers"][0]["export_bytes"] >= stored * 12, (export, s["workers"])
    assert s["workers"][1]["export_bytes"] == 0


ADULT_RAW = """
name = "adult_raw"
[cluster]
servers = 1
[data]
format = "adult_csv"
path = "{data}"
max_rows = 6000
[model]
storage = "hash"
[train]
epochs = 2
[evaluate]
sklearn_baseline = true
max_auc_gap = 0.01
[output]
dir = "{d}/run"
"""


def test_adult_unhashed_crosses_train_in_a_dynamic_table(tmp_path):
    """The quick-start model with [model] storage = "hash" and no hash_bits: every token and
    cross keeps its own 63-bit id (no buckets); scikit-learn fits the same unhashed features."""
    from tests.helpers import DATA

    j = write_job(tmp_path / "raw.toml", ADULT_RAW.format(data=DATA, d=tmp_path))
    proc, _ = hpcps(["run", "-n", "3", j], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    s = json.loads((tmp_path / "run" / "metrics.json").read_text())["summary"]
    stored = s["servers"][0]["keys_stored"]["weights"]
    with h5py.File(tmp_path / "run" / "model.h5", "r") as f:
        keys = f["weights_keys"][()]
    assert keys.size == stored and 1000 < stored < 20000, stored
    assert keys.max() > 2**50            # 63-bit ids, not buckets of 2**20
    assert "AUC gap (scikit-learn - hpcps)" in proc.stdout, proc.stdout[-3000:]


STREAM_IDS = (2**53 + 1, 2**62 + 3, 2**63 - 2)     # above 2**53: not exact as float64
STREAM_SVM = (f"1 5:1 {STREAM_IDS[0]}:1\n0 7:1 {STREAM_IDS[1]}:1\n1 5:1 12:1 {STREAM_IDS[2]}:1\n"
              f"0 7:1 12:1\n")
STREAM_JOB = """
name = "stream_dyn"
[cluster]
servers = 1
[data]
format = "svmlight"
path = "{d}/train.svm"
test_path = "{d}/test.svm.gz"
index_base = 0
stream = true
[model]
storage = "hash"
[train]
epochs = 2
batch_size = 2
[output]
dir = "{d}/run"
"""


def test_streamed_svmlight_without_n_features_trains_a_dynamic_table(tmp_path):
    """Found by a trial: a streamed svmlight job with ``storage = "hash"`` and no
    ``n_features`` (which the docs allow) stopped on every rank with a TypeError in the
    streamed reader (``int(data_cfg.n_features)``, None). It trains now, the test set
    (gzip, streamed too) and ``hpcps eval`` of the run included; ids above 2**53 are stored
    exactly, up to 2**63 - 2; an id of 2**63 - 1 is refused naming the largest id a dynamic
    table accepts, not an ``n_features`` the job does not set."""
    import gzip

    (tmp_path / "train.svm").write_text(STREAM_SVM)
    (tmp_path / "test.svm.gz").write_bytes(gzip.compress(STREAM_SVM.encode()))
    j = write_job(tmp_path / "stream_dyn.toml", STREAM_JOB.format(d=tmp_path))
    proc, _ = hpcps(["run", "-n", "2", j], cwd=tmp_path, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    with h5py.File(tmp_path / "run" / "model.h5", "r") as f:
        keys = f["weights_keys"][()]
    assert keys.dtype == np.int64
    assert [int(k) for k in keys] == [5, 7, 12, *STREAM_IDS]          # exact, not rounded
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["summary"]["servers"][0]["examples_per_epoch"] == [4, 4]
    assert len(m["epochs"]) == 2 and "test_logloss" in m["epochs"][-1]
    # hpcps eval of the run reads the gzip test file as training read it (streamed)
    proc, _ = hpcps(["eval", tmp_path / "run", "--data", tmp_path / "test.svm.gz"],
                    cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = float(proc.stdout.split("log-loss ")[1].split()[0])
    assert got == pytest.approx(m["epochs"][-1]["test_logloss"], rel=1e-5), proc.stdout
    # one id beyond: an input error naming the bound (exit status 65), not n_features
    (tmp_path / "train.svm").write_text(STREAM_SVM + f"1 3:1 {2**63 - 1}:1\n")
    j = write_job(tmp_path / "beyond.toml", STREAM_JOB.format(d=tmp_path).replace(
        'name = "stream_dyn"', 'name = "beyond"').replace("/run", "/beyond"))
    proc, _ = hpcps(["run", "-n", "2", j], cwd=tmp_path, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 65, (proc.returncode, out[-3000:])
    assert (f"train.svm:5: feature index {2**63 - 1} (index_base=0) is above "
            f"{2**63 - 2} (2**63 - 2), the largest id a dynamic table accepts") in out, out[-3000:]
    assert "n_features" not in out, out[-3000:]
