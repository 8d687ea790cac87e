"""The chief's progress line across a re-plan (hpcps.worker.progress). A trial (continue mode,
elastic growth from 2 to 4 workers at clock 1500 of a 3-epoch run of 1,200 steps per epoch)
printed after the growth::

    epoch 2/3  step 1/450  clock 1501  9,676 examples/s  ...  ETA 0:00:00

the step restarted at 1 of the rest of the epoch's steps, the rate counted the 1,500 clocks
of 2 workers at the examples per clock of 4 (twice the examples read), and the ETA took the
4 workers' 600 steps per epoch for the whole run (1,800 < clock 1,501: 0:00:00 to the end)."""

from types import SimpleNamespace

from hpcps.worker.progress import ProgressMeter, epoch_position


def test_the_step_of_the_epoch_and_the_steps_left_count_the_segments_before_a_replan():
    # epoch 2 of 3: 300 steps on 2 workers, then the re-planned rest (450 steps on 4)
    cur = SimpleNamespace(epoch=1, plan=[[2, 300]], steps=450)
    assert epoch_position(cur, 0, 600, 3) == (301, 750, 449 + 600)
    assert epoch_position(cur, 449, 600, 3) == (750, 750, 600)
    # a recovery's plan segment records every worker's steps done: the most of them counts
    cur = SimpleNamespace(epoch=0, plan=[[3, [21, 20, 21]]], steps=100)
    assert epoch_position(cur, 9, 150, 2) == (31, 121, 90 + 150)
    # no re-plan: the segment is the epoch
    assert epoch_position(SimpleNamespace(epoch=2, plan=[], steps=600), 99, 600, 3) == \
        (100, 600, 500)


def test_rate_and_eta_stay_meaningful_across_a_growth():
    # 2 workers, 8 examples per clock, 1,000 clocks/s; 4 workers from clock 1500: 16 per clock
    m = ProgressMeter(8)
    m.stepped(1.0, 1)                      # the first step ends at 1 s
    m.stepped(2.5, 1501 - 1)
    m.replan(1500, 16)                     # the growth's pause: 2 s
    m.stepped(4.5, 1501)
    # one step after the re-plan: the run's average (12,000 examples in 3.5 s); the ETA at
    # the whole run's pace (1,500 clocks in 3.5 s) for the 1,049 steps left
    head, tail = m.speed(4.5, 0.0, 1501, 1049)
    assert head == f"{(1499 * 8 + 16) / 3.5:,.0f} examples/s", head
    assert tail == f"  ETA 0:00:0{int(3.5 / 1500 * 1049)}", tail
    # 500 clocks later at 1,000 clocks/s: the rate since the re-plan is the 4 workers'
    # 16,000 examples/s, and the ETA of the 549 steps left takes their pace (0.55 s), not the
    # run's with the pause
    head, tail = m.speed(5.0, 0.0, 2001, 549)
    assert head == (f"{(1499 * 8 + 501 * 16) / 4.0:,.0f} examples/s (16,000 since the "
                    "re-plan at clock 1,500)"), head
    assert tail == "  ETA 0:00:00", tail
    head, tail = m.speed(5.0, 0.0, 2001, 60_000)
    assert tail == "  ETA 0:01:00", tail
    assert m.examples(2001) == 1499 * 8 + 501 * 16


def test_a_replan_before_the_first_step_only_sets_the_rate():
    m = ProgressMeter(8)
    m.replan(40, 16)                      # an added worker adopts its segment first
    assert m.first is None and m.replanned_at is None
    m.stepped(1.0, 41)
    m.stepped(2.0, 141)
    assert m.speed(2.0, 0.0, 141, 100) == ("1,600 examples/s", "  ETA 0:00:01")
