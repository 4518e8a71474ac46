# RequestData (compiled core): the rows of a SchedulerOutput, each field read from the
# report's columns when it is asked for. Same behaviour as tokcy/_pure/request_data.py.
#
# A row is its report's RowColumns and its row number. A whole report's rows cost one
# small object each, from a free list and untracked by the garbage collector, so a
# consumer pays only for the values it reads. RowColumns holds the memory of every column
# it reads, so none is freed under it, and nothing it holds can lead back to a row (no
# cycle, hence no need of the collector):
# - a manager's report: the three Storages the manager wrote, read directly (the report
#   holds them, and this holds the report). Never through the arrays over them: a caller's
#   __setstate__ can give such an array memory of its own, which a second one frees
#   whatever exports it has. The report holds the manager's arrays too, so their reference
#   counts keep the manager from writing the next report into that memory while a row
#   lives. Whoever holds a column can still write into it, so every read checks each
#   offset it follows against the length of the column it indexes before it reads there.
# - an output made by hand: a private copy of each column, made, exported and checked when
#   the rows are made (so its values cannot change after the check).

from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF

from tokcy import _request_data


cdef extern from "Python.h":
    object PyLong_FromLong(long value)


cdef inline list int32_list(const int32_t* values, int64_t begin, int64_t end):
    """``values[begin:end]`` as a new list (the caller checked the span)."""
    cdef list result = PyList_New(end - begin)
    cdef int64_t index
    cdef object value
    for index in range(begin, end):
        value = PyLong_FromLong(values[index])
        Py_INCREF(value)  # PyList_SET_ITEM steals the reference
        PyList_SET_ITEM(result, index - begin, value)
    return result


cdef inline bint inside(int64_t begin, int64_t end, Py_ssize_t length) noexcept nogil:
    return 0 <= begin <= end <= length


cdef int outside(Py_ssize_t row) except -1:
    raise ValueError(_request_data.OUTSIDE.format(row))


cdef inline list checked_int32_list(const int32_t* values, Py_ssize_t length, int64_t begin, int64_t end,
                                    Py_ssize_t row):
    """``values[begin:end]`` as a new list; ValueError naming ``row`` unless the span lies
    inside the ``length`` values."""
    if not inside(begin, end, length):
        outside(row)
    return int32_list(values, begin, end)


@cython.final
@cython.no_gc  # holds exports of arrays without attributes, and their report, only (see the top of this file)
@cython.auto_pickle(False)
cdef class RowColumns:
    """The columns of one report, as buffer exports its rows read through."""

    cdef Py_buffer views[12]
    cdef int num_views
    cdef object report         # a manager's report: it keeps the Storages its arrays show (see the top)
    cdef const int64_t* request_ids
    cdef const unsigned char* is_new
    cdef const int64_t* positions
    cdef const int64_t* scheduled
    cdef const int64_t* replaced_tokens
    cdef const int64_t* token_offsets
    cdef const int32_t* tokens
    cdef const int64_t* group_offsets
    cdef const int64_t* block_offsets
    cdef const int32_t* block_ids
    cdef const int64_t* replaced_blocks
    cdef const int64_t* released_blocks
    cdef Py_ssize_t batch
    cdef Py_ssize_t num_tokens
    cdef Py_ssize_t num_block_offsets
    cdef Py_ssize_t num_blocks
    cdef Py_ssize_t num_replaced_blocks
    cdef Py_ssize_t num_released_blocks

    def __dealloc__(self):
        cdef int index
        for index in range(self.num_views):
            PyBuffer_Release(&self.views[index])

    cdef const void* export(self, object array, Py_ssize_t itemsize, char code, Py_ssize_t* length) except? NULL:
        """A buffer export of ``array`` (1-D, C-contiguous, of the item type), held until
        this object dies: its data, and its length in ``length``."""
        cdef Py_buffer* view = &self.views[self.num_views]
        if get_buffer(<PyObject*>array, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0:
            return NULL  # the exporter's error
        if not (view.ndim == 1 and view.itemsize == itemsize and view.format != NULL and same_kind(view.format, code)):
            PyBuffer_Release(view)
            raise ValueError(_request_data.CHANGED)  # made so: someone changed its dtype or shape since
        self.num_views += 1
        length[0] = view.len // itemsize
        return view.buf

    cdef const void* export_copy(self, object output, str name, object dtype, Py_ssize_t itemsize, char code,
                                 Py_ssize_t* length) except? NULL:
        """A private copy of the column ``name`` of ``output`` in ``dtype`` (what
        ``_request_data.column_copy`` makes, on both backends), exported."""
        return self.export(_request_data.column_copy(getattr(output, name), dtype, name), itemsize, code, length)

    cdef const int64_t* int64_copy(self, object output, str name, Py_ssize_t* length) except? NULL:
        return <const int64_t*>self.export_copy(output, name, np.int64, 8, b"i"[0], length)

    cdef const int32_t* int32_copy(self, object output, str name, Py_ssize_t* length) except? NULL:
        return <const int32_t*>self.export_copy(output, name, np.int32, 4, b"i"[0], length)

    cdef int export_columns(self, object output) except -1:
        """Copy and export the twelve columns of ``output`` (a SchedulerOutput made by hand)."""
        cdef Py_ssize_t length[7]
        self.request_ids = self.int64_copy(output, "request_ids", &length[0])
        self.is_new = <const unsigned char*>self.export_copy(output, "is_new", np.bool_, 1, b"?"[0], &length[1])
        self.positions = self.int64_copy(output, "computed_positions", &length[2])
        self.scheduled = self.int64_copy(output, "num_scheduled_tokens", &length[3])
        self.replaced_tokens = self.int64_copy(output, "num_replaced_tokens", &length[4])
        self.token_offsets = self.int64_copy(output, "token_offsets", &length[5])
        self.tokens = self.int32_copy(output, "tokens", &self.num_tokens)
        self.group_offsets = self.int64_copy(output, "group_offsets", &length[6])
        self.block_offsets = self.int64_copy(output, "block_offsets", &self.num_block_offsets)
        self.block_ids = self.int32_copy(output, "block_ids", &self.num_blocks)
        self.replaced_blocks = self.int64_copy(output, "num_replaced_blocks", &self.num_replaced_blocks)
        self.released_blocks = self.int64_copy(output, "num_released_blocks", &self.num_released_blocks)
        self.batch = length[0]
        if not (length[1] == length[2] == length[3] == length[4] == self.batch
                and length[5] == length[6] == self.batch + 1):
            raise ValueError("the SchedulerOutput's per-row columns differ in length")
        return 0

    cdef int export_report(self, ReportColumns report) except -1:
        """A manager's report: the memory it was written into (its three Storages, held
        through ``self.report``), the columns at ``arrays()``' places."""
        cdef Py_ssize_t b = report.batch, s = report.num_segments
        cdef WideLayout at = wide_layout(b, s)
        cdef Storage wide_memory = report.written(report.int64_memory)
        cdef Storage narrow_memory = report.written(report.int32_memory)
        cdef Storage flags_memory = report.written(report.bool_memory)
        # the arena sized each Storage for the report (a Storage never changes its size)
        debug_assert(storage_length(wide_memory) >= at.start[NUM_WIDE] * <Py_ssize_t>sizeof(int64_t))
        debug_assert(storage_length(narrow_memory)
                     >= (report.num_tokens + report.num_blocks) * <Py_ssize_t>sizeof(int32_t))
        debug_assert(storage_length(flags_memory) >= b)
        self.report = report
        cdef const int64_t* wide = <const int64_t*>wide_memory.data
        cdef const int32_t* narrow = <const int32_t*>narrow_memory.data
        self.is_new = <const unsigned char*>flags_memory.data
        self.batch = b
        self.request_ids = wide + at.start[WIDE_REQUEST_IDS]
        self.positions = wide + at.start[WIDE_POSITIONS]
        self.scheduled = wide + at.start[WIDE_SCHEDULED]
        self.replaced_tokens = wide + at.start[WIDE_REPLACED_TOKENS]
        self.token_offsets = wide + at.start[WIDE_TOKEN_OFFSETS]
        self.group_offsets = wide + at.start[WIDE_GROUP_OFFSETS]
        self.block_offsets = wide + at.start[WIDE_BLOCK_OFFSETS]
        self.replaced_blocks = wide + at.start[WIDE_REPLACED_BLOCKS]
        self.released_blocks = wide + at.start[WIDE_RELEASED_BLOCKS]
        self.num_block_offsets = s + 1
        self.num_replaced_blocks = self.num_released_blocks = s
        self.tokens = narrow
        self.num_tokens = report.num_tokens
        self.block_ids = narrow + report.num_tokens
        self.num_blocks = report.num_blocks
        return 0

    cdef int check_layout(self) except -1:
        """ValueError unless every row's offsets lie inside the columns: its tokens, its
        segments, each segment's block ids and counts."""
        cdef Py_ssize_t row
        cdef int64_t segment, end
        for row in range(self.batch):
            end = self.group_offsets[row + 1]
            if not (inside(self.token_offsets[row], self.token_offsets[row + 1], self.num_tokens)
                    and 0 <= self.group_offsets[row] <= end < self.num_block_offsets
                    and end <= self.num_replaced_blocks and end <= self.num_released_blocks):
                outside(row)
            for segment in range(self.group_offsets[row], end):
                if not inside(self.block_offsets[segment], self.block_offsets[segment + 1], self.num_blocks):
                    outside(row)
        return 0

    cdef int64_t first_segment(self, Py_ssize_t row, int64_t* end) except -1:
        """Row ``row``'s segments, ``[result, end)``, checked against ``block_offsets``."""
        cdef int64_t first = self.group_offsets[row]
        end[0] = self.group_offsets[row + 1]
        if not (0 <= first <= end[0] < self.num_block_offsets):
            outside(row)
        return first

    cdef list segment_blocks(self, int64_t segment, Py_ssize_t row):
        return checked_int32_list(self.block_ids, self.num_blocks, self.block_offsets[segment],
                                  self.block_offsets[segment + 1], row)

    cdef list segment_counts(self, const int64_t* column, Py_ssize_t length, Py_ssize_t row):
        cdef int64_t first, end, segment
        first = self.first_segment(row, &end)
        if end > length:
            outside(row)
        counts = []
        for segment in range(first, end):  # (a loop: no list comprehension in the core, _core.pyx)
            counts.append(column[segment])
        return counts


cdef RowColumns row_columns(object output):
    """The columns of ``output`` exported: the three arrays of a manager's report (its
    twelve columns need not be made), else copies of the twelve columns, checked."""
    cdef RowColumns columns = RowColumns.__new__(RowColumns)
    source = output._source
    if type(source) is ReportColumns:
        columns.export_report(<ReportColumns>source)
    else:
        columns.export_columns(output)
        columns.check_layout()
    return columns


@cython.final
@cython.no_gc  # holds its RowColumns only
@cython.freelist(1024)
cdef class RequestData:
    """One row of a ``SchedulerOutput`` (the fields are documented on
    ``tokcy.connector.RequestData``); made by the report, never by hand."""

    cdef RowColumns columns
    cdef Py_ssize_t row

    _is_request_data = True

    def __init__(self, *args, **kwargs):
        raise TypeError(_request_data.MADE_BY_REPORT)

    cdef inline RowColumns checked_columns(self):
        if self.columns is None:  # made through __new__, by hand
            raise TypeError(_request_data.MADE_BY_REPORT)
        return self.columns

    def __setattr__(self, name, value):
        raise AttributeError(_request_data.READ_ONLY.format(name))

    def __delattr__(self, name):
        raise AttributeError(_request_data.READ_ONLY.format(name))

    @property
    def request_id(self):
        return self.checked_columns().request_ids[self.row]

    @property
    def is_new(self):
        return self.checked_columns().is_new[self.row] != 0

    @property
    def new_tokens(self):
        cdef RowColumns columns = self.checked_columns()
        return checked_int32_list(columns.tokens, columns.num_tokens, columns.token_offsets[self.row],
                                  columns.token_offsets[self.row + 1], self.row)

    @property
    def computed_position(self):
        return self.checked_columns().positions[self.row]

    @property
    def num_scheduled_tokens(self):
        return self.checked_columns().scheduled[self.row]

    @property
    def num_replaced_tokens(self):
        return self.checked_columns().replaced_tokens[self.row]

    @property
    def num_layer_groups(self):
        cdef int64_t end
        cdef int64_t first = self.checked_columns().first_segment(self.row, &end)
        return end - first

    @property
    def new_block_ids(self):
        cdef RowColumns columns = self.checked_columns()
        cdef int64_t end
        cdef int64_t first = columns.first_segment(self.row, &end)
        return columns.segment_blocks(first, self.row) if first < end else []

    @property
    def new_block_ids_by_group(self):
        cdef RowColumns columns = self.checked_columns()
        cdef int64_t end, segment
        cdef int64_t first = columns.first_segment(self.row, &end)
        blocks = []
        for segment in range(first, end):  # (a loop: no list comprehension in the core, _core.pyx)
            blocks.append(columns.segment_blocks(segment, self.row))
        return blocks

    @property
    def num_replaced_blocks_by_group(self):
        cdef RowColumns columns = self.checked_columns()
        return columns.segment_counts(columns.replaced_blocks, columns.num_replaced_blocks, self.row)

    @property
    def num_released_blocks_by_group(self):
        cdef RowColumns columns = self.checked_columns()
        return columns.segment_counts(columns.released_blocks, columns.num_released_blocks, self.row)

    def as_dict(self):
        """Every field, as plain Python values."""
        return _request_data.as_dict(self)

    def __eq__(self, other):
        return _request_data.equal(self, other)

    def __ne__(self, other):
        return _request_data.not_equal(self, other)

    __hash__ = None

    def __repr__(self):
        return _request_data.describe(self)

    def __reduce__(self):
        return _request_data.reduce(self)


cdef tuple rows_where(tuple rows, RowColumns columns, bint wanted, Py_ssize_t count):
    """The ``count`` rows of ``rows`` whose is_new is ``wanted``, in order (a new tuple).
    Making the tuple may run the collector, and so Python code that writes into is_new:
    the count is checked again, and a tuple is never written past its end. (``rows`` is a
    tuple because that code may reach it: nothing can change a tuple's items.)"""
    cdef tuple chosen = PyTuple_New(count)  # tracked empty; nothing that can run a collection fills it
    cdef Py_ssize_t row, index = 0
    cdef bint more = False
    for row in range(columns.batch):
        if (columns.is_new[row] != 0) == wanted:
            if index == count:
                more = True
                break
            item = <object>PyTuple_GET_ITEM(rows, row)
            Py_INCREF(item)  # PyTuple_SET_ITEM steals the reference
            PyTuple_SET_ITEM(chosen, index, item)
            index += 1
    if more or index != count:
        while index < count:  # no NULL item is left for the collector (the error allocates)
            Py_INCREF(None)
            PyTuple_SET_ITEM(chosen, index, None)
            index += 1
        raise RuntimeError("a report's is_new column was written while its rows were made")
    return chosen


def request_rows(output):
    """The ``RequestData`` of every row of ``output``, and of its new rows and its cached
    rows apart (three new tuples). The columns of an output made by hand are copied and
    checked first: each row's offsets must lie inside them (ValueError naming the first
    row that does not); a manager's rows check each offset when they read it."""
    cdef RowColumns columns = row_columns(output)
    cdef Py_ssize_t row, num_new = 0
    cdef tuple rows = PyTuple_New(columns.batch)
    cdef RequestData data
    for row in range(columns.batch):
        data = RequestData.__new__(RequestData)  # no_gc: making one starts no collection
        data.columns = columns
        data.row = row
        Py_INCREF(data)  # PyTuple_SET_ITEM steals the reference
        PyTuple_SET_ITEM(rows, row, data)
        num_new += columns.is_new[row] != 0
    # each tuple is made only once the one before it is full (making one may run the collector)
    new_rows = rows_where(rows, columns, True, num_new)
    return rows, new_rows, rows_where(rows, columns, False, columns.batch - num_new)
