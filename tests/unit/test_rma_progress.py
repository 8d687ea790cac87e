"""Which MPIs need help for passive RMA progress (hpcps.comm.progress): the decision table
from the facts measured on our machines, on real library version strings."""

import pytest

from hpcps.comm.progress import rma_progress_advice

OMPI5 = ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11, "
         "repo rev: v5.0.11rc1, Sep 16, 2026\x00")
OMPI4 = ("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, "
         "May 26, 2022")
MPICH = ("MPICH Version:      4.2.0\nMPICH Release date: Fri Feb  9 12:29:21 CST 2024\n"
         "MPICH ABI:          16:0:4\nMPICH Device:       ch4:ofi\n")
MPICH5 = "MPICH Version:\t5.0.0\nMPICH Release date:\tunreleased development copy\n"


@pytest.mark.parametrize("library,env,kind,setting", [
    (OMPI5, {}, "allocate", None),
    (OMPI5, {"OMPI_MCA_osc": "^ucx"}, "allocate", None),
    (OMPI5, {}, "create", "make the windows with Win.Allocate"),
    (OMPI4, {}, "allocate", "set OMPI_MCA_osc=sm"),
    (OMPI4, {"OMPI_MCA_osc": "^ucx"}, "allocate", "set OMPI_MCA_osc=sm"),
    (OMPI4, {"OMPI_MCA_osc": "sm"}, "allocate", None),
    (OMPI4, {"OMPI_MCA_osc": "sm,pt2pt"}, "create", None),
    (MPICH, {}, "allocate", "set MPIR_CVAR_ASYNC_PROGRESS=1"),
    (MPICH, {"MPIR_CVAR_ASYNC_PROGRESS": "0"}, "allocate", "set MPIR_CVAR_ASYNC_PROGRESS=1"),
    (MPICH, {"MPIR_CVAR_ASYNC_PROGRESS": "1"}, "allocate", None),
    (MPICH5, {}, "create", "set MPIR_CVAR_ASYNC_PROGRESS=1"),
    ("Intel(R) MPI Library 2021.10 for Linux* OS", {}, "allocate", None),   # not judged
    ("", {}, "allocate", None),
])
def test_decision_table(library, env, kind, setting):
    advice = rma_progress_advice(library, env, kind)
    if setting is None:
        assert advice is None
    else:
        assert advice is not None and advice.setting == setting


def test_message_says_what_to_set_and_how_to_fall_back():
    m = rma_progress_advice(MPICH, {}).message()
    assert m.startswith('pull = "rma" on MPICH 4.2.0: MPICH gives one-sided reads no passive '
                        "progress on any window kind")
    assert "To get it: set MPIR_CVAR_ASYNC_PROGRESS=1 (one progress thread per rank" in m
    assert m.endswith("or [consistency] rma_fallback = true to pull by messages (p2p) instead")
    assert rma_progress_advice(OMPI4, {}).mpi == "Open MPI 4.1.4"


def test_bad_window_kind():
    with pytest.raises(ValueError, match="window_kind"):
        rma_progress_advice(OMPI5, {}, "shared")
