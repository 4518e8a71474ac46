# The memory of the KV-connector report's columns (compiled core), reused across calls.
#
# A report's twelve columns live in three numpy arrays, one per dtype (OutputArena): the
# int64 columns one after another in one, the tokens and block ids in an int32 one, is_new
# in a bool one. A SchedulerOutput holds a ReportColumns, and the columns themselves are
# slices of those arrays, made on first read. The arena keeps each array after the call
# and reuses it for the next report only when nothing else references it any more (its
# reference count is the arena's own: no output, column, view or buffer export of it is
# alive anywhere, since each of those holds a reference to it), and when it still is the
# writable, aligned, 1-D, contiguous array of its dtype the arena made (a user can reach it
# through a column's ``base`` and change it). So a report's arrays stay valid, and never
# change, for as long as anyone holds them; a report kept alive only costs the next call a
# fresh allocation. The check runs before the report's plan (it reads the array's fields,
# or, where those cannot be trusted, numpy's buffer export, which may run Python code when
# it refuses); after the plan only sizes are compared, in C, so a report
# into kept arrays runs no Python code from its first read of a request to its last write.
# Each array is a numpy view of memory the arena owns (a Storage, held by the arena and by
# every report written into it): numpy frees no memory it does not own, so no resize or
# __setstate__ of an array (reached through a column's base, or revived through a weak
# reference from another thread while the copy runs without the GIL) frees the memory
# under the copy, and the check before each report confirms that the array still shows it
# (after the copy, an array that no longer does is not handed to the report: the report
# makes its own view of the memory written, when first read).

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE, PyBuffer_Release
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF

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


cdef inline void claim_array(ArenaArray* array, Py_ssize_t needed) noexcept nogil:
    if array.capacity < needed or (array.capacity > ARENA_SHRINK_MIN and 4 * needed < array.capacity):
        array.data = NULL


# The nine int64 columns, in the order they lie one after another in a report's int64
# array (the per-row ones first, so that their places depend on the batch alone): the one
# description of that layout, which every writer and reader of the array uses.
cdef enum:
    WIDE_REQUEST_IDS
    WIDE_POSITIONS
    WIDE_SCHEDULED
    WIDE_REPLACED_TOKENS
    WIDE_TOKEN_OFFSETS
    WIDE_GROUP_OFFSETS
    WIDE_BLOCK_OFFSETS
    WIDE_REPLACED_BLOCKS
    WIDE_RELEASED_BLOCKS
    NUM_WIDE


cdef struct WideLayout:
    Py_ssize_t start[NUM_WIDE + 1]  # column k is [start[k], start[k + 1]); start[NUM_WIDE]: all entries


cdef inline WideLayout wide_layout(Py_ssize_t batch, Py_ssize_t num_segments) noexcept nogil:
    """Where each int64 column of a report of ``batch`` rows and ``num_segments``
    segments lies: ``batch`` entries for a per-row column, ``num_segments`` for a
    per-segment one, and one more for each of the three offset columns."""
    cdef WideLayout at
    cdef Py_ssize_t k, length
    at.start[0] = 0
    for k in range(NUM_WIDE):
        if k < WIDE_TOKEN_OFFSETS:
            length = batch
        elif k < WIDE_BLOCK_OFFSETS:
            length = batch + 1
        elif k == WIDE_BLOCK_OFFSETS:
            length = num_segments + 1
        else:
            length = num_segments
        at.start[k + 1] = at.start[k] + length
    return at


cdef inline Py_ssize_t int64_entries(Py_ssize_t batch, Py_ssize_t num_segments) noexcept nogil:
    return wide_layout(batch, num_segments).start[NUM_WIDE]


# COLUMNS' index of each int64 column -> its place in the int64 array (-1: another array)
cdef Py_ssize_t WIDE_PLACE[12]
WIDE_PLACE[:] = [WIDE_REQUEST_IDS, -1, WIDE_POSITIONS, WIDE_SCHEDULED, WIDE_REPLACED_TOKENS, WIDE_TOKEN_OFFSETS,
                 -1, WIDE_GROUP_OFFSETS, WIDE_BLOCK_OFFSETS, -1, WIDE_REPLACED_BLOCKS, WIDE_RELEASED_BLOCKS]


@cython.final
@cython.auto_pickle(False)  # a SchedulerOutput pickles its columns, never this
@cython.no_gc  # holds numpy arrays and Storages, and its columns in a C array (no cycle): gc.get_referents hands out none
cdef class ReportColumns:
    """The columns of one report, as slices of the arena's arrays, each made on its first
    read (a SchedulerOutput's column reads it here) and kept."""

    cdef object int64_array
    cdef object int32_array
    cdef object bool_array
    cdef Storage int64_memory          # the Storage each array shows (kept as long as the report)
    cdef Storage int32_memory
    cdef Storage bool_memory
    cdef readonly Py_ssize_t num_context
    """The report's context rows (they come first)."""
    cdef Py_ssize_t batch
    cdef Py_ssize_t num_segments
    cdef Py_ssize_t num_tokens
    cdef Py_ssize_t num_blocks
    # the columns made so far, by COLUMNS index (NULL: not yet), owned: a C array rather than a
    # list, which gc.get_referrers(column) would hand to Python code that could empty it
    cdef PyObject* made[12]

    def __dealloc__(self):
        cdef Py_ssize_t index
        cdef PyObject* column
        for index in range(12):
            column = self.made[index]
            self.made[index] = NULL  # (cleared before the reference goes, as Py_CLEAR does)
            Py_XDECREF(column)

    cdef object wide(self):
        """The int64 array (None until first read if the arena's no longer showed the
        memory written: OutputArena.fill)."""
        if self.int64_array is None:
            self.int64_array = storage_array(self.written(self.int64_memory), INT64_DTYPE)
        return self.int64_array

    cdef object narrow(self):
        """The int32 array (the tokens, then the block ids), as ``wide``."""
        if self.int32_array is None:
            self.int32_array = storage_array(self.written(self.int32_memory), INT32_DTYPE)
        return self.int32_array

    cdef object flags(self):
        """The bool array (is_new), as ``wide``."""
        if self.bool_array is None:
            self.bool_array = storage_array(self.written(self.bool_memory), BOOL_DTYPE)
        return self.bool_array

    cdef Storage written(self, Storage memory):
        """``memory``, which a report filled (OutputArena.fill): a ReportColumns made any
        other way (from Python) has none."""
        if memory is None:
            raise TypeError("this ReportColumns holds no report: a SchedulerOutputManager's report makes them")
        return memory

    cdef object column(self, Py_ssize_t index):
        """Column ``index`` (COLUMNS' order): made on the first read (wide_layout's places)."""
        cdef Py_ssize_t place
        cdef WideLayout at
        debug_assert(0 <= index < 12)
        if self.made[index] != NULL:
            return <object>self.made[index]
        place = WIDE_PLACE[index]
        if place >= 0:
            at = wide_layout(self.batch, self.num_segments)
            column = self.wide()[at.start[place] : at.start[place + 1]]
        elif index == 1:
            column = self.flags()[0 : self.batch]
        elif index == 6:
            column = self.narrow()[0 : self.num_tokens]
        else:  # 9
            column = self.narrow()[self.num_tokens : self.num_tokens + self.num_blocks]
        if self.made[index] != NULL:  # made meanwhile, by a read from code that making it ran (a gc callback)
            return <object>self.made[index]
        Py_INCREF(column)
        self.made[index] = <PyObject*>column
        return column

    def arrays(self):
        """The twelve columns in ``SchedulerOutput``'s order (made once, on their first read)."""
        cdef Py_ssize_t index
        columns = []
        for index in range(12):  # (a loop: no list comprehension in the core, _core.pyx)
            columns.append(self.column(index))
        return tuple(columns)

    @property
    def request_ids(self):
        return self.column(0)

    @property
    def is_new(self):
        return self.column(1)

    @property
    def computed_positions(self):
        return self.column(2)

    @property
    def num_scheduled_tokens(self):
        return self.column(3)

    @property
    def num_replaced_tokens(self):
        return self.column(4)

    @property
    def token_offsets(self):
        return self.column(5)

    @property
    def tokens(self):
        return self.column(6)

    @property
    def group_offsets(self):
        return self.column(7)

    @property
    def block_offsets(self):
        return self.column(8)

    @property
    def block_ids(self):
        return self.column(9)

    @property
    def num_replaced_blocks(self):
        return self.column(10)

    @property
    def num_released_blocks(self):
        return self.column(11)


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


cdef inline void* data_by_fields(PyObject* array, object dtype, Py_ssize_t itemsize, Py_ssize_t* capacity) noexcept:
    """reusable_data's checks, on the array's fields (no Python code runs)."""
    cdef ArrayFields* fields = <ArrayFields*>array
    if (<void*>array.ob_type != <void*>NDARRAY or fields.descr != <PyObject*>dtype or fields.nd != 1
            or fields.strides[0] != itemsize or (fields.flags & ARRAY_WRITABLE_FLAGS) != ARRAY_WRITABLE_FLAGS
            or fields.data == NULL):
        return NULL
    capacity[0] = fields.dimensions[0]
    return fields.data


cdef void* data_by_export(PyObject* array, Py_ssize_t itemsize, char format_code, Py_ssize_t* capacity) noexcept:
    """reusable_data's checks, through numpy's buffer export (this may run Python code:
    numpy raises, then the error is cleared)."""
    cdef Py_buffer view
    cdef void* data = NULL
    if get_buffer(array, &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) != 0:
        PyErr_Clear()
        return NULL
    if (view.ndim == 1 and view.itemsize == itemsize and view.format != NULL and view.buf != NULL
            and same_kind(view.format, format_code)):
        data = view.buf
        capacity[0] = view.len // itemsize
    PyBuffer_Release(&view)
    return data


# how the arena checks its arrays: through their fields where those read right (see
# ArrayFields), else through numpy's buffer export; _array_reads switches it, for tests
cdef bint READ_ARRAY_FIELDS = ARRAY_FIELDS_AGREE


def _array_reads(mode=None):
    """How the report's arena checks its arrays: "fields" or "export" (a test sets
    ``mode`` to run both; "fields" only where they read right). Returns the mode before."""
    global READ_ARRAY_FIELDS
    before = "fields" if READ_ARRAY_FIELDS else "export"
    if mode is not None:
        if mode not in ("fields", "export"):
            raise ValueError(f"mode must be 'fields' or 'export', not {mode!r}")
        READ_ARRAY_FIELDS = mode == "fields" and array_fields_agree()
    return before


cdef void* reusable_data(PyObject* array, object dtype, Py_ssize_t itemsize, char format_code,
                         Py_ssize_t* capacity) noexcept:
    """The entries of ``array`` (borrowed from its one holder), their number in
    ``capacity``, if the arena may write into it: nothing else references it and it still
    is a writable, aligned, 1-D contiguous array of ``dtype``; NULL otherwise (this may
    run Python code, in numpy's buffer export)."""
    capacity[0] = 0
    if array == <PyObject*>None or reference_count(array) != 1:
        return NULL
    if READ_ARRAY_FIELDS:
        return data_by_fields(array, dtype, itemsize, capacity)
    return data_by_export(array, itemsize, format_code, capacity)


cdef inline void shows_own_memory(ArenaArray* slot, Storage memory, Py_ssize_t itemsize) noexcept:
    """Keep ``slot`` (reusable_data's finding) only if its array still shows ``memory``, all
    of it being there (a caller's ``__setstate__`` gives an array memory of its own)."""
    if slot.data != NULL and (memory is None or slot.data != memory.data
                              or slot.capacity * itemsize > storage_length(memory)):
        slot.data = NULL
        slot.capacity = 0


cdef inline bint shows(object array, Storage memory, object dtype, Py_ssize_t itemsize, char format_code) noexcept:
    """Whether ``array`` still shows all of ``memory`` (this may run Python code, in numpy's
    buffer export when it refuses; it cannot fail)."""
    cdef Py_ssize_t capacity = 0
    cdef void* data
    if READ_ARRAY_FIELDS:
        data = data_by_fields(<PyObject*>array, dtype, itemsize, &capacity)
    else:
        data = data_by_export(<PyObject*>array, itemsize, format_code, &capacity)
    return data == memory.data and capacity * itemsize == storage_length(memory)


@cython.final
@cython.no_gc  # holds numpy arrays and Storages only (no cycle), and hands them to no one through gc.get_referents
cdef class OutputArena:
    """The three arrays a ReportState writes its reports into (see the top of this file)."""

    cdef object int64_array
    cdef object int32_array
    cdef object bool_array
    cdef ArenaArray wide
    cdef ArenaArray narrow
    cdef ArenaArray flags
    cdef Py_ssize_t num_allocations    # arrays allocated so far (a counter for tests)
    cdef Storage int64_memory          # what each array shows (see the top)
    cdef Storage int32_memory
    cdef Storage bool_memory

    cdef void inspect(self) noexcept:
        """Before a report's plan: find which kept arrays may be written (see
        ``reusable_data``). This may run Python code; from here to the end of the copy
        nothing but ``allocate`` does, so the arrays found stay as they are."""
        self.wide.data = reusable_data(<PyObject*>self.int64_array, INT64_DTYPE, 8, b"i"[0], &self.wide.capacity)
        self.narrow.data = reusable_data(<PyObject*>self.int32_array, INT32_DTYPE, 4, b"i"[0], &self.narrow.capacity)
        self.flags.data = reusable_data(<PyObject*>self.bool_array, BOOL_DTYPE, 1, b"?"[0], &self.flags.capacity)
        shows_own_memory(&self.wide, self.int64_memory, 8)
        shows_own_memory(&self.narrow, self.int32_memory, 4)
        shows_own_memory(&self.flags, self.bool_memory, 1)

    cdef bint claim(self, Py_ssize_t num_wide, Py_ssize_t num_narrow, Py_ssize_t num_flags) noexcept nogil:
        """After the plan: keep each array ``inspect`` found if it is large enough and not
        far too large; True if all three are kept, False if ``allocate`` must replace some.
        Plain C: no Python code runs here."""
        claim_array(&self.wide, num_wide)
        claim_array(&self.narrow, num_narrow)
        claim_array(&self.flags, num_flags)
        return self.wide.data != NULL and self.narrow.data != NULL and self.flags.data != NULL

    cdef int allocate(self, Py_ssize_t num_wide, Py_ssize_t num_narrow, Py_ssize_t num_flags) except -1:
        """Replace every array ``claim`` did not keep (this may run Python code: the
        garbage collector). The replaced arrays stay with whoever holds them."""
        if self.wide.data == NULL:
            self.int64_memory = self._new(&self.wide, 8, num_wide)
            self.int64_array = storage_array(self.int64_memory, INT64_DTYPE)
        if self.narrow.data == NULL:
            self.int32_memory = self._new(&self.narrow, 4, num_narrow)
            self.int32_array = storage_array(self.int32_memory, INT32_DTYPE)
        if self.flags.data == NULL:
            self.bool_memory = self._new(&self.flags, 1, num_flags)
            self.bool_array = storage_array(self.bool_memory, BOOL_DTYPE)
        return 0

    cdef Storage _new(self, ArenaArray* slot, Py_ssize_t itemsize, Py_ssize_t needed):
        """The arena's own memory for ``needed`` entries and a quarter more; ``slot`` points
        into it (what the copy writes is this memory, whichever array shows it)."""
        cdef Py_ssize_t count = grown_capacity(0, needed + needed // 4)
        cdef Storage memory = new_byte_storage(count * itemsize)
        slot.data = memory.data
        slot.capacity = count
        self.num_allocations += 1
        return memory

    cdef void fill(self, ReportColumns columns, Py_ssize_t num_context, Py_ssize_t batch, Py_ssize_t num_segments,
                   Py_ssize_t num_tokens, Py_ssize_t num_blocks) noexcept:
        """Make ``columns`` (allocated before the plan) the report just written: it references
        the arrays from now on. This cannot fail, so a report once written is never lost.
        An array that no longer shows the memory written (a caller's ``__setstate__`` from
        another thread while the copy ran) is not handed on: the report makes its own view
        of that memory when first read, and the next ``inspect`` replaces the array."""
        columns.int64_memory = self.int64_memory
        columns.int32_memory = self.int32_memory
        columns.bool_memory = self.bool_memory
        if shows(self.int64_array, self.int64_memory, INT64_DTYPE, 8, b"i"[0]):
            columns.int64_array = self.int64_array
        if shows(self.int32_array, self.int32_memory, INT32_DTYPE, 4, b"i"[0]):
            columns.int32_array = self.int32_array
        if shows(self.bool_array, self.bool_memory, BOOL_DTYPE, 1, b"?"[0]):
            columns.bool_array = self.bool_array
        columns.num_context = num_context
        columns.batch = batch
        columns.num_segments = num_segments
        columns.num_tokens = num_tokens
        columns.num_blocks = num_blocks
