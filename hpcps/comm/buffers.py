"""Receive buffers reused across messages (:class:`BufferPool`): numpy only, no MPI (the
endpoints of :mod:`hpcps.comm.transport` receive into them)."""

from __future__ import annotations

import bisect
import math

import numpy as np

#: Receive buffers of at least this many bytes come from a :class:`BufferPool` (smaller
#: ones from ``np.empty``, whose small allocations malloc serves from memory already mapped).
POOL_MIN_BYTES = 64 << 10
#: Free bytes a pool keeps at most; buffers given back beyond that are freed (smallest first).
POOL_MAX_FREE_BYTES = 1 << 30


class BufferPool:
    """Receive buffers reused from one message to the next. Local; not thread-safe.

    A new numpy array of many MiB is fresh memory from the OS: the first write to each page
    faults, and an MPI receive into it ran at ~0.3 GB/s here (a 64 MiB push spent ~50 ms in
    page faults), against 5-30 GB/s into memory already touched. The server therefore takes
    the buffers of large pushes (keys, values) from this pool and gives them back once the
    update is applied.

    Parameters
    ----------
    max_free_bytes : int
        Largest total size of the free buffers kept.
    min_bytes : int
        Smaller requests get a plain ``np.empty`` (not pooled).

    Notes
    -----
    Best fit: :meth:`take` hands out (a view of) the smallest free buffer that is large
    enough, else a new one; a message larger than every free buffer gets a new buffer, which
    joins the pool when given back. :meth:`give` accepts any array and ignores those the pool
    did not hand out (or already has back), so a caller can give back whatever it held.
    """

    def __init__(self, max_free_bytes: int = POOL_MAX_FREE_BYTES, min_bytes: int = POOL_MIN_BYTES):
        self.max_free_bytes = int(max_free_bytes)
        self.min_bytes = int(min_bytes)
        self._free: list = []          # uint8 buffers, ascending size
        self._out: dict = {}           # id -> buffer handed out
        self.allocated = 0             # buffers created (statistics, tests)
        self.reused = 0                # takes served from a free buffer

    @property
    def free_bytes(self) -> int:
        return sum(b.nbytes for b in self._free)

    def take(self, shape, dtype) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype``."""
        dtype = np.dtype(dtype)
        n = (int(math.prod(shape)) if isinstance(shape, (tuple, list)) else int(shape)) * dtype.itemsize
        if n < self.min_bytes:
            return np.empty(shape, dtype=dtype)
        i = next((j for j, b in enumerate(self._free) if b.nbytes >= n), None)
        if i is None:
            buf = np.empty(n, dtype=np.uint8)
            self.allocated += 1
        else:
            buf = self._free.pop(i)
            self.reused += 1
        self._out[id(buf)] = buf
        return buf[:n].view(dtype).reshape(shape)

    def give(self, *arrays) -> None:
        """Return arrays obtained from :meth:`take` (views of them are fine); the caller must
        not use them afterwards. Other arrays and ``None`` are ignored."""
        if not self._out:            # nothing handed out (small requests): nothing to take back
            return
        for a in arrays:
            while isinstance(a, np.ndarray) and a.base is not None:
                a = a.base
            buf = self._out.pop(id(a), None) if isinstance(a, np.ndarray) else None
            if buf is None:
                continue
            sizes = [b.nbytes for b in self._free]
            self._free.insert(bisect.bisect_left(sizes, buf.nbytes), buf)
        total = self.free_bytes
        while self._free and total > self.max_free_bytes:
            total -= self._free.pop(0).nbytes          # drop the smallest: big ones matter most
