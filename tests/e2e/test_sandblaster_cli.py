"""End-to-end: ``[cluster] mode = "sandblaster"`` through the ``hpcps`` command under real mpirun
launches on real data (UCI Adult subset): ``hpcps check`` trains and compares with scikit-learn,
the outputs work with the analysis commands, and a too-small world is refused on every rank."""

import json
import re

import h5py
import numpy as np
import pytest

from tests.helpers import hpcps, launch, write_job

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

JOB = """
name = "sb_cli"
[cluster]
mode = "sandblaster"
servers = {servers}
[data]
format = "adult_csv"
path = "@DATA@"
max_rows = 4000
hash_bits = 16
[model]
l2 = 0.001
[lbfgs]
work_units = 16
[train]
progress_seconds = 0.000001   # a progress line after every iteration
[evaluate]
sklearn_baseline = true
[output]
dir = "out"
"""


def test_check_trains_compares_and_writes_usable_outputs(tmp_path):
    job = write_job(tmp_path / "sb.toml", JOB.format(servers=1))
    proc, _ = hpcps(["check", job], cwd=tmp_path)   # default: coordinator + 3 workers + servers
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "1 coordinator, 3 worker(s), 1 server(s)" in out
    assert "done (max|grad| <= tolerance)" in out
    assert re.search(r"iter +1 +F 0\.\d+", out)
    gap = float(re.search(r"relative gap ([-+0-9.e]+);", out).group(1))
    assert abs(gap) <= 1e-4
    assert "check: hpcps AUC" in out and "OK" in out
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    s = metrics["summary"]
    assert s["mode"] == "sandblaster" and s["status"] == "gradient"
    assert len(metrics["iterations"]) == s["iterations"]
    assert metrics["config"]["lbfgs"]["work_units"] == 16
    assert abs(s["baseline"]["relative_gap"]) <= 1e-4
    with h5py.File(tmp_path / "out" / "model.h5", "r") as f:
        assert f["weights"].shape == (2**16, 1) and f["bias"].shape == (1, 1)
        assert f["weights"].dtype == np.float64
        assert f.attrs["step"] == s["iterations"] and f.attrs["epoch"] == s["evaluations"]
        assert np.count_nonzero(f["weights"][()]) == s["active_keys"]
    # the offline evaluation of the model file gives the test AUC the run printed
    ev, _ = hpcps(["eval", tmp_path / "out" / "model.h5", "--data",
                   metrics["config"]["data"]["path"]], cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr[-2000:]
    auc = float(re.search(r"AUC\s*[:=]?\s*(0\.\d+)", ev.stdout).group(1))
    assert abs(auc - s["test"]["auc"]) < 1e-4, ev.stdout


def test_world_too_small_is_refused_on_every_rank(tmp_path):
    job = write_job(tmp_path / "sb.toml", JOB.format(servers=2))
    proc, _ = launch(3, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    msgs = re.findall(r"hpcps: rank (\d): error: .*cluster\.servers: mode 'sandblaster' needs "
                      r"a coordinator.*at least 4 MPI ranks, got 3", proc.stderr)
    assert sorted(msgs) == ["0", "1", "2"], proc.stderr
