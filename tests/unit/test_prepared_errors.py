"""Bad prepared (HDF5) inputs: every kind is a PreparedError naming the file and dataset."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from hpcps.config import ConfigError, load_job
from hpcps.data import DataError
from hpcps.data.prepared import FORMAT, PreparedError, read_part, write_prepared


def good(path, n=10, d=3):
    rng = np.random.default_rng(0)
    splits = {s: (rng.normal(size=(n, d)), (rng.random(n) > 0.5).astype(np.float64))
              for s in ("train", "test")}
    write_prepared(path, splits, {"dataset": "toy", "task": "classification", "n_features": d})
    return splits


def damaged(path, edit):
    good(path)
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


def test_valid_file_reads_every_row_once(tmp_path):
    splits = good(tmp_path / "p.h5", n=11)
    for n_parts in (1, 3, 11, 14):
        parts = [read_part(tmp_path / "p.h5", "train", k, n_parts) for k in range(n_parts)]
        np.testing.assert_array_equal(np.concatenate([X for X, _ in parts]), splits["train"][0])
        np.testing.assert_array_equal(np.concatenate([y for _, y in parts]), splits["train"][1])


def _replace(name, data):
    def edit(f):
        del f[name]
        f.create_dataset(name, data=data)
    return edit


@pytest.mark.parametrize("edit,message", [
    (lambda f: f.attrs.__delitem__("hpcps_format"),
     "not an hpcps prepared data file (attribute hpcps_format is None"),
    (lambda f: f["test"].__delitem__("y"), "missing dataset /test/y"),
    (lambda f: (f["train"].__delitem__("X"), f["train"].create_group("X")),
     "/train/X is a Group, expected a dataset"),
    (_replace("train/X", np.array([[b"a", b"b", b"c"]] * 10)),
     "dataset /train/X has dtype |S1 (strings, ascii), expected a numeric array"),
    (_replace("train/y", np.zeros((10, 2))), "dataset /train/y has shape (10, 2), expected 1-d"),
    (_replace("train/y", np.zeros(9)), "/train/X has 10 rows but /train/y has 9"),
    (_replace("train/X", np.where(np.arange(30).reshape(10, 3) == 13, np.nan, 1.0)),
     "dataset /train/X row 4: non-finite value"),
    (_replace("train/y", np.array([0, 1, np.inf] + [0] * 7, dtype=np.float32)),
     "dataset /train/y row 2: non-finite value"),
])
def test_damaged_file_names_file_and_dataset(tmp_path, edit, message):
    path = damaged(tmp_path / "bad.h5", edit)
    with pytest.raises(PreparedError) as ei:
        for k in range(3):
            read_part(path, "train", k, 3)
            read_part(path, "test", k, 3)
    assert str(ei.value).startswith(f"{path}: ") and message in str(ei.value), str(ei.value)
    assert isinstance(ei.value, DataError)


def test_not_hdf5_and_missing_file(tmp_path):
    text = tmp_path / "x.h5"
    text.write_text("label,a,b\n1,2,3\n")
    with pytest.raises(PreparedError, match=r"x\.h5: not a readable HDF5 file"):
        read_part(text, "train", 0, 1)
    with pytest.raises(PreparedError, match=r"nope\.h5: prepared data file not found"):
        read_part(tmp_path / "nope.h5", "train", 0, 1)


def test_job_with_a_bad_prepared_file_is_a_config_error(tmp_path):
    (tmp_path / "x.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 40)   # signature, no file
    job = tmp_path / "j.toml"
    job.write_text('name = "p"\n[data]\nformat = "prepared"\npath = "x.h5"\n')
    with pytest.raises(ConfigError) as ei:
        load_job(job)
    assert ei.value.key == "data.path" and "not a readable HDF5 file" in ei.value.message
    assert FORMAT == "prepared-v1"
