# The growable int32 buffer behind every token list and block table (compiled core).
# Same algorithm as tokcy/_pure/buffer.py, which documents the counters: size (live
# entries), shared_end (views may show storage[:shared_end]; writing below it copies
# first) and the change marks of the buffer's two readers: dirty_from (the connector's)
# and table_dirty_from with table_stamp (the device block table's); see
# docs/change-tracking.md.

cdef Py_ssize_t MIN_CAPACITY = 16


cdef inline Py_ssize_t grown_capacity(Py_ssize_t capacity, Py_ssize_t needed) noexcept nogil:
    cdef Py_ssize_t grown = capacity + capacity // 4
    if grown < needed:
        grown = needed
    if grown < MIN_CAPACITY:
        grown = MIN_CAPACITY
    return grown


@cython.final
cdef class Int32Buffer:
    # The connector's row reads data, size, capacity, dirty_from and num_released; they
    # come first (C keeps the declaration order), at bytes 24 to 63. With the pad, the
    # object is 112 bytes, 128 with the collector's header: CPython's small-object
    # allocator places such blocks 48 bytes past a 64-byte line (after its 48-byte pool
    # header), so every buffer starts on a line and those fields share it (unpadded, they
    # spanned two lines for one buffer in two). Only speed depends on this.
    cdef int32_t* data
    cdef Py_ssize_t size
    cdef Py_ssize_t capacity
    cdef Py_ssize_t dirty_from        # reader 1, the connector: lowest position changed since its last read
    # a block table's buffer only: its leading entries a sliding window released (they
    # read -1); kept here, not in the BlockTable, so that the hot loops read no table
    # object for a one-group request (0 for token buffers)
    cdef Py_ssize_t num_released
    cdef Py_ssize_t shared_end
    cdef Py_ssize_t table_dirty_from  # reader 2, the device block table: the same, since its last read
    cdef int64_t table_stamp          # which device-table row read it last (0: none)
    cdef object storage      # numpy int32 array that owns `data`; old ones live on in views
    cdef object readonly     # storage through a read-only buffer, made at the first view
    cdef Py_ssize_t _layout_pad[1]

    def __cinit__(self, values=None):
        if values is None:
            self._adopt(np.empty(0, dtype=np.int32))
        else:
            self.reset(values)

    cdef int _adopt(self, object storage) except -1:
        cdef int32_t[::1] memory = storage
        self.storage = storage
        self.readonly = None
        self.capacity = memory.shape[0]
        self.data = &memory[0] if self.capacity > 0 else NULL
        self.shared_end = 0
        return 0

    cdef int reset(self, object values) except -1:
        """Hold a copy of ``values`` (a validated 1-D int32 array) and nothing else, as a
        new buffer of them would: every mark and count back to a new buffer's."""
        self._adopt(np.array(values, dtype=np.int32, copy=True))
        self.size = self.capacity
        self.dirty_from = 0
        self.table_dirty_from = 0
        self.table_stamp = 0
        self.num_released = 0
        return 0

    cdef int make_writable(self, Py_ssize_t start, Py_ssize_t new_size) except -1:
        """Make positions [start, new_size) writable without changing any view."""
        cdef Py_ssize_t capacity = self.capacity
        cdef object previous
        cdef const int32_t* previous_data
        if start < self.shared_end or new_size > capacity:
            if new_size > capacity:
                if new_size > INT32_MAX:  # positions and lengths travel as int32
                    raise ValueError(f"a token buffer holds at most {INT32_MAX} entries")
                capacity = grown_capacity(capacity, new_size)
            previous = self.storage  # keeps previous_data alive through the copy
            previous_data = self.data
            self._adopt(np.empty(capacity, dtype=np.int32))
            if self.size:
                memcpy(self.data, previous_data, self.size * sizeof(int32_t))
        if start < self.dirty_from:
            self.dirty_from = start
        if start < self.table_dirty_from:
            self.table_dirty_from = start
        return 0

    cdef inline int append(self, int32_t value) except -1:
        if self.size >= self.capacity or self.size < self.shared_end:
            self.make_writable(self.size, self.size + 1)
        self.data[self.size] = value
        self.size += 1
        return 0

    cdef int extend(self, const int32_t* values, Py_ssize_t count) except -1:
        self.make_writable(self.size, self.size + count)
        if count:
            memcpy(self.data + self.size, values, count * sizeof(int32_t))
        self.size += count
        return 0

    cdef int extend_array(self, object values) except -1:
        """Append a validated int32 numpy array."""
        cdef const int32_t[::1] memory = values
        if memory.shape[0]:
            self.extend(&memory[0], memory.shape[0])
        return 0

    cdef int set(self, Py_ssize_t position, int32_t value) except -1:
        self.make_writable(position, self.size)
        self.data[position] = value
        return 0

    cdef int fill(self, Py_ssize_t begin, Py_ssize_t end, int32_t value) except -1:
        cdef Py_ssize_t position
        if begin < end:
            self.make_writable(begin, self.size)
            for position in range(begin, end):
                self.data[position] = value
        return 0

    cdef inline void truncate(self, Py_ssize_t size) noexcept:
        # never grows and never goes negative, whatever a caller computed: the size is
        # what every copy out of `data` trusts
        size = 0 if size < 0 else (self.size if size > self.size else size)
        self.size = size
        if size < self.dirty_from:
            self.dirty_from = size
        if size < self.table_dirty_from:
            self.table_dirty_from = size

    cdef list tolist(self, Py_ssize_t begin, Py_ssize_t end):
        return [self.data[position] for position in range(begin, end)]

    cdef object view(self, Py_ssize_t begin, Py_ssize_t end):
        """Read-only snapshot of [begin, end), zero-copy."""
        if end > self.shared_end:
            self.shared_end = end
        if self.readonly is None:
            self.readonly = np.frombuffer(memoryview(self.storage).toreadonly(), dtype=np.int32)
        return self.readonly[begin:end]

    cdef inline Py_ssize_t clamp_begin(self, Py_ssize_t begin) noexcept:
        return 0 if begin < 0 else (self.size if begin > self.size else begin)

    cdef inline Py_ssize_t clamp_end(self, Py_ssize_t begin, Py_ssize_t end) noexcept:
        # begin is already clamped to [0, size]
        return begin if end < begin else (self.size if end > self.size else end)
