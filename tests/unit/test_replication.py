"""Key ranges on a ring of servers, the recovery plan and the ``[fault_tolerance]`` keys (no
MPI: the pure parts of hpcps.core.placement, hpcps.resilience.recovery and hpcps.resilience.replica)."""

import numpy as np
import pytest

from hpcps.config import ConfigError, load_job
from hpcps.core.placement import chain, chains, ring_from
from hpcps.resilience.plan import Plan, ServerReport, WorkerReport, make_plan, report_row
from hpcps.server.shard import touched_rows

JOB = """\
name = "t"
[cluster]
servers = {servers}
[data]
format = "adult_csv"
path = "adult.csv"
[consistency]
model = "{model}"
[fault_tolerance]
{ft}
"""


def load(tmp_path, ft, servers=3, model="bsp"):
    (tmp_path / "adult.csv").write_text("39, State-gov, 77516\n")
    p = tmp_path / "job.toml"
    p.write_text(JOB.format(servers=servers, model=model, ft=ft))
    return load_job(p)


# ------------------------------------------------------------------------------ config


def test_fault_tolerance_defaults(tmp_path):
    f = load(tmp_path, 'mode = "continue"').fault_tolerance
    assert (f.mode, f.replicas, f.on_server_loss) == ("continue", 1, "reload")
    f = load(tmp_path, 'mode = "continue"\nreplicas = 2').fault_tolerance
    assert f.replicas == 2
    # async cannot resume a range at a clock: its lost range restarts the job
    assert load(tmp_path, 'mode = "continue"', model="async").fault_tolerance.on_server_loss == "restart"


@pytest.mark.parametrize("ft, key, words", [
    ('mode = "restart"\nreplicas = 2', "fault_tolerance.replicas", "only used with"),
    ('on_server_loss = "restart"', "fault_tolerance.on_server_loss", "only used with"),
    ('mode = "continue"\nreplicas = 3', "fault_tolerance.replicas", "must be in [1, 2], got 3"),
    ('mode = "continue"\nreplicas = 0', "fault_tolerance.replicas", "must be in [1, 2], got 0"),
    ('mode = "continue"\nreplicas = "2"', "fault_tolerance.replicas", "expected integer"),
    ('mode = "continue"\non_server_loss = "reloda"', "fault_tolerance.on_server_loss", "reload"),
])
def test_fault_tolerance_bad_values_name_file_and_key(tmp_path, ft, key, words):
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, ft)
    msg = str(ei.value)
    assert "job.toml" in msg and key in msg and words in msg, msg


def test_two_replicas_need_two_servers_and_bsp_or_ssp(tmp_path):
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, 'mode = "continue"\nreplicas = 2', servers=1)
    assert "fault_tolerance.replicas" in str(ei.value) and "at least 2 servers" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, 'mode = "continue"\nreplicas = 2', model="async")
    assert "'bsp' or 'ssp'" in str(ei.value)
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, 'mode = "continue"\non_server_loss = "reload"', model="async")
    assert "fault_tolerance.on_server_loss" in str(ei.value)
    assert load(tmp_path, 'mode = "continue"\nreplicas = 2', model="ssp").fault_tolerance.replicas == 2


# ---------------------------------------------------------------------------- placement


def test_ring_and_chains_all_alive():
    assert ring_from(2, range(4), 4) == [2, 3, 0, 1]
    assert chains(range(4), 4, 2) == [[0, 1], [1, 2], [2, 3], [3, 0]]
    assert chains(range(3), 3, 1) == [[0], [1], [2]]


def test_dead_primary_moves_to_its_backup_and_a_new_backup_is_named():
    # server 1 dies: range 1 goes to its backup 2 (which now backs up to 0); range 0 (backed up
    # by 1) gets 2 as its new backup
    holders = [[0, 1], [2], [2, 0]]       # who holds a copy of each range after the loss
    assert chains([0, 2], 3, 2, holders) == [[0, 2], [2, 0], [2, 0]]


def test_two_failures_in_a_row_keep_a_copy_whenever_one_chain_member_survives():
    # after server 1 died (above), server 2 dies too: only server 0 is left, holding 0 and 1's
    # copies it was given; each range keeps one copy and has no backup
    holders = [[0], [0], [0]]
    assert chains([0], 3, 2, holders) == [[0], [0], [0]]


def test_primary_is_the_first_holder_going_round_the_ring():
    # range 0's home (0) is alive but holds no copy (its copy was reloaded elsewhere): the
    # holder becomes primary, nothing travels before the range is served
    assert chain(0, [0, 1, 2], 3, 2, holders=[1]) == [1, 2]
    assert chain(0, [0, 1, 2], 3, 2, holders=[]) == [0, 1]      # no copy: reload at home


def test_chain_errors():
    with pytest.raises(ValueError, match="replicas"):
        chain(0, [0], 1, 0)
    with pytest.raises(ValueError, match="outside"):
        chain(3, [0], 3, 1)
    assert chain(0, [], 3, 2) == []


# -------------------------------------------------------------------------- recovery plan


def rows(reports, n_ranges, n_old):
    return np.stack([report_row(r, n_ranges, n_old) for r in reports])


def test_plan_backup_takes_over_workers_resend_nothing_lost():
    # 3 servers, server 1 died; 2 workers (old indices 0, 1) at clocks 41 and 40
    r = rows([WorkerReport(41, np.array([40, 40, 40]), epochs=0),
              WorkerReport(40, np.array([39, 40, 39]), epochs=0),
              ServerReport(0, np.array([40, -1, 40]), np.array([41, 40]), np.array([96, 96])),
              ServerReport(2, np.array([-1, 40, 40]), np.array([40, 40]), np.array([96, 96]))],
             3, 2)
    plan = make_plan(r, 3, 2, 2, old_ids=[0, 1, 2], worker_old_index=[0, 1, -1, -1])
    assert plan.alive_ids == [0, 2] and plan.dead_ids == [1]
    assert plan.chains == [[0, 2], [2, 0], [2, 0]] and plan.lost_ranges == []
    assert plan.resend
    # a worker's own clock counts when no server got its last CLOCK
    assert plan.clocks.tolist() == [41, 40]
    assert plan.source_clock.tolist() == [40, 40, 40]
    assert plan.base().tolist() == [40, 40, 40] and plan.lost_steps().tolist() == [0, 0, 0]


def test_plan_reload_counts_the_steps_between_checkpoint_and_resend():
    # replicas = 1: server 1 died with range 1; the workers kept range 1's pushes from step 50
    r = rows([WorkerReport(50, np.array([50, 50, 50]), epochs=1),
              WorkerReport(51, np.array([50, 50, 51]), epochs=0),
              ServerReport(0, np.array([50, -1, -1]), np.array([50, 51]), np.array([96, 96])),
              ServerReport(2, np.array([-1, -1, 51]), np.array([50, 51]), np.array([96, 96]))],
             3, 2)
    plan = make_plan(r, 3, 1, 2, old_ids=[0, 1, 2], worker_old_index=[0, 1, -1, -1])
    assert plan.lost_ranges == [1] and plan.chains[1] == [2]
    assert plan.epochs == 1                    # one worker passed the epoch's closing barrier
    assert plan.base(40).tolist() == [50, 50, 51]
    assert plan.lost_steps(40).tolist() == [0, 10, 0]
    # a checkpoint newer than every kept step loses nothing: the workers resend from it
    assert plan.base(60)[1] == 60 and plan.lost_steps(60)[1] == 0


def test_plan_without_kept_pushes_uses_server_counts_only():
    # async: workers keep nothing; a worker's own clock does not count
    r = rows([WorkerReport(12, None), ServerReport(0, np.array([5]), np.array([10]),
                                                   np.array([7]))], 1, 1)
    plan = make_plan(r, 1, 1, 1, old_ids=[0], worker_old_index=[0, -1])
    assert not plan.resend and plan.clocks.tolist() == [10] and plan.examples.tolist() == [7]


def test_plan_is_a_dataclass_of_plain_values():
    p = Plan(alive_ids=[0], dead_ids=[], chains=[[0]], holders=[{0: 3}],
             source_clock=np.array([3]), kept=np.array([2]), clocks=np.array([3]),
             examples=np.array([1]), lost_ranges=[], resend=True)
    assert p.base().tolist() == [3] and p.epochs == 0


# -------------------------------------------------------------------------- replication


@pytest.mark.parametrize("n_rows", [10, 1000])
def test_touched_rows_distinct_ascending(n_rows):
    rows_ = np.array([7, 3, 3, 9, 0, 7], dtype=np.int64)
    out = touched_rows(rows_, n_rows)
    assert out.dtype == np.int64 and out.tolist() == [0, 3, 7, 9]


def test_a_lost_range_under_async_does_not_blame_the_job_file():
    """A trial: a server killed under async stopped every rank with "... ([fault_tolerance]
    on_server_loss = 'restart')" for a job that never set it (async's only choice)."""
    from types import SimpleNamespace

    from hpcps.resilience.plan import lost_message

    plan = SimpleNamespace(dead_ids=[1], lost_ranges=[1])
    text = lost_message("restart", plan, [5])
    assert ("server 1 (rank(s) 5) died and key range(s) 1 have no surviving copy "
            "([fault_tolerance] on_server_loss = 'restart', the job file's or, under async, "
            "the only choice)") in text
    assert "(no server survived)" in lost_message("reload", plan, [5])
