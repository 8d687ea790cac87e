"""Non-finite values under mpirun, on real data with one row whose value overflows float32:
the step is rejected (on every worker under BSP, by a vote), the job stops with a clear error
after [train] max_nonfinite_steps rejected steps, and the checkpoints stay finite."""

import json

import h5py
import numpy as np
import pytest

from hpcps import checkpoint as ck
from tests.helpers import launch, log_lines, write_job

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

# 24 lines of equal length, so that 3 byte ranges hold 8 rows each; 1.0e39 overflows float32
GOOD = ["1 1:1.0e00 2:0.25", "0 2:1.0e00 3:0.50", "1 3:1.0e00 4:0.75", "0 1:1.0e00 4:0.25"]
ROWS = [GOOD[i % 4] for i in range(24)]
BAD_ROW = 22                                   # worker 2's 7th row: step 3 of every epoch
ROWS[BAD_ROW] = "0 1:1.0e39 2:0.25"

JOB = """
name = "nonfinite"
[data]
format = "svmlight"
path = "{train}"
test_path = "{test}"
index_base = 1
n_features = 4
[train]
epochs = 2
batch_size = 2
shuffle = false
max_nonfinite_steps = {limit}
[consistency]
model = "{model}"
[checkpoint]
every_steps = 1
keep = 20
[output]
dir = "out"
"""


def setup(tmp_path, limit, model="bsp"):
    (tmp_path / "train.svm").write_text("\n".join(ROWS) + "\n")
    (tmp_path / "test.svm").write_text("\n".join(GOOD) + "\n")
    return write_job(tmp_path / "job.toml", JOB.format(
        train=tmp_path / "train.svm", test=tmp_path / "test.svm", limit=limit, model=model))


def finite_checkpoint(d):
    with h5py.File(d / ck.MANIFEST, "r") as f:
        return all(np.isfinite(f[f"tables/{t}"][()]).all() for t in ("weights", "bias"))


def test_first_non_finite_gradient_stops_the_job_and_checkpoints_stay_finite(tmp_path):
    job = setup(tmp_path, 0)
    proc, secs = launch(4, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 65, proc.returncode      # EXIT_DATA
    assert ("NonFiniteError: non-finite values (NaN or inf) at clock 3 on worker 2 (gradient): "
            "rejected step 1, more than [train] max_nonfinite_steps = 0") in proc.stderr, \
        proc.stderr[-3000:]
    run = tmp_path / "out"
    assert ck.list_steps(run) == [1, 2, 3]             # the clock-3 step never completed
    found = ck.latest_valid(run)
    assert found[1]["step"] == 3 and finite_checkpoint(found[0])
    assert not (run / "model.h5").exists() and secs < 60


def test_bsp_rejects_the_step_on_every_worker_until_the_limit(tmp_path):
    job = setup(tmp_path, 2)
    proc, _ = launch(4, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in log_lines(proc.stdout) if line.startswith("hpcps: warning:")]
    assert warnings == [
        f"hpcps: warning: non-finite values (NaN or inf) at clock {c} on worker 2 (gradient): "
        f"step rejected on every worker ({k} of at most 2, [train] max_nonfinite_steps = 2)"
        for k, c in ((1, 3), (2, 7))]
    # every worker dropped its 2 rows of the rejected step, in both epochs: 48 - 2 * 3 * 2
    summary = json.loads((tmp_path / "out" / "metrics.json").read_text())["summary"]
    assert summary["examples"] == 36
    with h5py.File(tmp_path / "out" / "model.h5", "r") as f:
        assert np.isfinite(f["weights"][()]).all() and np.isfinite(f["bias"][()]).all()
    # one more epoch would be one rejected step too many
    job3 = setup(tmp_path, 1)
    proc, _ = launch(4, ["train", job3, "--resume", "never"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 65, proc.returncode
    assert ("at clock 7 on worker 2 (gradient): rejected step 2, more than [train] "
            "max_nonfinite_steps = 1") in proc.stderr, proc.stderr[-3000:]


def test_the_rejected_count_survives_a_resume(tmp_path):
    """The BSP-voted count is in the checkpoint: one epoch rejects 1 step (limit 1), the
    resumed second epoch's rejected step is number 2 (it restarted at 1 before)."""
    job = setup(tmp_path, 1)
    job.write_text(job.read_text().replace("epochs = 2", "epochs = 1"))
    proc, _ = launch(4, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ck.read_manifest(ck.latest_valid(tmp_path / "out")[0])["nonfinite_rejected"] == 1
    job.write_text(job.read_text().replace("epochs = 1", "epochs = 2"))
    proc, _ = launch(4, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 65, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "resumed from checkpoint step 4" in proc.stdout, proc.stdout[-2000:]
    assert ("at clock 7 on worker 2 (gradient): rejected step 2, more than [train] "
            "max_nonfinite_steps = 1") in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("model", ["async", "ssp"])
def test_ssp_and_async_drop_the_producing_workers_gradient(tmp_path, model):
    text = setup(tmp_path, 5, model).read_text()
    if model == "ssp":
        text = text.replace('model = "ssp"', 'model = "ssp"\nstaleness = 1')
    job = write_job(tmp_path / "job.toml", text)
    proc, _ = launch(4, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in log_lines(proc.stdout) if line.startswith("hpcps: warning:")]
    assert len(warnings) == 2 and all("on worker 2 (gradient): step worker 2's gradient dropped"
                                      in w for w in warnings), warnings
    summary = json.loads((tmp_path / "out" / "metrics.json").read_text())["summary"]
    assert summary["examples"] == 48 - 2 * 2       # only worker 2's rows of the step


def test_weights_made_non_finite_by_an_update_stop_on_the_server(tmp_path):
    """Gradients of 0.5e30 are finite in float32; a step of 1e10 times them is not."""
    text = setup(tmp_path, 0).read_text().replace(
        "[train]", '[optimizer]\nname = "sgd"\nlearning_rate = 1e10\n[train]')
    job = write_job(tmp_path / "job.toml", text)
    (tmp_path / "train.svm").write_text("\n".join(r.replace("1.0e00", "1.0e30") for r in GOOD * 6) + "\n")
    proc, _ = launch(4, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 65, proc.returncode
    assert "NonFiniteError: server 0: the update of table 'weights' at clock 0 made" in proc.stderr, \
        proc.stderr[-3000:]
    assert "weight(s) non-finite (NaN or inf; finite gradients overflowed float32)" in proc.stderr
    assert ck.latest_valid(tmp_path / "out") is None
