"""The polling loop of a server rank (no MPI of its own: ``poll`` and ``handle`` are the
endpoint's) and the agreement on a growth its workers asked for."""

from __future__ import annotations

import time

#: Idle back-off of the server loop, seconds (doubles from MIN to MAX while no request waits).
IDLE_SLEEP_MIN = 2e-6
IDLE_SLEEP_MAX = 2e-4
#: Seconds the idle loop keeps polling without sleeping after a request, when the node's
#: cores are oversubscribed (or the launcher did not say) ...
IDLE_SPIN = 5e-5
#: ... and when each rank has a core of its own: poll like a blocking MPI receive does (a
#: sleeping server is woken late, ~60 us at best and milliseconds on a loaded node).
IDLE_SPIN_DEDICATED = 1.0


def serve_requests(poll, handle, finished, idle_spin, recover=None, recoverable=None,
                   busy=None) -> None:
    """The polling loop of a server rank: ``handle(*poll())`` until ``finished()``. Local.
    A poll that returns ``(source, None)`` answered its request itself (and counted it in
    ``busy``).

    ``busy``, a list ``[requests, seconds, cpu seconds]`` (benchmarks), is increased by the
    requests handled and the wall-clock and CPU seconds of this thread spent in ``handle``
    (the server's own time per request, idle polling excluded; the CPU time leaves out the
    time other processes held the core).

    When no request waits it keeps polling for ``idle_spin`` seconds after the last one, then
    sleeps with a back-off doubling from ``IDLE_SLEEP_MIN`` to ``IDLE_SLEEP_MAX``.
    ``idle_spin`` is a float, or a function returning it, asked again after each request (a
    growth that oversubscribes the node lowers it while the loop runs). With
    ``recover``, an exception for which ``recoverable(e)`` is true (an MPI error from a failed
    or revoked peer, :func:`hpcps.comm.ft.is_peer_failure`) calls ``recover()`` (collective
    over the survivors) and the loop goes on; every other exception propagates.
    """
    sleep = IDLE_SLEEP_MIN
    last = time.perf_counter()
    spin_of = idle_spin if callable(idle_spin) else None
    spin = spin_of() if spin_of else float(idle_spin)
    while True:
        try:
            if finished():
                return
            msg = poll()
            if msg is None:
                if time.perf_counter() - last < spin:
                    continue
                time.sleep(sleep)
                sleep = min(sleep * 2, IDLE_SLEEP_MAX)
                continue
            sleep = IDLE_SLEEP_MIN
            if len(msg) == 2 and msg[1] is None:    # answered by poll (ServerEndpoint.poll)
                last = time.perf_counter()
            elif busy is None:
                handle(*msg)
                last = time.perf_counter()
            else:
                t0, c0 = time.perf_counter(), time.thread_time()
                handle(*msg)
                c1, last = time.thread_time(), time.perf_counter()
                busy[0] += 1
                busy[1] += last - t0
                busy[2] += c1 - c0
            if spin_of is not None:
                spin = spin_of()
        except Exception as e:           # noqa: BLE001 - only a peer failure is recovered
            if recover is None:
                raise
            if recoverable is None or not recoverable(e):
                raise
            recover()


def pull_lag(policy):
    """``lag`` such that a pull made at clock ``c`` is ready under ``policy`` exactly when the
    visible clock is ``>= c - lag`` (BSP: 0, SSP: its bound, async: any clock), or None
    when its ``read_floor`` is not of that form (the loop then asks ``ParameterServer._pull_ready``).
    Local."""
    f0, f1 = policy.read_floor(0), policy.read_floor(1000)
    if f0 == f1 == -1:                  # any visible clock (>= 0) will do
        return 1 << 62
    if f1 - f0 == 1000 and f0 <= 0:
        return -f0
    return None


def agreed_growth(asks: set, who: str) -> tuple[int, int, int]:
    """The one ``(workers to add, oversubscribe, clock)`` every worker's GROW asked for."""
    if len(asks) != 1:
        raise RuntimeError(f"{who}: workers disagree on the growth: {sorted(asks)}")
    return next(iter(asks))
