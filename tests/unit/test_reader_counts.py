"""The summary's ``readers:`` line after a recovery and a growth (found by a scale trial: lines
read ahead before a recovery and read again after it were counted as new, and the readers a
re-plan replaced dropped out): the reader's ``again`` counters
(:meth:`hpcps.data.lines.StreamedRows.release`) and the line made from the workers' records
(:func:`hpcps.runtime.report.readers_line`). No MPI."""

from __future__ import annotations

import time
import types

import numpy as np
import pytest

from hpcps.data.lineindex import load_index
from hpcps.data.lines import Parser, StreamedRows


def svm_cfg():
    return types.SimpleNamespace(format="svmlight", on_bad_line="skip", index_base=1,
                                 n_features=3, duplicate_indices="error", num_features=3)


@pytest.fixture
def ix(tmp_path):
    p = tmp_path / "s.svm"
    lines = [b"1 1:1 3:2\n" if i != 7 else b"2 1:1\n" for i in range(400)]    # line 8: bad
    p.write_bytes(b"".join(lines))
    return load_index(p)


def read_steps(rows, order, first, steps, batch=10):
    for s in range(first, first + steps):
        rows[order[s * batch:(s + 1) * batch]]


def test_release_counts_what_was_read_ahead_as_read_again(ix):
    rows = StreamedRows(ix, Parser(svm_cfg()), 0, ix.n_lines, unit=50, depth=2)
    order = np.arange(ix.n_lines)
    rows.start(order)
    read_steps(rows, order, 0, 7)                 # 70 lines used, units of 50 read ahead
    deadline = time.time() + 10
    while rows.stats["lines"] < 200 and time.time() < deadline:      # the queue fills up
        time.sleep(0.01)
    assert rows.stats["lines"] >= 200
    rows.release(60)      # 6 steps done: the 7th and what was read ahead are read again
    read, b, rs = rows.stats["lines"], rows.stats["bytes"], rows.stats["read_seconds"]
    assert rows.again["lines"] == read - 60
    assert rows.again["bytes"] == pytest.approx(b * (read - 60) / read, rel=0.01)
    assert 0 < rows.again["read_seconds"] <= rs
    rows.release(0)                   # a second release of the same start: nothing more
    assert rows.again["lines"] == read - 60
    # the reader goes on from step 6: the lines from 60 are read a second time
    rows.start(order, 60)
    read_steps(rows, order, 6, 34)
    rows.close()
    rep = rows.report()
    assert rep["lines"] == ix.n_lines + read - 60
    assert rep["lines_again"] == read - 60 and rep["bytes_again"] == rows.again["bytes"]
    assert set(rep) >= {"read_seconds_again", "wait_seconds_again"}


def test_a_view_does_not_count_its_parents_skipped_lines(ix):
    """A re-plan's partition for the later epochs is a view of the whole split sharing its
    parser: the bad line its parent read was counted twice."""
    whole = StreamedRows(ix, Parser(svm_cfg()), 0, ix.n_lines, unit=50)
    whole.start(np.arange(ix.n_lines))
    read_steps(whole, np.arange(ix.n_lines), 0, 40)
    part = whole[0:100]
    part.start(np.arange(100))
    read_steps(part, np.arange(100), 0, 10)
    whole.close()
    part.close()
    assert whole.report()["skipped"] == 1 and part.report()["skipped"] == 1


def record(w, lines, again=0, **kw):
    d = {"worker": w, "bytes": lines * 30, "lines": lines, "read_seconds": 0.5,
         "wait_seconds": 0.25, "skipped": 0, "peak_rss_mb": 100.0, "lines_again": again,
         "bytes_again": again * 30, "read_seconds_again": 0.1 if again else 0.0,
         "wait_seconds_again": 0.05 if again else 0.0}
    d.update(kw)
    return d


def test_the_readers_line_names_lines_read_again_and_lost_workers():
    from hpcps.runtime.report import readers_line

    plain = readers_line({"reader": [record(0, 40_000), record(1, 44_000)]})
    assert plain.startswith("  readers: 2.5 MB of text, 84,000 lines (2.5 MB/s per reader thread);")
    assert "again" not in plain and "lost" not in plain
    # a growth: every reader's lines (also those a re-plan replaced), the re-read named
    grown = readers_line({"reader": [record(0, 47_400, 3_400), record(1, 46_800, 6_800)],
                          "growth": [{"clock": 300}]})
    assert ("94,200 lines (10,200 of them, 0.3 MB in 0.20 s, read again after a growth: "
            "read ahead of the steps done then, and given out again)") in grown
    assert "workers waited 0.50 s for data (0.10 s of it for lines read again)" in grown
    # a worker lost (continue mode): its reads cannot be counted, and the line says so
    lost = readers_line({"reader": [record(0, 40_000, 3_368), record(1, 39_803, 3_368)],
                         "failures": [{"dead_workers": [2]}], "growth": [{"clock": 9}]})
    assert "6,736 of them, 0.2 MB in 0.20 s, read again after a recovery or a growth" in lost
    assert "not counted: what the 1 lost worker(s) read" in lost
    # a resumed launch's readers are this launch's, as the done line's examples
    resumed = readers_line({"reader": [record(0, 10)],
                            "launches": [{"launch": 1}, {"launch": 2, "resumed_from_step": 300}]})
    assert resumed.startswith("  readers (this launch): ")
