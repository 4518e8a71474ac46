# The memory of the KV-connector report's columns (compiled core), reused across calls.
#
# A report's twelve columns live in three numpy arrays, one per dtype (OutputArena): the
# int64 columns one after another in one, the tokens and block ids in an int32 one, is_new
# in a bool one. A SchedulerOutput holds a ReportColumns, and the columns themselves are
# slices of those arrays, made on first read. The arena keeps each array after the call
# and reuses it for the next report only when nothing else references it any more (its
# reference count is the arena's own: no output, column, view or buffer export of it is
# alive anywhere, since each of those holds a reference to it), and when it still is the
# writable, 1-D, contiguous array of its dtype the arena made (a user can reach it through
# a column's ``base``). So a report's arrays stay valid, and never change, for as long as
# anyone holds them; a report kept alive only costs the next call a fresh allocation.

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE, PyBuffer_Release

cdef extern from "Python.h":
    # on borrowed pointers: an object argument would add a reference of its own to the count
    Py_ssize_t reference_count "Py_REFCNT"(PyObject* obj)
    int get_buffer "PyObject_GetBuffer"(PyObject* obj, Py_buffer* view, int flags)
    void PyErr_Clear()

# arrays the arena keeps are shrunk when a report needs under a quarter of one (and the
# array is larger than this many entries): one large report does not pin its memory forever
cdef Py_ssize_t ARENA_SHRINK_MIN = 1 << 14


cdef struct ArenaArray:
    void* data                 # the array's entries, valid while the arena holds the array alone
    Py_ssize_t capacity        # entries


cdef inline Py_ssize_t int64_entries(Py_ssize_t batch, Py_ssize_t num_segments) noexcept nogil:
    """request_ids, positions, scheduled, replaced_tokens (batch each), token_offsets and
    group_offsets (batch + 1 each), block_offsets (segments + 1), replaced and released
    blocks (segments each), in that order."""
    return 6 * batch + 3 * num_segments + 3


@cython.final
cdef class ReportColumns:
    """The columns of one report, as slices of the arena's arrays (made by ``arrays()``)."""

    cdef object int64_array
    cdef object int32_array
    cdef object bool_array
    cdef Py_ssize_t batch
    cdef Py_ssize_t num_segments
    cdef Py_ssize_t num_tokens
    cdef Py_ssize_t num_blocks

    def arrays(self):
        """The twelve columns in ``SchedulerOutput``'s order (new slices on every call)."""
        cdef Py_ssize_t b = self.batch, s = self.num_segments, t = self.num_tokens
        wide = self.int64_array
        narrow = self.int32_array
        return (
            wide[0:b],
            self.bool_array[0:b],
            wide[b : 2 * b],
            wide[2 * b : 3 * b],
            wide[3 * b : 4 * b],
            wide[4 * b : 5 * b + 1],
            narrow[0:t],
            wide[5 * b + 1 : 6 * b + 2],
            wide[6 * b + 2 : 6 * b + 3 + s],
            narrow[t : t + self.num_blocks],
            wide[6 * b + 3 + s : 6 * b + 3 + 2 * s],
            wide[6 * b + 3 + 2 * s : 6 * b + 3 + 3 * s],
        )


cdef inline bint same_kind(const char* format, char format_code) noexcept:
    """``format`` (a buffer's, native order) is ``format_code``: '?' for bool, 'i' for any
    signed integer code (int64 is 'l' or 'q' by platform; the item size is checked apart)."""
    if format[0] == b"@"[0]:
        format += 1
    if format[0] == 0 or format[1] != 0:
        return False
    if format_code == b"?"[0]:
        return format[0] == format_code
    return format[0] in b"bhilq"


cdef void* reusable_data(PyObject* array, Py_ssize_t itemsize, char format_code, Py_ssize_t needed) noexcept:
    """The entries of ``array`` (borrowed from its one holder) if the arena may write
    ``needed`` of them: nothing else references it and it still is a writable 1-D
    contiguous array of that item type; NULL otherwise."""
    cdef Py_buffer view
    cdef void* data = NULL
    if array == <PyObject*>None or reference_count(array) != 1:
        return NULL
    if get_buffer(array, &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) != 0:
        PyErr_Clear()
        return NULL
    if (view.ndim == 1 and view.itemsize == itemsize and view.format != NULL and view.len >= needed * itemsize
            and view.buf != NULL and same_kind(view.format, format_code)):
        data = view.buf
    PyBuffer_Release(&view)
    return data


@cython.final
@cython.no_gc  # holds numpy arrays only (no cycle), and hands them to no one through gc.get_referents
cdef class OutputArena:
    """The three arrays a ReportState writes its reports into (see the top of this file)."""

    cdef object int64_array
    cdef object int32_array
    cdef object bool_array
    cdef ArenaArray wide
    cdef ArenaArray narrow
    cdef ArenaArray flags
    cdef Py_ssize_t num_allocations    # arrays allocated so far (a counter for tests)

    cdef bint claim(self, Py_ssize_t num_wide, Py_ssize_t num_narrow, Py_ssize_t num_flags) noexcept:
        """Point wide / narrow / flags at the kept arrays if all three can be reused (no
        Python code runs here); False if any must be allocated (``allocate``)."""
        self.wide.data = self._reusable(<PyObject*>self.int64_array, self.wide.capacity, 8, b"i"[0], num_wide)
        self.narrow.data = self._reusable(<PyObject*>self.int32_array, self.narrow.capacity, 4, b"i"[0], num_narrow)
        self.flags.data = self._reusable(<PyObject*>self.bool_array, self.flags.capacity, 1, b"?"[0], num_flags)
        return self.wide.data != NULL and self.narrow.data != NULL and self.flags.data != NULL

    cdef inline void* _reusable(self, PyObject* array, Py_ssize_t capacity, Py_ssize_t itemsize, char code,
                                Py_ssize_t needed) noexcept:
        if capacity > ARENA_SHRINK_MIN and 4 * needed < capacity:
            return NULL
        return reusable_data(array, itemsize, code, needed)

    cdef int allocate(self, Py_ssize_t num_wide, Py_ssize_t num_narrow, Py_ssize_t num_flags) except -1:
        """Replace every array ``claim`` could not reuse (this may run Python code: the
        garbage collector). The replaced arrays stay with whoever holds them."""
        if self.wide.data == NULL:
            self.int64_array = self._new(&self.wide, np.int64, 8, b"i"[0], num_wide)
        if self.narrow.data == NULL:
            self.int32_array = self._new(&self.narrow, np.int32, 4, b"i"[0], num_narrow)
        if self.flags.data == NULL:
            self.bool_array = self._new(&self.flags, np.bool_, 1, b"?"[0], num_flags)
        return 0

    cdef object _new(self, ArenaArray* slot, object dtype, Py_ssize_t itemsize, char code, Py_ssize_t needed):
        cdef Py_ssize_t capacity = grown_capacity(0, needed + needed // 4)
        array = np.empty(capacity, dtype=dtype)
        slot.data = NULL
        if reference_count(<PyObject*>array) == 1:  # a fresh array: held by this frame alone
            slot.data = reusable_data(<PyObject*>array, itemsize, code, needed)
        if slot.data == NULL:  # a fresh array is always reusable; never write through NULL
            raise MemoryError("a report's output array could not be set up")
        slot.capacity = capacity
        self.num_allocations += 1
        return array

    cdef ReportColumns columns(self, Py_ssize_t batch, Py_ssize_t num_segments, Py_ssize_t num_tokens,
                               Py_ssize_t num_blocks):
        """The report just written, for a SchedulerOutput (it references the arrays from now on)."""
        cdef ReportColumns columns = ReportColumns.__new__(ReportColumns)
        columns.int64_array = self.int64_array
        columns.int32_array = self.int32_array
        columns.bool_array = self.bool_array
        columns.batch = batch
        columns.num_segments = num_segments
        columns.num_tokens = num_tokens
        columns.num_blocks = num_blocks
        return columns
