# The connector's per-request slots (compiled core): one growable, line-aligned C array of
# ReportSlot with a free list, and a C open-addressing hash table (linear probing,
# backward-shift deletion) from request id to slot number, so a report never creates a
# Python int per request. ReportState (_core_report.pxi) keeps one SlotTable; these
# functions are its only writers. The twin keeps a dict of slots (tokcy/_pure/report.py).

from libc.stdlib cimport free, malloc


cdef struct SlotTable:
    ReportSlot* slots              # CACHE_LINE-aligned, in slots_block
    void* slots_block
    Py_ssize_t slot_capacity
    Py_ssize_t num_slots_used      # slots ever handed out (high-water mark)
    Py_ssize_t free_head           # the first free slot, or NO_ENTRY
    Py_ssize_t num_live
    Py_ssize_t* index              # the hash table: a slot number, or NO_ENTRY
    Py_ssize_t index_capacity      # a power of two, kept at least twice num_live


cdef int slot_table_init(SlotTable* table) except -1:
    """An empty table (``table`` zeroed, as a new object's fields are)."""
    table.free_head = NO_ENTRY
    return slot_table_grow_index(table, 64)


cdef void slot_table_free(SlotTable* table) noexcept:
    cdef Py_ssize_t number
    if table.slots != NULL:
        for number in range(table.num_slots_used):
            free_blocks(&table.slots[number])
    free(table.slots_block)
    free(table.index)
    table.slots = NULL
    table.slots_block = NULL
    table.index = NULL


cdef int slot_table_grow_index(SlotTable* table, Py_ssize_t capacity) except -1:
    cdef Py_ssize_t* index = <Py_ssize_t*>malloc(capacity * sizeof(Py_ssize_t))
    cdef Py_ssize_t position, number, number_position, mask = capacity - 1
    if index == NULL:
        raise MemoryError()
    for position in range(capacity):
        index[position] = NO_ENTRY
    for position in range(table.index_capacity):
        number = table.index[position]
        if number != NO_ENTRY:
            number_position = hash_request_id(table.slots[number].request_id) & mask
            while index[number_position] != NO_ENTRY:
                number_position = (number_position + 1) & mask
            index[number_position] = number
    free(table.index)
    table.index = index
    table.index_capacity = capacity
    return 0


cdef inline Py_ssize_t slot_table_probe(const SlotTable* table, int64_t request_id) noexcept nogil:
    """The index position holding ``request_id``, or the empty one where it would go."""
    cdef Py_ssize_t mask = table.index_capacity - 1
    cdef Py_ssize_t position = hash_request_id(request_id) & mask
    cdef Py_ssize_t number
    while True:
        number = table.index[position]
        if number == NO_ENTRY or table.slots[number].request_id == request_id:
            return position
        position = (position + 1) & mask


cdef inline Py_ssize_t slot_table_find(const SlotTable* table, int64_t request_id) noexcept nogil:
    """``request_id``'s slot number, or NO_ENTRY."""
    return table.index[slot_table_probe(table, request_id)]


cdef Py_ssize_t slot_table_insert(SlotTable* table, int64_t request_id) except -1:
    """A fresh, never-reported slot for ``request_id`` (which must not be present)."""
    cdef Py_ssize_t number
    cdef ReportSlot* slot
    if 2 * (table.num_live + 1) > table.index_capacity:
        slot_table_grow_index(table, 2 * table.index_capacity)
    if table.free_head != NO_ENTRY:
        number = table.free_head
        table.free_head = table.slots[number].blocks.next_free
    else:
        if table.num_slots_used == table.slot_capacity:
            slot_table_grow_slots(table)
        number = table.num_slots_used
        table.num_slots_used += 1
    slot = &table.slots[number]  # it has no block counts: never had any, or freed by slot_table_remove
    slot.group_capacity = INLINE_GROUPS
    slot.blocks.counts[0] = slot.blocks.counts[1] = 0  # never read before written; zero all the same
    slot.request_id = request_id
    slot.stamp = 0
    slot.num_tokens = 0
    slot.num_pauses = 0
    slot.matched = 0
    slot.num_groups = NEVER_REPORTED
    slot.reported = False
    table.index[slot_table_probe(table, request_id)] = number
    table.num_live += 1
    return number


cdef void slot_table_remove(SlotTable* table, int64_t request_id) noexcept:
    """Forget ``request_id`` (nothing if absent); its slot joins the free list."""
    cdef Py_ssize_t mask = table.index_capacity - 1
    cdef Py_ssize_t hole = slot_table_probe(table, request_id)
    cdef Py_ssize_t number = table.index[hole]
    cdef Py_ssize_t position = hole, home, moved
    if number == NO_ENTRY:
        return
    table.index[hole] = NO_ENTRY
    while True:  # backward-shift deletion: no tombstones, probes stay short
        position = (position + 1) & mask
        moved = table.index[position]
        if moved == NO_ENTRY:
            break
        home = hash_request_id(table.slots[moved].request_id) & mask
        # leave the entry if its home lies cyclically in (hole, position]
        if (hole < position and hole < home <= position) or (
            position < hole and (home > hole or home <= position)
        ):
            continue
        table.index[hole] = moved
        table.index[position] = NO_ENTRY
        hole = position
    free_blocks(&table.slots[number])  # no longer is_live()
    table.slots[number].reported = False  # so reported implies live (the fast plan reads one)
    table.slots[number].blocks.next_free = table.free_head
    table.free_head = number
    table.num_live -= 1


cdef int slot_table_grow_slots(SlotTable* table) except -1:
    """Room for one more slot: a larger aligned array, the slots moved into it."""
    cdef Py_ssize_t capacity = grown_capacity(table.slot_capacity, table.slot_capacity + 1)
    cdef void* block = malloc(capacity * sizeof(ReportSlot) + CACHE_LINE - 1)
    cdef ReportSlot* slots
    debug_assert(sizeof(ReportSlot) == CACHE_LINE)  # (ReportSlot's layout)
    if block == NULL:
        raise MemoryError()
    slots = <ReportSlot*>line_aligned(block)
    if table.num_slots_used:
        memcpy(slots, table.slots, table.num_slots_used * sizeof(ReportSlot))
    free(table.slots_block)
    table.slots_block = block
    table.slots = slots
    table.slot_capacity = capacity
    return 0
