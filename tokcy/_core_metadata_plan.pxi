# The pieces the attention-metadata plan (compiled, _core_metadata.pxi) is made of: one
# GroupSpec per planned sequence and layer group, the device block table's per-row state
# (DeviceTableRows, shared by the staging buffers of one InputPreparer), and the entries
# of one row that differ from the table planned into it (plan_row_delta).

from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF, Py_XINCREF
from cpython.tuple cimport PyTuple_GET_ITEM
from libc.stdint cimport uintptr_t
from libc.stdlib cimport calloc, free, realloc
from libc.string cimport memset

from tokcy import _prepare_checks as _checks

cdef enum:
    MAX_LAYER_GROUPS = 16
# the C arrays are sized by the enum, the shared checks bound the groups by their constant
assert MAX_LAYER_GROUPS == _checks.MAX_METADATA_GROUPS, "the metadata's group limit must agree with its checks"

cdef int64_t last_table_stamp = 0  # stamps handed out to device-table rows (process-wide, under the GIL)


cdef int as_block_table(object table) except -1:
    cdef BlockTable checked = <BlockTable?>table
    return 0


cdef inline int64_t block_of(int64_t position, int64_t block_size, int shift) noexcept nogil:
    """position // block_size for position >= 0: a shift for the usual power-of-two sizes
    (a 64-bit division costs tens of cycles, and each sequence needs a few)."""
    return position >> shift if shift >= 0 else position // block_size


cdef struct GroupSpec:
    const int32_t* blocks      # the table's ids at plan time
    PyObject* storage_owner    # numpy storage behind blocks, held until release() when owns_refs
    PyObject* buffer_owner     # the table's Int32Buffer (its device-table mark), held likewise
    Py_ssize_t num_blocks
    Py_ssize_t num_released
    # the device-table delta (plan_row_delta): row of the persistent table, and the entries
    # that changed: [released_begin, released_end) -> -1, [ids_begin, num_blocks) -> ids,
    # [num_blocks, zero_end) -> 0 (a dropped tail)
    Py_ssize_t row
    Py_ssize_t released_begin
    Py_ssize_t released_end
    Py_ssize_t ids_begin
    Py_ssize_t zero_end


cdef inline bint covers_row(Py_ssize_t num_blocks, Py_ssize_t num_released, Py_ssize_t block,
                            Py_ssize_t width) noexcept nogil:
    """Whether a table of ``num_blocks`` ids (``num_released`` released) holds a decode row
    in ``block`` and fits ``width`` blocks: what the decode runs check of each group
    before they record it (plan_sequence() checks the same, and names what fails)."""
    return num_blocks <= width and num_released <= block < num_blocks


cdef inline void set_group_spec(GroupSpec* spec, PyObject* buffer, Py_ssize_t num_blocks,
                                Py_ssize_t num_released) noexcept:
    """What pass 2 reads of one table (its Int32Buffer ``buffer``, borrowed): its ids now."""
    spec.blocks = (<Int32Buffer>buffer).data
    spec.storage_owner = <PyObject*>(<Int32Buffer>buffer).storage
    spec.buffer_owner = buffer
    spec.num_blocks = num_blocks
    spec.num_released = num_released


# The first entry of an array bound for writing (NULL if it has none), and its length
# into ``length``: both from the buffer numpy exports (typed, C-contiguous, writable), never
# from what the object says of itself (an ndarray subclass may answer len() or .shape
# with anything).
cdef int32_t* int32_pointer(object array, Py_ssize_t* length, BoundMemory bound) except? NULL:
    """Where the int32 entries of ``array`` (an output being bound) start, NULL for none,
    and their count into ``length``: taken through a plain view (numpy's export of the
    array's memory, whatever its class exports) and checked to lie where the array's
    memory starts (check_still_over), and where it started when ``bound`` was made
    (BoundMemory.check_taken)."""
    cdef int32_t[::1] memory = NDARRAY.view(array, NDARRAY)
    cdef int32_t* data = &memory[0] if memory.shape[0] else NULL
    length[0] = memory.shape[0]
    check_still_over(array, data)
    bound.check_taken(array, data)
    return data


cdef int64_t* int64_pointer(object array, Py_ssize_t* length, BoundMemory bound) except? NULL:
    """int32_pointer() for int64 entries."""
    cdef int64_t[::1] memory = NDARRAY.view(array, NDARRAY)
    cdef int64_t* data = &memory[0] if memory.shape[0] else NULL
    length[0] = memory.shape[0]
    check_still_over(array, data)
    bound.check_taken(array, data)
    return data


# Where the changed entries lie in the delta area (int32 words from its start, the used
# input ids first): their int64 indices from the first even word after the ids, then
# their int32 values; delta_end() is the words used in all (no padding word when no
# entry changed, so an area that just holds the ids is enough then).
cdef inline Py_ssize_t delta_start(Py_ssize_t num_tokens) noexcept nogil:
    return num_tokens + (num_tokens & 1)


cdef inline Py_ssize_t delta_end(Py_ssize_t num_tokens, Py_ssize_t num_entries) noexcept nogil:
    return delta_start(num_tokens) + 3 * num_entries if num_entries else num_tokens


@cython.final
cdef class DeviceTableRows:
    """What a device block table holds, per row (``num_groups * max_slots`` rows of
    ``width`` entries): the stamp of the table last sent into it, the entries sent and the
    leading entries sent as -1. Shared by the staging buffers of one ``InputPreparer``."""

    cdef readonly Py_ssize_t max_slots, num_groups, width
    cdef int64_t* row_stamps
    cdef Py_ssize_t* row_lengths
    cdef Py_ssize_t* row_released
    cdef int64_t* slot_seen            # per slot: the plan stamp of the call that uses it
    cdef int64_t* slot_request         # per slot: the request using it in that call
    cdef int64_t plan_stamp

    def __cinit__(self, Py_ssize_t max_slots, Py_ssize_t num_groups, Py_ssize_t width):
        cdef Py_ssize_t rows = max_slots * num_groups
        if max_slots < 1 or num_groups < 1 or width < 1:
            raise ValueError(f"max_slots, layer groups and max_blocks_per_seq must be >= 1, "
                             f"got {max_slots}, {num_groups}, {width}")
        if rows * width > INT32_MAX:
            raise ValueError(f"the device block table of {rows} x {width} entries is too large: "
                             f"it may hold at most {INT32_MAX} entries")
        self.row_stamps = <int64_t*>calloc(rows, sizeof(int64_t))
        self.row_lengths = <Py_ssize_t*>calloc(rows, sizeof(Py_ssize_t))
        self.row_released = <Py_ssize_t*>calloc(rows, sizeof(Py_ssize_t))
        self.slot_seen = <int64_t*>calloc(max_slots, sizeof(int64_t))
        self.slot_request = <int64_t*>calloc(max_slots, sizeof(int64_t))
        if (self.row_stamps == NULL or self.row_lengths == NULL or self.row_released == NULL
                or self.slot_seen == NULL or self.slot_request == NULL):
            raise MemoryError()
        self.max_slots = max_slots
        self.num_groups = num_groups
        self.width = width

    def __dealloc__(self):
        free(self.row_stamps)
        free(self.row_lengths)
        free(self.row_released)
        free(self.slot_seen)
        free(self.slot_request)

    def forget(self):
        """Forget what every row holds: the next step sends each scheduled table whole, and
        zeros past it to the row's end (after a step whose changed entries were staged but
        may not have reached the device: a row may hold any of its tables since)."""
        cdef Py_ssize_t row
        memset(self.row_stamps, 0, self.max_slots * self.num_groups * sizeof(int64_t))
        for row in range(self.max_slots * self.num_groups):
            self.row_lengths[row] = self.width


cdef inline bint row_holds(PyObject* buffer, Py_ssize_t num_blocks, Py_ssize_t num_released,
                           const int64_t* row_stamps, const Py_ssize_t* row_lengths, const Py_ssize_t* row_released,
                           Py_ssize_t row) noexcept:
    """Whether device-table ``row`` holds the table of Int32Buffer ``buffer`` (planned with
    ``num_blocks`` ids, ``num_released`` released) as it is: the usual decode step, which
    sends nothing. The decode runs ask this first, with the row arrays at hand."""
    cdef int64_t stamp = (<Int32Buffer>buffer).table_stamp
    return (stamp != 0 and stamp == row_stamps[row] and row_lengths[row] == num_blocks
            and (<Int32Buffer>buffer).table_dirty_from >= num_blocks and row_released[row] == num_released)


cdef inline Py_ssize_t plan_row_delta(GroupSpec* spec, PyObject* buffer, const int64_t* row_stamps,
                                      const Py_ssize_t* row_lengths, const Py_ssize_t* row_released,
                                      Py_ssize_t row) noexcept:
    """The entries of device-table ``row`` (its DeviceTableRows arrays given) that differ
    from the table planned in ``spec`` (its Int32Buffer ``buffer``): their count, and,
    when it is not 0, the ranges recorded in ``spec``."""
    cdef Py_ssize_t sent = row_lengths[row], start
    cdef int64_t stamp = (<Int32Buffer>buffer).table_stamp
    if row_holds(buffer, spec.num_blocks, spec.num_released, row_stamps, row_lengths, row_released, row):
        return 0  # the usual decode step (the rest below gives 0 too)
    spec.row = row
    if stamp != 0 and stamp == row_stamps[row]:
        # the row holds this table as of its last read: only the marked tail and newly
        # released leading entries can differ
        start = (<Int32Buffer>buffer).table_dirty_from
        if start > sent:
            start = sent
        spec.released_begin = row_released[row]
        spec.released_end = spec.num_released if spec.num_released < start else start
        if spec.released_end < spec.released_begin:
            spec.released_end = spec.released_begin
    else:  # another table (or none) is in the row: send it whole
        start = 0
        spec.released_begin = spec.released_end = 0
    if start > spec.num_blocks:
        start = spec.num_blocks
    spec.ids_begin = start
    spec.zero_end = sent if sent > spec.num_blocks else spec.num_blocks
    return (spec.released_end - spec.released_begin) + (spec.zero_end - start)
