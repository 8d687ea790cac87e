# cython: language_level=3
"""svmlight / LibSVM text → CSR arrays with int64 feature indices (no I/O, no MPI).

:func:`parse_svmlight` parses a ``bytes`` buffer holding whole lines of an svmlight file in
one ``nogil`` pass. Unlike ``sklearn.datasets.load_svmlight_file`` (whose parser stores
indices as C ``int`` and fails with ``OverflowError`` at 2**31) every index is an int64, so
tables of more than 2**31 (and 2**32) features can be read, and duplicate indices in a row
may be summed instead of refused.

Format (Joachims, SVMlight, http://svmlight.joachims.org/; LIBSVM's README):
``<label> [qid:<int>] <index>:<value> ...`` per line; lines end in ``\\n``, and ``\\r``
before it is whitespace (CRLF files read as LF ones); a ``\\r`` followed by anything else
(old Mac files end lines in CR alone) is an error, never whitespace: read as one line, a
``#`` comment on the first line would swallow every other row. ``#`` starts a comment to
the end of the line; blank and comment-only lines make no row; tokens are separated by
spaces, tabs, ``\\v``, ``\\f``. Indices are decimal digits only and must increase along a
row.
"""

import numpy as np

cimport numpy as cnp
from libc.math cimport isfinite
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport free, malloc, strtod
from libc.string cimport memchr, memcpy

from hpcps.kernels.text import pooled

cnp.import_array()

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #if defined(__SSE2__) && defined(__x86_64__)
    #include <emmintrin.h>
    #endif
    /* Counts of LF (10) and ':' (58) in s[0, n): 16 bytes a step with SSE2 (byte counters
       summed every 255 steps), else one byte a step. */
    static void hpcps_svm_count2(const char *s, Py_ssize_t n, Py_ssize_t *nl, Py_ssize_t *co) {
        Py_ssize_t a = 0, b = 0, i = 0;
    #if defined(__SSE2__) && defined(__x86_64__)
        const __m128i vn = _mm_set1_epi8(10), vc = _mm_set1_epi8(58), z = _mm_setzero_si128();
        while (i + 16 <= n) {
            __m128i ca = z, cb = z, x;
            Py_ssize_t stop = i + 16 * 255 <= n ? i + 16 * 255 : n;
            for (; i + 16 <= stop; i += 16) {
                x = _mm_loadu_si128((const __m128i *)(s + i));
                ca = _mm_sub_epi8(ca, _mm_cmpeq_epi8(x, vn));
                cb = _mm_sub_epi8(cb, _mm_cmpeq_epi8(x, vc));
            }
            ca = _mm_sad_epu8(ca, z);
            cb = _mm_sad_epu8(cb, z);
            a += _mm_cvtsi128_si64(ca) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(ca, ca));
            b += _mm_cvtsi128_si64(cb) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(cb, cb));
        }
    #endif
        for (; i < n; i++) {
            a += s[i] == 10;
            b += s[i] == 58;
        }
        *nl = a;
        *co = b;
    }
    /* The number of decimal digits (0 to 8) that start the 8 bytes at p, their value in
       *out: one 8-byte load (SWAR: Lemire, "Fast number parsing", the fast_float library's
       parse_eight_digits_unrolled). Little-endian machines; one byte a step elsewhere. */
    static inline int hpcps_svm_digits8(const char *p, uint64_t *out) {
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && (defined(__GNUC__) || defined(__clang__))
        uint64_t v, bad;
        int k;
        memcpy(&v, p, 8);
        /* a byte is a digit iff its high nibble is 3 and adding 6 keeps it 3; a carry
           (from a non-digit byte only) can spoil only bytes after the first non-digit */
        bad = ((v & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL)
            | (((v + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL);
        k = bad ? (__builtin_ctzll(bad) >> 3) : 8;
        if (k == 0) { *out = 0; return 0; }
        v = (v - 0x3030303030303030ULL) << (8 * (8 - k));   /* k digits, zeros before */
        v = v * 10 + (v >> 8);
        v = (((v & 0x000000FF000000FFULL) * 0x000F424000000064ULL)
             + (((v >> 16) & 0x000000FF000000FFULL) * 0x0000271000000001ULL)) >> 32;
        *out = (uint32_t)v;
        return k;
    #else
        uint64_t v = 0;
        int k = 0;
        while (k < 8 && p[k] >= '0' && p[k] <= '9') { v = v * 10 + (uint64_t)(p[k] - '0'); k++; }
        *out = v;
        return k;
    #endif
    }
    """
    void hpcps_svm_count2(const char* s, Py_ssize_t n, Py_ssize_t* nl, Py_ssize_t* co) noexcept nogil
    int hpcps_svm_digits8(const char* p, uint64_t* out) noexcept nogil

__all__ = ["SvmlightSyntaxError", "parse_svmlight"]

#: ``n_features`` of a dynamic table's id space (no ``n_features`` set: ids below 2**63 - 1,
#: :data:`hpcps.data.svmlight.DYNAMIC_IDS`); an id beyond it is refused naming that bound
DYNAMIC_IDS = (1 << 63) - 1

# error codes of the nogil loop
cdef enum:
    E_OK = 0
    E_LABEL = 1          # label is not a number
    E_PAIR = 2           # a token without ':'
    E_INDEX = 3          # index is not decimal digits
    E_INDEX_HUGE = 4     # index >= 2**63
    E_VALUE = 5          # value is not a number
    E_NONFINITE = 6      # value is nan or inf
    E_BELOW_BASE = 7     # index < index_base
    E_BEYOND = 8         # index - index_base >= n_features
    E_UNSORTED = 9       # index smaller than the previous one of the row
    E_DUPLICATE = 10     # index equal to the previous one (duplicates = error)
    E_QID = 11           # qid:X with X not an integer
    E_BARE_CR = 12       # a CR not followed by LF (old Mac line ending)


class SvmlightSyntaxError(ValueError):
    """A line of the buffer is not valid svmlight.

    Attributes
    ----------
    offset : int
        Byte offset (in the buffer) of the start of the offending line.
    reason : str
        What is wrong, e.g. ``"duplicate feature index 7 (index_base=1)"``.
    """

    def __init__(self, offset, reason):
        self.offset = int(offset)
        self.reason = reason
        super().__init__(f"byte {offset}: {reason}")


cdef inline bint _space(char c) nogil:
    return c == c' ' or c == c'\t' or c == c'\r' or c == c'\v' or c == c'\f'


# exact powers of ten for the fast path of _to_double
cdef double P10[23]
cdef int _i
for _i in range(23):
    P10[_i] = float(10 ** _i)


cdef inline bint _fast_double(const char* p, const char* e, double* out) noexcept nogil:
    """``[+-]digits[.digits][(e|E)[+-]digits]`` spanning ``[p, e)`` with at most 19
    significant digits, a mantissa below 2**53 and a decimal exponent within +-22: the
    value, correctly rounded (one exact IEEE multiplication or division of exact operands,
    Clinger's fast path), so equal to ``strtod``'s. False for anything else."""
    cdef bint neg = False, dot = False, any_digit = False, eneg = False
    cdef uint64_t m = 0
    cdef int nsig = 0, ex = 0, ev = 0, d
    if p < e and (p[0] == c'-' or p[0] == c'+'):
        neg = p[0] == c'-'
        p += 1
    while p < e:
        d = <int>p[0] - 48
        if 0 <= d <= 9:
            any_digit = True
            if m == 0 and d == 0:
                if dot:
                    ex -= 1
            elif nsig < 19:
                m = m * 10 + <uint64_t>d
                nsig += 1
                if dot:
                    ex -= 1
            else:
                return False
        elif p[0] == c'.' and not dot:
            dot = True
        else:
            break
        p += 1
    if not any_digit:
        return False
    if p < e and (p[0] == c'e' or p[0] == c'E'):
        p += 1
        if p < e and (p[0] == c'-' or p[0] == c'+'):
            eneg = p[0] == c'-'
            p += 1
        if p >= e:
            return False
        while p < e:
            d = <int>p[0] - 48
            if not (0 <= d <= 9) or ev > 10000:
                return False
            ev = ev * 10 + d
            p += 1
        ex += -ev if eneg else ev
    if p != e or m > (<uint64_t>1 << 53) or ex < -22 or ex > 22:
        return False
    if ex >= 0:
        out[0] = <double>m * P10[ex]
    else:
        out[0] = <double>m / P10[-ex]
    if neg:
        out[0] = -out[0]
    return True


cdef inline bint _to_double(const char* s, Py_ssize_t t0, Py_ssize_t t1, double* out) noexcept nogil:
    """``strtod`` of the token ``[t0, t1)``; False unless it reads exactly the token. The
    token is copied with a terminating NUL for ``strtod`` (the buffer need not have one)."""
    cdef char* stop
    cdef char small[128]
    cdef char* tok = small
    cdef Py_ssize_t m = t1 - t0
    cdef bint ok
    if _fast_double(s + t0, s + t1, out):
        return True
    if m >= 128:
        tok = <char*>malloc(m + 1)
        if tok == NULL:
            return False
    memcpy(tok, s + t0, m)
    tok[m] = 0
    out[0] = strtod(tok, &stop)
    ok = stop == tok + m
    if tok != small:
        free(tok)
    return ok


cdef inline const char* _num(const char* p, const char* e, double* out) noexcept nogil:
    """A decimal number ``[+-]digits[.digits]`` (no exponent) starting at ``p``, scanned up
    to its first other byte, whose end is returned (NULL: not such a number, more than 19
    significant digits, a mantissa above 2**53 or more than 22 decimals). The value is
    :func:`_fast_double`'s (the same digits, the same exact operation), so ``strtod``'s."""
    cdef bint neg = False
    cdef uint64_t m = 0
    cdef int nsig = 0, ex = 0
    cdef unsigned int d
    cdef const char* q
    cdef bint any_digit
    if p < e and (p[0] == c'-' or p[0] == c'+'):
        neg = p[0] == c'-'
        p += 1
    q = p
    while p < e:
        d = <unsigned int>(<unsigned char>p[0]) - 48
        if d > 9:
            break
        if m != 0 or d != 0:
            if nsig == 19:
                return NULL
            m = m * 10 + d
            nsig += 1
        p += 1
    any_digit = p != q
    if p < e and p[0] == c'.':
        p += 1
        q = p
        while p < e:
            d = <unsigned int>(<unsigned char>p[0]) - 48
            if d > 9:
                break
            ex -= 1
            if m != 0 or d != 0:
                if nsig == 19:
                    return NULL
                m = m * 10 + d
                nsig += 1
            p += 1
        any_digit = any_digit or p != q
    if not any_digit or m > (<uint64_t>1 << 53) or ex < -22:
        return NULL
    out[0] = <double>m / P10[-ex] if ex < 0 else <double>m
    if neg:
        out[0] = -out[0]
    return p


cdef inline bint _ends_token(const char* p, const char* e) noexcept nogil:
    """Whether ``p`` ends a token for the fast path: the end of the buffer, a space, a tab,
    LF, or CR LF (any other CR, ``\\v``, ``\\f``, ``#`` and the rest: the careful path)."""
    return p >= e or p[0] == c' ' or p[0] == c'\t' or p[0] == c'\n' or \
        (p[0] == c'\r' and p + 1 < e and p[1] == c'\n')


cdef inline void _put(void* a, bint i32, Py_ssize_t k, int64_t v) noexcept nogil:
    """``a[k] = v`` in an int32 (``i32``) or int64 array."""
    if i32:
        (<int32_t*>a)[k] = <int32_t>v
    else:
        (<int64_t*>a)[k] = v


cdef Py_ssize_t _fast_line(const char* s, Py_ssize_t pos, Py_ssize_t n, int index_base,
                           int64_t n_features, bint sum_duplicates, double* labels,
                           void* indptr, bint i32_ptr, void* indices, bint i32, double* data,
                           int64_t* offsets, Py_ssize_t* rows_io, Py_ssize_t* nnz_io) noexcept nogil:
    """One line starting at ``pos`` in one pass, for the usual lines only: ``label
    [qid:N] index:value ...`` with decimal numbers (no exponent, see :func:`_num`), spaces
    or tabs between tokens, LF or CR LF at the end, no comment, every check passed. Returns
    the start of the next line (the row stored, ``rows_io``/``nnz_io`` advanced), or -1
    with nothing committed: the careful path then reads the line (and finds its error)."""
    cdef const char* e = s + n
    cdef const char* p = s + pos
    cdef const char* q
    cdef Py_ssize_t rows = rows_io[0], nnz = nnz_io[0]
    cdef double label, value
    cdef uint64_t idx
    cdef unsigned int d
    cdef int64_t col, prev = -1
    cdef int k8
    while p < e and (p[0] == c' ' or p[0] == c'\t'):
        p += 1
    if p >= e:
        return n
    if p[0] == c'\n':
        return p - s + 1                                    # blank line: no row
    p = _num(p, e, &label)
    if p == NULL or not _ends_token(p, e):
        return -1
    # qid:N right after the label
    while p < e and (p[0] == c' ' or p[0] == c'\t'):
        p += 1
    if p + 4 < e and p[0] == c'q' and p[1] == c'i' and p[2] == c'd' and p[3] == c':':
        p += 4
        if p[0] == c'-' or p[0] == c'+':
            p += 1
        q = p
        while p < e and <unsigned int>(<unsigned char>p[0]) - 48 <= 9:
            p += 1
        if p == q or not _ends_token(p, e):
            return -1
    while True:
        while p < e and (p[0] == c' ' or p[0] == c'\t'):
            p += 1
        if p >= e:
            break
        if p[0] == c'\n':
            p += 1
            break
        if p[0] == c'\r':
            if p + 1 < e and p[1] == c'\n':
                p += 2
                break
            return -1
        q = p
        idx = 0
        k8 = 8
        if p + 8 <= e:                                  # up to 8 digits at once
            k8 = hpcps_svm_digits8(p, &idx)
            p += k8
        if k8 == 8:                                     # more digits (or near the end)
            while p < e:
                d = <unsigned int>(<unsigned char>p[0]) - 48
                if d > 9:
                    break
                idx = idx * 10 + d
                p += 1
        if p == q or p - q > 18 or p >= e or p[0] != c':':
            return -1
        p += 1
        d = <unsigned int>(<unsigned char>p[0]) - 48 if p < e else 10
        if d <= 9 and p + 1 < e and (p[1] == c' ' or p[1] == c'\n'):
            value = <double>d                           # one digit (binary features)
            p += 1
        else:
            p = _num(p, e, &value)
            if p == NULL or not _ends_token(p, e):
                return -1
        col = <int64_t>idx - index_base
        if col < 0 or col >= n_features or col < prev:
            return -1
        if col == prev:
            if not sum_duplicates:
                return -1
            data[nnz - 1] += value
            if not isfinite(data[nnz - 1]):
                return -1
            continue
        _put(indices, i32, nnz, col)
        data[nnz] = value
        nnz += 1
        prev = col
    labels[rows] = label
    offsets[rows] = pos
    rows += 1
    _put(indptr, i32_ptr, rows, nnz)
    rows_io[0] = rows
    nnz_io[0] = nnz
    return p - s



def parse_svmlight(buf, int index_base, int64_t n_features, bint sum_duplicates=False,
                   index_dtype=np.int64, dict out=None):
    """Parse whole svmlight lines into CSR arrays.

    Parameters
    ----------
    buf : bytes-like (bytes, memoryview, mmap), contiguous
        Whole lines of an svmlight file (the last one may lack its ``\\n``).
    index_base : {0, 1}
        Index of the first feature in the file; subtracted from every index.
    n_features : int
        Every index minus ``index_base`` must be in ``[0, n_features)``; up to 2**63 - 1
        (:data:`DYNAMIC_IDS`: a dynamic table's id space, named so in the error).
    sum_duplicates : bool, default False
        A feature index repeated right after itself in a row: add the values (True) or
        raise (False). An index smaller than its predecessor is always an error.
    index_dtype : {numpy.int64, numpy.int32}, default numpy.int64
        dtype of ``indices`` and ``indptr``; int32 needs ``n_features <= 2**31 - 1``
        (``indptr`` stays int64 if ``buf`` could hold ``2**31`` or more values). int32 is
        what scipy keeps for such a matrix: no cast after parsing.
    out : dict or None
        Reused output buffers (:func:`hpcps.kernels.text.pooled`): a dict the caller keeps
        across calls (empty at first). The arrays returned are then views of its buffers,
        valid until the next call with the same ``out``: a streaming reader parses chunk
        after chunk into the same memory (its pages touched once), and copies what it keeps.

    Returns
    -------
    labels : ndarray of float64, shape (n_rows,)
        The labels as written (any finite or non-finite number; the caller checks them).
    indptr : ndarray of int64 (or int32, see ``index_dtype``), shape (n_rows + 1,)
    indices : ndarray of int64 (or int32), shape (nnz,)
        Zero-based, strictly increasing within each row.
    data : ndarray of float64, shape (nnz,)
        Finite values (explicit zeros are kept).
    line_offsets : ndarray of int64, shape (n_rows,)
        Byte offset in ``buf`` of the line each row comes from.

    Raises
    ------
    SvmlightSyntaxError
        At the first bad line: ``offset`` is where that line starts in ``buf``. A ``\\r``
        followed by neither ``\\r`` nor ``\\n`` (nor the end of ``buf``) is one.
    ValueError
        If ``index_base`` is not 0 or 1, ``n_features < 1``, or ``index_dtype`` is not
        int64 or int32 (int32 with ``n_features > 2**31 - 1``).

    Notes
    -----
    One pass over ``buf`` counts ``\\n`` and ``:`` to size the outputs (upper bounds of rows
    and non-zeros), a second pass parses without the GIL.
    """
    if index_base not in (0, 1):
        raise ValueError(f"index_base must be 0 or 1, got {index_base}")
    if n_features < 1:
        raise ValueError(f"n_features must be >= 1, got {n_features}")
    index_dtype = np.dtype(index_dtype)
    if index_dtype not in (np.dtype(np.int64), np.dtype(np.int32)):
        raise ValueError(f"index_dtype must be int64 or int32, got {index_dtype}")
    cdef bint i32 = index_dtype == np.dtype(np.int32)
    if i32 and n_features > 2**31 - 1:
        raise ValueError(f"index_dtype int32 holds no index of n_features={n_features}")
    cdef const unsigned char[::1] view = buf
    cdef Py_ssize_t n = view.shape[0]
    cdef const char* s = b""
    if n > 0:
        s = <const char*>&view[0]
    cdef Py_ssize_t max_rows, max_nnz
    with nogil:
        hpcps_svm_count2(s, n, &max_rows, &max_nnz)
    max_rows += 1
    # indptr: int32 only if no count of values can pass 2**31 - 1 (indices: int32 whenever
    # asked, the values are below n_features); both written through _put
    cdef bint i32_ptr = i32 and max_nnz <= 2**31 - 1
    labels_a = pooled(out, "labels", max_rows, np.float64)
    indptr_a = pooled(out, "indptr", max_rows + 1, np.int32 if i32_ptr else np.int64)
    indices_a = pooled(out, "indices", max_nnz, index_dtype)
    data_a = pooled(out, "data", max_nnz, np.float64)
    offsets_a = pooled(out, "offsets", max_rows, np.int64)
    cdef double* labels = <double*>cnp.PyArray_DATA(labels_a)
    cdef void* p_indptr = cnp.PyArray_DATA(indptr_a)
    cdef void* p_indices = cnp.PyArray_DATA(indices_a)
    cdef double* data = <double*>cnp.PyArray_DATA(data_a)
    cdef int64_t* offsets = <int64_t*>cnp.PyArray_DATA(offsets_a)

    cdef Py_ssize_t pos = 0, eol, end, t0, t1, colon, k
    cdef Py_ssize_t rows = 0, nnz = 0, line_start = 0, bad_t0 = 0, bad_t1 = 0
    cdef int err = E_OK
    cdef const char* hit
    cdef double label, value
    cdef uint64_t idx, digit
    cdef int64_t col, prev, bad_col = 0, bad_prev = 0
    cdef bint first, qid_allowed
    _put(p_indptr, i32_ptr, 0, 0)
    cdef Py_ssize_t nxt
    with nogil:
        while pos < n and err == E_OK:
            line_start = pos
            nxt = _fast_line(s, pos, n, index_base, n_features, sum_duplicates, labels,
                             p_indptr, i32_ptr, p_indices, i32, data, offsets, &rows, &nnz)
            if nxt >= 0:
                pos = nxt
                continue
            hit = <const char*>memchr(s + pos, c'\n', n - pos)
            eol = (hit - s) if hit != NULL else n
            hit = <const char*>memchr(s + pos, c'\r', eol - pos)
            if hit != NULL:                            # CR CR... then not LF nor the end
                k = hit - s
                while k < eol and s[k] == c'\r':
                    k += 1
                if k < eol:
                    err = E_BARE_CR
                    break
            hit = <const char*>memchr(s + pos, c'#', eol - pos)
            end = (hit - s) if hit != NULL else eol
            first = True
            qid_allowed = True
            prev = -1
            t0 = pos
            while err == E_OK:
                while t0 < end and _space(s[t0]):
                    t0 += 1
                if t0 >= end:
                    break
                t1 = t0
                colon = -1
                while t1 < end and not _space(s[t1]):
                    if s[t1] == c':' and colon < 0:
                        colon = t1
                    t1 += 1
                bad_t0, bad_t1 = t0, t1
                if first:
                    if not _to_double(s, t0, t1, &label):
                        err = E_LABEL
                        break
                    labels[rows] = label
                    offsets[rows] = line_start
                    first = False
                    t0 = t1
                    continue
                if colon < 0:
                    err = E_PAIR
                    break
                if qid_allowed and colon - t0 == 3 and s[t0] == c'q' and s[t0 + 1] == c'i' \
                        and s[t0 + 2] == c'd':
                    qid_allowed = False
                    k = colon + 1
                    if k < t1 and (s[k] == c'-' or s[k] == c'+'):
                        k += 1
                    if k >= t1:
                        err = E_QID
                        break
                    while k < t1 and c'0' <= s[k] <= c'9':
                        k += 1
                    if k != t1:
                        err = E_QID
                        break
                    t0 = t1
                    continue
                qid_allowed = False
                if colon == t0:
                    err = E_INDEX
                    break
                idx = 0
                k = t0
                while k < colon:
                    if not (c'0' <= s[k] <= c'9'):
                        err = E_INDEX
                        break
                    digit = <uint64_t>(s[k] - c'0')
                    if k - t0 >= 18 and idx > (<uint64_t>0x7FFFFFFFFFFFFFFF - digit) // 10:
                        err = E_INDEX_HUGE
                        break
                    idx = idx * 10 + digit
                    k += 1
                if err != E_OK:
                    break
                if colon + 1 >= t1:
                    err = E_VALUE
                    break
                if not _to_double(s, colon + 1, t1, &value):
                    err = E_VALUE
                    break
                if not isfinite(value):
                    err = E_NONFINITE
                    break
                col = <int64_t>idx - index_base
                if col < 0:
                    err = E_BELOW_BASE
                    break
                if col >= n_features:
                    err = E_BEYOND
                    bad_col = col
                    break
                if col < prev:
                    err = E_UNSORTED
                    bad_col, bad_prev = col, prev
                    break
                if col == prev:
                    if sum_duplicates:
                        data[nnz - 1] += value
                        if not isfinite(data[nnz - 1]):
                            err = E_NONFINITE
                            break
                        t0 = t1
                        continue
                    err = E_DUPLICATE
                    bad_col = col
                    break
                _put(p_indices, i32, nnz, col)
                data[nnz] = value
                nnz += 1
                prev = col
                t0 = t1
            if err == E_OK and not first:
                rows += 1
                _put(p_indptr, i32_ptr, rows, nnz)
            pos = eol + 1
    if err != E_OK:
        raise SvmlightSyntaxError(line_start, _reason(err, bytes(view[bad_t0:bad_t1]), bad_col,
                                                      bad_prev, index_base, n_features))
    if out is not None or (4 * (max_nnz - nnz) <= max_nnz and 4 * (max_rows - rows) <= max_rows):
        # pooled buffers, or little unused (no comment, blank or qid line to speak of): views, not copies
        return (labels_a[:rows], indptr_a[:rows + 1], indices_a[:nnz], data_a[:nnz],
                offsets_a[:rows])
    return (labels_a[:rows].copy(), indptr_a[:rows + 1].copy(), indices_a[:nnz].copy(),
            data_a[:nnz].copy(), offsets_a[:rows].copy())


def _reason(int err, bytes token, int64_t col, int64_t prev, int index_base, int64_t n_features):
    tok = str(token, "utf-8", "replace")
    value = tok.partition(":")[2]
    if err == E_BARE_CR:
        return ("carriage return (CR) not followed by LF: lines must end in LF or CRLF; "
                "old Mac (CR) line endings are not read (convert the file, e.g. "
                "tr '\\r' '\\n' < FILE > NEW)")
    if err == E_LABEL:
        return f"could not convert string to float: {tok!r} (the label)"
    if err == E_PAIR:
        return f"expected INDEX:VALUE, got {tok!r}"
    if err == E_QID:
        return f"qid must be an integer, got {tok!r}"
    if err == E_INDEX:
        return f"feature index is not a non-negative integer in {tok!r}"
    if err == E_INDEX_HUGE:
        return f"feature index in {tok!r} does not fit in int64 (>= 2**63)"
    if err == E_VALUE:
        return f"could not convert string to float: {value!r} (value of {tok!r})"
    if err == E_NONFINITE:
        return f"non-finite feature value {float(value)!r} in {tok!r}"
    if err == E_BELOW_BASE:
        return (f"feature index {tok.split(':', 1)[0]} is below index_base={index_base} "
                f"(is the file {1 - index_base}-based?)")
    if err == E_BEYOND and n_features == DYNAMIC_IDS:
        # no n_features set (a dynamic table's ids): the bound of that id space, not an
        # n_features the job does not set (a trial read "out of range for n_features=9223...")
        return (f"feature index {col + index_base} (index_base={index_base}) is above "
                f"{DYNAMIC_IDS - 1} (2**63 - 2), the largest id a dynamic table accepts "
                f"(after removing index_base)")
    if err == E_BEYOND:
        return (f"feature index {col + index_base} (index_base={index_base}) is out of range "
                f"for n_features={n_features}")
    if err == E_UNSORTED:
        return (f"feature indices must increase along a row: {col + index_base} after "
                f"{prev + index_base}")
    if err == E_DUPLICATE:
        return (f"duplicate feature index {col + index_base} in a row (set [data] "
                f"duplicate_indices = \"sum\" to add their values)")
    return f"parse error {err}"


def _count_lf_colon(const unsigned char[::1] buf):
    """``(buf.count(b"\\n"), buf.count(b":"))`` by the sizing pass (for tests)."""
    cdef Py_ssize_t a = 0, b = 0
    if buf.shape[0]:
        hpcps_svm_count2(<const char*>&buf[0], buf.shape[0], &a, &b)
    return a, b
