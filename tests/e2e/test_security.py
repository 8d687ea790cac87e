"""Run directories, checkpoints and outputs are created with the user's umask, under
mpirun; a run directory outside the working directory is announced before anything is
written there."""

import os
import stat

import pytest

from tests.helpers import launch, write_job

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

JOB = """
name = "sec"
[data]
format = "adult_csv"
path = "@DATA@"
max_rows = 2000
hash_bits = 10
[train]
epochs = 1
batch_size = 64
[checkpoint]
every_steps = 4
[output]
dir = "{out}"
"""


def modes(run):
    out = {}
    for root, dirs, files in os.walk(run):
        for n in dirs + files:
            p = os.path.join(root, n)
            out[os.path.relpath(p, run)] = stat.S_IMODE(os.lstat(p).st_mode)
    return out


@pytest.mark.parametrize("mask,file_mode,dir_mode", [(0o077, 0o600, 0o700),
                                                     (0o022, 0o644, 0o755)])
def test_run_directory_follows_the_umask(tmp_path, mask, file_mode, dir_mode):
    job = write_job(tmp_path / "j.toml", JOB.format(out="runs/sec"))
    old = os.umask(mask)                      # inherited by mpirun and every rank
    try:
        proc, _ = launch(3, ["train", job], cwd=tmp_path, timeout=120)
    finally:
        os.umask(old)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "hpcps: note:" not in proc.stdout
    run = tmp_path / "runs" / "sec"
    got = modes(run)
    assert {"model.h5", "metrics.json", "ckpt"} <= set(got), sorted(got)
    assert any(p.endswith("/shard-0000.h5") for p in got) and \
        any(p.endswith("/manifest.h5") for p in got), sorted(got)
    wrong = {p: oct(m) for p, m in got.items()
             if m != (dir_mode if (run / p).is_dir() else file_mode)}
    assert not wrong, wrong
    assert stat.S_IMODE((tmp_path / "runs").stat().st_mode) == dir_mode


def test_run_directory_outside_the_working_directory_is_announced(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    job = write_job(work / "j.toml", JOB.format(out="../elsewhere"))
    proc, _ = launch(3, ["train", job], cwd=work, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    note = (f"hpcps: note: j.toml:14: output.dir: writing to {tmp_path / 'elsewhere'}, outside "
            f"the working directory {work}")
    assert proc.stdout.count("hpcps: note: ") == 1 and note in proc.stdout, proc.stdout[:2000]
    assert proc.stdout.index(note) < proc.stdout.index("epoch 1")
    assert (tmp_path / "elsewhere" / "model.h5").exists()
