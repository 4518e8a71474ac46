# The request ids of one input-preparation plan, to refuse an id given twice: an
# open-addressing hash set (linear probing) whose slots are stamped with the plan that
# filled them, so a new plan starts empty without clearing it. While the ids only increase
# (the usual batch) the set is not needed: InputWriter._seen keeps the largest id and
# fills the set only at the first id out of order.

from libc.stdint cimport uint64_t
from libc.stdlib cimport calloc, free


cdef struct SeenEntry:
    int64_t request_id
    int64_t stamp              # the plan that inserted it: a slot is used iff stamp == the plan's


cdef struct SeenIds:
    SeenEntry* entries
    Py_ssize_t capacity        # a power of two, at least twice the plan's requests
    int64_t stamp              # bumped per plan
    bint hashing               # False while the plan's ids have only increased
    bint any                   # an id was seen in this plan
    int64_t last               # the largest id so far, while not hashing


cdef int seen_reset(SeenIds* ids, Py_ssize_t num_requests) except -1:
    """An empty set for a plan of ``num_requests`` requests (load <= 1/2)."""
    cdef Py_ssize_t capacity = 64
    cdef SeenEntry* grown
    while capacity < 2 * num_requests:
        capacity *= 2
    if capacity > ids.capacity:
        grown = <SeenEntry*>calloc(capacity, sizeof(SeenEntry))  # stamps 0: all free
        if grown == NULL:
            raise MemoryError()
        free(ids.entries)
        ids.entries = grown
        ids.capacity = capacity
    ids.stamp += 1
    ids.hashing = False
    ids.any = False
    return 0


cdef inline bint seen_ascending(SeenIds* ids, int64_t key) noexcept:
    """True (and key recorded) if the plan has not hashed yet and key is above every id so
    far: then it is new."""
    if not ids.hashing and (not ids.any or key > ids.last):
        ids.any = True
        ids.last = key
        return True
    return False


cdef inline bint seen_probe(SeenIds* ids, int64_t key) noexcept:
    """The hash set: insert key; True if it was already there."""
    cdef Py_ssize_t mask = ids.capacity - 1
    cdef uint64_t h = (<uint64_t>key) * <uint64_t>0x9E3779B97F4A7C15
    cdef Py_ssize_t index = <Py_ssize_t>(h >> 32) & mask
    cdef SeenEntry* entry = &ids.entries[index]
    while entry.stamp == ids.stamp:
        if entry.request_id == key:
            return True
        index = (index + 1) & mask
        entry = &ids.entries[index]
    entry.stamp = ids.stamp
    entry.request_id = key
    return False
