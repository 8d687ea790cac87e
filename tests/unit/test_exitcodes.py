"""Exit statuses: which errors a relaunch can cure (hpcps.core.exitcodes)."""

import pytest

from hpcps.core import exitcodes as xc
from hpcps.checkpoint import CheckpointError, ResumeError
from hpcps.config import ConfigError
from hpcps.data import DataError
from hpcps.data.prepared import PreparedError
from hpcps.core.resources import ResourceError
from hpcps.core.optim import NonFiniteError
from hpcps.runtime.output import OutputError


@pytest.mark.parametrize("exc, code", [
    (ConfigError("job.toml", "train.epochs", "x"), 2), (ResumeError("x"), 2), (ResourceError("x"), 2),
    (DataError("x"), 65), (PreparedError("x"), 65), (NonFiniteError("x"), 65),
    (CheckpointError("x"), 74), (OutputError(28, "x"), 74),
    (RuntimeError("x"), 1), (OSError(5, "x"), 1), (KeyboardInterrupt(), 1),
])
def test_status_for(exc, code):
    assert xc.status_for(exc) == code


@pytest.mark.parametrize("status, again", [(0, False), (1, True), (2, False), (65, False),
                                           (74, False), (75, True), (137, True), (143, True)])
def test_restartable(status, again):
    assert xc.restartable(status) is again


def test_batch_scripts_know_every_final_status():
    from tests.helpers import ROOT
    for script in ("common.sh",):                   # sourced by train.sbatch and multinode.sbatch
        text = (ROOT / "slurm" / script).read_text()
        for code in sorted(xc.FINAL - {0}):
            assert f"\n    {code})" in text, (script, code)


def test_a_status_of_128_plus_n_names_the_signal():
    """``hpcps run: mpirun exited with status 137 (exit status 137)`` said nothing of the kill
    (found by a fresh user's trial)."""
    assert xc.describe(137) == "a process was killed by signal 9 (SIGKILL)"
    assert "SIGTERM" in xc.describe(143)
    assert xc.describe(7) == "exit status 7"
