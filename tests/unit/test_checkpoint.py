"""Checkpoint files (hpcps.checkpoint): layout, validation and fallback, re-sharded reads,
and the epoch plan that keeps every row read once when the worker count changes."""

import hashlib
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcps.analysis import offline as analysis
from hpcps import checkpoint as ck
from hpcps.config import changed_keys
from hpcps.core.tables import KeyPartition
from hpcps.core.planning import epoch_order, epoch_rows

NUM_KEYS, DIM = 1000, 2


def make_checkpoint(run_dir, step, n_servers, seed=0, epoch=1, step_in_epoch=3,
                    text='name = "t"\n'):
    """A real checkpoint of a (NUM_KEYS, DIM) table 'w' with an AdaGrad slot; returns the full
    table in permuted order (and its keys) for comparison."""
    part = KeyPartition(NUM_KEYS, n_servers)
    rng = np.random.default_rng(seed)
    full = rng.standard_normal((NUM_KEYS, DIM))
    acc = rng.random((NUM_KEYS, DIM))
    d = ck.step_dir(run_dir, step)
    shards = []
    for s in range(n_servers):
        lo, hi = part.shard_range(s)
        shards.append(ck.write_shard(d, s, n_servers, step, [dict(
            name="w", rows=full[lo:hi], keys=part.shard_keys(s), slots={"accumulator": acc[lo:hi]},
            lo=lo, hi=hi, num_keys=NUM_KEYS, multiplier=part.multiplier, sparse=True,
            optimizer="adagrad")]))
    ranges = np.array([part.shard_range(s) for s in range(n_servers)])
    ck.write_manifest(d, cfg_text=text, job_name="t", step=step, epoch=epoch,
                      step_in_epoch=step_in_epoch,
                      steps_per_epoch=9, n_workers=2, worker_clocks=[step, step],
                      last_push_seq=[0, 0], shards=shards,
                      partitions={"w": dict(num_keys=NUM_KEYS, dim=DIM, dtype="float64",
                                            multiplier=part.multiplier, range_size=part.range_size,
                                            sparse=True, ranges=ranges, slots=["accumulator"])},
                      history=[{"epoch": 1, "test_auc": 0.9}])
    return d, full, acc, part


def test_manifest_layout_and_virtual_datasets(tmp_path):
    d, full, acc, part = make_checkpoint(tmp_path, 12, 3)
    with h5py.File(d / ck.MANIFEST, "r") as f:
        np.testing.assert_array_equal(f["tables/w"][()], full)          # stitched VDS
        keys = f["tables/w_keys"][()]
        assert sorted(keys.tolist()) == list(range(NUM_KEYS))
        np.testing.assert_array_equal(part.positions(keys), np.arange(NUM_KEYS))
        np.testing.assert_array_equal(f["slots/w/accumulator"][()], acc)
        assert isinstance(f.attrs["config"], str) and f.attrs["step"] == 12
        assert f.attrs["format"] == ck.FORMAT
    m = ck.verify(d)
    assert m["history"] == [{"epoch": 1, "test_auc": 0.9}]
    assert m["shards"]["files"] == ["shard-0000.h5", "shard-0001.h5", "shard-0002.h5"]
    assert ck.latest_valid(tmp_path)[0] == d


@pytest.mark.parametrize("new_servers", [1, 2, 3, 4, 7])
def test_read_range_reshards_to_any_server_count(tmp_path, new_servers):
    d, full, acc, _ = make_checkpoint(tmp_path, 5, 3)
    m = ck.read_manifest(d)
    new = KeyPartition(NUM_KEYS, new_servers)
    got = []
    for s in range(new_servers):
        lo, hi = new.shard_range(s)
        rows, slots = ck.read_range(d, m, "w", lo, hi, num_keys=NUM_KEYS, dim=DIM, dtype="float64",
                                    multiplier=new.multiplier, slots=["accumulator"])
        np.testing.assert_array_equal(slots["accumulator"], acc[lo:hi])
        got.append(rows)
    np.testing.assert_array_equal(np.concatenate(got), full)


def test_mismatched_table_is_a_clear_error(tmp_path):
    d, *_ = make_checkpoint(tmp_path, 5, 2)
    m = ck.read_manifest(d)
    with pytest.raises(ck.CheckpointError, match=r"table 'w' has shape \(1000, 2\) in the checkpoint but \(1000, 3\)"):
        ck.read_range(d, m, "w", 0, 10, num_keys=NUM_KEYS, dim=3, dtype="float64", multiplier=1)
    with pytest.raises(ck.CheckpointError, match="no table 'bias'"):
        ck.read_range(d, m, "bias", 0, 1, num_keys=1, dim=1, dtype="float64", multiplier=1)


def _corrupt_truncate(d):
    p = d / "shard-0001.h5"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _corrupt_flip(d):
    p = d / "shard-0000.h5"
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0xFF
    p.write_bytes(bytes(b))


def _corrupt_no_manifest(d):
    (d / ck.MANIFEST).unlink()


def _corrupt_missing_shard(d):
    (d / "shard-0002.h5").unlink()


def _corrupt_garbage_manifest(d):
    (d / ck.MANIFEST).write_bytes(b"\x89HDF\r\n\x1a\n" + os.urandom(300))


@pytest.mark.parametrize("corrupt,reason", [
    (_corrupt_truncate, "truncated"), (_corrupt_flip, "checksum does not match"), (_corrupt_no_manifest, "incomplete"),
    (_corrupt_missing_shard, "missing"), (_corrupt_garbage_manifest, "unreadable manifest")])
def test_newest_bad_checkpoint_falls_back_to_previous(tmp_path, corrupt, reason):
    good, full, *_ = make_checkpoint(tmp_path, 10, 3, seed=1)
    bad, *_ = make_checkpoint(tmp_path, 20, 3, seed=2)
    corrupt(bad)
    warnings = []
    d, m = ck.latest_valid(tmp_path, warn=warnings.append)
    assert d == good and m["step"] == 10
    assert len(warnings) == 1 and reason in warnings[0] and "step-00000020" in warnings[0]
    with pytest.raises(ck.CheckpointError, match=reason):
        ck.verify(bad)


def test_interrupted_write_leaves_previous_checkpoint_usable(tmp_path):
    """What a kill during a shard write leaves: a temp file and no manifest."""
    good, *_ = make_checkpoint(tmp_path, 10, 2)
    partial = ck.step_dir(tmp_path, 20)
    partial.mkdir(parents=True)
    (partial / ".shard-0000.h5.abc.tmp").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    assert ck.latest_valid(tmp_path)[0] == good


def test_prune_keeps_the_newest_complete(tmp_path):
    for step in (1, 2, 3, 4):
        make_checkpoint(tmp_path, step, 1)
    (ck.step_dir(tmp_path, 5)).mkdir()                   # being written: must survive
    ck.prune(tmp_path, keep=2)
    assert ck.list_steps(tmp_path) == [3, 4, 5]


def _damage_all(run_dir):
    """Damage every checkpoint of ``run_dir`` in a different way; their names, ascending."""
    steps = ck.list_steps(run_dir)
    hurts = [_corrupt_flip, _corrupt_truncate, _corrupt_missing_shard]
    for s, hurt in zip(steps, hurts):
        hurt(ck.step_dir(run_dir, s))
    return [ck.step_dir(run_dir, s).name for s in steps]


def test_prune_counts_only_verified_checkpoints(tmp_path):
    """Issue 21.3: three damaged checkpoints of an earlier launch and a new valid one at a
    lower step: pruning (keep 1) must keep the new one, the only one that verifies (it used
    to count every directory with a manifest, keep the damaged step 300 and delete the new
    checkpoint, and the chief then died on its missing manifest)."""
    for step in (100, 200, 300):
        make_checkpoint(tmp_path, step, 3, seed=step)
    _damage_all(tmp_path)
    new, *_ = make_checkpoint(tmp_path, 10, 3)
    ck.prune(tmp_path, keep=1)
    assert ck.verify(new)["step"] == 10


def test_prune_deletes_damaged_checkpoints_older_than_the_newest_verified(tmp_path):
    for step in (10, 15, 20):
        make_checkpoint(tmp_path, step, 3, seed=step)
    _corrupt_flip(ck.step_dir(tmp_path, 15))
    assert [d.name for d in ck.prune(tmp_path, keep=2)] == ["step-00000015"]
    assert ck.list_steps(tmp_path) == [10, 20]


def test_prune_never_deletes_the_checkpoint_just_written(tmp_path):
    """Issue 23.3: an earlier run's higher-numbered checkpoints must not push out the one
    this run has just written."""
    for step in (100, 200, 300):
        make_checkpoint(tmp_path, step, 1, seed=step)
    make_checkpoint(tmp_path, 10, 1)
    ck.prune(tmp_path, keep=3, current=10)
    assert ck.list_steps(tmp_path) == [10, 100, 200, 300]


def test_checksum_mismatch_names_the_expected_and_the_actual_digest(tmp_path):
    """Issue 21.9."""
    d, *_ = make_checkpoint(tmp_path, 10, 2)
    want = ck.read_manifest(d)["shards"]["digest"][1]
    _flip_byte(d / "shard-0001.h5", _rows_offset(d / "shard-0001.h5"))
    have = xxhash.xxh3_128((d / "shard-0001.h5").read_bytes()).hexdigest()
    with pytest.raises(ck.CheckpointError) as e:
        ck.verify(d)
    assert f"expected {want}, file has {have}" in str(e.value) and "shard-0001.h5" in str(e.value)


def test_a_leftover_temporary_shard_is_named_and_removed_when_the_step_is_written_again(tmp_path):
    """Issue 21.9: a server killed while writing its shard leaves ``.shard-0001.h5.*.tmp`` and
    no manifest; the warning names it, and writing that checkpoint again removes it."""
    make_checkpoint(tmp_path, 10, 2)
    d, *_ = make_checkpoint(tmp_path, 20, 2)
    (d / ck.MANIFEST).unlink()
    (d / "shard-0001.h5").unlink()
    tmp = d / ".shard-0001.h5.k2x9q1zz.tmp"
    tmp.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    warnings = []
    assert ck.latest_valid(tmp_path, warn=warnings.append)[1]["step"] == 10
    assert len(warnings) == 1 and tmp.name in warnings[0], warnings
    make_checkpoint(tmp_path, 20, 2)                        # the relaunch writes step 20 again
    assert not tmp.exists() and ck.verify(d)["step"] == 20


def test_no_valid_checkpoint_is_one_line_naming_each_and_auto_sets_them_aside(tmp_path):
    """Issue 21.3: every checkpoint damaged. ``--resume auto`` says so in one line naming
    every checkpoint and why, trains from scratch and moves them aside (so that the new
    run's checkpoints are never ranked against them); ``--resume require`` is an error."""
    for step in (10, 20, 30):
        make_checkpoint(tmp_path, step, 3, seed=step)
    names = _damage_all(tmp_path)
    st = ck.choose_start(tmp_path, "require", 'name = "t"\n', epochs=2)
    assert st.error and st.directory is None and "--resume require" in st.error
    assert all(n in st.error for n in names) and "\n" not in st.error
    assert ck.list_steps(tmp_path) == [10, 20, 30]          # untouched
    st = ck.choose_start(tmp_path, "auto", 'name = "t"\n', epochs=2)
    assert st.error is None and st.directory is None and not st.notes
    (line,) = st.warnings
    assert "\n" not in line and "trains from scratch" in line
    for n, why in zip(names, ("checksum does not match", "truncated", "missing")):
        assert f"{n} (" in line and why in line
    assert ck.list_steps(tmp_path) == [] and sorted(p.name for p in st.aside.iterdir()) == names


def test_resume_never_moves_an_earlier_runs_checkpoints_aside(tmp_path):
    """Issue 23.3."""
    for step in (100, 200):
        make_checkpoint(tmp_path, step, 1, seed=step)
    st = ck.choose_start(tmp_path, "never", 'name = "t"\n', epochs=2)
    assert st.directory is None and st.error is None and ck.list_steps(tmp_path) == []
    assert st.aside.name.startswith("ckpt.aside-") and str(st.aside) in st.notes[0]
    assert ck.list_steps(tmp_path) == [] and len(list(st.aside.iterdir())) == 2
    assert ck.choose_start(tmp_path, "never", "", 2).aside is None     # nothing to move


def test_a_finished_checkpoint_of_another_job_text_is_not_taken_as_finished(tmp_path):
    """Issue 23.3: the end of a run of another job file is refused, not 'already finished';
    the end of this very job is 'finished' (nothing to train); a checkpoint mid-run of another
    job text is resumed as before."""
    make_checkpoint(tmp_path, 10, 1, epoch=1, step_in_epoch=9, text='name = "old"\n')
    st = ck.choose_start(tmp_path, "auto", 'name = "new"\n', epochs=2)
    assert st.refuse and "another job file" in st.refuse and not st.finished and not st.error
    st = ck.choose_start(tmp_path, "auto", 'name = "old"\n', epochs=2)
    assert st.error is None and st.finished
    st = ck.choose_start(tmp_path, "auto", 'name = "new"\n', epochs=3)     # one more epoch
    assert st.error is None and not st.finished and st.manifest["step"] == 10


def test_the_refusal_of_another_finished_job_names_the_keys_that_differ(tmp_path):
    """Found by a trial (2026-12-05): a finished run relaunched with only [cluster] servers
    changed was refused as "another job file" without saying which keys differed, and the
    advice was to train afresh; a comment alone made the text differ too."""
    old = 'name = "old"\n[cluster]\nservers = 2\n[train]\nepochs = 2\n'
    make_checkpoint(tmp_path, 10, 1, epoch=1, step_in_epoch=9, text=old)
    st = ck.choose_start(tmp_path, "auto", old.replace("servers = 2", "servers = 3"), epochs=2)
    assert "(keys that differ: cluster.servers)" in st.refuse and "raise train.epochs" in st.refuse
    st = ck.choose_start(tmp_path, "auto", "# a note\n" + old.replace("= 2\n[train]", "= 2   # two\n[train]"),
                         epochs=2)
    assert st.refuse is None and st.finished
    assert changed_keys(old, 'name = "new"\n[cluster]\nservers = 2\n[data]\nx = 1\n') == [
        "data.x", "name", "train.epochs"]


def test_write_error_names_the_file(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "ckpt").write_text("a file where the checkpoint directory should be")
    with pytest.raises(ck.CheckpointError, match="cannot write"):
        ck.write_shard(ck.step_dir(ro, 1), 0, 1, 1, [])


# ------------------------------------------------------------------ shard checksums

#: a real format-1 checkpoint (manifest ``shards/sha256``), written by hpcps at commit dd32fcf:
#: table 'w' of 40 keys x 2 float64 on 2 servers, w[key, j] = 10 key + j, AdaGrad
#: accumulator[key, j] = key + 0.25, step 7 (see its README.md)
FORMAT1 = Path(__file__).resolve().parent.parent / "data" / "ckpt_format1"


def _flip_byte(path, offset):
    b = bytearray(Path(path).read_bytes())
    b[offset] ^= 0x01
    Path(path).write_bytes(bytes(b))


def _rows_offset(path, table="w"):
    """Byte offset of the first row of ``table`` in a shard file (a data byte, not metadata)."""
    with h5py.File(path, "r") as f:
        return int(f[f"tables/{table}/rows"].id.get_offset())


def test_manifest_records_the_xxh3_128_of_every_shard_file(tmp_path):
    d, *_ = make_checkpoint(tmp_path, 12, 3)
    with h5py.File(d / ck.MANIFEST, "r") as f:
        sh = {k: ck.attr_value(v) for k, v in f["shards"].attrs.items()}
    assert sh["checksum"] == "xxh3_128" and "sha256" not in sh
    assert sh["digest"] == [xxhash.xxh3_128((d / n).read_bytes()).hexdigest() for n in sh["files"]]
    assert all(len(x) == 32 for x in sh["digest"])


def test_digest_hashed_while_writing_is_the_files_across_many_pieces(tmp_path):
    """Arrays of several pieces (``_PIECE`` = 1 MiB) and uneven tails: the digest returned with
    the write equals the XXH3-128 of the file read back, in the 32-byte field servers send."""
    n = 3 * (ck._PIECE // 8) + 12345
    rng = np.random.default_rng(3)
    nbytes, field = ck.write_shard(tmp_path, 0, 1, 4, [dict(
        name="w", rows=rng.standard_normal((n, 1)), keys=np.arange(n), lo=0, hi=n, num_keys=n,
        slots={"accumulator": rng.random((n, 1)).astype(np.float32)}, multiplier=1,
        sparse=True, optimizer="adagrad")])
    data = (tmp_path / ck.shard_name(0)).read_bytes()
    assert nbytes == len(data) > 3 * ck._PIECE
    assert len(field) == 2 * ck.DIGEST_FIELD
    assert field == xxhash.xxh3_128(data).hexdigest() + "0" * 32


@pytest.mark.parametrize("where", ["first byte", "first row", "last byte"])
def test_one_flipped_bit_in_a_shard_is_caught_on_restore(tmp_path, where):
    """A single bit flipped in a real shard (in the superblock, in a row of the table, at the
    end) is caught by the checksum; the data byte is one h5py reads without complaint."""
    good, *_ = make_checkpoint(tmp_path, 10, 3, seed=1)
    bad, *_ = make_checkpoint(tmp_path, 20, 3, seed=2)
    shard = bad / "shard-0001.h5"
    offset = {"first byte": 0, "first row": _rows_offset(shard),
              "last byte": shard.stat().st_size - 1}[where]
    _flip_byte(shard, offset)
    if where == "first row":
        with h5py.File(shard, "r") as f:
            f["tables/w/rows"][()]                       # HDF5 itself does not notice
    with pytest.raises(ck.CheckpointError, match="shard-0001.h5: xxh3_128 checksum does not match"):
        ck.verify(bad)
    warnings = []
    assert ck.latest_valid(tmp_path, warn=warnings.append)[0] == good
    assert len(warnings) == 1 and "step-00000020" in warnings[0] and "checksum" in warnings[0]


def test_format1_checkpoint_with_sha256_still_restores(tmp_path):
    shutil.copytree(FORMAT1, tmp_path / "ckpt")
    with h5py.File(FORMAT1 / "step-00000007" / ck.MANIFEST, "r") as f:
        assert f.attrs["format"] == "hpcps-checkpoint-1" and "checksum" not in f["shards"].attrs
    d, m = ck.latest_valid(tmp_path)
    assert d == ck.step_dir(tmp_path, 7) and m["step"] == 7
    assert m["shards"]["checksum"] == "sha256"
    assert m["shards"]["digest"] == [hashlib.sha256((d / n).read_bytes()).hexdigest()
                                     for n in m["shards"]["files"]]
    part = KeyPartition(40, 3)                                  # restored on 3 servers
    keys = np.concatenate([part.shard_keys(s) for s in range(3)])
    rows, slots = zip(*(ck.read_range(d, m, "w", *part.shard_range(s), num_keys=40, dim=2,
                                      dtype="float64", multiplier=part.multiplier,
                                      slots=["accumulator"]) for s in range(3)))
    w = np.empty((40, 2))
    w[keys] = np.concatenate(rows)
    acc = np.empty((40, 2))
    acc[keys] = np.concatenate([s["accumulator"] for s in slots])
    np.testing.assert_array_equal(w, 10.0 * np.arange(40)[:, None] + np.arange(2))
    np.testing.assert_array_equal(acc, np.arange(40)[:, None] + 0.25 + np.zeros(2))
    assert "sha256 checksums match" in analysis.inspect(d)["integrity"]


def test_format1_corrupt_shard_is_caught_with_sha256(tmp_path):
    shutil.copytree(FORMAT1, tmp_path / "ckpt")
    d = ck.step_dir(tmp_path, 7)
    _flip_byte(d / "shard-0000.h5", _rows_offset(d / "shard-0000.h5"))
    with pytest.raises(ck.CheckpointError, match="shard-0000.h5: sha256 checksum does not match"):
        ck.verify(d)
    assert ck.latest_valid(tmp_path) is None


def test_unknown_checksum_in_a_manifest_is_refused_by_name(tmp_path):
    d, *_ = make_checkpoint(tmp_path, 5, 1)
    with h5py.File(d / ck.MANIFEST, "r+") as f:
        f["shards"].attrs["checksum"] = "md4"
    with pytest.raises(ck.CheckpointError, match="shards/checksum 'md4' is not one this hpcps"):
        ck.verify(d)


def test_write_manifest_refuses_a_digest_field_it_did_not_write(tmp_path):
    """A server of another version replying with a full 32-byte SHA-256 (no zero padding)."""
    with pytest.raises(ck.CheckpointError, match="shard-0000.h5: digest .* is not a xxh3_128"):
        ck.write_manifest(tmp_path, cfg_text="", job_name="t", step=1, epoch=0, step_in_epoch=1,
                          steps_per_epoch=1, n_workers=1, worker_clocks=[1], last_push_seq=[0],
                          shards=[(100, hashlib.sha256(b"x").hexdigest())], partitions={},
                          history=[])
    assert not (tmp_path / ck.MANIFEST).exists()


@settings(max_examples=120, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=5),
       plan_tail=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 6)), max_size=3),
       n_last=st.integers(1, 6), done0=st.integers(0, 6), batch=st.integers(1, 7),
       shuffle=st.booleans())
def test_every_row_read_exactly_once_across_worker_count_changes(sizes, plan_tail, n_last, done0,
                                                                 batch, shuffle):
    """Segments of an epoch on changing worker counts read each row once, all rows overall."""
    plan = [[len(sizes), done0]] + [list(t) for t in plan_tail]
    seen = []
    # rows read by each segment = the first `done` batches of each worker's list
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    lists = [offsets[w] + epoch_order(n, 7, w, 2, shuffle) for w, n in enumerate(sizes)]
    for k, (n_k, done) in enumerate(plan):
        seen += [r[: done * batch] for r in lists]
        lists = epoch_rows(sizes, plan[: k + 1], plan[k + 1][0] if k + 1 < len(plan) else n_last,
                           7, 2, shuffle, batch)
    seen += lists                                         # the last segment reads the rest
    allrows = np.concatenate(seen) if seen else np.empty(0)
    assert sorted(allrows.tolist()) == list(range(sum(sizes)))


@settings(max_examples=120, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=5),
       data=st.data(), batch=st.integers(1, 7), shuffle=st.booleans())
def test_every_row_read_once_when_workers_die_at_different_steps(sizes, data, batch, shuffle):
    """A segment ended by a lost worker: each old worker finished its own number of steps
    (``done`` per worker, as agreed in hpcps.resilience.recovery); the survivors read the rest, once."""
    n = len(sizes)
    done = data.draw(st.lists(st.integers(0, 8), min_size=n, max_size=n))
    n_next = data.draw(st.integers(1, max(1, n)))
    plan = [[n, done]]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    lists = [offsets[w] + epoch_order(m, 7, w, 2, shuffle) for w, m in enumerate(sizes)]
    seen = [r[: d * batch] for r, d in zip(lists, done)]
    seen += epoch_rows(sizes, plan, n_next, 7, 2, shuffle, batch)
    allrows = np.concatenate(seen)
    assert sorted(allrows.tolist()) == list(range(sum(sizes)))
    with pytest.raises(ValueError, match="step counts"):
        epoch_rows(sizes, [[n, done + [0]]], 1, 7, 2, shuffle, batch)
