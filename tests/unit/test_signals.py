"""Stop requests by signal (hpcps.core.signals), in this process: no MPI."""

import os
import signal
import time

from hpcps.core.signals import StopRequest


def _deliver(sig):
    os.kill(os.getpid(), sig)
    time.sleep(0.05)             # the handler runs in the main thread between bytecodes


def test_sigterm_and_sigusr1_request_a_stop_and_restore_puts_back_the_handlers():
    before = signal.getsignal(signal.SIGTERM)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        stop = StopRequest().install()
        try:
            assert not stop.requested
            _deliver(sig)
            assert stop.requested and stop.signum == sig and stop.name == sig.name
        finally:
            stop.restore()
    assert signal.getsignal(signal.SIGTERM) is before


def test_added_worker_ignores_sigterm_but_stops_on_sigusr1():
    """An added worker (hpcps join) ignores SIGTERM: Open MPI's runtime sends it to the spawned
    job's other processes when one of them dies, and in continue mode that is no stop request
    (before the fix the whole job stopped with exit 75)."""
    stop = StopRequest().install(ignore_sigterm=True)
    try:
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        _deliver(signal.SIGTERM)                    # alive, and no stop requested
        assert not stop.requested
        _deliver(signal.SIGUSR1)
        assert stop.requested and stop.signum == signal.SIGUSR1
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGTERM) != signal.SIG_IGN
