# numpy arrays read in place (compiled core): the leading fields of numpy's array object,
# how far the module can trust them (ARRAY_FIELDS_AGREE), the writers' check that a
# pointer they took into an output array still lies at the start of that array's memory,
# and BoundMemory, what keeps the memory of a writer's output arrays and what each of its
# calls checks of it before writing.

from cpython.object cimport PyObject
from libc.stdlib cimport free, malloc

# numpy's array object, as far as the arena reads it: the leading fields of numpy's
# PyArrayObject_fields. Every extension built against numpy's headers reads them in place
# (PyArray_DATA, PyArray_NDIM, ... are inline field reads), so where they lie is part of
# numpy's ABI, the same in 1.x and 2.x. The module compares them with numpy's own account
# of a few arrays when it loads (array_fields_agree) and, should they ever disagree, reads
# the arena's arrays through numpy's buffer export instead: the same answer, ~600
# instructions an array (numpy builds a format string for each export) against ~20.
cdef extern from *:
    """
    typedef struct {
        PyObject_HEAD
        char *data;
        int nd;
        Py_ssize_t *dimensions;
        Py_ssize_t *strides;
        PyObject *base;
        PyObject *descr;
        int flags;
    } tokcy_array_fields;
    """
    ctypedef struct ArrayFields "tokcy_array_fields":
        char* data
        int nd
        Py_ssize_t* dimensions
        Py_ssize_t* strides
        PyObject* descr
        int flags

cdef enum:  # numpy's NPY_ARRAY_* flag bits (ABI too): the three needed to write an array, and OWNDATA
    ARRAY_C_CONTIGUOUS = 0x0001
    ARRAY_OWNDATA = 0x0004
    ARRAY_ALIGNED = 0x0100
    ARRAY_WRITEABLE = 0x0400
    ARRAY_WRITABLE_FLAGS = ARRAY_C_CONTIGUOUS | ARRAY_ALIGNED | ARRAY_WRITEABLE

# numpy's array type: the arena's exact-type check, and the writers' plain views
# (NDARRAY.view(array, NDARRAY): numpy's own, whatever the array's class)
cdef object NDARRAY = np.ndarray


cdef bint array_fields_agree():
    """Whether ArrayFields reads what numpy reports of arrays of every kind the arena's
    checks tell apart (each dtype; 1-D and 2-D; read-only; strided, a view that owns no
    memory; Fortran order)."""
    cdef ArrayFields* fields
    cdef Py_ssize_t k
    samples = []
    for dtype in (INT64_DTYPE, INT32_DTYPE, BOOL_DTYPE):
        samples += [np.empty(7, dtype=dtype), np.empty((2, 3), dtype=dtype), np.empty(9, dtype=dtype)[::2],
                    np.empty((3, 2), dtype=dtype, order="F")]
    samples[0].flags.writeable = False
    for array in samples:
        fields = <ArrayFields*><PyObject*>array
        flags = array.flags
        if (type(array) is not NDARRAY or fields.descr != <PyObject*>array.dtype
                or <size_t>fields.data != array.__array_interface__["data"][0] or fields.nd != array.ndim
                or bool(fields.flags & ARRAY_C_CONTIGUOUS) != flags.c_contiguous
                or bool(fields.flags & ARRAY_OWNDATA) != flags.owndata
                or bool(fields.flags & ARRAY_ALIGNED) != flags.aligned
                or bool(fields.flags & ARRAY_WRITEABLE) != flags.writeable):
            return False
        for k in range(fields.nd):
            if fields.dimensions[k] != array.shape[k] or fields.strides[k] != array.strides[k]:
                return False
    # the arena compares dtypes by identity, and makes its arrays with these
    for dtype in (INT64_DTYPE, INT32_DTYPE, BOOL_DTYPE):
        if np.empty(1, dtype=dtype).dtype is not dtype:
            return False
    return True


# whether ArrayFields reads numpy arrays right here (checked once, as the module loads)
cdef bint ARRAY_FIELDS_AGREE = array_fields_agree()


cdef int check_still_over(object array, const void* pointer) except -1:
    """RuntimeError unless ``pointer``, taken through a plain view of ``array`` (an output a
    writer binds), is where ``array``'s memory starts now: code that ran since the view was
    made (a collection's callbacks) may have given the view other memory with
    ``__setstate__``, and the writer would keep a pointer into that. Read from the array's
    fields where they read right (no Python code runs), else from numpy's account of it.
    (A NULL ``pointer``, of an empty array, is never written through.)"""
    if pointer == NULL:
        return 0
    if ARRAY_FIELDS_AGREE:
        if (<ArrayFields*><PyObject*>array).data == pointer:
            return 0
    elif NDARRAY.view(array, NDARRAY).__array_interface__["data"][0] == <uintptr_t>pointer:
        return 0
    raise RuntimeError("an output array was given other memory by code that ran while it was bound: "
                       "nothing was bound")


# ---------------------------------------------------------------- the memory a writer is bound to
cdef struct OwnerRecord:
    PyObject* array        # a numpy array owning memory a writer writes (held by the BoundMemory)
    char* data             # where that memory was when bound
    PyObject* descr        # its dtype then (held: compared by identity)
    Py_ssize_t size        # its element count then


@cython.final
@cython.no_gc_clear  # its records borrow the arrays ``watched`` holds: a collection must not drop them first
cdef class BoundMemory:
    """The memory behind the output arrays a writer is bound to (``_invariants.bound_memory``):
    the guards that keep it where it is (pinned), and a C record of each numpy array that
    owns some of it, which ``check()`` compares with the array as it is now, reading its
    fields (no Python code runs), before every write."""
    cdef tuple guards
    cdef tuple watched             # _invariants.bound_memory's entries, which hold what the records borrow
    cdef tuple taken               # its (array, data address) of each bound array, read before its guards
    cdef OwnerRecord* records
    cdef Py_ssize_t count

    def __dealloc__(self):
        free(self.records)

    cdef inline int check(self) except -1:
        """RuntimeError, naming the array, if a numpy array owning memory the writer writes no
        longer owns it (``__setstate__`` freed it): the writer's last check before it writes,
        after which no Python code runs until the write is done."""
        if ARRAY_FIELDS_AGREE and first_moved(self.records, self.count) < 0:
            return 0
        return self.refuse_moved()

    cdef int check_taken(self, object array, const void* pointer) except -1:
        """RuntimeError unless ``pointer``, taken into the bound ``array`` (after
        check_still_over), is where ``array``'s memory started when its guards were made
        (``_invariants.bound_memory``'s ``taken``): code that ran in between may have given
        the array memory of its own, which nothing here keeps or watches. (A NULL ``pointer``,
        of an empty array, is never written through.)"""
        cdef Py_ssize_t index
        if pointer == NULL:
            return 0
        for index in range(len(self.taken)):
            entry = <tuple>self.taken[index]
            if entry[0] is array and <uintptr_t>entry[1] != <uintptr_t>pointer:
                raise RuntimeError("an output array was given other memory by code that ran while it was bound: "
                                   "nothing was bound")
        return 0

    cdef int refuse_moved(self) except -1:
        """check()'s slow path: the RuntimeError naming the array that moved, found from the
        arrays' fields or, where those do not read right, from numpy's account of them."""
        cdef bint was_enabled
        if ARRAY_FIELDS_AGREE:
            moved = self.watched[first_moved(self.records, self.count)][0]
        else:
            was_enabled = PyGC_Disable()  # numpy's account allocates: no collection in between
            try:
                moved = _invariants.moved_array(self.watched)
            finally:
                if was_enabled:
                    PyGC_Enable()
        if moved is not None:
            _checks.memory_moved(moved)
        return 0


cdef inline Py_ssize_t first_moved(const OwnerRecord* records, Py_ssize_t count) noexcept:
    """The first record whose array no longer owns the memory it owned when bound, -1 if
    none: it must still own as many entries, of the same dtype, at the same address (new
    memory that landed there is alive and its own, hence as good as the old: see
    ``_invariants.bound_memory``)."""
    cdef const OwnerRecord* record
    cdef const ArrayFields* fields
    cdef Py_ssize_t index, axis, size
    for index in range(count):
        record = &records[index]
        fields = <const ArrayFields*>record.array
        if (fields.data != record.data or fields.descr != record.descr
                or not (fields.flags & ARRAY_OWNDATA)):
            return index
        if fields.nd == 1:  # (the usual owner)
            size = fields.dimensions[0]
        else:
            size = 1
            for axis in range(fields.nd):
                size *= fields.dimensions[axis]
        if size < record.size:
            return index
    return -1


cdef BoundMemory bound_memory(tuple arrays, tuple names):
    """The BoundMemory of the output ``arrays`` (named ``names``) a writer binds: made from
    the caller's arrays before any pointer into them is taken, so that whatever gives them
    other memory from then on is seen by the first ``check()``."""
    cdef BoundMemory memory = BoundMemory.__new__(BoundMemory)
    cdef OwnerRecord* record
    cdef Py_ssize_t index
    guards, watched, taken = _invariants.bound_memory(arrays, names)
    memory.guards = pinned(guards)
    memory.watched = watched
    memory.taken = taken
    memory.records = <OwnerRecord*>malloc(max(1, len(watched)) * sizeof(OwnerRecord))
    if memory.records == NULL:
        raise MemoryError()
    for index in range(len(watched)):
        _, array, data, dtype, size = <tuple>watched[index]
        record = &memory.records[index]
        record.array = <PyObject*>array
        record.data = <char*><uintptr_t>data
        record.descr = <PyObject*>dtype
        record.size = size
    memory.count = len(watched)
    return memory
