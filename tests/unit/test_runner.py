"""The suite runner (tests/run.py): counts from pytest's JUnit XML, streamed output, groups."""

import sys
import textwrap

from tests import run


def _xml(path, cases):
    body = "".join(f'<testcase classname="tests.mpi.t" name="{n}">{inner}</testcase>' for n, inner in cases)
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{body}'
                    "</testsuite></testsuites>")
    return path


def test_a_test_failing_on_one_rank_counts_once_as_failed(tmp_path):
    r0 = _xml(tmp_path / "r0.xml", [("a", ""), ("b", ""), ("c", '<skipped message="needs 5 ranks"/>')])
    r1 = _xml(tmp_path / "r1.xml", [("a", ""), ("b", '<failure message="x"/>'),
                                    ("c", '<skipped message="needs 5 ranks"/>')])
    c = run.junit_counts([r0, r1, tmp_path / "missing.xml"])
    assert (c.passed, c.failed, c.skipped) == (1, 1, 1)
    assert c.skips == [("tests.mpi.t::c", "needs 5 ranks")]


def test_a_failure_shows_the_tail_of_its_message_not_only_the_first_line(tmp_path):
    """CI failed on a message whose first line was the middle of a run's output tail ("offset 0
    - aborting the schedule"): which assertion failed, and why, was in the lines after it."""
    lines = "&#10;".join(["AssertionError: start"] + [f"line {i}" for i in range(100)])
    x = _xml(tmp_path / "x.xml", [("a", f'<failure message="{lines}">traceback</failure>')])
    ((name, message),) = run.junit_counts([x]).fails
    shown = message.splitlines()
    assert shown[0] == "AssertionError: start" and shown[-1].strip() == "line 99"
    assert len(shown) == 1 + run.FAIL_TAIL_LINES and "line 74" not in message
    y = _xml(tmp_path / "y.xml", [("b", '<error>E   Fixture failed&#10;E   at setup</error>')])
    assert run.junit_counts([y]).fails[0][1].splitlines()[-1].strip() == "E   at setup"


def test_errors_count_as_failed_and_an_unreadable_file_counts_nothing(tmp_path):
    x = _xml(tmp_path / "x.xml", [("a", '<error message="fixture"/>'), ("b", "")])
    bad = tmp_path / "bad.xml"
    bad.write_text("<testsuites><testsuite")
    c = run.junit_counts([x, bad])
    assert (c.passed, c.failed, c.skipped) == (1, 1, 0)


def test_a_launch_streams_its_lines_with_its_label_and_a_dead_launch_counts_as_failed(tmp_path, capsys):
    script = tmp_path / "t.py"
    script.write_text(textwrap.dedent("""
        import sys
        print("first\\x00", flush=True)
        sys.stdout.write("no newline")
        sys.exit(3)
    """))
    c = run.run(run.Launch("lbl", [sys.executable, str(script)], {}), tmp_path)
    out = capsys.readouterr().out
    assert "[lbl] first\n[lbl] no newline\n" in out          # labelled, NUL bytes dropped
    assert "exit 3, 0 passed, 1 failed" in out
    assert (c.passed, c.failed) == (0, 1)


def test_a_launch_that_hangs_is_killed_at_its_timeout(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run, "TIMEOUT", 1)
    c = run.run(run.Launch("hang", [sys.executable, "-c", "import time; time.sleep(60)"], {}), tmp_path)
    assert "[hang] TIMEOUT after 1 s" in capsys.readouterr().out
    assert c.failed == 1



def test_every_mpi_file_runs_at_two_sizes():
    for path in sorted((run.ROOT / "tests" / "mpi").glob("test_*.py")):
        assert len(set(run.mpi_sizes(path))) == 2, path.name


def test_launches_side_by_side_print_whole_lines_and_count_their_cpu(tmp_path, capsys):
    """Two launches at once (the e2e group's lanes): each line whole, with its own label, even
    when a launch writes a line in pieces; each launch's CPU seconds include its children's."""
    script = tmp_path / "t.py"
    script.write_text(textwrap.dedent("""
        import subprocess, sys, time
        me = sys.argv[1]
        for i in range(20):
            sys.stdout.write(me + "-head-"); sys.stdout.flush(); time.sleep(0.01)
            sys.stdout.write(f"tail-{i}\\n"); sys.stdout.flush()
        subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                        "while time.process_time() - t < 0.5: pass"])
    """))
    from concurrent.futures import ThreadPoolExecutor
    launches = [run.Launch(name, [sys.executable, str(script), name], {}) for name in ("aa", "bb")]
    with ThreadPoolExecutor(2) as pool:
        counts = list(pool.map(lambda x: run.run(x, tmp_path), launches))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "-head-" in ln]
    assert sorted(lines) == sorted(f"[{n}] {n}-head-tail-{i}" for n in ("aa", "bb") for i in range(20))
    assert all(c.cpu >= 0.4 for c in counts), [c.cpu for c in counts]     # the grandchild's 0.5 s


def test_waiting_groups_run_beside_the_others(tmp_path, monkeypatch, capsys):
    """With --jobs > 1 a group marked ``waiting`` (slurm, multihost) runs beside the other
    groups: each of two launches, one per kind of group, waits for the other's marker file
    and fails after 20 s without it, so the run passes only if they overlap."""
    script = tmp_path / "meet.py"
    script.write_text(textwrap.dedent("""
        import pathlib, sys, time
        mine, other = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
        mine.touch()
        t = time.time()
        while not other.exists():
            if time.time() - t > 20:
                sys.exit(1)
            time.sleep(0.05)
    """))
    a, b = tmp_path / "a", tmp_path / "b"

    def group(name, mine, other, **kw):
        return run.Group(name, lambda args: [run.Launch(name, [sys.executable, str(script),
                                                               str(mine), str(other)], {})], **kw)

    monkeypatch.setattr(run, "GROUPS", [group("first", a, b), group("side", b, a, waiting=True)])
    monkeypatch.setattr(sys, "argv", ["run.py", "--jobs", "2"])
    assert run.main() == 0
    out = capsys.readouterr().out
    assert "(side beside the others)" in out and "0 passed, 0 failed" in out


def test_every_launch_shares_one_cache_dir_not_the_users(monkeypatch, tmp_path):
    """The suite's launches (and the hpcps/mpirun processes they start) get one HPCPS_CACHE_DIR
    for the run: featurized data is made once per run, and ~/.cache/hpcps is never written."""
    monkeypatch.delenv("HPCPS_CACHE_DIR", raising=False)
    a, b = run.mpi_env()["HPCPS_CACHE_DIR"], run.mpi_env()["HPCPS_CACHE_DIR"]
    assert a == b and run.Path(a).is_dir() and run.Path(a).name.startswith("hpcps-cache-")
    monkeypatch.setenv("HPCPS_CACHE_DIR", str(tmp_path))           # the caller's choice wins
    assert run.mpi_env()["HPCPS_CACHE_DIR"] == str(tmp_path)
    monkeypatch.setenv("HPCPS_CACHE_DIR", "off")
    assert run.mpi_env()["HPCPS_CACHE_DIR"] == "off"


def test_a_selection_that_matches_no_launch_fails_and_says_why(monkeypatch, capsys):
    """``--file test_config.py`` matched no launch (the unit tests are one) and printed
    "0 passed, 0 failed" with status 0 (found by a trial): now status 5 and what --file
    matches."""
    monkeypatch.setattr(sys, "argv", ["run.py", "--file", "test_config.py", "--group", "unit"])
    assert run.main() == 5
    err = capsys.readouterr().err
    assert "no launch matches" in err and "--group unit -k" in err
