"""End-to-end: consistency models from the job file, through real ``mpirun`` launches."""

import json

import pytest

from tests.helpers import launch, write_job

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

JOB = """
name = "cons_e2e"
[data]
format = "adult_csv"
path = "@DATA@"
max_rows = 6000
[optimizer]
name = "{opt}"
learning_rate = {lr}
[train]
epochs = 2
progress_seconds = 0.01
[consistency]
{consistency}
[output]
dir = "out"
"""


def test_async_divergence_stops_with_a_clear_error(tmp_path):
    """A learning rate that overflows the float32 weights: the server whose update made them
    non-finite stops the job with NonFiniteError (exit status != 0) before any worker reads
    them, and no model file is written."""
    job = write_job(tmp_path / "div.toml", JOB.format(opt="sgd", lr="1e300",
                                                      consistency='model = "async"'))
    proc, _ = launch(5, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 65, proc.returncode      # EXIT_DATA
    assert "NonFiniteError: server 0: the update of table 'weights' at clock" in proc.stderr, \
        proc.stderr[-2000:]
    assert "lower [optimizer] learning_rate" in proc.stderr
    assert not (tmp_path / "out" / "model.h5").exists()


def test_ssp_rma_run_reports_staleness_and_worker_clocks(tmp_path):
    job = write_job(tmp_path / "ssp.toml", JOB.format(
        opt="adagrad", lr=0.1, consistency='model = "ssp"\nstaleness = 2\npull = "rma"'))
    proc, _ = launch(4, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SSP(s=2) (rma pulls)" in proc.stdout
    assert "(workers " in proc.stdout                      # per-worker clocks in progress
    assert "staleness of" in proc.stdout and "RMA reads" in proc.stdout
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    c = m["summary"]["consistency"]
    assert c["model"] == "ssp" and c["pull"] == "rma"
    assert c["staleness"]["max"] <= 2 and c["staleness"]["updates"] > 0
    assert sum(c["staleness"]["histogram"].values()) == c["staleness"]["updates"]
    assert m["epochs"][-1]["test_auc"] > 0.85
