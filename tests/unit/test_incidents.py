"""The summary's lines about what a run went through (hpcps.runtime.incidents): a scale trial
(24-48 ranks, continue mode, replicas 2, elastic growth) printed its lost ranks and growths
when they happened, and the end-of-run summary repeated none of them: in a long log the last
screen did not tell that the run had lost a server or grown from 8 to 16 workers."""

from tests.unit.test_report_size import _summary

WORKER_LOST = {"time": 1.0, "epoch": 1, "failed_ranks": [1], "failed_hosts": ["n1"],
               "dead_workers": [1], "dead_servers": [], "examples_reassigned": 2560,
               "survivors": 7, "clock": 21, "recovery_seconds": 0.122, "gap_seconds": 0.21}
SERVER_LOST = {"time": 2.0, "epoch": 2, "failed_ranks": [12, 13], "failed_hosts": ["n3"],
               "dead_workers": [], "dead_servers": [1, 2], "ranges_moved": {"2": 3, "1": 0},
               "ranges_reloaded": [], "reload_step": None, "lost_steps": {},
               "examples_reassigned": 0, "survivors": 7, "clock": 1031,
               "recovery_seconds": 0.012, "gap_seconds": 0.034}
RELOADED = {"epoch": 2, "failed_ranks": [9], "failed_hosts": ["n2"], "dead_workers": [],
            "dead_servers": [0], "ranges_moved": {}, "ranges_reloaded": [0], "reload_step": 40,
            "lost_steps": {"0": 10}, "clock": 50, "recovery_seconds": 1.5}
GROWN = {"clock": 60, "epoch": 1, "workers_requested": 8, "trigger": "job file",
         "spawn_seconds": 1.457, "workers_added": 8, "workers": 16, "workers_before": 8,
         "seconds": 2.279, "pause_seconds": 2.53}


def test_the_summary_repeats_the_failures_and_growths_after_the_done_line():
    from hpcps.runtime.report import summary_lines

    s = _summary(8, 4)
    s.update(failures=[WORKER_LOST, SERVER_LOST, RELOADED], replicas=2,
             growth=[GROWN, {"clock": 900, "workers_requested": 2, "trigger": "request",
                             "refused": "MPI_Comm_spawn of 2 process(es) failed"}])
    lines = summary_lines(s, [])
    assert lines[0].startswith("done: ")
    assert lines[1:9] == [
        "  failures: 3 survived (continue mode, 2 copies of each key range; metrics.json "
        "summary.failures)",
        "    clock 21 (epoch 1): worker 1 lost (rank 1, on n1); 7 worker(s) continue, 2,560 "
        "unread example(s) of the epoch reassigned; recovered in 0.12 s, training paused 0.21 s",
        "    clock 1,031 (epoch 2): servers 1-2 lost (ranks 12-13, on n3); key range 1 taken "
        "over by server 0 (its backup copy); key range 2 taken over by server 3 (its backup "
        "copy); recovered in 0.01 s, training paused 0.03 s",
        "    clock 50 (epoch 2): server 0 lost (rank 9, on n2); key range 0 reloaded from "
        "checkpoint step 40, 10 steps of its updates lost; recovered in 1.50 s",
        "  growth: 1 growth, workers 8 -> 16, 1 refused (metrics.json summary.growth)",
        "    clock 60 (epoch 1): 8 worker(s) added ([elastic] at_step): 8 -> 16 workers; "
        "pause 2.53 s (spawn 1.46 s)",
        "    clock 900: 2 worker(s) requested (hpcps grow); refused: MPI_Comm_spawn of 2 "
        "process(es) failed",
        "  server 0: 1,000 rows (8,000 B, peak RSS 100 MiB); received 1.0 MB (pushes and pull "
        "requests; 10 keys pushed), sent 2.0 MB (10 keys pulled), 300 requests"]


def test_a_run_without_events_has_no_such_lines():
    from hpcps.runtime.report import summary_lines

    lines = summary_lines(_summary(4, 2), [])
    assert lines[1].startswith("  server 0: ")
    assert not any(w in "".join(lines) for w in ("failures:", "growth:", "launches:"))
    one = dict(_summary(4, 2), launches=[{"launch": 1, "resumed_from_step": None}])
    assert summary_lines(one, [])[1].startswith("  server 0: ")


def test_growth_records_of_before_workers_before_and_a_worker_lost_at_once():
    from hpcps.runtime.incidents import incident_lines

    old = {k: v for k, v in GROWN.items() if k != "workers_before"}     # an earlier launch's
    at_once = dict(GROWN, clock=300, workers_before=16, workers_added=8, workers=23,
                   trigger="request")
    lines = incident_lines({"growth": [old, at_once]})
    assert lines[0] == "  growth: 2 growths, workers 8 -> 16 -> 23 (metrics.json summary.growth)"
    assert lines[2] == ("    clock 300 (epoch 1): 8 worker(s) added (hpcps grow): 16 -> 23 "
                        "workers (1 lost at once); pause 2.53 s (spawn 1.46 s)")


def test_many_failures_and_growths_are_one_spread_line_each():
    from hpcps.runtime.incidents import incident_lines

    failures = [dict(WORKER_LOST, dead_workers=[w], failed_ranks=[w], failed_hosts=[f"n{w}"],
                     clock=10 * w, recovery_seconds=0.1 * w, gap_seconds=0.2 * w)
                for w in range(1, 41)] + [SERVER_LOST, RELOADED]
    growth = [dict(GROWN, clock=100 * i, workers_before=8 * i, workers=8 * (i + 1))
              for i in range(1, 13)]
    lines = incident_lines({"failures": failures, "growth": growth, "replicas": 2})
    assert len(lines) == 2 and max(map(len, lines)) < 500, lines
    assert lines[0] == (
        "  failures: 42 survived (continue mode, 2 copies of each key range; metrics.json "
        "summary.failures); lost 40 workers (1-40), 3 servers (0-2) on 40 hosts; clocks "
        "10 .. 1,031 (median 205); recovery 0.01 .. 4.00 s (median 1.95), training paused "
        "0.03 .. 8.00 s (median 4.00); 102,400 examples reassigned; key ranges taken over "
        "by a backup 2; reloaded from a checkpoint 1 (10 steps of updates lost)")
    assert lines[1] == ("  growth: 12 growths (metrics.json summary.growth); workers 8 -> 104, "
                        "96 added at clocks 100 .. 1,200 (median 650); pause 2.53 s (in all "
                        "30.36 s)")


def test_the_launches_of_a_restarted_run():
    from hpcps.runtime.incidents import incident_lines

    launches = [{"launch": 1, "started": "2026-12-05T19:49:53+00:00", "resumed_from_step": None,
                 "steps_kept": 600},
                {"launch": 2, "started": "2026-12-05T19:52:10+00:00", "resumed_from_step": 600,
                 "restart": 1, "after_status": 1, "steps_kept": 400},
                {"launch": 3, "started": "2026-12-05T19:55:00+00:00", "resumed_from_step": 1000,
                 "restart": 2, "after_status": 137, "steps": 200}]
    assert incident_lines({"launches": launches}) == [
        "  launches: 3 (2 restarts by hpcps run --max-restarts; metrics.json summary.launches)",
        "    launch 1 started 2026-12-05 19:49:53 UTC, from step 0; 600 steps of it kept by "
        "the next",
        "    launch 2 started 2026-12-05 19:52:10 UTC: restart 1 after exit status 1, resumed "
        "at step 600; 400 steps of it kept by the next",
        "    launch 3 started 2026-12-05 19:55:00 UTC: restart 2 after exit status 137, "
        "resumed at step 1,000 (this launch)"]
    # resumed by hand (no restart), from a checkpoint written before launches were kept
    resumed = [{"launch": 1, "resumed_from_step": None, "steps_kept": 280},
               {"launch": 2, "started": "2026-12-05T20:00:00+00:00", "resumed_from_step": 280}]
    assert incident_lines({"launches": resumed}) == [
        "  launches: 2 (metrics.json summary.launches)",
        "    launch 1, from step 0; 280 steps of it kept by the next",
        "    launch 2 started 2026-12-05 20:00:00 UTC, resumed at step 280 (this launch)"]
    many = [dict(launches[1], launch=i, resumed_from_step=100 * i, steps_kept=100)
            for i in range(1, 12)]
    (line,) = incident_lines({"launches": many})
    assert line == ("  launches: 11 (11 restarts by hpcps run --max-restarts; metrics.json "
                    "summary.launches): exit status(es) 1; steps kept per launch 100; the last "
                    "resumed at step 1,100")
