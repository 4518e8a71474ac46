# Request's helpers (compiled core), shared by its methods in _core_request.pxi: setting
# and retiring its fields, reading and growing its beams, and checking what pause() listed.
# Functions rather than C methods so that the class has no vtable pointer (its layout
# note says why).

from cpython.list cimport PyList_CheckExact, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.ref cimport PyObject
from libc.stdint cimport INT16_MAX

cdef inline int set_block_tables(Request request, tuple tables) except -1:
    # the hot loops read group 0 and the count from the request itself; every caller
    # passes at most _invariants.MAX_LAYER_GROUPS (1,024) tables, checked, and this keeps
    # a count that would not fit _num_groups from ever being narrowed
    if len(tables) > INT16_MAX:
        raise OverflowError(f"{len(tables)} layer groups do not fit a Request")
    request._block_tables = tables
    request._num_groups = <int16_t>len(tables)
    request._blocks0 = (<BlockTable>tables[0])._buffer if tables and type(tables[0]) is BlockTable else None
    request._blocks1 = (<BlockTable>tables[1])._buffer if len(tables) > 1 and type(tables[1]) is BlockTable else None
    return 0


cdef inline Int32Buffer beam_of(Request request, Py_ssize_t beam):
    check_beam(beam, request._beam_width)
    return <Int32Buffer>request._beams[beam]


cdef int32_t last_token(Request request, Py_ssize_t beam) except? -1:
    cdef Int32Buffer buffer = beam_of(request, beam)
    if buffer.size == 0:
        raise IndexError(f"beam {beam} has no tokens")
    return buffer.data[buffer.size - 1]


cdef Py_ssize_t longest_beam(Request request) noexcept:
    """Tokens in the request's longest beam."""
    cdef Py_ssize_t longest = 0
    cdef Int32Buffer buffer
    for buffer in request._beams:
        if buffer.size > longest:
            longest = buffer.size
    return longest


cdef inline int append_to_beam(Request request, tuple beams, Int32Buffer buffer, int32_t value, str call) except -1:
    """Append ``value`` to ``buffer``, one of ``beams`` (the request's beams when ``call``
    began). Growing it can run Python code (a weakref callback as the old storage goes)
    that re-initialises the request: refused then, before anything is written, as the
    write would go to a beam the request no longer has."""
    while not buffer.has_room(buffer.size, 1):  # (the code may also have grown or shared it)
        buffer.reserve(buffer.size, 1)
        if request._beams is not beams:
            _invariants.changed_during(call, "re-initialised")
    buffer.append(value)  # (room made: no allocation, no Python code)
    return 0


cdef tuple retire_fields(Request request):
    """The request's object fields, held while new ones are written: releasing the old
    ones can run Python code (a weakref callback), which must find every field of one
    state, so that happens when the caller drops this tuple, after its last write."""
    return (request._beams, request._beam0, request._draft_tokens, request._block_tables, request._blocks0,
            request._blocks1, request._state)


cdef bint lists_hold_tables(list held, tuple tables) noexcept:
    """Whether ``held[g]`` (the lists of ints Request.pause made, one per table) still lists
    the live ids of ``tables[g]``, every one: read without allocating or running Python
    code. The lists are checked as they are now, not trusted: the code that changed a table
    could also have found them (gc.get_objects) and changed them."""
    cdef Py_ssize_t group, index, begin
    cdef Int32Buffer buffer
    cdef PyObject* listed
    cdef PyObject* item
    cdef int overflow
    if PyList_GET_SIZE(held) != len(tables):
        return False
    for group in range(len(tables)):
        buffer = (<BlockTable>tables[group])._buffer
        listed = PyList_GET_ITEM(held, group)
        begin = buffer.num_released
        if not PyList_CheckExact(<object>listed) or PyList_GET_SIZE(<object>listed) != buffer.size - begin:
            return False
        for index in range(buffer.size - begin):
            item = PyList_GET_ITEM(<object>listed, index)
            if not PyLong_CheckExact(<object>item):  # (another int's __index__ would be Python code)
                return False
            if (PyLong_AsLongLongAndOverflow(<object>item, &overflow) != buffer.data[begin + index]
                    or overflow != 0):
                return False
    return True


cdef bint beams_have_room(tuple beams, Py_ssize_t start, const Py_ssize_t* counts) noexcept:
    """Whether every beam of ``beams`` can take ``counts[b]`` entries from ``start`` (-1:
    one entry after its size) without allocating (Int32Buffer.has_room). Checked again
    after the reserves, which may run Python code that changes a beam, with none between
    this check and the writes."""
    cdef Py_ssize_t beam
    cdef Int32Buffer buffer
    for beam in range(len(beams)):
        buffer = <Int32Buffer>beams[beam]
        if not buffer.has_room(buffer.size if start < 0 else start, 1 if counts == NULL else counts[beam]):
            return False
    return True


cdef inline int same_beams(Request request, tuple beams, str argument) except -1:
    """RuntimeError unless ``request`` still has the beams it had before ``argument`` was
    converted (a conversion runs the caller's code, which may re-initialise the request)."""
    if request._beams is not beams:
        _invariants.reinitialised_during(argument)
    return 0


cdef object checked_per_beam(Request request, object per_beam):
    """``per_beam`` as a tuple of one entry per beam, or the error."""
    if isinstance(per_beam, (str, bytes)) or not hasattr(per_beam, "__len__"):
        raise TypeError(f"per_beam must be a sequence with one entry per beam, not {type(per_beam).__name__}")
    per_beam = tuple(per_beam)  # owned: element conversion below may run caller code
    if len(per_beam) != request._beam_width:
        raise ValueError(f"per_beam has {len(per_beam)} entries but beam_width is {request._beam_width}")
    return per_beam
