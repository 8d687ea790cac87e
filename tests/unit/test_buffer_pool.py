"""The server's receive-buffer pool (hpcps.comm.buffers.BufferPool); no communication."""

import numpy as np

from hpcps.comm.buffers import BufferPool


def test_pool_reuses_best_fit_and_grows_for_a_larger_message():
    pool = BufferPool(max_free_bytes=1 << 30, min_bytes=1024)
    a = pool.take((1000, 2), np.float64)               # 16 000 B
    a[...] = 1.0
    pool.give(a)
    b = pool.take(1500, np.int64)                      # 12 000 B: fits the free buffer
    assert pool.reused == 1 and pool.allocated == 1
    assert b.dtype == np.int64 and b.shape == (1500,) and b.flags.c_contiguous
    c = pool.take((5000, 2), np.float64)               # larger than every free buffer: new
    assert pool.allocated == 2
    c[...] = 3.0
    b[...] = 2                                         # distinct memory
    assert np.all(c == 3.0)
    pool.give(b, c)
    d = pool.take((100, 4), np.float32)                # best fit: the 16 000 B buffer, not c's
    assert pool.reused == 2
    pool.give(d)
    assert pool.free_bytes == 16_000 + 80_000


def test_pool_ignores_foreign_and_repeated_arrays_and_small_requests():
    pool = BufferPool(min_bytes=4096)
    small = pool.take(10, np.float32)                  # below min_bytes: a plain array
    pool.give(small, np.zeros(10_000), None)
    assert pool.free_bytes == 0 and pool.allocated == 0
    x = pool.take(10_000, np.float32)
    pool.give(x[:10])                                  # a view of it gives the buffer back
    pool.give(x)                                       # already back: ignored
    assert pool.free_bytes == 40_000
    assert pool.take(10_000, np.float32) is not None and pool.free_bytes == 0


def test_pool_keeps_at_most_max_free_bytes():
    pool = BufferPool(max_free_bytes=100_000, min_bytes=1)
    bufs = [pool.take(n, np.uint8) for n in (30_000, 40_000, 60_000)]
    pool.give(*bufs)
    assert pool.free_bytes == 100_000                  # the smallest (30 000 B) was dropped
