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


UNKNOWN_WEIGHT = ("tables.weight: no table 'weight' in model 'logistic' (its tables: weights, "
                  "bias; did you mean [tables.weights]?)")


@pytest.mark.parametrize("extra", [
    # found by a trial: "tables.weight.min_count: only used with storage = 'hash'" though
    # [model] storage is 'hash'; the unknown table came only with n_features set
    '[model]\nstorage = "hash"\n[tables.weight]\nmin_count = 2\n',
    'n_features = 9\n[model]\nstorage = "hash"\n[tables.weight]\nmin_count = 2\n',
    # found by a trial: only "data.n_features: required key missing", the typo never named
    '[model]\nstorage = "array"\n[tables.weight]\nstorage = "hash"\n',
    '[tables.weight]\nstorage = "hsh"\nmin_cout = 1\n',
    '[tables]\nweight.storage = "hash"\n',
], ids=["min_count-under-model-hash", "with-n_features", "hash-typo-no-n_features",
        "bad-keys-inside", "dotted"])
def test_a_table_the_model_lacks_is_named_first_with_its_line(d, extra):
    with pytest.raises(ConfigError) as e:
        parse(d, extra)
    text = (SVM.format(d=d) + extra).splitlines()
    line = 1 + next(n for n, t in enumerate(text) if "weight." in t or "tables.weight]" in t)
    assert [str(x) for x in e.value.errors] == [f"{d / 'job.toml'}:{line}: {UNKNOWN_WEIGHT}"]


def test_model_level_storage_applies_to_a_named_table_without_its_own(d):
    """``[model] storage = "hash"`` is the storage of a sparse ``[tables.NAME]`` that sets
    none: its admission keys are taken (a trial got 'only used with storage = hash')."""
    cfg = parse(d, '[model]\nstorage = "hash"\n[tables.weights]\nmin_count = 2\n')
    assert cfg.tables["weights"]["storage"] == "hash"
    w = specs(cfg)["weights"]
    assert w.dynamic and w.min_count == 2
    with pytest.raises(ConfigError) as e:       # fixed: the message says where 'array' is from
        parse(d, 'n_features = 9\n[tables.weights]\nmin_count = 2\n')
    assert e.value.key == "tables.weights.min_count"
    assert "its storage is [model] storage = 'array'" in e.value.message


@pytest.mark.parametrize("extra, key, words", [
    ('[tables.weights]\nstorage = "hash"\n[tables.bias]\nstorage = "hash"\n',
     "tables.bias.storage", "table 'bias' of model 'logistic' is dense"),
    ('[model]\nstorage = "hash"\n[tables.bias]\nmin_count = 2\n', "tables.bias.min_count",
     "table 'bias' of model 'logistic' is dense, always an array"),
    ('[tables]\nstorage = "hash"\n', "tables.storage",
     "[tables] holds one section per table, [tables.NAME] (its tables: weights, bias): set "
     "'storage' in one, or [model] storage for every sparse table"),
    ('[tables.weights]\nmin_cout = 2\n', "tables.weights.min_cout",
     "unknown key (did you mean 'min_count'?)"),
])
def test_a_dense_or_misplaced_table_key_is_a_job_file_error_with_its_line(d, extra, key, words):
    with pytest.raises(ConfigError) as e:
        parse(d, "n_features = 9\n" + extra)
    errs = [x for x in e.value.errors if x.key == key]
    assert errs and words in errs[0].message and errs[0].line > 0, str(e.value)


def test_mlp_tables_follow_hidden(d):
    with pytest.raises(ConfigError) as e:
        parse(d, 'n_features = 9\n[model]\ntype = "mlp"\nhidden = [4]\n[tables.w2]\n')
    assert e.value.key == "tables.w2"
    assert "no table 'w2' in model 'mlp' (its tables: w0, b0, w1, b1)" in e.value.message


def test_builtin_tables_are_the_models_tables(d):
    """What the checker knows of the built-in models' tables is what they declare."""
    from hpcps.models import builtin_tables
    from hpcps.models.mf import MatrixFactorization
    from hpcps.models.mlp import MLP

    def declared(model):
        return {t.name: t.sparse for t, _ in model.tables()}

    cfg = parse(d, "n_features = 9\n")
    assert declared(make_model(cfg)) == builtin_tables("logistic")
    cfg = parse(d, 'n_features = 9\n[model]\ntype = "mlp"\nhidden = [4, 3]\n')
    assert declared(MLP(cfg, sizes=(9, 4, 3, 2))) == builtin_tables("mlp", (4, 3))
    mf = MatrixFactorization.__new__(MatrixFactorization)
    mf.cfg, mf.n_users, mf.n_items = cfg, 3, 4
    assert declared(mf) == builtin_tables("mf")
    assert builtin_tables("mymod:Model") is None


def test_a_user_models_unknown_table_is_refused_when_it_is_built(d):
    """A user model's tables are known once it is built (hpcps run checks it before the
    launch): the name, its tables and the closest one."""
    from hpcps.core.tables import TableSpec
    from hpcps.models.load import apply_storage

    extra = 'n_features = 5\n[model]\ntype = "mymod:Model"\n[tables.wieghts]\nstorage = "hash"\n'
    (d / "job.toml").write_text(SVM.format(d=d) + extra)      # the line is looked up in it
    cfg = parse(d, extra)
    tables = [(TableSpec("weights", 5, 1, "float32"), None),
              (TableSpec("bias", 1, 1, "float32", sparse=False), None)]
    with pytest.raises(ConfigError) as e:
        apply_storage(cfg, tables)
    assert e.value.key == "tables.wieghts" and e.value.line == 10
    assert e.value.message == ("no table 'wieghts' in model 'mymod:Model' (its tables: "
                               "weights, bias; did you mean [tables.weights]?)")


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
