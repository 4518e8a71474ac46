# The connector report's C records (compiled core): what a ReportState keeps per request
# (ReportSlot), the copy jobs its plan makes per row and per block table (RowJob,
# SegmentJob), and the small helpers both passes share. ReportState: _core_report.pxi.

from cpython.ref cimport PyObject
from libc.stdint cimport uint64_t

cdef extern from "Python.h":
    # on borrowed pointers (an object argument would add and drop a reference per call)
    PyObject* tuple_item "PyTuple_GET_ITEM"(PyObject* tuple, Py_ssize_t index)
    Py_ssize_t tuple_size "PyTuple_GET_SIZE"(PyObject* tuple)


cdef enum:
    # layer groups whose reported block counts a slot keeps in itself (ReportSlot.inline_blocks)
    INLINE_GROUPS = 2


cdef struct ReportSlot:
    int64_t request_id
    int64_t stamp              # the build() call that last scheduled it (duplicate check)
    Py_ssize_t num_tokens      # beam-0 tokens reported so far (the consumer's mirror length)
    Py_ssize_t num_pauses      # the request's pause count at its last report
    Py_ssize_t matched         # connector-supplied tokens to subtract on the next report
    Py_ssize_t num_groups      # layer groups at the first report; NEVER_REPORTED before any
    Py_ssize_t group_capacity  # groups blocks_of() has room for
    # blocks reported so far, per group (blocks_of()): in the slot itself for up to
    # INLINE_GROUPS groups (num_blocks NULL), else in a malloc'd array
    Py_ssize_t inline_blocks[INLINE_GROUPS]
    Py_ssize_t* num_blocks
    Py_ssize_t next_free       # free-list link while the slot is unused
    bint live
    bint reported              # False: the next report is a new request (never reported, or reset)


cdef struct RowJob:
    Py_ssize_t slot
    int64_t request_id
    int64_t position
    int64_t scheduled
    PyObject* buffer           # beam 0 (an Int32Buffer): borrowed in pass 1, held for a GIL-free pass 2
    const int32_t* data        # beam-0 tokens (buffer.storage, held likewise)
    Py_ssize_t* dirty          # &beam0.dirty_from, consumed in pass 1
    Py_ssize_t saved_dirty     # its value before, put back if the call fails
    Py_ssize_t begin
    Py_ssize_t end
    Py_ssize_t num_pauses
    Py_ssize_t first_segment
    Py_ssize_t num_groups
    Py_ssize_t replaced        # already-reported tokens the delta replaces (0 for a new request)
    Py_ssize_t saved_matched   # a committed row's slot.matched before, put back if the call fails
    bint is_new
    bint committed             # its slot already holds the report (the fast plan's rows; undone if the call fails)


cdef struct SegmentJob:
    PyObject* buffer           # table._buffer, as RowJob.buffer
    const int32_t* data        # block ids of one group (its storage, as RowJob.data)
    Py_ssize_t* dirty          # &table._buffer.dirty_from, as RowJob.dirty
    Py_ssize_t saved_dirty
    Py_ssize_t begin
    Py_ssize_t end
    Py_ssize_t replaced
    Py_ssize_t released


cdef Py_ssize_t NO_ENTRY = -1
# ReportSlot.num_groups before the first report: a request reported with no layer groups
# (a blank Request) is not "never reported", and its next report must have none either
cdef Py_ssize_t NEVER_REPORTED = -1
# pass 2 releases the GIL when it copies at least this many int32 entries (256 KiB)
cdef Py_ssize_t NOGIL_MIN_ENTRIES = 1 << 16


cdef inline Py_ssize_t* blocks_of(ReportSlot* slot) noexcept nogil:
    """The slot's reported block count per group (group_capacity entries)."""
    return slot.num_blocks if slot.num_blocks != NULL else slot.inline_blocks


cdef inline void consume_marks(RowJob* job, SegmentJob* parts) noexcept:
    """Pass 1, with the GIL: take the connector's change marks of a planned row (its
    tokens and each group's blocks), as read; restore_marks() puts them back."""
    cdef Py_ssize_t group
    job.saved_dirty = job.dirty[0]
    job.dirty[0] = job.end
    for group in range(job.num_groups):
        parts[group].saved_dirty = parts[group].dirty[0]
        parts[group].dirty[0] = parts[group].end


cdef inline void restore_marks(RowJob* job, SegmentJob* parts) noexcept:
    """Undo consume_marks() for a failed call (lower only: a mark never rises here)."""
    cdef Py_ssize_t group
    if job.saved_dirty < job.dirty[0]:
        job.dirty[0] = job.saved_dirty
    for group in range(job.num_groups):
        if parts[group].saved_dirty < parts[group].dirty[0]:
            parts[group].dirty[0] = parts[group].saved_dirty


cdef inline void give_back_marks(RowJob* job, SegmentJob* parts) noexcept:
    """Undo consume_marks() exactly, when nothing has run since (the marks the fast plan
    consumed, given back before a general row's checks can run Python code)."""
    cdef Py_ssize_t group
    job.dirty[0] = job.saved_dirty
    for group in range(job.num_groups):
        parts[group].dirty[0] = parts[group].saved_dirty


cdef inline uint64_t hash_request_id(int64_t request_id) noexcept nogil:
    # splitmix64 finaliser: consecutive ids spread over the table
    cdef uint64_t x = <uint64_t>request_id
    x = (x ^ (x >> 30)) * <uint64_t>0xbf58476d1ce4e5b9ULL
    x = (x ^ (x >> 27)) * <uint64_t>0x94d049bb133111ebULL
    return x ^ (x >> 31)


cdef inline list as_list(object requests):
    return <list>requests if type(requests) is list else list(requests)


cdef inline int check_span(int64_t request_id, Py_ssize_t begin, Py_ssize_t end, Py_ssize_t size,
                           Py_ssize_t capacity) except -1:
    """The loop-boundary check of one planned copy: it lies inside its buffer (``size``
    entries of ``capacity``), whatever state the buffer's counters were in."""
    if begin < 0 or begin > end or end > size or size > capacity:
        return span_outside(request_id, begin, end, size)
    return 0


cdef int span_outside(int64_t request_id, Py_ssize_t begin, Py_ssize_t end, Py_ssize_t size) except -1:
    """check_span's error, out of line: the inline check stays a few instructions."""
    _report_checks.outside_buffer(request_id, begin, end, size)
    return -1
