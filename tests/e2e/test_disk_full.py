"""A checkpoint that meets a full disk, under mpirun, on a real small file system (a tmpfs
mounted for the test; needs root, skipped otherwise): the job stops with an error naming the
shard file and the space it needs, the previous checkpoint stays valid, and once there is
space the job resumes from it."""

import os
import re
import subprocess

import pytest

from hpcps import checkpoint as ck
from tests.helpers import launch, write_job

pytestmark = pytest.mark.slow      # launches mpirun (python tests/run.py; pytest -m "not slow" leaves it out)

JOB = """
name = "full"
seed = 1
[data]
format = "adult_csv"
path = "@DATA@"
max_rows = 2000
hash_bits = 16
[model]
dtype = "float64"
[train]
epochs = 2
batch_size = 64
[checkpoint]
every_steps = 5
keep = 1
[output]
dir = "{out}"
"""


@pytest.fixture
def tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "fs"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2560k", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_disk_full_at_a_checkpoint_keeps_the_previous_one_and_resumes(tmpfs, tmp_path):
    run = tmpfs / "run"
    job = write_job(tmp_path / "full.toml", JOB.format(out=run))
    # 65,536 float64 rows + int64 keys + AdaGrad accumulator: ~1.6 MB a checkpoint; the
    # second does not fit beside the first in 2.5 MiB (keep = 1 prunes only after a success)
    proc, secs = launch(4, ["train", job], cwd=tmp_path, timeout=180)
    assert proc.returncode == 74, proc.returncode      # EXIT_IO: never restarted
    shard = ck.step_dir(run, 10) / "shard-0000.h5"
    m = re.search(rf"CheckpointError: cannot write {re.escape(str(shard))}: not enough free "
                  r"space; the file needs about 1\.6\d MB, \d\.\d\d MB free in ", proc.stderr)
    assert m, proc.stderr[-3000:]
    assert secs < 120
    found = ck.latest_valid(run)
    assert found is not None and found[1]["step"] == 5
    assert not any(p.name.endswith(".tmp") for p in run.rglob("*"))

    subprocess.run(["mount", "-o", "remount,size=16m", str(tmpfs)], check=True)
    proc, _ = launch(4, ["train", job], cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from checkpoint step 5" in proc.stdout
    assert "skipping checkpoint step-00000010" in proc.stdout     # the incomplete one
    assert (run / "model.h5").exists()
