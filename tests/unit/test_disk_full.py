"""Checkpoints and outputs on a full or read-only file system — a real one: a small tmpfs
mounted for the test (needs root and mount permission; skipped otherwise).

Each case asserts that the error names the file, the reason and the bytes needed, that no
partial file is left and that the previous checkpoint stays valid."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from hpcps import checkpoint as ck
from hpcps.runtime.output import write_metrics
from tests.unit.test_checkpoint import make_checkpoint


def _mount(d, size):
    d.mkdir(exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                          capture_output=True, text=True)


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs; yields (directory, remount) where remount(opts) remounts it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "small"
    r = _mount(d, "1m")
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")

    def remount(opts):
        subprocess.run(["mount", "-o", f"remount,{opts}", str(d)], check=True)

    try:
        yield d, remount
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def _shard_tables(n):
    rows = np.ones((n, 1), dtype=np.float64)
    return [dict(name="w", rows=rows, keys=np.arange(n), slots={"accumulator": rows.copy()},
                 lo=0, hi=n, num_keys=n, multiplier=1, sparse=True, optimizer="adagrad")]


def _leftovers(d):
    return sorted(p.name for p in d.rglob("*") if p.is_file() and p.name.endswith(".tmp"))


def test_shard_too_large_for_the_free_space_is_refused_before_writing(small_fs):
    d, _ = small_fs
    prev, _, _, _ = make_checkpoint(d, 10, 2)             # a valid checkpoint first (~60 KB)
    step = ck.step_dir(d, 20)
    with pytest.raises(ck.CheckpointError) as ei:
        ck.write_shard(step, 0, 1, 20, _shard_tables(100_000))     # 2.4 MB > 1 MiB
    msg = str(ei.value)
    assert f"cannot write {step / 'shard-0000.h5'}: not enough free space" in msg
    assert "needs about 2.47 MB" in msg and "MB free in" in msg, msg
    assert "Earlier checkpoints are untouched" in msg
    assert not (step / "shard-0000.h5").exists() and _leftovers(d) == []
    found = ck.latest_valid(d)
    assert found is not None and found[0] == prev


def test_real_enospc_while_writing_names_the_file_and_removes_it(small_fs):
    """The estimate left out (need=0): HDF5 itself meets ENOSPC mid-file."""
    d, _ = small_fs
    prev, _, _, _ = make_checkpoint(d, 10, 2)
    final = ck.step_dir(d, 20) / "shard-0000.h5"

    def fill(f):
        f.create_dataset("big", data=np.ones(400_000))     # 3.2 MB
    with pytest.raises(ck.CheckpointError) as ei:
        ck._atomic_h5(final, fill, need=0)
    msg = str(ei.value)
    assert f"cannot write {final}: " in msg and os.strerror(28) in msg, msg
    assert not final.exists() and _leftovers(d) == []
    assert ck.latest_valid(d)[0] == prev
    # and with the space freed the same write succeeds (nothing was left locked or half-made)
    ck.write_shard(final.parent, 0, 1, 20, _shard_tables(1000))
    assert final.exists()


def test_read_only_file_system_during_a_checkpoint(small_fs):
    d, remount = small_fs
    prev, _, _, _ = make_checkpoint(d, 10, 2)
    ck.step_dir(d, 20).mkdir(parents=True)
    remount("ro")
    try:
        with pytest.raises(ck.CheckpointError) as ei:
            ck.write_shard(ck.step_dir(d, 20), 0, 1, 20, _shard_tables(1000))
        msg = str(ei.value)
        assert f"cannot write {ck.step_dir(d, 20) / 'shard-0000.h5'}: Read-only file system" in msg
        assert "needs about 0.09 MB" in msg, msg
        assert ck.latest_valid(d)[0] == prev
        with pytest.raises(OSError) as eo:
            write_metrics(d / "metrics.json", {"epochs": []})
        assert eo.value.errno == 30
        assert f"cannot write {d / 'metrics.json'}: Read-only file system; it needs about" in str(eo.value)
    finally:
        remount("rw")


def _cfg():
    from types import SimpleNamespace
    return SimpleNamespace(name="t", text="name = 't'\n",
                           data=SimpleNamespace(num_features=4, index_base=1))


def test_model_too_large_for_the_free_space_leaves_the_old_model(small_fs):
    """Before (issue: HDF5 writing to the file itself): HDF5 met ENOSPC half-way and crashed
    (SIGSEGV) or raised a RuntimeError. The file was then built in memory (the whole model,
    twice) and refused before a byte was written. Now it is written as it is produced,
    through a file object that keeps the first failed write from the HDF5 library: the
    error names the file, the bytes written and needed; nothing is left behind."""
    from hpcps.runtime.output import OutputError, read_model, write_model

    d, _ = small_fs
    old = write_model(d / "model.h5", {"w": np.zeros((10, 1))}, _cfg(), 1, 0)
    big = {"w": np.random.default_rng(0).normal(size=(200_000, 1))}     # 1.6 MB > 1 MiB
    with pytest.raises(OutputError) as ei:
        write_model(d / "model.h5", big, _cfg(), 2, 1, chunk_bytes=64 << 10)
    msg = str(ei.value)
    assert ei.value.errno == 28
    assert (f"cannot write {d / 'model.h5'}: not enough free space ({os.strerror(28)} after "
            in msg), msg
    assert "MB written); it needs about 1.6" in msg and " MB uncompressed, " in msg, msg
    assert read_model(old)["attrs"]["step"] == 1 and _leftovers(d) == []
    # the space is all free again (the temporary file is gone) and a model that fits is
    # written in the same directory
    assert "1.0" in msg.split("uncompressed, ")[1][:6], msg
    small = {"w": np.random.default_rng(0).normal(size=(50_000, 1))}
    write_model(d / "model.h5", small, _cfg(), 3, 2, chunk_bytes=64 << 10)
    got = read_model(d / "model.h5")
    assert got["attrs"]["step"] == 3 and np.array_equal(got["tables"]["w"], small["w"])


def test_a_full_disk_stops_reading_the_model_source(small_fs):
    """A source streamed from the servers is not read to its end once a write failed (the
    chief does not pull a table it cannot write)."""
    from hpcps.runtime.output import OutputError, write_model

    d, _ = small_fs
    rng = np.random.default_rng(1)

    class Source:                       # as hpcps.worker.export's streams
        dynamic, dim, dtype, n_rows = True, 2, np.dtype("float64"), 400_000
        asked = 0

        def blocks(self, max_rows):
            for a in range(0, self.n_rows, max_rows):
                self.asked += 1
                b = min(self.n_rows, a + max_rows)
                yield np.arange(a, b, dtype=np.int64), rng.normal(size=(b - a, 2))

    src = Source()
    with pytest.raises(OutputError) as ei:
        write_model(d / "model.h5", {"w": src}, _cfg(), 1, 0, chunk_bytes=240_000)   # 10k rows
    assert ei.value.errno == 28 and "it needs about 9.6" in str(ei.value), ei.value
    print(f"\nblocks read before the failure: {src.asked} of 40")
    assert src.asked < 40 // 2, src.asked            # 40 blocks in all; ~1 MiB fit
    assert _leftovers(d) == [] and not (d / "model.h5").exists()


def test_model_on_a_read_only_file_system(small_fs):
    from hpcps.runtime.output import OutputError, write_model

    d, remount = small_fs
    remount("ro")
    try:
        with pytest.raises(OutputError) as ei:
            write_model(d / "model.h5", {"w": np.zeros((10, 1))}, _cfg(), 1, 0)
        assert ei.value.errno == 30, ei.value
        assert f"cannot write {d / 'model.h5'}: Read-only file system" in str(ei.value)
    finally:
        remount("rw")


def test_rewriting_a_shard_counts_the_space_of_the_file_it_replaces(small_fs):
    """A relaunch rewrites the shard of a checkpoint that failed half-way: the old file is
    replaced, so its bytes are free for the new one (every relaunch was refused before)."""
    d, _ = small_fs
    step = ck.step_dir(d, 20)
    ck.write_shard(step, 0, 1, 20, _shard_tables(25_000))          # ~0.6 MB of 1 MiB
    ck.write_shard(step, 0, 1, 20, _shard_tables(25_000))          # the same again
    assert (step / "shard-0000.h5").exists() and _leftovers(d) == []
