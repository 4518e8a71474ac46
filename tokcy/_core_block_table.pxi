# BlockTable (compiled core) and the conversions of Python values to token and block ids
# that it and Request share. Same behaviour and errors as tokcy/_pure/block_table.py.

cdef extern from "Python.h":
    # (Python 3.10+) pause and resume the garbage collector; each says whether it was enabled
    int PyGC_Disable()
    int PyGC_Enable()


cdef inline int32_t token_arg(object value, str name, str kind="token") except? -1:
    """An int32 token id (``kind`` "block": a block id) from a Python object; the shared
    Python check on the slow path."""
    cdef long long number
    if type(value) is int:
        try:
            number = value
        except OverflowError:
            number = INT32_MAX + 1  # falls through to the shared error below
        if INT32_MIN <= number <= INT32_MAX:
            return <int32_t>number
    return <int32_t>_tokens.check_token(value, name, kind)


cdef inline Py_ssize_t clamped_index(object value) except? -1:
    """An index that is clamped anyway: saturates beyond the C ssize_t range (see _tokens)."""
    if type(value) is int:
        try:
            return value
        except OverflowError:
            pass
    return _tokens.as_clamped_index(value)


cdef inline int check_beam(Py_ssize_t beam, Py_ssize_t beam_width) except -1:
    if beam < 0 or beam >= beam_width:
        _tokens.check_beam(beam, beam_width)
    return 0


cdef object block_ids_array(object block_ids, str name):
    ids = _tokens.as_int32_array(block_ids, name, "block")
    if ids.size and ids.min() < 0:
        raise ValueError(f"{name}: block id {int(ids[ids < 0][0])} is negative")
    return ids


cdef inline int32_t block_id_arg(object block_id, str name) except? -2:
    cdef int32_t value = token_arg(block_id, name, "block")
    if value < 0:
        raise ValueError(f"{name}: block id {value} is negative")
    return value


cdef class BlockTable:
    """BlockTable(block_ids=())
--

Growable int32 list of the KV-cache block ids assigned to one request (one layer group).

    ``release_front(k)`` marks the first ``k`` entries -1, as a sliding window frees them.
    """

    # the ids and their released count (_buffer.num_released): made here once and never
    # replaced (__init__ and _restore refill it), because a Request keeps its first two
    # tables' buffers for the hot loops (set_block_tables)
    cdef Int32Buffer _buffer

    def __cinit__(self, *args, **kwargs):
        self._buffer = Int32Buffer()

    @cython.embedsignature(False)  # the class docstring carries the signature for inspect/help
    def __init__(self, block_ids=()):
        self._buffer.reset(block_ids_array(block_ids, "block_ids"))

    def _restore(self, block_ids, num_released, dirty_from, table_dirty_from=0, attributes=None):
        ids, released, mark, table_mark = _invariants.checked_block_table(
            block_ids, num_released, dirty_from, table_dirty_from)
        self._buffer.reset(ids)
        self._buffer.dirty_from = mark
        self._buffer.table_dirty_from = table_mark
        self._buffer.num_released = released
        if attributes:
            _pickle.restore_subclass_attributes(self, BlockTable, attributes)

    def __reduce__(self):
        # the table's own fields, never a subclass's methods or properties, read with the
        # collector paused (_pickle.read_whole: no callback changes the table between them)
        cdef bint was_enabled = PyGC_Disable()
        try:
            cls = None if type(self) is BlockTable else type(self)
            state = (cls, self._buffer.tolist(0, self._buffer.size), self._buffer.num_released,
                     self._buffer.dirty_from, self._buffer.table_dirty_from)
            attributes = None if cls is None else _pickle.subclass_attributes(self, BlockTable)
        finally:
            if was_enabled:
                PyGC_Enable()
        return (_pickle.restore_block_table, state if attributes is None else state + (attributes,))

    def __repr__(self):
        return _repr.block_table_repr(type(self).__name__, self.tolist(), self._buffer.num_released)

    def __len__(self):
        return self._buffer.size

    cdef Py_ssize_t _position(self, Py_ssize_t index) except -1:
        cdef Py_ssize_t position = index + self._buffer.size if index < 0 else index
        if position < 0 or position >= self._buffer.size:
            raise IndexError(f"block table index {index} is out of range for {self._buffer.size} blocks")
        return position

    def __getitem__(self, Py_ssize_t index):
        return self._buffer.data[self._position(index)]

    def __setitem__(self, Py_ssize_t index, block_id):
        cdef Py_ssize_t position = self._position(index)
        cdef int32_t value = block_id_arg(block_id, "block_id")
        position = self._position(index)  # block_id's __index__ may have run Python code
        if position < self._buffer.num_released:
            raise ValueError(f"block {position} was released by the sliding window and cannot be set")
        self._buffer.set(position, value)

    def __delitem__(self, index):
        _invariants.no_item_deletion(self)

    def __iter__(self):
        return iter(self.tolist())

    def __eq__(self, other):
        if isinstance(other, BlockTable):
            return (self._buffer.num_released == (<BlockTable>other)._buffer.num_released
                    and self.tolist() == other.tolist())
        if isinstance(other, list):
            return self.tolist() == other
        return NotImplemented

    __hash__ = None

    def append(self, block_id):
        """Add one block id at the end; returns the new length."""
        self._buffer.append(block_id_arg(block_id, "block_id"))
        return self._buffer.size

    def extend(self, block_ids):
        """Add block ids at the end; returns the new length."""
        self._buffer.extend_array(block_ids_array(block_ids, "block_ids"))
        return self._buffer.size

    def truncate(self, Py_ssize_t num_blocks):
        """Keep only the first ``num_blocks`` entries (blocks freed from the tail)."""
        if num_blocks < 0 or num_blocks > self._buffer.size:
            raise ValueError(f"num_blocks {num_blocks} is outside [0, {self._buffer.size}]")
        self._buffer.truncate(num_blocks)
        if num_blocks < self._buffer.num_released:
            self._buffer.num_released = num_blocks

    def clear(self):
        """Drop every entry (``truncate(0)``): the table holds no blocks afterwards."""
        self.truncate(0)

    def release_front(self, Py_ssize_t num_released):
        """Mark the first ``num_released`` entries -1; the count may grow, never shrink."""
        self._buffer.release(num_released)

    @property
    def num_released(self):
        """How many leading entries a sliding window has released (they read -1)."""
        return self._buffer.num_released

    def tolist(self):
        """The block ids as a new list."""
        return self._buffer.tolist(0, self._buffer.size)

    def view(self):
        """A read-only zero-copy numpy snapshot of the block ids."""
        return self._buffer.view(0, self._buffer.size)
