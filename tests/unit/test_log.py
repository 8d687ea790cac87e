"""hpcps.core.log: one formatter, levels from the lines' prefixes, -v / -q."""

import io
import logging

from hpcps.core import log


def _run(verbosity, lines, rank="2", host="node7"):
    buf = io.StringIO()
    logger = log.configure(verbosity, stream=buf, rank=rank)
    for h in logger.handlers:
        h.setFormatter(log.RankFormatter(where=verbosity > 0, rank=rank, host=host))
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


def test_default_keeps_every_text_as_written():
    assert _run(0, LINES) == "".join(LINES)


def test_verbose_puts_rank_and_host_in_front_of_every_line():
    got = _run(1, LINES).splitlines()
    assert len(got) == 4 and all(l.startswith("[rank 2 on node7] ") for l in got), got
    assert got[1] == "[rank 2 on node7] epoch 1/2  step 10/20  ETA 3 s  12,000 ex/s"
    assert _run(1, ["x\n"], rank=None).startswith("[node7] x")


def test_quiet_keeps_warnings_and_errors_only():
    got = _run(-1, LINES + ["hpcps: error: boom\n"])
    assert got == ("hpcps: warning: the job file differs from the checkpoint's\n"
                   "hpcps: error: boom\n")


def test_levels_from_prefixes_and_rank_from_the_launcher():
    assert log.level_of("hpcps: warning: x") == logging.WARNING
    assert log.level_of("hpcps: rank 1: error: x") == logging.ERROR
    assert log.level_of("done: 2 epoch(s)") == logging.INFO
    assert log.rank_from_env({"OMPI_COMM_WORLD_RANK": "3"}) == "3"
    assert log.rank_from_env({"PMI_RANK": "1"}) == "1"
    assert log.rank_from_env({}) is None
