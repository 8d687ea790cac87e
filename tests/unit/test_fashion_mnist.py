"""Tests of hpcps.data.fashion_mnist and ``hpcps data prepare`` on the real Fashion-MNIST files
(Debian package ``dataset-fashion-mnist``), and of the IDX reader's errors on damaged copies."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hpcps.data import DataError
from hpcps.data.fashion_mnist import DEFAULT_SOURCE, FILES, prepare_fashion_mnist, read_idx, read_split
from hpcps.data.prepared import file_attrs, read_part

needs_data = pytest.mark.skipif(
    not (DEFAULT_SOURCE / FILES["train"][0]).exists(),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    if not (DEFAULT_SOURCE / FILES["train"][0]).exists():
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    return prepare_fashion_mnist(DEFAULT_SOURCE, tmp_path_factory.mktemp("fm") / "fm.h5")


@needs_data
def test_prepared_layout_and_content(prepared):
    a = file_attrs(prepared)
    assert (a["dataset"], a["task"], a["n_features"], a["n_classes"]) == (
        "fashion-mnist", "classification", 784, 10)
    assert len(a["source_sha256"]) == 64
    Xtr, ytr = read_part(prepared, "train", 0, 1)
    Xte, yte = read_part(prepared, "test", 0, 1)
    assert Xtr.shape == (60000, 784) and Xtr.dtype == np.uint8 and ytr.dtype == np.int64
    assert Xte.shape == (10000, 784) and yte.dtype == np.int64
    # Fashion-MNIST is balanced: 6000 / 1000 images per class
    assert np.bincount(ytr).tolist() == [6000] * 10
    assert np.bincount(yte).tolist() == [1000] * 10
    # test split in file order, pixels row-major
    src_X, src_y = read_split(DEFAULT_SOURCE, "test")
    np.testing.assert_array_equal(Xte, src_X)
    np.testing.assert_array_equal(yte, src_y)
    img = read_idx(DEFAULT_SOURCE / FILES["test"][0], 3)
    np.testing.assert_array_equal(Xte[7].reshape(28, 28), img[7])
    # train rows are the source rows in the seed-0 permutation (not file order)
    tr_X, tr_y = read_split(DEFAULT_SOURCE, "train")
    perm = np.random.default_rng(0).permutation(60000)
    np.testing.assert_array_equal(ytr, tr_y[perm])
    np.testing.assert_array_equal(Xtr[:50], tr_X[perm[:50]])
    assert not np.array_equal(ytr[:100], tr_y[:100])
    # every block of 4 workers holds every class
    for part in range(4):
        _, y = read_part(prepared, "train", part, 4)
        assert np.bincount(y, minlength=10).min() > 1000


@needs_data
def test_cli_prepare_and_errors(tmp_path):
    out = tmp_path / "sub" / "fm.h5"
    p = subprocess.run([sys.executable, "-m", "hpcps", "data", "prepare", "fashion-mnist",
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "train_rows = 60000" in p.stdout and "test_rows = 10000" in p.stdout and out.is_file()
    p = subprocess.run([sys.executable, "-m", "hpcps", "data", "prepare", "fashion-mnist",
                        "--from", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.h5")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "nowhere: no such directory" in p.stderr
    assert not (tmp_path / "x.h5").exists()


def _copy_source(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for names in FILES.values():
        for n in names:
            shutil.copy(DEFAULT_SOURCE / n, src / n)
    return src


def _write_idx(path, magic: bytes, dims, payload: bytes):
    head = magic + b"".join(int(d).to_bytes(4, "big") for d in dims)
    path.write_bytes(gzip.compress(head + payload))


@needs_data
@pytest.mark.parametrize("damage, message", [
    ("missing", "t10k-labels-idx1-ubyte.gz: cannot read"),
    ("bad_magic", "t10k-labels-idx1-ubyte.gz: bad IDX magic number 0x00000901"),
    ("images_magic", "t10k-labels-idx1-ubyte.gz: bad IDX magic number 0x00000803"),
    ("truncated", "t10k-labels-idx1-ubyte.gz: header says shape (10000,) (10000 bytes of data) "
                  "but the file holds 9999"),
    ("corrupt_gzip", "t10k-labels-idx1-ubyte.gz: corrupt gzip stream"),
    ("short_header", "too short for an IDX header"),
    ("count", "has 10000 images but"),
    ("label", "t10k-labels-idx1-ubyte.gz: item 3 has label 10"),
])
def test_damaged_source_is_an_error_naming_the_file(tmp_path, damage, message):
    src = _copy_source(tmp_path)
    lab = src / FILES["test"][1]
    labels = read_idx(DEFAULT_SOURCE / FILES["test"][1], 1)
    if damage == "missing":
        lab.unlink()
    elif damage == "bad_magic":
        _write_idx(lab, b"\x00\x00\x09\x01", [10000], labels.tobytes())
    elif damage == "images_magic":
        _write_idx(lab, b"\x00\x00\x08\x03", [10000], labels.tobytes())
    elif damage == "truncated":
        _write_idx(lab, b"\x00\x00\x08\x01", [10000], labels.tobytes()[:-1])
    elif damage == "corrupt_gzip":
        raw = bytearray(lab.read_bytes())
        raw[len(raw) // 2: len(raw) // 2 + 64] = b"\xff" * 64
        lab.write_bytes(bytes(raw[:-20]))
    elif damage == "short_header":
        lab.write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00"))
    elif damage == "count":
        _write_idx(lab, b"\x00\x00\x08\x01", [9999], labels.tobytes()[:9999])
    elif damage == "label":
        bad = labels.copy()
        bad[3] = 10
        _write_idx(lab, b"\x00\x00\x08\x01", [10000], bad.tobytes())
    out = tmp_path / "out.h5"
    with pytest.raises(DataError, match="^" + re.escape(str(src))) as e:
        prepare_fashion_mnist(src, out)
    assert message in str(e.value)
    assert not out.exists()


def test_read_idx_uncompressed(tmp_path):
    f = tmp_path / "x-idx3-ubyte"
    data = np.arange(2 * 3 * 4, dtype=np.uint8)
    f.write_bytes(b"\x00\x00\x08\x03" + b"".join(d.to_bytes(4, "big") for d in (2, 3, 4))
                  + data.tobytes())
    np.testing.assert_array_equal(read_idx(f, 3), data.reshape(2, 3, 4))
    with pytest.raises(DataError, match="expected 0x00000801"):
        read_idx(f, 1)
