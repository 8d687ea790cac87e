"""``[cluster] mode = "sandblaster"`` and the ``[lbfgs]`` section of job files."""

from pathlib import Path

import pytest

from hpcps.config import ConfigError, LbfgsConfig, check_world, load_job, to_dict
from tests.unit.test_config import ADULT, error, job, jobdir, with_key  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]
SB = with_key(ADULT, "cluster.mode", '"sandblaster"')


def test_defaults_and_values(jobdir):
    cfg = job(jobdir, SB)
    assert cfg.lbfgs == LbfgsConfig()
    assert (cfg.lbfgs.history, cfg.lbfgs.work_units, cfg.lbfgs.wolfe_c1, cfg.lbfgs.wolfe_c2) == (
        10, 64, 1e-4, 0.9)
    text = SB + "\n[lbfgs]\nhistory = 3\ntolerance = 1e-8\nwork_units = 7\nwolfe_c2 = 0.5\n"
    cfg = job(jobdir, text)
    assert (cfg.lbfgs.history, cfg.lbfgs.tolerance, cfg.lbfgs.work_units, cfg.lbfgs.wolfe_c2) == (
        3, 1e-8, 7, 0.5)
    assert to_dict(cfg)["lbfgs"]["history"] == 3


def test_shipped_job():
    cfg = load_job(REPO / "jobs" / "adult_lbfgs.toml")
    assert cfg.cluster.mode == "sandblaster" and cfg.evaluate.sklearn_baseline
    assert cfg.lbfgs.history == 10 and cfg.model.l2 > 0


@pytest.mark.parametrize("key,value,message", [
    ("lbfgs.history", "0", "must be in [1, 1000], got 0"),
    ("lbfgs.history", "1.5", "expected integer, got float 1.5"),
    ("lbfgs.max_iterations", "0", "must be >= 1"),
    ("lbfgs.tolerance", "-1e-6", "must be >= 0"),
    ("lbfgs.work_units", "0", "must be in [1, "),
    ("lbfgs.wolfe_c1", "0.0", "must be in (0, 1)"),
    ("lbfgs.wolfe_c2", "1.0", "must be in (0, 1)"),
    ("lbfgs.line_search_max_evals", "0", "must be in [1, 1000]"),
    ("lbfgs.histroy", "3", "unknown key (did you mean 'history'?)"),
])
def test_bad_values_name_the_key(jobdir, key, value, message):
    e = error(jobdir, with_key(SB, key, value))
    assert e.key == key and message in e.message, str(e)
    assert "x.toml" in str(e)


def test_c2_must_exceed_c1(jobdir):
    e = error(jobdir, SB + "\n[lbfgs]\nwolfe_c1 = 0.5\nwolfe_c2 = 0.4\n")
    assert e.key == "lbfgs.wolfe_c2" and "must be > lbfgs.wolfe_c1 = 0.5" in e.message


def test_lbfgs_section_only_with_sandblaster(jobdir):
    e = error(jobdir, ADULT + "\n[lbfgs]\nhistory = 5\n")
    assert e.key == "lbfgs.history" and "only used with cluster.mode = 'sandblaster'" in e.message
    assert job(jobdir, ADULT + "\n[lbfgs]\n").lbfgs == LbfgsConfig()     # empty table: harmless


def test_sandblaster_requires_the_logistic_model_in_float64(jobdir):
    e = error(jobdir, with_key(SB, "model.type", '"mf"'))
    assert e.key == "model.type" and "logistic model only" in e.message
    e = error(jobdir, with_key(SB, "model.dtype", '"float32"'))
    assert e.key == "model.dtype" and "float64" in e.message
    assert job(jobdir, with_key(SB, "model.dtype", '"float64"')).model.dtype == "float64"


@pytest.mark.parametrize("servers,world,ok", [(1, 3, True), (1, 2, False), (2, 4, True),
                                              (2, 3, False), (3, 10, True)])
def test_check_world_counts_the_coordinator(jobdir, servers, world, ok):
    cfg = job(jobdir, with_key(SB, "cluster.servers", str(servers)))
    if ok:
        assert check_world(cfg, world) is None
    else:
        with pytest.raises(ConfigError) as ei:
            check_world(cfg, world)
        assert ei.value.key == "cluster.servers"
        assert f"at least {servers + 2} MPI ranks, got {world}" in ei.value.message
