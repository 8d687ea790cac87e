"""Sizes in the printed summary (hpcps.runtime.report.size)."""

from hpcps.runtime.report import size


def test_a_small_table_is_printed_in_bytes_not_as_zero_megabytes():
    # a dynamic table of 6 keys held 232 B and the summary said "0.0 MB" (a fresh user's trial)
    assert size(232) == "232 B"
    assert size(99_999) == "99,999 B"
    assert size(8_400_000) == "8.4 MB"
