"""The job of the checkpoint/restart tests (tests/e2e/test_restart.py, test_resume.py) and
their helpers: Adult, float64, BSP unless a test adds a [consistency] section."""

from pathlib import Path

import h5py
import numpy as np

from tests.helpers import write_job

JOB = """
name = "restart"
seed = 5
[cluster]
servers = {servers}
[data]
format = "adult_csv"
path = "@DATA@"
max_rows = {rows}
hash_bits = 14
[model]
dtype = "float64"
l2 = 0.001
[optimizer]
name = "{opt}"
[train]
epochs = {epochs}
batch_size = {batch}
[checkpoint]
every_steps = {every}
keep = {keep}
[output]
dir = "{out}"
"""


def job(tmp_path, name, *, servers=1, rows=6000, epochs=2, batch=64, every=10, keep=3, out=None,
        opt="adagrad"):
    """Write ``tmp_path/NAME.toml`` (output directory ``out``, default ``tmp_path/NAME``)."""
    return write_job(tmp_path / f"{name}.toml", JOB.format(
        servers=servers, rows=rows, epochs=epochs, batch=batch, every=every, keep=keep,
        out=out or (tmp_path / name), opt=opt))


def weights(run_dir):
    with h5py.File(Path(run_dir) / "model.h5", "r") as f:
        return f["weights"][()], f["bias"][()]


def assert_identical(a, b):
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]), \
        f"max |diff| {np.abs(a[0] - b[0]).max()}"
