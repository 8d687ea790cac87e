"""Unit tests run without MPI: importing mpi4py here fails (``sys.modules['mpi4py'] = None``
makes every ``import mpi4py`` raise ImportError), so a unit test that reaches the MPI layer
(:mod:`hpcps.comm`) by accident fails loudly. Tests that need MPI live in ``tests/mpi``."""

import sys

if "mpi4py" in sys.modules and sys.modules["mpi4py"] is not None:
    # pytest imported it before this conftest (e.g. the pytest-mpi plugin): drop the module
    # objects so that hpcps code imported from here on cannot use it
    for name in [n for n in sys.modules if n == "mpi4py" or n.startswith("mpi4py.")]:
        del sys.modules[name]
sys.modules["mpi4py"] = None
