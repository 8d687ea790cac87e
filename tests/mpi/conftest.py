"""Multi-rank test files: one JUnit XML per rank.

``tests/run.py`` launches ``mpirun -n K python -m pytest --junitxml=DIR/NAME-{rank}.xml``: every
rank gets the same arguments, so ``{rank}`` in the path is replaced here by the rank's index in
the world (from the launcher's environment: Open MPI, MPICH/PMI, PMIx or Slurm), before pytest's
junitxml plugin opens the file. Without ``{rank}`` the path is left alone.
"""

import os

import pytest

RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def _rank() -> str:
    for name in RANK_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return os.environ[name]
    return "0"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    path = getattr(config.option, "xmlpath", None)
    if path and "{rank}" in path:
        config.option.xmlpath = path.replace("{rank}", _rank())
