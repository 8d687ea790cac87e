"""MovieLens-100K preparation (hpcps.data.movielens) on the real file and on bad inputs."""

import h5py
import numpy as np
import pytest

from hpcps.data import DataError
from hpcps.data.movielens import prepare_movielens_100k, read_ratings, recbole_copy
from hpcps.data.prepared import file_attrs, read_part


def _recbole():
    try:
        return recbole_copy()
    except DataError as e:
        pytest.skip(f"MovieLens-100K not available: {e}")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    src = _recbole()
    out = tmp_path_factory.mktemp("ml") / "ml.h5"
    return src, prepare_movielens_100k(None, out)


def test_real_file_split_and_attributes(prepared):
    src, info = prepared
    a = file_attrs(info["path"])
    assert a["dataset"] == "movielens-100k" and a["task"] == "regression"
    assert a["source"] == str(src) and a["n_ratings"] == 100_000
    Xtr, ytr = read_part(info["path"], "train", 0, 1)
    Xte, yte = read_part(info["path"], "test", 0, 1)
    assert Xtr.shape == (80_000, 2) and Xte.shape == (20_000, 2)
    assert Xtr.dtype == np.int64 and ytr.dtype == np.float32
    # train indices are contiguous [0, n) and every one of them is used
    assert a["n_users"] == np.unique(Xtr[:, 0]).size == Xtr[:, 0].max() + 1
    assert a["n_items"] == np.unique(Xtr[:, 1]).size == Xtr[:, 1].max() + 1
    assert Xtr.min() == 0
    assert a["global_mean"] == pytest.approx(ytr.astype(np.float64).mean(), rel=1e-6)
    assert (a["rating_min"], a["rating_max"]) == (1.0, 5.0)
    # test-only ids sit above the train range and are counted
    unseen_u, unseen_i = Xte[:, 0] >= a["n_users"], Xte[:, 1] >= a["n_items"]
    assert a["test_rows_unseen_user"] == unseen_u.sum()
    assert a["test_rows_unseen_item"] == unseen_i.sum() > 0      # ML-100K has rare movies
    assert a["test_only_items"] == np.unique(Xte[unseen_i, 1]).size
    assert set(np.unique(Xte[unseen_i, 1])) == set(range(a["n_items"], a["n_items"] + a["test_only_items"]))
    # rows are shuffled (not in file order, not sorted by user)
    assert not (np.diff(Xtr[:, 0]) >= 0).all()


def test_prepared_rows_are_the_file_ratings(prepared):
    """Mapping the indices back to raw ids gives exactly the file's (user, item, rating) rows."""
    src, info = prepared
    users, items, ratings = read_ratings(src)
    Xtr, ytr = read_part(info["path"], "train", 0, 1)
    Xte, yte = read_part(info["path"], "test", 0, 1)

    def vocab(tr, te, n):
        known = np.unique(tr)
        return np.concatenate([known, np.setdiff1d(np.unique(te), known)])

    # raw train ids are the ones the rows with index < n came from: rebuild from the file
    perm = np.random.default_rng(0).permutation(users.size)
    te, tr = perm[:20_000], perm[20_000:]
    uv = vocab(users[tr], users[te], info["n_users"])
    iv = vocab(items[tr], items[te], info["n_items"])
    np.testing.assert_array_equal(uv[Xtr[:, 0]], users[tr])
    np.testing.assert_array_equal(iv[Xte[:, 1]], items[te])
    np.testing.assert_array_equal(ytr, ratings[tr].astype(np.float32))
    got = sorted(zip(uv[np.r_[Xtr[:, 0], Xte[:, 0]]].tolist(), iv[np.r_[Xtr[:, 1], Xte[:, 1]]].tolist(),
                     np.r_[ytr, yte].tolist()))
    assert got == sorted(zip(users.tolist(), items.tolist(), ratings.tolist()))


def test_preparation_is_deterministic_and_seeded(prepared, tmp_path):
    _, info = prepared
    again = prepare_movielens_100k(None, tmp_path / "a.h5")
    other = prepare_movielens_100k(None, tmp_path / "b.h5", seed=1)
    with h5py.File(info["path"]) as f, h5py.File(again["path"]) as g, h5py.File(other["path"]) as h:
        np.testing.assert_array_equal(f["test/X"][:], g["test/X"][:])
        np.testing.assert_array_equal(f["train/y"][:], g["train/y"][:])
        assert not np.array_equal(f["test/y"][:], h["test/y"][:])


def test_u_data_format_and_test_only_ids(tmp_path):
    """GroupLens' headerless u.data; a user and an item that occur only in the test split get
    indices n_users / n_items and are counted."""
    rng = np.random.default_rng(5)
    lines = [f"{u}\t{i}\t{rng.integers(1, 6)}\t88125{u}{i}" for u in (10, 20, 30) for i in (1, 2, 3, 4)]
    lines.append("999\t7777\t4\t881250949")          # the one rating of user 999 and item 7777
    src = tmp_path / "u.data"
    src.write_text("\n".join(lines) + "\n")
    for seed in range(50):                            # a seed that puts that row in the test split
        info = prepare_movielens_100k(src, tmp_path / "x.h5", seed=seed, test_fraction=0.3)
        Xte, _ = read_part(info["path"], "test", 0, 1)
        if info["test_only_users"]:
            break
    assert info["n_ratings"] == 13 and info["n_users"] == 3 and info["test_only_users"] == 1
    assert info["test_only_items"] == 1
    assert info["test_rows_unseen_user"] == info["test_rows_unseen_item"] == 1
    row = Xte[(Xte[:, 0] >= 3)]
    np.testing.assert_array_equal(row, [[3, info["n_items"]]])


@pytest.mark.parametrize("text, match", [
    ("user_id:token\titem_id:token\ttimestamp:float\n1\t2\t3\n", r"x\.inter:1: header has no column 'rating:float'"),
    ("user_id:token\titem_id:token\trating:token\n1\t2\t3\n", r"x\.inter:1: header column 'rating' has type 'token'"),
    ("user\titem\trating\n1\t2\t3\n", r"x\.inter:1: header field 'user' is not 'name:type'"),
    ("user_id:token\titem_id:token\trating:float\n1\t2\t3\n4\t5\n", r"x\.inter:3: 2 tab-separated column"),
    ("user_id:token\titem_id:token\trating:float\n1\t2\t3\n4\t5\tgood\n", r"x\.inter:3: rating 'good' is not a number"),
    ("1\t2\t3\t0\n1\t3\tnan\t0\n", r"x\.inter:2: rating 'nan' is not finite"),
    ("1\t2\t3\t0\n\n1\tb7\t4\t0\n", r"x\.inter:3: user and item ids must be integers"),
    ("1 2 3 0\n", r"x\.inter:1: 1 tab-separated column"),
    ("user_id:token\titem_id:token\trating:float\n", r"x\.inter: no ratings"),
])
def test_bad_input_names_file_and_line(tmp_path, text, match):
    src = tmp_path / "x.inter"
    src.write_text(text)
    with pytest.raises(DataError, match=match):
        prepare_movielens_100k(src, tmp_path / "out.h5")
    assert not (tmp_path / "out.h5").exists()


def test_missing_input_file(tmp_path):
    with pytest.raises(DataError, match="nope.inter: ratings file not found"):
        prepare_movielens_100k(tmp_path / "nope.inter", tmp_path / "out.h5")


def test_cli_prepare_default_out_and_errors(tmp_path, capsys, monkeypatch):
    """``hpcps data prepare movielens-100k`` writes data/movielens-100k.h5 under the current
    directory; a bad --from is one error line and exit status 1."""
    from hpcps.cli.main import main

    _recbole()
    monkeypatch.chdir(tmp_path)
    assert main(["data", "prepare", "movielens-100k"]) == 0
    out = capsys.readouterr().out
    assert "wrote data/movielens-100k.h5" in out and "test_rows_unseen_item = " in out
    assert file_attrs(tmp_path / "data" / "movielens-100k.h5")["n_ratings"] == 100_000
    bad = tmp_path / "bad.inter"
    bad.write_text("1\t2\tfive\t0\n")
    assert main(["data", "prepare", "movielens-100k", "--from", str(bad), "--out", "o.h5"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hpcps data: error: ") and "bad.inter:1: rating 'five'" in err
    assert not (tmp_path / "o.h5").exists()


@pytest.mark.parametrize("header", ["", "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"])
def test_utf8_bom_and_cr_line_endings_read_exactly(tmp_path, header):
    """A UTF-8 byte-order mark made the first field '\\ufeff196' — taken for a header, or a
    header without 'user_id' (issue 21.5 for this reader); CR line ends are line ends."""
    text = header + "196\t242\t3\t881250949\n186\t302\t3.5\t891717742\n"
    (tmp_path / "plain.tsv").write_text(text)
    want = read_ratings(tmp_path / "plain.tsv")
    for name, data in [("bom.tsv", b"\xef\xbb\xbf" + text.encode()),
                       ("mac.tsv", b"\xef\xbb\xbf" + text.replace("\n", "\r").encode())]:
        (tmp_path / name).write_bytes(data)
        got = read_ratings(tmp_path / name)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(want[0], [196, 186])
