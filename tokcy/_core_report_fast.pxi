# The connector report's common row and pass 2 (compiled core): the fast plan that
# ReportState.build() (tokcy/_core_report.pxi) runs for runs of common rows, the undoing
# of its slot commits when a call fails, and the pass-2 writer every row goes through.

cdef Py_ssize_t plan_fast_rows(ReportState state, list items, Py_ssize_t index, Py_ssize_t kind, int64_t stamp,
                               Py_ssize_t* totals, bint consume) noexcept:
    """Plan the common rows of ``items`` (generation or device-token rows, ``kind`` 1 or
    2) from ``index`` on: an exact Request, already reported and not paused since, not
    finished, not yet in this call, its slot hint valid, its layer-group count the one
    reported, every table an exact BlockTable, every copy inside its buffer. Returns the
    index of the first request that is anything else (the general _plan_row plans it or
    raises its error), having changed nothing for it. Runs no Python code and raises
    nothing: the requests are read through borrowed pointers. Each planned row's slot
    is committed at once (build() undoes it from the job if the call fails) and, with
    ``consume``, its change marks are consumed (the whole batch is valid so far, and
    build() gives them back, in C, before any general row's checks can run Python
    code). ``totals``: rows, tokens, segments and blocks planned so far, updated."""
    # everything the loop reads of state in locals: its stores cannot alias them
    cdef ReportSlot* slots = state.slots
    cdef RowJob* job = state.rows + totals[0]
    cdef SegmentJob* parts = state.segments + totals[2]
    cdef SegmentJob* parts_end = state.segments + state.segment_capacity
    cdef size_t num_slots = <size_t>state.num_slots_used
    cdef Py_ssize_t count = len(items), first = index
    cdef Py_ssize_t num_tokens = totals[1], num_blocks = totals[3], segment = totals[2]
    cdef Py_ssize_t number, size, begin, group, num_groups, new_blocks, planned
    cdef PyObject** requests = PySequence_Fast_ITEMS(items)
    cdef PyObject* item
    cdef PyObject* tables
    cdef PyObject* tokens       # borrowed, as every pointer here: nothing is counted per row
    cdef ReportSlot* slot
    cdef Py_ssize_t* slot_blocks
    while index < count:
        item = requests[index]
        if <void*>item.ob_type != <void*>Request:
            break
        number = (<Request>item)._report_slot
        if <size_t>number >= num_slots:
            break
        slot = &slots[number]
        if (slot.request_id != (<Request>item)._request_id or not slot.live or not slot.reported
                or slot.stamp == stamp or slot.num_pauses != (<Request>item)._num_pauses
                or (<Request>item)._state_code == 2):
            break
        tables = <PyObject*>(<Request>item)._block_tables
        num_groups = tuple_size(tables)
        if num_groups != slot.num_groups or num_groups > parts_end - parts:
            break
        tokens = <PyObject*>(<Request>item)._beam0
        size = (<Int32Buffer>tokens).size
        begin = (<Int32Buffer>tokens).dirty_from
        if slot.num_tokens < begin:
            begin = slot.num_tokens
        if begin > size:
            begin = size
        if begin < 0 or size > (<Int32Buffer>tokens).capacity:
            break
        slot_blocks = blocks_of(slot)
        if num_groups == 1:  # the common layout, without a loop's set-up
            new_blocks = plan_fast_segment(tuple_item(tables, 0), slot_blocks[0], parts)
        else:
            new_blocks = 0
            for group in range(num_groups):
                planned = plan_fast_segment(tuple_item(tables, group), slot_blocks[group], &parts[group])
                if planned < 0:
                    new_blocks = -1
                    break
                new_blocks += planned
        if new_blocks < 0:  # a table that is anything else
            break
        # the row is valid: plan it and commit its slot (nothing above changed anything;
        # build() undoes the commit, from the job, if the call fails)
        slot.stamp = stamp
        job.slot = number
        job.request_id = slot.request_id
        job.is_new = False
        job.committed = True
        job.saved_matched = slot.matched
        job.num_pauses = slot.num_pauses
        job.buffer = tokens
        job.data = (<Int32Buffer>tokens).data
        job.dirty = &(<Int32Buffer>tokens).dirty_from
        job.begin = begin
        job.end = size
        job.replaced = slot.num_tokens - begin
        job.first_segment = segment
        job.num_groups = num_groups
        if kind == 1:  # generation: the newest host token is re-fed
            job.position = size - 1
            job.scheduled = 1 + (<Request>item)._draft_tokens.size
        else:  # device token: the newest token, at position n, is on the device
            job.position = size
            job.scheduled = 1
        slot.matched = 0  # used by a context row, discarded by any other
        slot.num_tokens = size
        if num_groups == 1:  # the common layout, without a loop's set-up
            slot_blocks[0] = parts[0].end
        else:
            for group in range(num_groups):
                slot_blocks[group] = parts[group].end
        if consume:
            consume_marks(job, parts)
        num_tokens += size - begin
        num_blocks += new_blocks
        segment += num_groups
        parts += num_groups
        job += 1
        index += 1
    totals[0] += index - first
    state.num_fast_rows += index - first
    totals[1] = num_tokens
    totals[2] = segment
    totals[3] = num_blocks
    return index


cdef void uncommit(ReportState state, RowJob* job) noexcept:
    """Put back what the fast plan committed to a row's slot (the call failed); the
    slot is the manager's own memory, so this is safe whatever ran since."""
    cdef ReportSlot* slot = &state.slots[job.slot]
    cdef Py_ssize_t* slot_blocks = blocks_of(slot)
    cdef SegmentJob* part
    cdef Py_ssize_t group
    slot.matched = job.saved_matched
    slot.num_tokens = job.begin + job.replaced
    for group in range(job.num_groups):
        part = &state.segments[job.first_segment + group]
        slot_blocks[group] = part.begin + part.replaced


cdef void write_report(
    ReportState state,
    Py_ssize_t batch,
    Py_ssize_t num_segments,
    Py_ssize_t total_tokens,
    Py_ssize_t total_blocks,
    int64_t* wide,               # int64_entries(batch, num_segments) entries (ReportColumns' layout)
    int32_t* narrow,             # the tokens, then the block ids
    unsigned char* is_new,       # batch entries
) noexcept nogil:
    """Pass 2: copy the planned deltas and commit; nothing here can fail.

    Only planned values are used (sizes, begins); the buffers' change marks were
    consumed in pass 1. A request mutated by another thread during the report is the
    caller's race: the report shows it as it was at plan time (and tokens written into
    the old storage meanwhile may or may not show), but no memory is ever freed under
    this loop.
    """
    cdef Py_ssize_t row, group, count, segment, token_offset = 0, block_offset = 0
    cdef int64_t* request_ids = wide
    cdef int64_t* positions = wide + batch
    cdef int64_t* scheduled = wide + 2 * batch
    cdef int64_t* replaced_tokens = wide + 3 * batch
    cdef int64_t* token_offsets = wide + 4 * batch
    cdef int64_t* group_offsets = wide + 5 * batch + 1
    cdef int64_t* block_offsets = wide + 6 * batch + 2
    cdef int64_t* replaced_blocks = wide + 6 * batch + 3 + num_segments
    cdef int64_t* released_blocks = wide + 6 * batch + 3 + 2 * num_segments
    cdef int32_t* tokens = narrow
    cdef int32_t* block_ids = narrow + total_tokens
    cdef RowJob* job
    cdef SegmentJob* part
    cdef ReportSlot* slot
    cdef Py_ssize_t* slot_blocks
    token_offsets[0] = 0
    group_offsets[0] = 0
    block_offsets[0] = 0
    for row in range(batch):
        job = &state.rows[row]
        request_ids[row] = job.request_id
        is_new[row] = job.is_new
        positions[row] = job.position
        scheduled[row] = job.scheduled
        replaced_tokens[row] = job.replaced
        count = job.end - job.begin
        debug_assert(0 <= count and token_offset + count <= total_tokens)
        if count == 1:
            tokens[token_offset] = job.data[job.begin]
        elif count:
            memcpy(tokens + token_offset, job.data + job.begin, count * sizeof(int32_t))
        token_offset += count
        token_offsets[row + 1] = token_offset
        if not job.committed:  # a general row's slot is committed here (a fast row's was in pass 1)
            slot = &state.slots[job.slot]
            slot.num_tokens = job.end
            slot.num_pauses = job.num_pauses
            slot.matched = 0  # used by a context row, discarded by any other
            slot.reported = True
            slot.num_groups = job.num_groups
            slot_blocks = blocks_of(slot)
            for group in range(job.num_groups):
                slot_blocks[group] = state.segments[job.first_segment + group].end
        segment = job.first_segment
        if job.num_groups == 1:  # the common layout, without a loop's set-up
            block_offset = write_segment(&state.segments[segment], segment, block_offset, block_ids,
                                         block_offsets, replaced_blocks, released_blocks)
        else:
            for group in range(job.num_groups):
                block_offset = write_segment(&state.segments[segment + group], segment + group, block_offset,
                                             block_ids, block_offsets, replaced_blocks, released_blocks)
        debug_assert(block_offset <= total_blocks)
        group_offsets[row + 1] = segment + job.num_groups
