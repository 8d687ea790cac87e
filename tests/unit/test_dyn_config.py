"""Dynamic (hash) tables in the job file (issue 18): ``[tables.NAME] storage`` and
``[model] storage``, what they need, and the errors that name the file and the key."""

import numpy as np
import pytest

from hpcps.config import ConfigError, parse_job
from hpcps.config.sections import DYNAMIC_KEYS
from hpcps.models.load import load_model as make_model

SVM = """\
name = "s"
[data]
format = "svmlight"
path = "{d}/train.svm"
test_path = "{d}/test.svm"
index_base = 1
"""


@pytest.fixture
def d(tmp_path):
    (tmp_path / "train.svm").write_text("1 1:1 1099511627000:0.5\n")
    (tmp_path / "test.svm").write_text("0 2:1\n")
    return tmp_path


def parse(d, extra, base=SVM):
    return parse_job(base.format(d=d) + extra, d / "job.toml")


def specs(cfg):
    return {t.name: t for t, _ in make_model(cfg).tables()}


def test_hash_weights_need_no_n_features_and_take_ids_below_2_63(d):
    cfg = parse(d, '[tables.weights]\nstorage = "hash"\n')
    assert cfg.tables["weights"] == {"storage": "hash", "min_count": 0, "ttl_steps": 0,
                                     "max_keys": 0, "evict": "none"}
    assert cfg.data.num_features == DYNAMIC_KEYS == 2**63 - 1
    s = specs(cfg)
    assert s["weights"].dynamic and s["weights"].num_keys == 2**63 - 1
    assert not s["bias"].dynamic


def test_model_level_default_applies_to_sparse_tables_only(d):
    cfg = parse(d, '[model]\nstorage = "hash"\n')
    s = specs(cfg)
    assert s["weights"].dynamic and s["bias"].storage == "array"
    # a per-table section overrides the model default
    cfg = parse(d, 'n_features = 2000000000000\n[model]\nstorage = "hash"\n'
                   '[tables.weights]\nstorage = "array"\n')
    assert not specs(cfg)["weights"].dynamic


def test_fixed_weights_still_need_n_features(d):
    with pytest.raises(ConfigError, match="data.n_features: required key missing") as e:
        parse(d, "")
    assert 'or [model] storage = "hash" for raw ids' in str(e.value)   # the other cure named


@pytest.mark.parametrize("extra, key, words", [
    ('[tables.weights]\nstorage = "hsh"\n', "tables.weights.storage", "did you mean 'hash'"),
    ('[tables.weights]\nstorage = "hash"\nsize = 3\n', "tables.weights.size", "unknown key"),
    ('[tables.weights]\nstorage = "hash"\n[consistency]\npull = "rma"\n',
     "tables.weights.storage", "cannot be read by RMA"),
    ('[model]\nstorage = "hash"\n[consistency]\npull = "rma"\n', "model.storage",
     "cannot be read by RMA"),
    ('[tables.weights]\nstorage = "hash"\n[cluster]\nmode = "allreduce"\n',
     "tables.weights.storage", "needs [cluster] mode = 'ps'"),
    ('[tables.weights]\nstorage = "hash"\n[fault_tolerance]\nmode = "continue"\n',
     "tables.weights.storage", "mode = 'continue'"),
])
def test_bad_storage_names_the_file_and_key(d, extra, key, words):
    with pytest.raises(ConfigError) as e:
        parse(d, extra)
    msg = str(e.value)
    assert str(d / "job.toml") in msg and f"{key}:" in msg and words in msg, msg


def test_unknown_or_dense_table_is_refused_when_the_model_is_built(d):
    cfg = parse(d, 'n_features = 5\n[tables.wieghts]\nstorage = "hash"\n')
    with pytest.raises(ConfigError, match=r"tables.wieghts: no table 'wieghts' in model "
                                          r"'logistic' \(its tables: weights, bias\)"):
        specs(cfg)
    cfg = parse(d, '[tables.weights]\nstorage = "hash"\n[tables.bias]\nstorage = "hash"\n')
    with pytest.raises(ConfigError, match="tables.bias.storage: table 'bias' is dense"):
        specs(cfg)


def test_a_key_outside_the_declared_id_space_names_the_table():
    from hpcps.core.dyntables import HashPartition

    p = HashPartition(3, num_keys=2**63 - 1, name="weights")
    srv, counts, _ = p.route(np.array([0, 2**63 - 2, 5], dtype=np.int64))
    assert counts.sum() == 3
    with pytest.raises(ValueError, match=r"table 'weights': key -1 is outside its id space "
                                         r"\[0, 9223372036854775807\)"):
        p.route(np.array([3, -1], dtype=np.int64))
    with pytest.raises(ValueError, match=r"key 100 is outside .* below n_features"):
        HashPartition(1, num_keys=100, name="w").route(np.array([100]))


def test_admission_and_eviction_keys_reach_the_table_spec(d):
    cfg = parse(d, '[tables.weights]\nstorage = "hash"\nmin_count = 3\nttl_steps = 100\n'
                   'max_keys = 1000\nevict = "lfu"\n')
    w = specs(cfg)["weights"]
    assert (w.min_count, w.ttl_steps, w.max_keys, w.evict) == (3, 100, 1000, "lfu")
    assert specs(parse(d, '[tables.weights]\nstorage = "hash"\n'))["weights"].min_count == 0


@pytest.mark.parametrize("extra, key, words", [
    ('n_features = 9\n[tables.weights]\nmin_count = 3\n', "tables.weights.min_count",
     "only used with storage = 'hash'"),
    ('[tables.weights]\nstorage = "hash"\nevict = "lfu"\n', "tables.weights.evict",
     "set [tables.weights] max_keys"),
    ('[tables.weights]\nstorage = "hash"\nttl_steps = -1\n', "tables.weights.ttl_steps",
     "must be >= 0"),
])
def test_bad_admission_or_eviction_keys(d, extra, key, words):
    with pytest.raises(ConfigError) as e:
        parse(d, extra)
    assert f"{key}:" in str(e.value) and words in str(e.value), str(e.value)


ADULT = """\
name = "a"
[data]
format = "adult_csv"
path = "{d}/adult.csv"
"""

CRITEO = """\
name = "c"
[data]
format = "criteo"
path = "{d}/day.tsv"
test_path = "{d}/day.tsv"
"""


@pytest.mark.parametrize("base", [ADULT, CRITEO], ids=["adult_csv", "criteo"])
def test_hashed_formats_keep_raw_ids_in_a_dynamic_table(d, base):
    (d / "adult.csv").write_text("age,income\n1,>50K\n")
    (d / "day.tsv").write_text("1" + "\t" * 39 + "\n")
    cfg = parse(d, '[model]\nstorage = "hash"\n', base)
    assert cfg.data.hash_bits == 0 and cfg.data.num_features == DYNAMIC_KEYS
    assert specs(cfg)["weights"].dynamic
    # buckets still on request, and the fixed-array default is unchanged
    assert parse(d, 'hash_bits = 22\n[model]\nstorage = "hash"\n', base).data.num_features == 2**22
    assert parse(d, "", base).data.hash_bits == 20
    with pytest.raises(ConfigError, match=r"data.hash_bits: 0 \(unhashed 63-bit feature ids\) "
                                          r"needs a dynamic table"):
        parse(d, "hash_bits = 0\n", base)
