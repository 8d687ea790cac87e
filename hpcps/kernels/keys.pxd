# C-level entry points of keys.pyx for other compiled modules (hpcps.comm.fastpath).
from libc.stdint cimport int64_t, uint64_t

cdef Py_ssize_t gather_local_ptr(const int64_t* keys, Py_ssize_t m, uint64_t n, uint64_t a,
                                 uint64_t lo, uint64_t hi, const char* w, Py_ssize_t rowb,
                                 char* out, int* outside, Py_ssize_t ahead) noexcept nogil

cdef Py_ssize_t local_rows_ptr(const int64_t* keys, Py_ssize_t m, uint64_t n, uint64_t a,
                               uint64_t lo, uint64_t hi, int64_t* out,
                               int* outside) noexcept nogil

cdef bint finite_ptr(const void* v, Py_ssize_t nbytes, int itemsize) noexcept nogil

cdef Py_ssize_t take_rows_ptr(const char* w, uint64_t num_rows, Py_ssize_t rowb,
                              const int64_t* rows, Py_ssize_t m, char* out) noexcept nogil
