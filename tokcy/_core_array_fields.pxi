# numpy arrays read in place (compiled core): the leading fields of numpy's array object,
# how far the module can trust them (ARRAY_FIELDS_AGREE), and the writers' check that a
# pointer they took into an output array still lies at the start of that array's memory.

from cpython.object cimport PyObject

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

cdef enum:  # numpy's NPY_ARRAY_* flag bits (ABI too), all three needed to write an array
    ARRAY_C_CONTIGUOUS = 0x0001
    ARRAY_ALIGNED = 0x0100
    ARRAY_WRITEABLE = 0x0400
    ARRAY_WRITABLE_FLAGS = ARRAY_C_CONTIGUOUS | ARRAY_ALIGNED | ARRAY_WRITEABLE

# numpy's array type: the arena's exact-type check, and the writers' plain views
# (NDARRAY.view(array, NDARRAY): numpy's own, whatever the array's class)
cdef object NDARRAY = np.ndarray


cdef bint array_fields_agree():
    """Whether ArrayFields reads what numpy reports of arrays of every kind the arena's
    checks tell apart (each dtype; 1-D and 2-D; read-only; strided; Fortran order)."""
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
