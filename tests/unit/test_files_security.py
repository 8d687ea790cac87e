"""Files follow the user's umask (hpcps.core.files) and a run directory outside the working
directory is announced (hpcps.config.output_note)."""

import os
import stat

import pytest

from hpcps.config import parse_job
from hpcps.core.files import current_umask, make_temp


@pytest.fixture
def umask():
    old = os.umask(0o022)
    os.umask(old)

    def set_(mask):
        os.umask(mask)
    yield set_
    os.umask(old)


@pytest.mark.parametrize("mask,mode", [(0o077, 0o600), (0o022, 0o644), (0o002, 0o664),
                                       (0o000, 0o666)])
def test_temp_files_take_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    assert current_umask() == mask
    tmp = make_temp(tmp_path / "model.h5")
    assert tmp.parent == tmp_path and tmp.name.startswith(".model.h5.") and tmp.name.endswith(".tmp")
    assert stat.S_IMODE(tmp.stat().st_mode) == mode
    # what open() would have made with the same umask
    (tmp_path / "plain").write_text("x")
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == mode


JOB = '''
name = "sec"
[data]
format = "svmlight"
path = "t.svm"
test_path = "t.svm"
index_base = 1
n_features = 4
[output]
dir = "{out}"
'''


def job(tmp_path, out):
    (tmp_path / "t.svm").write_text("1 1:1\n")
    return parse_job(JOB.format(out=out), tmp_path / "j.toml")


def test_output_note(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    from hpcps.config import output_note

    assert output_note(job(tmp_path, "runs/x")) is None
    assert output_note(job(tmp_path, str(work / "deep" / "x"))) is None
    note = output_note(job(tmp_path, "../elsewhere"))
    assert note == (f"{tmp_path / 'j.toml'}: output.dir: writing to {tmp_path / 'elsewhere'}, "
                    f"outside the working directory {work}")
    assert output_note(job(tmp_path, "/var/tmp/hpcps-x")).startswith(
        f"{tmp_path / 'j.toml'}: output.dir: writing to /var/tmp/hpcps-x, outside")
    # a link inside the working directory that points elsewhere is followed
    (work / "link").symlink_to(tmp_path / "target", target_is_directory=True)
    (tmp_path / "target").mkdir()
    assert f"writing to {tmp_path / 'target' / 'r'}, outside" in output_note(job(tmp_path, "link/r"))
