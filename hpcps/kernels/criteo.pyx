# cython: language_level=3
"""Criteo display-advertising TSV → CSR feature ids, and the reverse for generated data.

No I/O, no MPI. Format (Criteo Labs, "Display Advertising Challenge" data set, 2014; the
same layout in the 1 TB "Criteo Terabyte" click logs): one example per line, 40 fields
separated by tabs: the label (``0`` or ``1``), 13 integer fields ``I1..I13`` (decimal, may be
negative), 26 categorical fields ``C1..C26`` (hexadecimal, 8 digits in the released files);
any field but the label may be empty (missing). Lines end in ``\\n``; a ``\\r`` before it is
dropped.

Every field becomes exactly one feature id, so each row has 39 non-zeros of value 1:

- integer field ``i`` with value ``v``: the bin ``v`` for ``v <= 2`` and
  ``floor(log(v) ** 2)`` above (the log-square binning of the Criteo challenge's winning
  entry, Juan et al., "Field-aware Factorization Machines in a Real-world Online Advertising
  System", 2016, §3); a missing value is its own bin;
- categorical field ``j``: its 32-bit value; a missing value is its own value.

The id of (field ``f``, value ``x``) is ``mix(mix(x ^ seed) + (f + 1) * G)`` with SplitMix64's
output function ``mix`` and ``G = 0x9E3779B97F4A7C15``, masked to 63 bits (a non-negative
int64: raw 64-bit ids for a table with ``storage = "hash"``), or to ``hash_bits`` bits when
``hash_bits > 0`` (buckets of a fixed table).
"""

import numpy as np

cimport numpy as cnp
from libc.math cimport floor, log
from libc.stdint cimport int16_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr

from hpcps.kernels.text import pooled

cnp.import_array()

__all__ = ["N_INT", "N_CAT", "N_FIELDS", "MISSING", "CriteoSyntaxError", "parse_criteo",
           "feature_ids", "int_bins", "format_criteo"]

#: Integer fields, categorical fields, and the features per row.
cdef enum:
    NI = 13
    NC = 26
    NF = 39
N_INT = NI
N_CAT = NC
N_FIELDS = NF
#: The value a missing field is binned to (outside every bin and every 32-bit category).
MISSING = 1 << 62

cdef enum:
    E_OK = 0
    E_LABEL = 1          # label is not 0 or 1
    E_FIELDS = 2         # not 40 tab-separated fields
    E_INT = 3            # integer field is not a decimal integer
    E_HEX = 4            # categorical field is not 1..16 hexadecimal digits

cdef uint64_t GOLDEN = 0x9E3779B97F4A7C15ULL
cdef int64_t C_MISSING = 1LL << 62


class CriteoSyntaxError(ValueError):
    """A line of the buffer is not a Criteo TSV row.

    Attributes
    ----------
    offset : int
        Byte offset (in the buffer) of the start of the offending line.
    reason : str
        What is wrong, e.g. ``"field C3 'zz12' is not hexadecimal"``.
    """

    def __init__(self, offset, reason):
        self.offset = int(offset)
        self.reason = reason
        super().__init__(f"byte {offset}: {reason}")


cdef inline uint64_t _mix(uint64_t z) noexcept nogil:
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline int64_t _feature(int field, int64_t value, uint64_t seed, uint64_t mask) noexcept nogil:
    return <int64_t>(_mix(_mix(<uint64_t>value ^ seed) + <uint64_t>(field + 1) * GOLDEN) & mask)


cdef inline int64_t _int_bin(int64_t v) noexcept nogil:
    cdef double l
    if v <= 2:
        return v
    l = log(<double>v)
    return <int64_t>floor(l * l)


# lookup tables: hexadecimal digit values (H_TAB for a tab, H_BAD for any other byte), the
# bins of 0 <= v < BIN_N (as _int_bin computes them), the bins FT_LO <= b < FT_LO + FT_N whose
# feature ids are computed once per call
cdef enum:
    H_TAB = 254
    H_BAD = 255
    BIN_N = 1 << 16
    FT_LO = -16
    FT_N = 256
cdef uint8_t HEX[256]
cdef int16_t bins[BIN_N]


cdef void _init_tables() noexcept:
    cdef int i
    for i in range(256):
        HEX[i] = H_BAD
    for i in range(10):
        HEX[48 + i] = i
    for i in range(6):
        HEX[97 + i] = 10 + i
        HEX[65 + i] = 10 + i
    HEX[9] = H_TAB
    for i in range(BIN_N):
        bins[i] = <int16_t>_int_bin(i)


_init_tables()


def _mask(int hash_bits):
    if hash_bits < 0 or hash_bits > 63:
        raise ValueError(f"hash_bits must be in [0, 63], got {hash_bits}")
    return (1 << 63) - 1 if hash_bits == 0 else (1 << hash_bits) - 1


def parse_criteo(buf, int hash_bits=0, uint64_t seed=0, dict out=None):
    """Parse whole Criteo TSV lines into labels and CSR feature ids.

    Parameters
    ----------
    buf : bytes-like (bytes, bytearray, memoryview, uint8 array), contiguous
        Whole lines (the last one may lack its ``\\n``). Empty lines make no row.
    hash_bits : int, default 0
        0: 63-bit ids (for a hash-stored table); ``b`` in 1..63: ids in ``[0, 2**b)``.
    seed : int, default 0
        Mixed into every id (uint64).
    out : dict or None
        Reused output buffers (:func:`hpcps.kernels.text.pooled`), kept by the caller across
        calls: the arrays returned (``indptr`` aside) are then views of them, valid until
        the next call with the same ``out``.

    Returns
    -------
    labels : ndarray of float64, shape (n_rows,)
        0.0 or 1.0.
    indptr : ndarray of int64, shape (n_rows + 1,)
        ``39 * arange(n_rows + 1)``: every row has one feature per field.
    indices : ndarray of int64, shape (39 * n_rows,)
        Feature ids, field order (``I1..I13``, ``C1..C26``) within a row; not sorted.
    line_offsets : ndarray of int64, shape (n_rows,)
        Byte offset in ``buf`` of each row's line.

    Raises
    ------
    CriteoSyntaxError
        At the first bad line (``offset`` = where it starts in ``buf``).
    ValueError
        If ``hash_bits`` is outside ``[0, 63]``.
    """
    cdef uint64_t mask = _mask(hash_bits)
    cdef const unsigned char[::1] view = buf
    cdef Py_ssize_t n = view.shape[0]
    cdef const char* s = b""
    if n > 0:
        s = <const char*>&view[0]
    cdef Py_ssize_t max_rows
    with nogil:
        max_rows = _count_nl(s, n) + 1
    labels_a = pooled(out, "labels", max_rows, np.float64)
    indices_a = pooled(out, "indices", max_rows * NF, np.int64)
    offsets_a = pooled(out, "offsets", max_rows, np.int64)
    cdef double[::1] labels = labels_a
    cdef int64_t[::1] indices = indices_a
    cdef int64_t[::1] offsets = offsets_a
    # ids of the missing value of each field, and of the small bins of the integer fields
    cdef int64_t miss[NF]
    cdef int64_t ftab[NI][FT_N]
    cdef Py_ssize_t pos = 0, line_start = 0, line_end, row = 0, k, fstart, p
    cdef int field = 0, err = E_OK, err_field = 0, b
    cdef int64_t v, nd
    cdef bint neg
    cdef uint8_t c, d
    cdef const char* nl
    cdef Py_ssize_t err_line = 0
    with nogil:
        for field in range(NF):
            miss[field] = _feature(field, C_MISSING, seed, mask)
        for field in range(NI):
            for b in range(FT_N):
                ftab[field][b] = _feature(field, b + FT_LO, seed, mask)
        while pos < n:
            line_start = pos
            nl = <const char*>memchr(s + pos, c'\n', n - pos)
            line_end = (nl - s) if nl != NULL else n
            pos = line_end + 1
            if line_end > line_start and s[line_end - 1] == c'\r':
                line_end -= 1
            if line_end == line_start:
                continue                                    # blank line
            # label
            if line_end - line_start >= 2 and (s[line_start] == c'0' or s[line_start] == c'1') \
                    and s[line_start + 1] == c'\t':
                labels[row] = <double>(s[line_start] - c'0')
            else:
                err = E_LABEL
                err_line = line_start
                break
            p = line_start + 2
            k = row * NF
            # each field is parsed while it is scanned, up to its tab or the line end; a bad
            # character sends it to _field_error, which says what the two-pass reading said
            for field in range(NI):
                fstart = p
                neg = p < line_end and s[p] == c'-'
                p += neg
                v = 0
                nd = 0
                while p < line_end:
                    c = <uint8_t>s[p]
                    if c == 9:                              # tab
                        break
                    d = c - 48
                    if d > 9 or nd >= 18:
                        err = E_INT
                        break
                    v = v * 10 + d
                    nd += 1
                    p += 1
                if err == E_OK and p >= line_end:
                    err = E_FIELDS
                elif err == E_OK and nd == 0 and neg:
                    err = E_INT
                if err != E_OK:
                    err = _field_error(s, fstart, line_end, field, err)
                    break
                if nd == 0:
                    indices[k + field] = miss[field]
                else:
                    if neg:
                        v = -v
                    if v > 2:
                        v = bins[v] if v < BIN_N else _int_bin(v)
                    if v >= FT_LO and v < FT_LO + FT_N:
                        indices[k + field] = ftab[field][v - FT_LO]
                    else:
                        indices[k + field] = _feature(field, v, seed, mask)
                p += 1
            if err == E_OK:
                for field in range(NI, NF):
                    fstart = p
                    if p + 8 <= line_end and (p + 8 == line_end or s[p + 8] == c'\t'):
                        # the usual field: 8 digits, converted without a branch per digit
                        v = _hex8(<const uint8_t*>(s + p))
                        if v >= 0:
                            if (field < NF - 1 and p + 8 == line_end) or (field == NF - 1 and p + 8 != line_end):
                                err = _field_error(s, fstart, line_end, field, E_FIELDS)
                                break
                            indices[k + field] = _feature(field, v, seed, mask)
                            p += 9
                            continue
                    v = 0
                    while p < line_end:
                        d = HEX[<uint8_t>s[p]]
                        if d >= 16:
                            break
                        v = (v << 4) | d
                        p += 1
                    nd = p - fstart
                    if p < line_end and d != H_TAB:
                        err = E_HEX
                    elif nd > 16:
                        err = E_HEX
                    elif (field < NF - 1 and p >= line_end) or (field == NF - 1 and p != line_end):
                        err = E_FIELDS
                    if err != E_OK:
                        err = _field_error(s, fstart, line_end, field, err)
                        break
                    indices[k + field] = miss[field] if nd == 0 else _feature(field, v, seed, mask)
                    p += 1
            if err != E_OK:
                err_field = field
                err_line = line_start
                break
            offsets[row] = line_start
            row += 1
    if err != E_OK:
        raise CriteoSyntaxError(err_line, _reason(bytes(view), err, err_field, err_line))
    indptr_a = np.arange(row + 1, dtype=np.int64) * NF
    if out is not None or row + 1 >= max_rows:                 # the usual case: no blank line, so no copy
        return labels_a[:row], indptr_a, indices_a[:row * NF], offsets_a[:row]
    return labels_a[:row].copy(), indptr_a, indices_a[:row * NF].copy(), offsets_a[:row].copy()


cdef inline int _field_error(const char* s, Py_ssize_t fstart, Py_ssize_t line_end, int field,
                             int err) noexcept nogil:
    """The error of a field that starts at ``fstart`` where the fast scan found ``err``: a
    wrong field count (the field ends the line too early, or the last field does not end it)
    comes first, as when the field's end is found before its value is parsed."""
    cdef Py_ssize_t q = fstart
    while q < line_end and s[q] != c'\t':
        q += 1
    if (field < NF - 1 and q >= line_end) or (field == NF - 1 and q != line_end):
        return E_FIELDS
    return err


cdef inline int64_t _hex8(const uint8_t* q) noexcept nogil:
    """The value of 8 hexadecimal digits at ``q``, or -1 if one is not a digit."""
    cdef uint32_t d0 = HEX[q[0]], d1 = HEX[q[1]], d2 = HEX[q[2]], d3 = HEX[q[3]]
    cdef uint32_t d4 = HEX[q[4]], d5 = HEX[q[5]], d6 = HEX[q[6]], d7 = HEX[q[7]]
    if (d0 | d1 | d2 | d3 | d4 | d5 | d6 | d7) >= 16:
        return -1
    return <int64_t>(((d0 << 28) | (d1 << 24) | (d2 << 20) | (d3 << 16))
                     | ((d4 << 12) | (d5 << 8) | (d6 << 4) | d7))


cdef inline Py_ssize_t _count_nl(const char* s, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t count = 0
    cdef const char* p = s
    cdef const char* e = s + n
    while p < e:
        p = <const char*>memchr(p, c'\n', e - p)
        if p == NULL:
            break
        count += 1
        p += 1
    return count


def _field_name(int f):
    return f"I{f + 1}" if f < N_INT else f"C{f - NI + 1}"


def _reason(bytes buf, int err, int field, Py_ssize_t start):
    end = buf.find(b"\n", start)
    line = buf[start:end if end >= 0 else len(buf)].rstrip(b"\r")
    text = line.decode("utf-8", "replace")
    parts = text.split("\t")
    if err == E_LABEL and parts[0] in ("0", "1"):
        err = E_FIELDS
    if err == E_LABEL:
        return f"label {parts[0][:20]!r} is not 0 or 1 (a Criteo row starts with the label and a tab)"
    if err == E_FIELDS:
        return f"{len(parts)} tab-separated fields, expected {NF + 1} (label, I1..I13, C1..C26)"
    value = parts[field + 1] if field + 1 < len(parts) else ""
    if err == E_INT:
        return f"field {_field_name(field)} {value[:24]!r} is not a decimal integer"
    return f"field {_field_name(field)} {value[:24]!r} is not hexadecimal (1 to 16 digits)"


def int_bins(values):
    """The bin of each integer-field value (``v`` for ``v <= 2``, else ``floor(log(v)**2)``).

    Parameters
    ----------
    values : array_like of int64

    Returns
    -------
    ndarray of int64, same shape.
    """
    v = np.asarray(values, dtype=np.int64)
    out = v.copy()
    big = v > 2
    out[big] = np.floor(np.log(v[big].astype(np.float64)) ** 2).astype(np.int64)
    return out


def feature_ids(fields, values, int hash_bits=0, uint64_t seed=0):
    """Feature ids of (field, binned value) pairs, as :func:`parse_criteo` computes them.

    Parameters
    ----------
    fields : array_like of int, shape (n,)
        0..12 for ``I1..I13``, 13..38 for ``C1..C26``.
    values : array_like of int64, shape (n,)
        The bin (integer fields, see :func:`int_bins`), the category's value (categorical
        fields), or :data:`MISSING`.
    hash_bits, seed
        As in :func:`parse_criteo`.

    Returns
    -------
    ndarray of int64, shape (n,)
    """
    cdef uint64_t mask = _mask(hash_bits)
    f = np.ascontiguousarray(fields, dtype=np.int64)
    v = np.ascontiguousarray(values, dtype=np.int64)
    if f.shape != v.shape:
        raise ValueError(f"fields {f.shape} and values {v.shape} differ in shape")
    out_a = np.empty(f.size, dtype=np.int64)
    cdef const int64_t[::1] fv = f.ravel()
    cdef const int64_t[::1] vv = v.ravel()
    cdef int64_t[::1] out = out_a
    cdef Py_ssize_t i
    with nogil:
        for i in range(fv.shape[0]):
            out[i] = _feature(<int>fv[i], vv[i], seed, mask)
    return out_a.reshape(f.shape)


cdef inline Py_ssize_t _put_int(char* o, Py_ssize_t p, int64_t v) noexcept nogil:
    cdef char tmp[24]
    cdef int m = 0
    cdef uint64_t u
    if v < 0:
        o[p] = c'-'
        p += 1
        u = <uint64_t>(-v)
    else:
        u = <uint64_t>v
    if u == 0:
        o[p] = c'0'
        return p + 1
    while u > 0:
        tmp[m] = c'0' + <char>(u % 10)
        u //= 10
        m += 1
    while m > 0:
        m -= 1
        o[p] = tmp[m]
        p += 1
    return p


def format_criteo(const uint8_t[::1] labels, const int64_t[:, ::1] ints,
                  const uint32_t[:, ::1] cats, const uint8_t[:, ::1] int_missing,
                  const uint8_t[:, ::1] cat_missing):
    """Criteo TSV lines (the generator's writer; inverse of the parser up to binning).

    Parameters
    ----------
    labels : ndarray of uint8, shape (n,)
        0 or 1.
    ints : ndarray of int64, shape (n, 13)
    cats : ndarray of uint32, shape (n, 26)
        Written as 8 lower-case hexadecimal digits.
    int_missing, cat_missing : ndarray of uint8, shapes (n, 13) and (n, 26)
        1 where the field is written empty.

    Returns
    -------
    bytes
        ``n`` lines, each ending in ``\\n``.

    Raises
    ------
    ValueError
        If the shapes disagree.
    """
    cdef Py_ssize_t n = labels.shape[0], i, j, p = 0
    if ints.shape[0] != n or cats.shape[0] != n or ints.shape[1] != NI or cats.shape[1] != NC \
            or int_missing.shape[0] != n or cat_missing.shape[0] != n \
            or int_missing.shape[1] != NI or cat_missing.shape[1] != NC:
        raise ValueError("format_criteo: labels (n,), ints/int_missing (n, 13) and "
                         "cats/cat_missing (n, 26) must agree")
    out_a = np.empty(n * (2 + NI * 21 + NC * 9) + 1, dtype=np.uint8)
    cdef uint8_t[::1] outv = out_a
    cdef char* o = <char*>&outv[0]
    cdef const char* hexd = b"0123456789abcdef"
    cdef uint32_t c
    cdef int b
    with nogil:
        for i in range(n):
            o[p] = c'0' + <char>labels[i]
            p += 1
            for j in range(NI):
                o[p] = c'\t'
                p += 1
                if not int_missing[i, j]:
                    p = _put_int(o, p, ints[i, j])
            for j in range(NC):
                o[p] = c'\t'
                p += 1
                if not cat_missing[i, j]:
                    c = cats[i, j]
                    for b in range(7, -1, -1):
                        o[p] = hexd[(c >> (4 * b)) & 15]
                        p += 1
            o[p] = c'\n'
            p += 1
    return out_a[:p].tobytes()
