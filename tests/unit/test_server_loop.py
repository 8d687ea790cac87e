"""The server rank's polling loop (no MPI: poll and handle are plain functions)."""

import time

import pytest

from hpcps.server import loop as srv


@pytest.mark.parametrize("lowered", [True, False])
def test_idle_spin_is_asked_again_after_each_request(monkeypatch, lowered):
    """A growth that oversubscribes the node lowers idle_spin while the loop runs: the loop
    must use the new value after the request that lowered it (it kept the start value)."""
    sleeps = []
    monkeypatch.setattr(srv.time, "sleep", lambda s: sleeps.append(s))
    spin = {"s": 30.0}                      # would poll without sleeping for 30 s
    msgs = [("grow",)]
    t_end = time.perf_counter() + 0.3

    def handle(_):
        if lowered:
            spin["s"] = 0.0                  # as ParameterServer.add_workers does

    srv.serve_requests(lambda: msgs.pop() if msgs else None, handle,
                       lambda: bool(sleeps) or time.perf_counter() > t_end,
                       lambda: spin["s"])
    assert bool(sleeps) is lowered          # slept at once with the new value; else spun on


def test_float_idle_spin_still_accepted(monkeypatch):
    sleeps = []
    monkeypatch.setattr(srv.time, "sleep", lambda s: sleeps.append(s))
    srv.serve_requests(lambda: None, lambda *_: None, lambda: len(sleeps) >= 3, 0.0)
    assert sleeps[:3] == [srv.IDLE_SLEEP_MIN, 2 * srv.IDLE_SLEEP_MIN, 4 * srv.IDLE_SLEEP_MIN]
