"""The corpus of bad inputs in tests/data/bad/, each run end to end under mpirun: a clear
message naming the file and line, a non-zero exit, within seconds — never a hang."""

import re
import shutil

import pytest

from tests.helpers import ROOT, hpcps, launch, write_job

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

BAD = ROOT / "tests" / "data" / "bad"
GOOD = "1 1:1 3:0.5\n0 2:1\n1 1:0.5 4:1\n0 3:1\n"

JOB = """
name = "bad"
[data]
format = "svmlight"
path = "{train}"
test_path = "{test}"
index_base = 1
n_features = 8
[train]
epochs = 1
batch_size = 2
[output]
dir = "out"
"""

CASES = {
    "bad_value.svm": "bad_value.svm:2: could not convert string to float: 'abc'",
    "bad_label.svm": "bad_label.svm:2: could not convert string to float: 'yes' (the label)",
    "index_beyond_table.svm": "index_beyond_table.svm:2: feature index 9 (index_base=1) is out of range for n_features=8",
    "label_out_of_range.svm": "label_out_of_range.svm:1: label 2.0 is not -1, 0 or +1",
    "nan_value.svm": "nan_value.svm:1: non-finite feature value nan",
    "unsorted_indices.svm": "unsorted_indices.svm:2: feature indices must increase along a row: 2 after 3",
    "index_2pow31.svm": "index_2pow31.svm:2: feature index 2147483649 (index_base=1) is out of range for n_features=8",
    "index_2pow32.svm": "index_2pow32.svm:4: feature index 4294967297 (index_base=1) is out of range for n_features=8",
    "duplicate_index.svm": 'duplicate_index.svm:2: duplicate feature index 4 in a row (set [data] duplicate_indices = "sum"',
    "empty.svm": "empty.svm: no training rows",
    "cr_line_endings.svm": "cr_line_endings.svm:1: carriage return (CR) not followed by LF: lines must end in LF or CRLF",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_training_file_fails_fast_with_file_and_line(tmp_path, name):
    train = tmp_path / name
    shutil.copy(BAD / name, train)
    (tmp_path / "test.svm").write_text(GOOD)
    job = write_job(tmp_path / "job.toml", JOB.format(train=train, test=tmp_path / "test.svm"))
    proc, secs = launch(3, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 65, proc.returncode      # EXIT_DATA: never restarted
    assert CASES[name] in proc.stderr, proc.stderr[-2000:]
    assert secs < 60


def test_empty_test_file_is_an_error(tmp_path):
    """Before, an empty test file trained to the end and reported 'AUC nan'."""
    (tmp_path / "train.svm").write_text(GOOD)
    shutil.copy(BAD / "empty.svm", tmp_path / "test.svm")
    job = write_job(tmp_path / "job.toml", JOB.format(train=tmp_path / "train.svm",
                                                      test=tmp_path / "test.svm"))
    proc, secs = launch(3, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 65, proc.stderr[-2000:]
    assert f"DataError: {tmp_path / 'test.svm'}: no test rows" in proc.stderr, proc.stderr[-2000:]
    assert secs < 60


def test_hpcps_run_does_not_restart_a_data_error(tmp_path):
    """Bad data fails the same way every time: ``--max-restarts`` must not relaunch it (it
    did, four times in 15 s, before exit status 65 existed)."""
    shutil.copy(BAD / "bad_value.svm", tmp_path / "train.svm")
    (tmp_path / "test.svm").write_text(GOOD)
    job = write_job(tmp_path / "job.toml", JOB.format(train=tmp_path / "train.svm",
                                                      test=tmp_path / "test.svm"))
    proc, secs = hpcps(["run", "-n", "3", "--max-restarts", "2", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 65, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "mpirun exited with status 65 (bad training data or non-finite values): not " \
           "restarting" in proc.stdout, proc.stdout
    assert "restart 1/2" not in proc.stdout, proc.stdout
    # one launch: the origin's line once, and each other rank's notice of it once
    origin = re.findall(r"^hpcps: rank \d+ on \S+: DataError: ", proc.stderr, re.M)
    told = re.findall(r"^hpcps: rank \d+ on \S+: stopped: rank \d+ on \S+ found an input error: "
                      r"DataError: ", proc.stderr, re.M)
    assert (len(origin), len(told)) == (1, 2), proc.stderr[-3000:]
    assert secs < 60


def test_duplicate_indices_summed_when_the_job_says_so(tmp_path):
    """[data] duplicate_indices = "sum": the file that is refused by default trains, and the
    model records the index base the data was read with."""
    import h5py

    train = tmp_path / "dup.svm"
    shutil.copy(BAD / "duplicate_index.svm", train)
    (tmp_path / "test.svm").write_text(GOOD + "1 2:1 2:1\n")
    text = JOB.format(train=train, test=tmp_path / "test.svm").replace(
        "n_features = 8", 'n_features = 8\nduplicate_indices = "sum"')
    job = write_job(tmp_path / "job.toml", text)
    proc, _ = launch(3, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "3 train / 5 test rows" in proc.stdout
    with h5py.File(tmp_path / "out" / "model.h5", "r") as f:
        assert int(f.attrs["index_base"]) == 1 and f["weights"].shape == (8, 1)


def test_quirky_valid_file_smaller_than_the_worker_count_trains(tmp_path):
    """Comments, CRLF, qid:, a blank and a label-only line, no final newline; 4 rows for 5
    workers: some workers get no rows and the job still works."""
    train = tmp_path / "q.svm"
    shutil.copy(BAD / "quirky_but_valid.svm", train)
    (tmp_path / "test.svm").write_text(GOOD)
    job = write_job(tmp_path / "job.toml", JOB.format(train=train, test=tmp_path / "test.svm"))
    proc, _ = launch(6, ["train", job], cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "4 train / 4 test rows" in proc.stdout


CSV_JOB = """
name = "badcsv"
[data]
format = "{fmt}"
path = "{train}"
[train]
epochs = 1
batch_size = 2
[output]
dir = "out"
"""

CSV_CASES = {
    "csv_missing_column.csv": "csv_missing_column.csv: missing column 'hours-per-week'",
    "csv_non_numeric.csv": "csv_non_numeric.csv:4: column 'hours-per-week': bad numeric value 'forty'",
}


@pytest.mark.parametrize("name", sorted(CSV_CASES))
def test_bad_csv_names_file_line_and_column(tmp_path, name):
    """[data] format = "adult_csv" on a user's CSV: a missing column or a non-numeric value
    in a numeric column stops every rank with the file, line and column."""
    train = tmp_path / name
    shutil.copy(BAD / name, train)
    job = write_job(tmp_path / "job.toml", CSV_JOB.format(fmt="adult_csv", train=train))
    proc, secs = launch(3, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 65, proc.returncode
    assert CSV_CASES[name] in proc.stderr, proc.stderr[-2000:]
    assert "DataError" in proc.stderr and secs < 60


def _prepared(path, edit=None):
    import h5py
    import numpy as np

    from hpcps.data.prepared import write_prepared

    rng = np.random.default_rng(0)
    write_prepared(path, {s: (rng.normal(size=(12, 4)), (rng.random(12) > 0.5).astype(float))
                          for s in ("train", "test")},
                   {"dataset": "toy", "task": "classification", "n_features": 4})
    if edit:
        with h5py.File(path, "r+") as f:
            edit(f)
    return path


def _set(name, data):
    def edit(f):
        del f[name]
        f.create_dataset(name, data=data)
    return edit


PREPARED_CASES = {
    "length": (_set("train/y", [0.0, 1.0, 0.0]), "/train/X has 12 rows but /train/y has 3"),
    "dtype": (_set("train/X", [[b"x"] * 4] * 12), "dataset /train/X has dtype object (strings, ascii), expected a numeric array"),
    "missing": (lambda f: f["train"].__delitem__("y"), "missing dataset /train/y"),
}


@pytest.mark.parametrize("case", sorted(PREPARED_CASES))
def test_bad_prepared_file_names_file_and_dataset(tmp_path, case):
    edit, message = PREPARED_CASES[case]
    path = _prepared(tmp_path / "p.h5", edit)
    job = write_job(tmp_path / "job.toml", CSV_JOB.format(fmt="prepared", train=path))
    proc, secs = launch(3, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 65, proc.returncode
    assert f"{path}: {message}" in proc.stderr, proc.stderr[-2000:]
    assert secs < 60


def test_prepared_path_that_is_not_hdf5_is_a_job_error_on_every_rank(tmp_path):
    path = tmp_path / "p.h5"
    shutil.copy(BAD / "csv_non_numeric.csv", path)
    job = write_job(tmp_path / "job.toml", CSV_JOB.format(fmt="prepared", train=path))
    proc, _ = launch(3, ["train", job], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    for r in range(3):
        assert f"hpcps: rank {r}: error: {job}:5: data.path: {path}: not a readable HDF5 file" \
            in proc.stderr, proc.stderr[-2000:]
