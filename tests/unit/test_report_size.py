"""Sizes and lengths of the printed summary (hpcps.runtime.report, hpcps.analysis.listing)."""

from hpcps.runtime.report import size


def test_a_small_table_is_printed_in_bytes_not_as_zero_megabytes():
    # a dynamic table of 6 keys held 232 B and the summary said "0.0 MB" (a fresh user's trial)
    assert size(232) == "232 B"
    assert size(99_999) == "99,999 B"
    assert size(8_400_000) == "8.4 MB"


def _summary(n_workers, n_servers, hosts=1, age=0):
    """A run summary as metrics.json has it, of ``n_workers`` workers and ``n_servers`` servers
    placed round-robin on ``hosts`` hosts."""
    server = {"rows": 1000, "memory_bytes": 8000, "keys_pulled": 10, "keys_pushed": 10,
              "bytes_out": 2_000_000, "requests": 300, "rss_peak_bytes": 100 << 20}
    return {
        "epochs": 1, "steps": 3, "examples": 100, "train_seconds": 1.0,
        "examples_per_second": 100.0,
        "servers": [dict(server, index=i, bytes_in=1_000_000 + 1000 * i, host=f"n{i % hosts}")
                    for i in range(n_servers)],
        "workers": [{"index": i, "pull_seconds": 0.1, "push_seconds": 0.0, "bytes_pulled": 0,
                     "host": f"n{i % hosts}"} for i in range(n_workers)],
        "checkpoints": {"count": 0},
        "consistency": {"description": "SSP(s=2)", "pull": "p2p", "staleness_unit": "updates",
                        "staleness": {"updates": 0, "mean": 0.0, "max": 0, "counts": []},
                        "workers": [{"index": i, "read_age_max": age * (i == 7),
                                     "lead_max": age * (i == 7), "rma_reads": 0,
                                     "rma_retries": 0} for i in range(n_workers)]},
    }


def test_the_summary_of_thousands_of_workers_stays_short():
    """A trial at 60 workers on 2 cores: the hosts line and the read-age line had an entry per
    rank (at 1,000 workers, lines of tens of kB); many servers had a line each."""
    from hpcps.runtime.report import summary_lines

    small = summary_lines(_summary(4, 2), [])
    # each host's parameter-server bytes (a trial on 3 hosts had to add them up itself)
    assert "  hosts: n0: servers 0-1, workers 0-3 (sent 4.0 MB, received 2.0 MB)" in small
    assert sum(line.startswith("  server ") for line in small) == 2
    assert any("w0 0/0, w1 0/0, w2 0/0, w3 0/0" in line for line in small)
    # a sum over many workers says little alone: the mean per worker and its share of the time
    assert ("  workers: pull wait 0.40 s, push 0.00 s (summed over 4 workers; 0.10 s of pull "
            "wait per worker, 10 % of the training time)") in small

    for n in (60, 1000):
        lines = summary_lines(_summary(n, 20, age=3), [])
        assert max(len(line) for line in lines) < 400, max(lines, key=len)[:300]
        assert any(line.startswith(f"  hosts: n0: servers 0-19, workers 0-{n - 1} (sent ")
                   for line in lines)
        (ages,) = [line for line in lines if "max read age" in line]
        assert f"at most 3/3 over {n} workers; the largest: w7 3/3, w0 0/0" in ages, ages
        (spread,) = [line for line in lines if line.startswith("  servers (20): ")]
        # values that print alike are printed once ("1.0 MB .. 1.0 MB" said nothing)
        assert "received 1.0 MB; sent 2.0 MB; requests 300;" in spread, spread
        # the busiest two servers and the least busy one (received bytes grow with the index)
        assert [line.split(":")[0] for line in lines if line.startswith("  server ")] == \
            ["  server 19", "  server 18", "  server 0"]
    many_hosts = summary_lines(_summary(1000, 20, hosts=100), [])
    (hosts,) = [line for line in many_hosts if line.startswith("  hosts: ")]
    assert hosts.startswith("  hosts: 100; servers per host 0 .. 1 (median 0), workers per host 10;")
    assert "; sent per host 0 B .. 2.0 MB (median 0 B), received 0 B .. 1.0 MB" in hosts


def test_id_ranges_and_spread():
    from hpcps.analysis.listing import id_ranges, spread

    assert id_ranges([3, 0, 1, 2, 7, 9, 10]) == "0-3, 7, 9-10"
    assert id_ranges([5]) == "5" and id_ranges([]) == ""
    assert spread([4, 4]) == "4"
    assert spread([1, 2, 10]) == "1 .. 10 (median 2)"
    assert spread([1.01, 1.02], lambda v: f"{v:.1f}") == "1.0"


def test_inspect_gives_the_spread_of_rows_over_many_servers():
    from hpcps.analysis.inspection import _per_server

    assert _per_server([3, 2]) == "[3, 2]"
    assert _per_server([8192] * 127 + [8193]) == "8,192 .. 8,193 (median 8,192) over 128 servers"


def test_a_resumed_launch_says_its_examples_are_this_launchs():
    from hpcps.runtime.report import summary_lines

    s = _summary(4, 2)
    s.update(run_steps=120, steps=100, examples=1_297_796,
             launches=[{"launch": 1, "resumed_from_step": None},
                       {"launch": 2, "resumed_from_step": 20}])
    assert summary_lines(s, [])[0].startswith(
        "done: 1 epoch(s), 120 steps in all (100 in this launch, resumed at step 20; 2 launches, "
        "0 restart(s)), this launch 1,297,796 examples in 1.0 s")
    assert ", 100 examples in 1.0 s" in summary_lines(_summary(4, 2), [])[0]


def test_the_checkpoint_share_names_its_wall_time_and_the_model_write_is_timed():
    """A trial: 'checkpoints: ... 49.49 s (25.5 % of the run)' was a share of a 194 s wall
    time printed nowhere (the done line gives the 95 s of training), and the 44 s of writing
    model.h5 were reported nowhere."""
    from hpcps.runtime.report import summary_lines

    s = _summary(4, 2)
    s.update(wall_seconds=194.0, checkpoints={"count": 5, "bytes": 3_223_700_000,
                                              "seconds": 49.49, "share_of_run": 49.49 / 194},
             model_path="runs/x/model.h5", model_seconds=44.04, model_bytes=300_000_000)
    lines = summary_lines(s, [])
    assert "  checkpoints: 5 written, 3,223.7 MB, 49.49 s (25.5 % of the launch's 194.0 s)" in lines
    assert "  model: runs/x/model.h5 (300.0 MB, written in 44.0 s)" in lines


def test_an_auc_gap_above_the_jobs_limit_is_warned(monkeypatch):
    """A trial: +0.0168 below scikit-learn's AUC at 40 BSP workers (limit 0.005) passed in
    silence; the summary now warns and says why more workers can cost quality."""
    from hpcps.runtime.report import summary_lines

    s = _summary(4, 2)
    base = {"test_auc": 0.9067, "test_logloss": 0.3, "test_accuracy": 0.85, "C": 1.0,
            "seconds": 1.0, "max_auc_gap": 0.005}
    for gap, warned in ((0.0168, True), (0.005, False), (-0.001, False)):
        s["baseline"] = dict(base, auc_gap=gap)
        lines = summary_lines(s, [])
        got = [ln for ln in lines if ln.startswith("  warning: the AUC gap")]
        assert bool(got) == warned, (gap, lines)
    s["baseline"] = dict(base, auc_gap=0.0168)
    (w,) = [ln for ln in summary_lines(s, []) if ln.startswith("  warning: the AUC gap")]
    assert "above [evaluate] max_auc_gap = 0.005; under BSP a step averages" in w
    # a review: an async run's warning said "under BSP" too (the consistency record's
    # own lines are not what is tested here)
    from hpcps.analysis import consistency_report
    monkeypatch.setattr(consistency_report, "lines", lambda c: [])
    for model, says, not_says in (("async", "under async every worker pushes gradients", "BSP a step"),
                                  ("ssp", "under SSP a step averages", "under async")):
        s["consistency"] = {"model": model}
        (w,) = [ln for ln in summary_lines(s, []) if ln.startswith("  warning: the AUC gap")]
        assert says in w and not_says not in w, (model, w)


def test_the_test_metrics_of_other_models_are_labelled_as_in_the_plots():
    """A trial: the MLP's summary read "test logloss" where the others say "log-loss"."""
    from hpcps.runtime.report import summary_lines

    lines = summary_lines(_summary(4, 2), [{"epoch": 1, "test_logloss": 0.35,
                                            "test_accuracy": 0.85, "test_rows": 10}])
    assert "  hpcps  test log-loss 0.3500  accuracy 0.8500" in lines, lines


def test_servers_without_a_row_are_named_at_start():
    """A trial: 3 features on 8 servers ran with servers 3-7 holding nothing, unsaid."""
    from types import SimpleNamespace

    from hpcps.core.routing import Routing
    from hpcps.core.tables import TableSpec
    from hpcps.worker.banner import _empty_servers

    def client(n_keys, n_servers, storage="array"):
        specs = [TableSpec("weights", n_keys, 1, "float32", storage=storage),
                 TableSpec("bias", 1, 1, "float32", sparse=False)]
        return SimpleNamespace(specs=specs, n_servers=n_servers, routing=Routing(specs, n_servers))

    assert _empty_servers(client(3, 8)) == [3, 4, 5, 6, 7]
    assert _empty_servers(client(1 << 20, 8)) == []
    assert _empty_servers(client(3, 3)) == []
    assert _empty_servers(SimpleNamespace(specs=[], n_servers=0)) == []     # AllReduce
