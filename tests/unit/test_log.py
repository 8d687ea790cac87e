"""hpcps.core.log: one formatter, levels from the lines' prefixes, -v / -q."""

import io
import logging
import socket

from hpcps.core import log


def _run(verbosity, lines, rank="2", host="node7"):
    buf = io.StringIO()
    logger = log.configure(verbosity, stream=buf, rank=rank)
    for h in logger.handlers:
        h.setFormatter(log.RankFormatter(rank=rank, host=host))
    out = log.LineStream()
    for text in lines:
        out.write(text)
    out.flush()
    return buf.getvalue()


LINES = ["hpcps: 3 worker(s), 1 server(s); ...\n",
         "epoch 1/2  step 10/20  ETA 3 s",            # a line in two writes
         "  12,000 ex/s\n",
         "hpcps: warning: the job file differs from the checkpoint's\n",
         "done: 2 epoch(s), 40 steps\n"]
TEXTS = ["hpcps: 3 worker(s), 1 server(s); ...", "epoch 1/2  step 10/20  ETA 3 s  12,000 ex/s",
         "hpcps: warning: the job file differs from the checkpoint's", "done: 2 epoch(s), 40 steps"]


def test_every_line_names_its_rank_and_host_then_keeps_the_text_as_written():
    for v in (0, 1):
        assert _run(v, LINES).splitlines() == ["[rank 2@node7] " + t for t in TEXTS]
    assert _run(0, ["x\n"], rank=None) == "[node7] x\n"          # outside a launch
    assert _run(0, ["a\nb"]) == "[rank 2@node7] a\n[rank 2@node7] b\n"


def test_set_rank_names_the_jobs_rank_from_then_on():
    buf = io.StringIO()
    log.configure(0, stream=buf, rank="0")
    out = log.LineStream()
    out.write("before\n")
    log.set_rank(5)                        # e.g. an added worker, numbered after the launch
    out.write("after\n")
    host = socket.gethostname()
    assert buf.getvalue() == f"[rank 0@{host}] before\n[rank 5@{host}] after\n"


def test_verbose_shows_debug_messages_and_quiet_warnings_and_errors_only():
    buf = io.StringIO()
    logger = log.configure(1, stream=buf, rank="1")
    logger.debug("details")
    assert buf.getvalue().endswith("] details\n")
    got = _run(-1, LINES + ["hpcps: error: boom\n"])
    assert got == ("[rank 2@node7] hpcps: warning: the job file differs from the checkpoint's\n"
                   "[rank 2@node7] hpcps: error: boom\n")


def test_levels_from_prefixes_and_rank_from_the_launcher():
    assert log.level_of("hpcps: warning: x") == logging.WARNING
    assert log.level_of("hpcps: rank 1: error: x") == logging.ERROR
    assert log.level_of("done: 2 epoch(s)") == logging.INFO
    assert log.rank_from_env({"OMPI_COMM_WORLD_RANK": "3"}) == "3"
    assert log.rank_from_env({"PMI_RANK": "1"}) == "1"
    assert log.rank_from_env({}) is None


def test_progress_rate_counts_from_the_end_of_the_first_step():
    """A trial resumed a 32 M-key run: the servers' restore (20-40 s) fell in the first step,
    and the first progress line read 177 examples/s, ETA 1:48:41 (the run ended 39 s later)."""
    from hpcps.worker.progress import ProgressMeter

    # launch start at 0 s, first step (clock 450) ended at 30 s, clock 460 at 31 s
    m = ProgressMeter(6144)
    assert m.speed(3.0, 0.0, 0, 733)[1] == ""
    m.stepped(30.0, 450)
    # only the first step has ended: no rate yet, the start-up is named
    assert m.speed(30.5, 0.0, 450, 283) == ("first step 30.5 s (start-up included)", "")
    m.stepped(31.0, 460)
    head, tail = m.speed(31.0, 0.0, 460, 273)
    assert head == "61,440 examples/s" and tail == "  ETA 0:00:27", (head, tail)
