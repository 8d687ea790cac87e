"""hpcps.core.procs.exit_after: the deadline an added worker (hpcps join) sets before MPI_Init
(issue 22.1), in real child processes."""

import subprocess
import sys
import time

from tests.helpers import ROOT

PRELUDE = ("import sys, time; sys.path.insert(0, %r); from hpcps.core.procs import exit_after; "
           % str(ROOT))


def _run(body: str, timeout=60):
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", PRELUDE + body], capture_output=True, text=True,
                       timeout=timeout)
    return p, time.perf_counter() - t0


def test_deadline_ends_the_process_with_its_message():
    p, secs = _run("exit_after(0.5, 'not joined in time'); time.sleep(30)")
    assert p.returncode == 1, p.stderr
    assert "not joined in time" in p.stderr and "pid" in p.stderr
    assert secs < 15


def test_cancelled_deadline_lets_the_process_finish():
    p, _ = _run("d = exit_after(0.5, 'x'); d.cancel(); time.sleep(3); print('done')")
    assert p.returncode == 0 and p.stdout.strip() == "done", p.stderr


def test_backstop_ends_a_process_whose_main_thread_holds_the_gil():
    # sum over a range runs in C without letting the GIL go, as MPI_Init does under mpi4py:
    # the timer thread cannot run, faulthandler's C thread ends the process
    p, secs = _run("exit_after(0.5, 'not joined in time'); sum(range(10**13))")
    assert p.returncode == 1, p.stderr
    assert "Timeout" in p.stderr and "not joined in time" not in p.stderr
    assert secs < 20


def test_set_timer_slack_sets_the_calling_threads_slack():
    """The ranks' waits sleep between polls when cores are shared; their timer slack is set
    (hpcps.comm.core.WAIT_TIMER_SLACK_NS) so that short sleeps are short. Read back with
    PR_GET_TIMERSLACK in a thread of its own (the test's thread keeps its slack)."""
    import ctypes
    import threading

    import pytest

    from hpcps.core.procs import set_timer_slack

    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_TIMERSLACK is Linux's")
    got = []

    def probe():
        before = ctypes.CDLL(None).prctl(30, 0, 0, 0, 0)        # PR_GET_TIMERSLACK
        ok = set_timer_slack(10_000)
        got.extend([before, ok, ctypes.CDLL(None).prctl(30, 0, 0, 0, 0)])

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    assert got[1] is True and got[2] == 10_000 and got[0] != 10_000, got


def test_a_launch_that_times_out_prints_its_python_stacks(capsys):
    """tests.helpers.run_in_session on a hang: the stacks of the session's Python processes are
    printed before the kill (a hang in CI was reported with no clue where it waited)."""
    import pytest

    from tests.helpers import py_spy, run_in_session

    if py_spy() is None:
        pytest.skip("py-spy is not installed (the test extra installs it)")
    body = "import time\ndef waiting_here():\n    time.sleep(60)\nprint('started', flush=True)\nwaiting_here()\n"
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_session([sys.executable, "-c", body], timeout=3)
    out = capsys.readouterr().out
    assert "timed out after 3 s" in out and "started" in out, out
    assert "waiting_here" in out, out
