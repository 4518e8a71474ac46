# The growable int32 buffer behind every token list and block table (compiled core).
# Same algorithm as tokcy/_pure/buffer.py, which documents the counters: size (live
# entries), shared_end (views may show storage[:shared_end]; writing below it copies
# first) and the change marks of the buffer's two readers: dirty_from (the connector's)
# and table_dirty_from with table_stamp (the device block table's); see
# docs/change-tracking.md.

from cpython.buffer cimport PyBUF_FULL_RO, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport uintptr_t
from libc.string cimport memset
from cpython.bytearray cimport PyByteArray_FromStringAndSize
from cpython.pyport cimport PY_SSIZE_T_MAX

cdef Py_ssize_t MIN_CAPACITY = 16
# new_storage()'s cache coloring of large buffers: COLORS starting lines of LINE_BYTES
cdef Py_ssize_t COLOR_MIN_BYTES = 16 * 1024, LINE_BYTES = 64, COLORS = 64
cdef Py_ssize_t next_color = 0
# the dtypes of the arrays the core shows its memory as, held for the module's life so that
# a dtype the arena compares by identity can never be another one at the same address
cdef object INT64_DTYPE = np.dtype(np.int64)
cdef object INT32_DTYPE = np.dtype(np.int32)
cdef object BOOL_DTYPE = np.dtype(np.bool_)


@cython.final
@cython.no_gc  # holds a bytearray only (no cycle), and hands it to no one through gc.get_referents
cdef class Storage:
    """Memory the compiled core writes (a buffer's entries, the connector's report arrays,
    the holders' arrays): a bytearray, and a buffer export of it held in C for as long as
    this lives, so nothing can resize the bytearray and free the memory. It has no method
    and exports nothing: unlike a memoryview, which the garbage collector's introspection
    hands out, it cannot be released from Python. numpy sees its bytes only through an
    ArraySource; the arrays shown over it do not own it, so neither their ``resize`` nor
    their ``__setstate__`` can free it. It holds the bytes from ``data`` to the export's
    end (storage_length()): all of them, or (new_storage()) those from a few lines in.
    (One field more would make it 120 bytes: in the small-object allocator's pools of
    the token buffers, 128 with their collector's header, spreading them over twice the
    pages; tests/test_layout.py.)"""
    cdef object bytes_owner
    cdef Py_buffer export
    cdef char* data

    def __dealloc__(self):
        if self.bytes_owner is not None:
            PyBuffer_Release(&self.export)


@cython.final
@cython.no_gc  # holds one export of a memoryview, and hands it to no one
cdef class ExportPin:
    """A buffer export of a memoryview (one that ``_invariants.bound_memory`` made over the
    export behind a bound array), held in C for as long as this lives: the memoryview then
    refuses ``release()``, even from code that reaches it through the collector, so the
    memory it shows stays where the writer's pointers are. No method, nothing exported."""
    cdef Py_buffer export
    cdef bint held

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.export)


cdef tuple pinned(tuple guards):
    """``guards`` (``_invariants.bound_memory``'s) and an ExportPin of each memoryview among
    them: what a compiled writer keeps while it keeps pointers into the arrays."""
    cdef ExportPin pin
    pins = []
    for guard in guards:
        if type(guard) is memoryview:
            pin = ExportPin.__new__(ExportPin)
            PyObject_GetBuffer(guard, &pin.export, PyBUF_FULL_RO)
            pin.held = True
            pins.append(pin)
    return guards + tuple(pins)


@cython.final
@cython.no_gc  # holds a Storage only, and hands it to no one
cdef class ArraySource:
    """A Storage's bytes as numpy reads them (``np.asarray(source)``, storage_array()): a
    1-D array of one dtype whose base is this object, which keeps the Storage and shows no
    way to it (read-only for a token buffer's views). ``np.frombuffer(storage)`` would
    put a memoryview in between, which anyone reaching the array's bases can
    ``release()``: the array would then no longer keep the memory it shows, and read it
    freed once nothing else held it (a view, once its buffer moved on)."""
    cdef Storage storage
    cdef object typestr
    cdef Py_ssize_t itemsize
    cdef bint read_only

    @property
    def __array_interface__(self):
        return {"shape": (storage_length(self.storage) // self.itemsize,), "typestr": self.typestr,
                "data": (<uintptr_t>self.storage.data, self.read_only), "version": 3}


cdef Storage new_storage(Py_ssize_t capacity):
    """A token buffer's storage for ``capacity`` int32 entries (not initialised). Its views
    are made through an ArraySource, read-only, so no numpy array that a caller can reach
    owns that memory (numpy's ``resize(refcheck=False)`` and ``__setstate__`` ignore
    exports) or can write it. No Python code runs here: neither object is tracked by the
    garbage collector, so no collection starts.

    A large one starts a rotating number of cache lines into its bytes: the C allocator
    hands out blocks above its mmap threshold (128 KiB at first) page-aligned, so the ends
    of many sequences of one length, where a decode step reads, would otherwise fall on
    the same few cache sets and evict each other. Measured on a decode step over 256
    requests of 131,072 tokens: 14.6 us without the offsets, 13.0 us with them from
    64 KiB on (the token buffers), 11.8 us from 16 KiB on (their block tables of 32 KiB
    too). At most COLORS - 1 lines more, and at most a sixteenth of the buffer;
    tracemalloc counts them."""
    global next_color
    cdef Py_ssize_t num_bytes = capacity * sizeof(int32_t)
    cdef Py_ssize_t offset
    cdef Storage storage
    if num_bytes < COLOR_MIN_BYTES:
        return new_byte_storage(num_bytes)
    # at most a sixteenth of the buffer: COLORS lines from 64 KiB on, fewer below
    offset = (next_color % min(COLORS, num_bytes // (16 * LINE_BYTES))) * LINE_BYTES
    next_color = (next_color + 1) % COLORS
    storage = new_byte_storage(num_bytes + offset)
    storage.data += offset
    return storage


cdef Storage new_byte_storage(Py_ssize_t num_bytes):
    """A Storage of ``num_bytes`` bytes (not initialised; see new_storage)."""
    cdef Storage storage = Storage.__new__(Storage)
    owner = PyByteArray_FromStringAndSize(NULL, num_bytes)
    PyObject_GetBuffer(owner, &storage.export, PyBUF_WRITABLE)
    storage.bytes_owner = owner
    storage.data = <char*>storage.export.buf
    return storage


cdef inline Py_ssize_t storage_length(Storage storage) noexcept:
    """The bytes ``storage`` holds, from its ``data``."""
    return storage.export.len - (storage.data - <char*>storage.export.buf)


cdef object storage_array(Storage memory, object dtype, bint read_only=False):
    """A numpy array of ``dtype`` over all of ``memory``, not owning it: its base is an
    ArraySource, which keeps the memory for whoever holds the array (no memoryview in
    between that could be released)."""
    cdef ArraySource source = ArraySource.__new__(ArraySource)
    dtype = np.dtype(dtype)
    source.storage = memory
    source.typestr = dtype.str
    source.itemsize = dtype.itemsize
    source.read_only = read_only
    return np.asarray(source)


def zeroed_array(Py_ssize_t count, dtype):
    """``count`` zeros of ``dtype`` in memory the compiled core owns (a Storage), as a
    writable 1-D numpy array that does not own it (storage_array()), for the arrays
    writers are bound to: no ``resize`` or ``__setstate__`` of it frees what a writer
    writes, and a writer bound to it keeps its ArraySource, hence the Storage."""
    cdef Py_ssize_t itemsize
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    dtype = np.dtype(dtype)
    # plain numbers only: a zero-sized item would divide by zero in the ArraySource, and
    # an object dtype would read raw zeroed memory as references
    if dtype.kind not in "biuf" or dtype.hasobject or dtype.itemsize < 1:
        raise ValueError(f"zeroed_array needs a boolean, integer or float dtype, got {dtype}")
    itemsize = dtype.itemsize
    if count > PY_SSIZE_T_MAX // itemsize:
        raise OverflowError(f"{count} entries of {itemsize} bytes do not fit in memory")
    cdef Storage memory = new_byte_storage(count * itemsize)
    if count:
        memset(memory.data, 0, count * itemsize)
    return storage_array(memory, dtype)


cdef inline int32_t* storage_data(object storage) noexcept:
    return <int32_t*>(<Storage>storage).data


# every empty buffer's storage: nothing is ever written into its 0 entries (a write grows
# into new storage first), so one serves them all and an empty buffer costs no allocation
cdef object EMPTY_STORAGE = new_storage(0)


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
    cdef object storage      # what owns `data` (a Storage); an old one's bytearray lives on in its views
    cdef object readonly     # storage through a read-only buffer, made at the first view
    cdef Py_ssize_t _layout_pad[1]

    def __cinit__(self, values=None):
        if values is None:
            self.install(EMPTY_STORAGE, NULL, 0, 0)
        else:
            self.reset(values)

    cdef int install(self, object storage, int32_t* data, Py_ssize_t capacity, Py_ssize_t size) except -1:
        """Make ``storage`` (from ``new_storage``: its ``data``, ``capacity`` and the
        ``size`` entries written) the buffer's. Every field describes the new storage
        before the old one and its read-only face are released: releasing them can run
        Python code (a weakref callback), which then finds the buffer whole."""
        retired_storage = self.storage
        retired_readonly = self.readonly
        self.storage = storage
        self.readonly = None
        self.data = data
        self.capacity = capacity
        self.size = size
        self.shared_end = 0
        return 0

    cdef int reset(self, object values) except -1:
        """Hold a copy of ``values`` (a validated 1-D int32 array) and nothing else, as a
        new buffer of them would: every mark and count back to a new buffer's."""
        cdef const int32_t[::1] source = values
        cdef int32_t* data = NULL
        cdef Py_ssize_t count = source.shape[0]
        storage = EMPTY_STORAGE
        if count:
            storage = new_storage(count)  # no Python code runs from here until install() has set every field
            data = storage_data(storage)
            memcpy(data, &source[0], count * sizeof(int32_t))
        self.dirty_from = 0  # a new buffer's marks and counts, valid whatever the size
        self.table_dirty_from = 0
        self.table_stamp = 0
        self.num_released = 0
        self.install(storage, data, count, count)
        return 0

    cdef int make_writable(self, Py_ssize_t start, Py_ssize_t new_size) except -1:
        """Make positions [start, new_size) writable without changing any view (the
        values stay as they are, so no change mark moves: a writer lowers them itself).

        Python code can run in here (dropping the old storage's read-only array, which a
        caller's view was sliced from, can call a weakref callback; making the new storage
        runs none), and that code can change this buffer. So
        this only makes progress: a caller checks its condition again on return and calls
        again until it holds, then writes with no Python code in between (append, extend,
        set, release)."""
        cdef Py_ssize_t capacity = self.capacity
        cdef int32_t* data
        if start < self.shared_end or new_size > capacity:
            if new_size > capacity:
                if new_size > INT32_MAX:  # positions and lengths travel as int32
                    raise ValueError(f"a token buffer holds at most {INT32_MAX} entries")
                capacity = grown_capacity(capacity, new_size)
            storage = new_storage(capacity)
            data = storage_data(storage)
            # no Python code from here to install(): the buffer read now is the one copied
            if self.size <= capacity:  # else code that ran grew it past this: the caller calls again
                if self.size:
                    memcpy(data, self.data, self.size * sizeof(int32_t))
                self.install(storage, data, capacity, self.size)
        return 0

    cdef inline bint has_room(self, Py_ssize_t start, Py_ssize_t count) noexcept:
        """Whether writing ``count`` entries from ``start`` (at most the size) needs no
        allocation: no copy-on-write, no growth."""
        return start >= self.shared_end and start + count <= self.capacity

    cdef int reserve(self, Py_ssize_t start, Py_ssize_t count) except -1:
        """Make writing ``count`` entries from ``start`` need no allocation (has_room), so
        that a caller writing several buffers allocates for all of them before it writes
        any. Python code can run in here (make_writable): a caller checks again."""
        while not self.has_room(start, count):
            self.make_writable(start, start + count)
        return 0

    cdef inline void mark_changed(self, Py_ssize_t start) noexcept:
        """Lower both readers' marks to ``start``: positions from there on were written."""
        if start < self.dirty_from:
            self.dirty_from = start
        if start < self.table_dirty_from:
            self.table_dirty_from = start

    cdef inline int append(self, int32_t value) except -1:
        while self.size >= self.capacity or self.size < self.shared_end:
            self.make_writable(self.size, self.size + 1)
        self.data[self.size] = value
        self.size += 1
        return 0

    cdef int extend(self, const int32_t* values, Py_ssize_t count) except -1:
        """Append ``count`` values from memory the caller owns (Python code that runs in
        here cannot free it)."""
        while self.size + count > self.capacity or self.size < self.shared_end:
            self.make_writable(self.size, self.size + count)
        if count:
            memcpy(self.data + self.size, values, count * sizeof(int32_t))
        self.size += count
        return 0

    cdef int extend_array(self, object values) except -1:
        """Append a validated int32 numpy array that tokcy made (no one else can resize it)."""
        cdef const int32_t[::1] memory = values
        if memory.shape[0]:
            self.extend(&memory[0], memory.shape[0])
        return 0

    cdef int set(self, Py_ssize_t position, int32_t value) except -1:
        """Write one entry below the size (the caller checked ``position``; Python code
        that runs here may shrink the buffer, which is checked again before the write)."""
        while position < self.shared_end:
            self.make_writable(position, self.size)
        if not 0 <= position < self.size:
            raise IndexError(f"position {position} is past the {self.size} entries left by code that ran meanwhile")
        self.mark_changed(position)
        self.data[position] = value
        return 0

    cdef int release(self, Py_ssize_t num_released) except -1:
        """A block table's sliding-window release: the first ``num_released`` entries read
        -1 from now on. Both readers learn of releases through the count, so no change mark
        moves. The count is checked after any copy-on-write (which can run Python code),
        with no Python code between that check and the writes."""
        cdef Py_ssize_t position
        while self.num_released < num_released and self.num_released < self.shared_end:
            self.make_writable(self.num_released, self.size)
        if num_released < self.num_released:
            _invariants.released_below(num_released, self.num_released)
        if num_released > self.size:
            _invariants.released_past(num_released, self.size)
        for position in range(self.num_released, num_released):
            self.data[position] = -1
        self.num_released = num_released
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
        """[begin, end) (clamped to the size) as a new list, as the buffer is now: making the
        list can run Python code, so it reads the storage it holds from before that."""
        storage = self.storage  # keeps `data` alive whatever that code does
        cdef const int32_t* data = self.data
        end = min(end, self.size)
        begin = min(max(begin, 0), end)
        values = []
        for position in range(begin, end):  # (a loop: no list comprehension in the core, _core.pyx)
            values.append(data[position])
        return values

    cdef object view(self, Py_ssize_t begin, Py_ssize_t end):
        """Read-only snapshot of [begin, end) (clamped to the size), zero-copy."""
        while self.readonly is None:
            storage = self.storage
            readonly = storage_array(<Storage>storage, INT32_DTYPE, True)
            if self.storage is storage:  # else code that ran meanwhile replaced it: again
                self.readonly = readonly
        readonly = self.readonly
        end = min(end, self.size)
        begin = min(max(begin, 0), end)
        if end > self.shared_end:  # with no Python code since `readonly` was read
            self.shared_end = end
        return readonly[begin:end]

    cdef inline Py_ssize_t clamp_begin(self, Py_ssize_t begin) noexcept:
        return 0 if begin < 0 else (self.size if begin > self.size else begin)

    cdef inline Py_ssize_t clamp_end(self, Py_ssize_t begin, Py_ssize_t end) noexcept:
        # begin is already clamped to [0, size]
        return begin if end < begin else (self.size if end > self.size else end)
