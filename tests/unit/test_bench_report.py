"""Benchmark reports: ratios against goals, a bound no real measurement can pass."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import benchlib  # noqa: E402

from hpcps.cli.bench import markdown  # noqa: E402


def test_a_ratio_above_its_bound_is_disturbed_not_met():
    """A kernel at 2.31x its bandwidth ceiling (a disturbed ceiling measurement, seen in a
    run on a loaded machine) was marked "met"; it is now neither met nor missed."""
    rep = benchlib.Report("kernels", argv=[])
    bad = rep.ratio("ours / bandwidth ceiling", 2.31, 0.5, headline=True, bound=1.0)
    ok = rep.ratio("ours / bandwidth ceiling, small", 0.71, 0.5, bound=1.0)
    low = rep.ratio("numpy / ours", 1.6, 5)
    assert bad["met"] is None and bad["disturbed"]
    assert ok["met"] is True and not ok["disturbed"]
    assert low["met"] is False
    assert any("2.31 is above 1" in n for n in rep.notes)
    lines = rep.last_line().splitlines()
    assert lines[-1].startswith("ours / bandwidth ceiling: 2.31") and "DISTURBED" in lines[-1]
    assert "numpy / ours: 1.60 (goal >= 5)  MISSED" in lines
    md = markdown({"date": "d", "machine": {}, "load_average_before": [1, 1, 1],
                   "load_average_after": [1, 1, 1], "total_seconds": 1, "quick": False,
                   "reports": [{"name": "kernels", "ratios": rep.ratios, "notes": rep.notes}]})
    assert "| 2.31x | >= 0.5 | disturbed: rerun |" in md
    assert "| 0.71x | >= 0.5 | met |" in md and "| **missed** |" in md


def test_bench_hosts_without_root_reports_na_with_the_reason(tmp_path, monkeypatch, capsys):
    """``hpcps bench``'s ``hosts`` step where the test hosts cannot be made (not root): exit 0,
    its headline ratio n/a with the goal, a note saying why, nothing made."""
    import importlib
    import json
    import os

    bench_hosts = importlib.import_module("bench_hosts")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    out = tmp_path / "hosts.json"
    assert bench_hosts.main(["--quick", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["name"] == "hosts"
    head = [x for x in rep["ratios"] if x["headline"]]
    assert len(head) == 1 and head[0]["value"] is None and head[0]["goal"] == 0.8
    assert head[0]["met"] is None and "across 2 hosts" in head[0]["what"]
    assert any("skipped: the test hosts need root" in n for n in rep["notes"])
    assert "bench_hosts: skipped: the test hosts need root" in capsys.readouterr().out


def test_torch_peer_unique_inverse_matches_torch_unique_across_reused_scratch():
    """bench_torch_ps's linear-time distinct keys (scratch array kept between batches): every
    key once, keys[inv] gives the batch back, stale scratch entries of earlier batches and an
    empty batch do no harm."""
    import pytest

    torch = pytest.importorskip("torch")
    import bench_torch_ps

    uniq = bench_torch_ps.UniqueInverse(1000)
    g = torch.Generator().manual_seed(0)
    for n in (500, 3, 0, 2000):
        k = torch.randint(0, 1000, (n,), generator=g)
        keys, inv = uniq(k)
        assert torch.equal(keys[inv], k)
        assert torch.equal(keys.sort().values, torch.unique(k))


def test_baseline_commit_interpreter_finds_the_commit_and_the_environments_packages(tmp_path):
    """``bench_e2e.py --baseline-commit`` builds and runs the commit under the base
    interpreter of the virtual environment; it had only ``PYTHONPATH`` = the commit, so
    where that interpreter has no numpy or Cython (a pyenv Python under a venv) the build
    failed (``No module named 'Cython'``). Now the environment's site-packages follow the
    commit on its path, and ``hpcps`` is still the commit's, not the editable install's."""
    import os
    import subprocess

    import bench_e2e

    (tmp_path / "hpcps").mkdir()
    (tmp_path / "hpcps" / "__init__.py").write_text("MARK = 'the commit'\n")
    py, env = bench_e2e.base_python(tmp_path)
    code = "import hpcps, numpy, Cython; print(hpcps.MARK)"
    (tmp_path / "run").mkdir()          # not this checkout's directory (sys.path[0] of -c)
    p = subprocess.run([py, "-c", code], env={**os.environ, **env}, cwd=tmp_path / "run",
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "the commit"


def test_only_help_names_every_step_of_the_suite():
    """``hpcps bench --help`` listed the steps by hand and left out ``hashtable`` and
    ``reader`` (added with issues 18 and 19): the list now comes from the suite."""
    import argparse

    from hpcps.cli import bench as cli_bench

    ap = argparse.ArgumentParser()
    cli_bench.register(ap.add_subparsers())
    text = ap._subparsers._group_actions[0].choices["bench"].format_help()
    for name in (s["name"] for s in cli_bench.suite(False, cli_bench.Path("."))):
        assert f" {name} " in " ".join(text.split()) + " ", name


def test_scaling_fits_the_fused_request_per_request_and_per_step():
    """bench_scaling's cost model is fitted to the request a BSP step sends: the calibration
    runs' server CPU per request less the step's (a + K c, paid per worker) and the step's
    own (a_step + K c_step, paid once per step), the fastest repetition of each key count."""
    import bench_scaling

    def run(keys, per_request, per_step, step_ms):
        return {"keys_per_worker_step": keys, "server_cpu_us_per_request": [per_request],
                "server_step_cpu_us": [per_step], "step_ms": step_ms}

    calib = [run(100, 50.0, 20.0, 0.09), run(100, 40.0, 15.0, 0.07),  # fastest: 40 = 25 + 15
             run(1100, 140.0, 45.0, 0.24)]                            # 95 + 45
    f = bench_scaling.fit_fused(calib)
    assert abs(f["a_us"] - 18.0) < 1e-9 and abs(f["c_ns"] - 70.0) < 1e-6
    assert abs(f["a_step_us"] - 12.0) < 1e-9 and abs(f["c_step_ns"] - 30.0) < 1e-6
    # the worker's own: its step less the server's CPU, fastest (30 us at 100 keys, 100 at 1,100)
    assert abs(f["a_worker_us"] - 23.0) < 1e-6 and abs(f["c_worker_ns"] - 70.0) < 1e-6
    assert bench_scaling.fit_fused(calib[:2]) is None              # one key count: no fit



def test_scaling_fits_the_group_collectives_per_key_of_a_member():
    """fit_group: a member's time in the collectives of a group's step, a_group + K c_group
    (the predictions with groups: tests/mpi/test_groups.py, which may import MPI)."""
    import bench_scaling

    group = bench_scaling.fit_group([
        {"members": 2, "keys_per_member": 1000, "member_us_per_step": 30.0},
        {"members": 2, "keys_per_member": 11000, "member_us_per_step": 130.0}])
    assert abs(group["a_group_us"] - 20.0) < 1e-9 and abs(group["c_group_ns"] - 10.0) < 1e-6
    assert bench_scaling.fit_group([{"members": 2, "keys_per_member": 5,
                                     "member_us_per_step": 1.0}]) is None


def test_e2e_summary_keeps_each_runs_epochs_and_names_a_stalled_run():
    """A run far below its row's median (seen once: 38k examples/s among runs of ~500k) is
    printed with the times its epochs ended, so the stall can be placed."""
    import bench_e2e

    def run(eps, ends):
        return {"examples_per_second": eps,
                "epochs": [{"epoch": i, "seconds": t, "test_logloss": 0.4 - 0.05 * i, "test_auc": 0.9}
                           for i, t in enumerate(ends)]}

    runs = [run(500e3, [0.9, 1.8]), run(38e3, [0.9, 23.4]), run(510e3, [0.88, 1.77])]
    row = bench_e2e.summarize(runs, 0.34)
    assert row["epoch_seconds_runs"] == [[0.9, 1.8], [0.9, 23.4], [0.88, 1.77]]
    lines = bench_e2e.stalled_runs({"hpcps BSP": row})
    assert len(lines) == 1 and "run 2 of 3" in lines[0] and "0.90, 23.40 s" in lines[0]
    assert bench_e2e.stalled_runs({"hpcps BSP": bench_e2e.summarize(runs[::2], 0.34)}) == []
