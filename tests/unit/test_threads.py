"""Tests of hpcps.core.threads: each rank's share of BLAS threads."""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_info

from hpcps.core.threads import blas_threads_for, limit_blas_threads, usable_cores


def test_share_of_cores_per_rank():
    assert blas_threads_for(4, cores=2, environ={}) == 1
    assert blas_threads_for(2, cores=8, environ={}) == 4
    assert blas_threads_for(3, cores=8, environ={}) == 2
    assert blas_threads_for(1, cores=8, environ={}) == 8
    assert blas_threads_for(1, environ={}) == usable_cores() >= 1


def test_user_choice_is_left_alone():
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        assert blas_threads_for(4, cores=2, environ={var: "2"}) is None
    assert blas_threads_for(4, cores=2, environ={"OMP_NUM_THREADS": ""}) == 1


def test_limit_reaches_numpy_blas():
    np.ones((4, 4)) @ np.ones((4, 4))          # numpy's BLAS is loaded
    blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
    assert blas, "numpy's BLAS was not found by threadpoolctl"
    with limit_blas_threads(1):
        assert all(p["num_threads"] == 1 for p in threadpool_info() if p["user_api"] == "blas")
