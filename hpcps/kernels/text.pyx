# cython: language_level=3
"""Byte counting and CSR row gathers for the text readers (no I/O, no MPI)."""

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memchr, memcpy

cnp.import_array()

cdef extern from *:
    """
    /* Ask for the cache lines of [p, p + n) ahead of their use (a row gather in random order
       otherwise waits for memory at every row). */
    static inline void hpcps_prefetch_span(const char *p, Py_ssize_t n) {
    #if defined(__GNUC__) || defined(__clang__)
        Py_ssize_t k;
        for (k = 0; k < n; k += 64)
            __builtin_prefetch(p + k, 0, 0);
    #else
        (void)p; (void)n;
    #endif
    }
    """
    void hpcps_prefetch_span(const char* p, Py_ssize_t n) noexcept nogil

# rows ahead whose bytes take_rows asks the cache for
cdef enum:
    AHEAD = 16

__all__ = ["count_newlines", "newline_end", "take_rows", "pooled"]


def pooled(out, str name, Py_ssize_t size, dtype):
    """An array of at least ``size`` items of ``dtype``: ``out[name]`` when it is one, else
    a new one (a quarter larger, so that slightly larger chunks do not reallocate) kept
    there; ``out`` None: a new array of ``size``.

    The parsers write their outputs into such buffers when a caller passes them a dict
    ``out`` that it keeps across calls (the streaming reader, one chunk after another): the
    memory is allocated and first touched (page faults) once, not for every chunk.
    """
    cdef object a
    if out is None:
        return np.empty(size, dtype=dtype)
    a = out.get(name)
    if a is None or a.dtype != dtype or a.shape[0] < size:
        a = np.empty(size + size // 4, dtype=dtype)
        out[name] = a
    return a


cdef Py_ssize_t _newlines(const char* p, const char* e, Py_ssize_t k,
                          const char** after) noexcept nogil:
    """Count the ``\\n`` bytes in ``[p, e)`` with ``memchr``, stopping at the ``k``-th
    (``k < 0``: all); ``after[0]``: just after the last one counted."""
    cdef Py_ssize_t count = 0
    after[0] = p
    while p < e:
        p = <const char*>memchr(p, 10, e - p)
        if p == NULL:
            break
        count += 1
        p += 1
        after[0] = p
        if count == k:
            break
    return count


def count_newlines(const unsigned char[::1] buf):
    """Number of ``\\n`` bytes in ``buf``.

    Parameters
    ----------
    buf : bytes-like, contiguous
        E.g. ``bytes``, ``bytearray`` or a ``memoryview`` of one.

    Returns
    -------
    int
        As ``bytes(buf).count(b"\\n")``, found with ``memchr`` without the GIL.
    """
    cdef Py_ssize_t n = buf.shape[0], count
    cdef const char* p
    cdef const char* after
    if n == 0:
        return 0
    p = <const char*>&buf[0]
    with nogil:
        count = _newlines(p, p + n, -1, &after)
    return count


def newline_end(const unsigned char[::1] buf, Py_ssize_t k):
    """Where the ``k``-th ``\\n`` of ``buf`` ends, or how many there are.

    Parameters
    ----------
    buf : bytes-like, contiguous
    k : int
        ``>= 0`` (0: ``(0, 0)``).

    Returns
    -------
    (int, int)
        ``(k, offset just after the k-th \\n)`` if ``buf`` holds ``k`` of them, else
        ``(count of \\n, -1)``; found with ``memchr`` without the GIL.
    """
    cdef Py_ssize_t n = buf.shape[0], count
    cdef const char* s
    cdef const char* after
    if k < 1:
        return 0, 0
    if n == 0:
        return 0, -1
    s = <const char*>&buf[0]
    with nogil:
        count = _newlines(s, s + n, k, &after)
    if count == k:
        return count, after - s
    return count, -1


cdef inline int64_t _at(const void* a, bint i32, Py_ssize_t k) noexcept nogil:
    """``a[k]`` of an int32 (``i32``) or int64 array."""
    if i32:
        return (<const int32_t*>a)[k]
    return (<const int64_t*>a)[k]


cdef bint _int_array(a, str name) except -1:
    """Whether ``a`` (a C-contiguous 1-d int32 or int64 array) is int32."""
    if not isinstance(a, np.ndarray) or a.ndim != 1 or not a.flags.c_contiguous \
            or a.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"take_rows: {name} must be a contiguous 1-d int32 or int64 array")
    return a.dtype == np.dtype(np.int32)


def take_rows(indptr, indices, data, const int64_t[::1] rows, bint int32=False):
    """The CSR rows ``rows`` (in that order) of ``(indptr, indices, data)``, one copy of
    each row's run without the GIL.

    Parameters
    ----------
    indptr : int64 or int32 (n + 1,)
    indices : int64 or int32 (nnz,)
        Contiguous; read as they are (no cast).
    data : float64 (nnz,) or None
    rows : int64 (m,)
        Each in ``[0, n)``.
    int32 : bool, default False
        Write ``indptr`` and ``indices`` as int32 (the caller knows they fit).

    Returns
    -------
    (indptr, indices, data)
        ``(m + 1,)`` and ``(sum of the rows' lengths,)`` arrays; ``data`` None if it was.

    Raises
    ------
    IndexError
        A row outside ``[0, n)``.
    TypeError
        ``indptr`` or ``indices`` not a contiguous 1-d int32 or int64 array.
    """
    cdef bint ptr32 = _int_array(indptr, "indptr"), ind32 = _int_array(indices, "indices")
    cdef const void* ptr = cnp.PyArray_DATA(indptr)
    cdef const void* ind = cnp.PyArray_DATA(indices)
    cdef Py_ssize_t n = indptr.shape[0] - 1, m = rows.shape[0], i, j, r, a, b, out = 0
    cdef int64_t total = 0
    for i in range(m):
        r = rows[i]
        if r < 0 or r >= n:
            raise IndexError(f"row {r} outside [0, {n})")
        total += _at(ptr, ptr32, r + 1) - _at(ptr, ptr32, r)
    ptr_a = np.empty(m + 1, dtype=np.int32 if int32 else np.int64)
    ind_a = np.empty(total, dtype=np.int32 if int32 else np.int64)
    cdef const double[::1] dv
    cdef double[::1] dout
    cdef bint has_data = data is not None
    dat_a = None
    if has_data:
        dv = data
        dat_a = np.empty(total, dtype=np.float64)
        dout = dat_a
    cdef int32_t* p32 = <int32_t*>cnp.PyArray_DATA(ptr_a)
    cdef int64_t* p64 = <int64_t*>cnp.PyArray_DATA(ptr_a)
    cdef int32_t* i32 = <int32_t*>cnp.PyArray_DATA(ind_a)
    cdef int64_t* i64 = <int64_t*>cnp.PyArray_DATA(ind_a)
    cdef Py_ssize_t isz = 4 if ind32 else 8
    with nogil:
        for i in range(m):
            if i + AHEAD < m:                       # prefetch row i + AHEAD's runs
                r = rows[i + AHEAD]
                a = _at(ptr, ptr32, r)
                b = _at(ptr, ptr32, r + 1)
                hpcps_prefetch_span(<const char*>ind + a * isz, (b - a) * isz)
                if has_data and b > a:
                    hpcps_prefetch_span(<const char*>&dv[a], (b - a) * 8)
            if int32:
                p32[i] = <int32_t>out
            else:
                p64[i] = out
            r = rows[i]
            a = _at(ptr, ptr32, r)
            b = _at(ptr, ptr32, r + 1)
            if int32 and ind32:
                memcpy(i32 + out, <const int32_t*>ind + a, (b - a) * sizeof(int32_t))
            elif int32:
                for j in range(a, b):
                    i32[out + j - a] = <int32_t>(<const int64_t*>ind)[j]
            elif ind32:
                for j in range(a, b):
                    i64[out + j - a] = (<const int32_t*>ind)[j]
            else:
                memcpy(i64 + out, <const int64_t*>ind + a, (b - a) * sizeof(int64_t))
            if has_data and b > a:
                memcpy(&dout[out], &dv[a], (b - a) * sizeof(double))
            out += b - a
        if int32:
            p32[m] = <int32_t>out
        else:
            p64[m] = out
    return ptr_a, ind_a, dat_a
