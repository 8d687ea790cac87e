"""The run directory after a job that failed on bad data (issue 21.8): real mpirun."""

import gzip

from tests.helpers import DATA, hpcps, write_job


def test_a_data_error_found_by_workers_is_said_first_and_leaves_no_running_json(tmp_path):
    """A CSV whose header lacks the label column: the workers find it after the chief wrote
    running.json; their MPI_Abort killed the chief before it removed the file, and Open MPI's
    MPI_ABORT banner came before hpcps's line on stderr."""
    lines = gzip.open(DATA, "rt").read().splitlines()[:500]
    lines[0] = lines[0].replace("income", "revenue")
    (tmp_path / "bad.csv").write_text("\n".join(lines) + "\n")
    job = write_job(tmp_path / "bad.toml", f"""
name = "bad"
[data]
format = "adult_csv"
path = "{tmp_path / 'bad.csv'}"
hash_bits = 10
[output]
dir = "{tmp_path / 'out'}"
""")
    proc, secs = hpcps(["run", "-n", "4", job], cwd=tmp_path, timeout=300)
    assert proc.returncode == 65, proc.stderr[-3000:]
    first = next(x for x in proc.stderr.splitlines() if x.strip())
    assert first.startswith("hpcps: rank ") and "missing column 'income'" in first, \
        proc.stderr[:2000]
    assert not (tmp_path / "out" / "running.json").exists()
