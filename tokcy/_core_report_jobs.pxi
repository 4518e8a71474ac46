# The connector report's C records (compiled core): what a ReportState keeps per request
# (ReportSlot), the copy jobs its plan makes per row and per block table (RowJob,
# SegmentJob), and the small helpers both passes share. ReportState: _core_report.pxi.

from cpython.ref cimport PyObject
from libc.stdint cimport int16_t, uint64_t, uintptr_t
from libc.stdlib cimport free

cdef extern from "Python.h":
    # on borrowed pointers (an object argument would add and drop a reference per call)
    PyObject* tuple_item "PyTuple_GET_ITEM"(PyObject* tuple, Py_ssize_t index)
    Py_ssize_t tuple_size "PyTuple_GET_SIZE"(PyObject* tuple)


ctypedef unsigned char bint8  # a one-byte flag (RowJob's, which must fit its first line)

# ReportSlot and RowJob arrays are aligned to this (ReportState.slots, .rows)
cdef size_t CACHE_LINE = 64


cdef enum:
    # layer groups whose reported block counts a slot keeps in itself (SlotBlocks.counts)
    INLINE_GROUPS = 2


cdef union SlotBlocks:
    # Which member holds depends on the slot's group_capacity (blocks_of()): 0, the slot is
    # free and this is the free list's link; up to INLINE_GROUPS, the counts are here; more,
    # they are in a malloc'd array of group_capacity entries.
    Py_ssize_t counts[INLINE_GROUPS]
    Py_ssize_t* heap
    Py_ssize_t next_free       # the next free slot, or NO_ENTRY


cdef struct ReportSlot:
    # 64 bytes from a 64-byte aligned array (ReportState.slots): one cache line per request,
    # read and written by every fast-plan row. Only speed depends on this.
    int64_t request_id
    int64_t stamp              # the build() call that last scheduled it (duplicate check)
    Py_ssize_t num_tokens      # beam-0 tokens reported so far (the consumer's mirror length)
    Py_ssize_t num_pauses      # the request's pause count at its last report
    Py_ssize_t matched         # connector-supplied tokens to subtract on the next report
    SlotBlocks blocks          # blocks reported so far, per group (blocks_of())
    int16_t num_groups         # layer groups at the first report (at most 1,024, a Request's); NEVER_REPORTED before
    int16_t group_capacity     # groups blocks_of() has room for; 0 exactly while the slot is free (is_live())
    bint8 reported             # False: the next report is a new request (never reported, or reset)


cdef struct RowJob:
    # 128 bytes from a 64-byte aligned array (ReportState.rows): what every fast-plan row
    # writes fills the first cache line, so a large batch's direct rows write one line each.
    # Only speed depends on this.
    Py_ssize_t slot
    PyObject* buffer           # beam 0 (an Int32Buffer): borrowed in pass 1, held for a GIL-free pass 2
    Py_ssize_t saved_dirty     # buffer.dirty_from (mark_of()) before pass 1 consumed it, put back if the call fails
    Py_ssize_t end
    Py_ssize_t first_segment
    Py_ssize_t saved_tokens    # a committed row's slot.num_tokens before, put back if the call fails
    Py_ssize_t saved_matched   # a committed row's slot.matched before, likewise
    int32_t num_groups         # at most MAX_LAYER_GROUPS (a Request's bound)
    bint8 committed            # its slot already holds the report (the fast plan's rows; undone if the call fails)
    # its columns and tokens are already in the output (a fast row, DirectOutput): pass 2
    # writes only its segments, and nothing below is set
    bint8 direct
    bint8 is_new
    # the second line: what pass 2 reads of the rows it writes (not direct)
    int64_t request_id
    int64_t position
    int64_t scheduled
    const int32_t* data        # beam-0 tokens (buffer.storage, held likewise)
    Py_ssize_t begin
    Py_ssize_t num_pauses
    Py_ssize_t replaced        # already-reported tokens the delta replaces (0 for a new request)
    Py_ssize_t line_pad        # to 128 bytes


cdef struct SegmentJob:
    PyObject* buffer           # table._buffer, as RowJob.buffer
    const int32_t* data        # block ids of one group (its storage, as RowJob.data)
    Py_ssize_t saved_dirty     # as RowJob.saved_dirty
    Py_ssize_t begin
    Py_ssize_t end
    Py_ssize_t replaced
    Py_ssize_t released


cdef struct DirectOutput:
    # The arena's arrays, found reusable before the plan, into which the fast plan writes
    # its rows' per-row columns and tokens at once: their places depend on the batch size
    # alone (wide_layout's places). Block ids and block columns
    # follow the tokens and the segments, whose totals are known only after the plan:
    # pass 2 writes those.
    int64_t* request_ids       # NULL: the fast plan writes its rows' jobs only
    int64_t* positions
    int64_t* scheduled
    int64_t* replaced_tokens
    int64_t* token_ends        # token_offsets + 1: row i's is token_offsets[i + 1]
    int64_t* group_ends        # group_offsets + 1, likewise
    unsigned char* is_new
    int32_t* tokens
    Py_ssize_t token_capacity  # entries of tokens


cdef Py_ssize_t NO_ENTRY = -1
# ReportSlot.num_groups before the first report: a request reported with no layer groups
# (a blank Request) is not "never reported", and its next report must have none either
cdef Py_ssize_t NEVER_REPORTED = -1


cdef inline void* line_aligned(void* block) noexcept nogil:
    """The first CACHE_LINE boundary in a block malloc'd CACHE_LINE - 1 bytes larger."""
    return <void*>((<uintptr_t>block + CACHE_LINE - 1) & ~<uintptr_t>(CACHE_LINE - 1))


cdef inline bint is_live(const ReportSlot* slot) noexcept nogil:
    """The slot holds a tracked request (a free one has no room for block counts)."""
    return slot.group_capacity != 0


cdef inline Py_ssize_t* blocks_of(ReportSlot* slot) noexcept nogil:
    """The slot's reported block count per group (group_capacity entries; a live slot's)."""
    return slot.blocks.heap if slot.group_capacity > INLINE_GROUPS else slot.blocks.counts


cdef inline void free_blocks(ReportSlot* slot) noexcept nogil:
    """Free a slot's block counts if they are not in the slot (it is left without any)."""
    if slot.group_capacity > INLINE_GROUPS:
        free(slot.blocks.heap)
    slot.group_capacity = 0


cdef inline Py_ssize_t* mark_of(PyObject* buffer) noexcept:
    """The connector's change mark of a planned buffer (an Int32Buffer, borrowed)."""
    return &(<Int32Buffer>buffer).dirty_from


cdef inline void consume_mark(SegmentJob* part) noexcept:
    part.saved_dirty = mark_of(part.buffer)[0]
    mark_of(part.buffer)[0] = part.end


cdef inline void consume_marks(RowJob* job, SegmentJob* parts) noexcept:
    """Pass 1, with the GIL: take the connector's change marks of a planned row (its
    tokens and each group's blocks), as read; restore_marks() puts them back."""
    cdef Py_ssize_t group
    job.saved_dirty = mark_of(job.buffer)[0]
    mark_of(job.buffer)[0] = job.end
    for group in range(job.num_groups):
        consume_mark(&parts[group])


cdef inline void restore_marks(RowJob* job, SegmentJob* parts) noexcept:
    """Undo consume_marks() for a failed call (lower only: a mark never rises here)."""
    cdef Py_ssize_t group
    if job.saved_dirty < mark_of(job.buffer)[0]:
        mark_of(job.buffer)[0] = job.saved_dirty
    for group in range(job.num_groups):
        if parts[group].saved_dirty < mark_of(parts[group].buffer)[0]:
            mark_of(parts[group].buffer)[0] = parts[group].saved_dirty


cdef inline void give_back_marks(RowJob* job, SegmentJob* parts) noexcept:
    """Undo consume_marks() exactly, when nothing has run since (the marks the fast plan
    consumed, given back before a general row's checks can run Python code)."""
    cdef Py_ssize_t group
    mark_of(job.buffer)[0] = job.saved_dirty
    for group in range(job.num_groups):
        mark_of(parts[group].buffer)[0] = parts[group].saved_dirty


cdef inline Py_ssize_t plan_fast_segment(PyObject* table, Py_ssize_t reported, SegmentJob* part) noexcept:
    """The fast plan of one layer group (``table``, borrowed; ``reported``: its blocks
    reported so far): the new blocks, or -1 if ``table`` is not an exact BlockTable or
    its copy would leave its buffer (the general plan then raises the error)."""
    if <void*>table.ob_type != <void*>BlockTable:
        return -1
    return plan_fast_blocks(<PyObject*>(<BlockTable>table)._buffer, reported, part)


cdef inline Py_ssize_t plan_fast_blocks(PyObject* block_ids, Py_ssize_t reported, SegmentJob* part) noexcept:
    """plan_fast_segment of a table's buffer (``block_ids``, borrowed): -1 if it is not
    an Int32Buffer (a request's _blocks0 is None when its first table is not an exact
    BlockTable) or its copy would leave it."""
    cdef Py_ssize_t size, begin
    if <void*>block_ids.ob_type != <void*>Int32Buffer:
        return -1
    size = (<Int32Buffer>block_ids).size
    begin = (<Int32Buffer>block_ids).dirty_from
    if reported < begin:
        begin = reported
    if begin > size:
        begin = size
    if begin < 0 or size > (<Int32Buffer>block_ids).capacity:
        return -1
    part.buffer = block_ids
    part.data = (<Int32Buffer>block_ids).data
    part.saved_dirty = (<Int32Buffer>block_ids).dirty_from  # what consuming the mark saves
    part.begin = begin
    part.end = size
    part.replaced = reported - begin
    part.released = (<Int32Buffer>block_ids).num_released
    return size - begin


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define tokcy_prefetch(address) __builtin_prefetch((const void *)(address))
    #else
    #define tokcy_prefetch(address) ((void)(address))
    #endif
    """
    # a hint to load a cache line: never faults, whatever the address (given as an integer,
    # so no pointer past an object is ever formed)
    void prefetch "tokcy_prefetch"(uintptr_t address) noexcept nogil


cdef enum:
    # how far ahead (in rows) the fast plan asks for a request's fields (twice this), then
    # for its slot and buffer objects (this), then for its newest tokens (half this)
    PREFETCH_ROWS = 8
    # the fewest rows (left in a batch) for which it asks at all
    PREFETCH_MIN_ROWS = 2048


cdef inline uint64_t hash_request_id(int64_t request_id) noexcept nogil:
    # splitmix64 finaliser: consecutive ids spread over the table
    cdef uint64_t x = <uint64_t>request_id
    x = (x ^ (x >> 30)) * <uint64_t>0xbf58476d1ce4e5b9ULL
    x = (x ^ (x >> 27)) * <uint64_t>0x94d049bb133111ebULL
    return x ^ (x >> 31)


cdef inline list as_list(object requests, int kind):
    """Request group ``kind`` (0 context, 1 generation, 2 device-token) as a list: a list
    as given, a tuple copied (the default () of device_token_requests: no Python call
    per report), anything else through the shared check that names a non-iterable."""
    if type(requests) is list:
        return <list>requests
    if type(requests) is tuple:
        return list(<tuple>requests)
    return _report_checks.request_group(requests, _report_checks.GROUPS[kind], list)


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
