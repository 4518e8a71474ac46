# The connector report's common row and pass 2 (compiled core): the fast plan that
# ReportState.build() (tokcy/_core_report.pxi) runs for runs of common rows (writing
# their per-row columns and tokens straight into the output when it can), the undoing of
# its slot commits when a call fails, and the pass-2 writer of everything else.

from libc.stdint cimport int8_t, int16_t, uintptr_t
from libc.string cimport memset

# fused-type tags: a plan_fast_loop specialisation per row kind and per consume
ctypedef int8_t GenerationRows
ctypedef int16_t DeviceTokenRows
ctypedef fused RowKind:
    GenerationRows
    DeviceTokenRows
ctypedef int8_t ConsumeMarks
ctypedef int16_t KeepMarks
ctypedef fused MarkUse:
    ConsumeMarks
    KeepMarks


cdef Py_ssize_t plan_fast_rows(ReportState state, list items, Py_ssize_t index, Py_ssize_t kind, int64_t stamp,
                               Py_ssize_t* totals, bint consume, const DirectOutput* out) noexcept:
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
    code). With ``out.request_ids`` (the arena's arrays, reusable), a row whose tokens
    fit ``out`` has its per-row columns and tokens written there at once (its job is
    ``direct``: pass 2 writes only its segments); pass 2 writes the others.
    ``totals``: rows, tokens, segments, blocks and direct rows planned so far, updated."""
    # one copy of the loop per row kind and per consume (compile-time constants in each,
    # fused-type tags): fewer branches per row, and fewer values the loop keeps live
    cdef GenerationRows generation = 0
    cdef DeviceTokenRows device_token = 0
    cdef ConsumeMarks consuming = 0
    cdef KeepMarks keeping = 0
    if kind == 1:
        if consume:
            return plan_fast_loop(state, items, index, stamp, totals, out, generation, consuming)
        return plan_fast_loop(state, items, index, stamp, totals, out, generation, keeping)
    if consume:
        return plan_fast_loop(state, items, index, stamp, totals, out, device_token, consuming)
    return plan_fast_loop(state, items, index, stamp, totals, out, device_token, keeping)


cdef Py_ssize_t plan_fast_loop(ReportState state, list items, Py_ssize_t index, int64_t stamp, Py_ssize_t* totals,
                               const DirectOutput* out, RowKind row_kind, MarkUse mark_use) noexcept:
    """plan_fast_rows' loop, for one row kind (generation or device-token rows) and
    consuming the marks or not, each known when compiled."""
    # everything the loop reads of state in locals: its stores cannot alias them
    cdef ReportSlot* slots = state.table.slots
    cdef RowJob* job = state.rows + totals[0]
    cdef SegmentJob* parts = state.segments + totals[2]
    cdef size_t num_slots = <size_t>state.table.num_slots_used
    cdef Py_ssize_t count = len(items), first = index
    cdef Py_ssize_t num_tokens = totals[1], num_blocks = totals[3], segment = totals[2], num_direct = totals[4]
    cdef Py_ssize_t number, size, begin, dirty, replaced, new_tokens, group, num_groups, new_blocks, planned
    cdef int64_t position, scheduled
    # the output's per-row columns, indexed by the request's index in items (row = index + shift)
    cdef Py_ssize_t shift = totals[0] - index
    cdef int64_t* request_ids = NULL
    cdef int64_t* positions = NULL
    cdef int64_t* scheduled_tokens = NULL
    cdef int64_t* replaced_tokens = NULL
    cdef int64_t* token_ends = NULL
    cdef int64_t* group_ends = NULL
    cdef unsigned char* is_new = NULL
    # out's fields in locals too: the loop's int64 stores may alias them, so the compiler
    # would reload them every row
    cdef int32_t* out_tokens = out.tokens
    cdef Py_ssize_t token_capacity = out.token_capacity
    cdef Py_ssize_t room = state.segment_capacity - totals[2]  # segment jobs left
    cdef const int32_t* data
    cdef PyObject** requests = PySequence_Fast_ITEMS(items)
    cdef PyObject* item
    cdef PyObject* tables
    cdef PyObject* tokens       # borrowed, as every pointer here: nothing is counted per row
    cdef ReportSlot* slot
    cdef Py_ssize_t* slot_blocks
    cdef PyObject* ahead         # a request of the rows ahead, and one of its buffers (cache hints)
    cdef PyObject* ahead_buffer
    cdef Py_ssize_t ahead_size
    cdef bint prefetching = count - index >= PREFETCH_MIN_ROWS
    if out.request_ids != NULL:
        request_ids = out.request_ids + shift
        positions = out.positions + shift
        scheduled_tokens = out.scheduled + shift
        replaced_tokens = out.replaced_tokens + shift
        token_ends = out.token_ends + shift
        group_ends = out.group_ends + shift
        is_new = out.is_new + shift
    while index < count:
        # Cache hints for the rows ahead (written out here, not in a helper: GCC counts a
        # prefetch as no side effect and drops a call that only prefetches). A large batch's
        # rows miss the caches and each row's reads chain (the request, then its slot and
        # buffers, then its tokens); without them each row waits for each in turn. Only
        # fields of objects of the exact types checked are read; a hint never faults.
        # With fewer than PREFETCH_MIN_ROWS rows left in this run, the rows (some 700 bytes
        # each, job and output included) stay in a 1-2 MiB L2, where the hints only cost
        # instructions (a tenth of the row's time at 256 rows, measured).
        if prefetching:
            if index + 2 * PREFETCH_ROWS < count:  # the type and the fields read: one line (Request's layout)
                prefetch(<uintptr_t>requests[index + 2 * PREFETCH_ROWS] + 8)
            if index + PREFETCH_ROWS < count:
                ahead = requests[index + PREFETCH_ROWS]
                if <void*>ahead.ob_type == <void*>Request:
                    if <size_t>(<Request>ahead)._report_slot < num_slots:
                        prefetch(<uintptr_t>&slots[(<Request>ahead)._report_slot])  # one line (ReportSlot)
                    prefetch(<uintptr_t><PyObject*>(<Request>ahead)._beam0 + 24)  # type and counts: one line
                    prefetch(<uintptr_t><PyObject*>(<Request>ahead)._blocks0 + 24)  # likewise
            if index + PREFETCH_ROWS // 2 < count:
                ahead = requests[index + PREFETCH_ROWS // 2]
                if <void*>ahead.ob_type == <void*>Request:
                    ahead_buffer = <PyObject*>(<Request>ahead)._beam0
                    if <void*>ahead_buffer.ob_type == <void*>Int32Buffer:
                        ahead_size = (<Int32Buffer>ahead_buffer).size
                        if 0 < ahead_size <= (<Int32Buffer>ahead_buffer).capacity:
                            prefetch(<uintptr_t>(<Int32Buffer>ahead_buffer).data + (ahead_size - 1) * sizeof(int32_t))
        item = requests[index]
        if <void*>item.ob_type != <void*>Request:
            break
        number = (<Request>item)._report_slot
        if <size_t>number >= num_slots:
            break
        slot = &slots[number]
        if (slot.request_id != (<Request>item)._request_id or not slot.reported  # reported: live too
                or slot.stamp == stamp or slot.num_pauses != (<Request>item)._num_pauses
                or (<Request>item)._state_code == 2):
            break
        num_groups = (<Request>item)._num_groups
        if num_groups != slot.num_groups or num_groups > room:
            break
        tokens = <PyObject*>(<Request>item)._beam0
        size = (<Int32Buffer>tokens).size
        dirty = (<Int32Buffer>tokens).dirty_from
        begin = slot.num_tokens if slot.num_tokens < dirty else dirty
        if begin > size:
            begin = size
        if begin < 0 or size > (<Int32Buffer>tokens).capacity:
            break
        slot_blocks = blocks_of(slot)
        if num_groups == 1:  # the common layout, without a loop's set-up (nor the tuple)
            new_blocks = plan_fast_blocks(<PyObject*>(<Request>item)._blocks0, slot_blocks[0], parts)
        else:
            tables = <PyObject*>(<Request>item)._block_tables
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
        job.committed = True
        job.saved_matched = slot.matched
        job.buffer = tokens
        job.saved_dirty = dirty  # what consuming the mark saves
        job.end = size
        job.saved_tokens = slot.num_tokens
        job.first_segment = segment
        job.num_groups = <int32_t>num_groups
        replaced = slot.num_tokens - begin
        if RowKind is GenerationRows:  # the newest host token is re-fed
            position = size - 1
            scheduled = 1 + (<Request>item)._draft_tokens.size
        else:  # device-token rows: the newest token, at position n, is on the device
            position = size
            scheduled = 1
        new_tokens = size - begin
        data = (<Int32Buffer>tokens).data
        if request_ids != NULL and new_tokens <= token_capacity - num_tokens:
            # straight into the output (write_report writes the other rows likewise)
            job.direct = True
            request_ids[index] = slot.request_id
            is_new[index] = False
            positions[index] = position
            scheduled_tokens[index] = scheduled
            replaced_tokens[index] = replaced
            if new_tokens == 1:
                out_tokens[num_tokens] = data[begin]
            elif new_tokens:
                memcpy(out_tokens + num_tokens, data + begin, new_tokens * sizeof(int32_t))
            token_ends[index] = num_tokens + new_tokens
            group_ends[index] = segment + num_groups
            num_direct += 1
        else:
            job.direct = False
            job.begin = begin
            job.replaced = replaced
            job.request_id = slot.request_id
            job.is_new = False
            job.num_pauses = slot.num_pauses
            job.data = data
            job.position = position
            job.scheduled = scheduled
        slot.matched = 0  # used by a context row, discarded by any other
        slot.num_tokens = size
        if num_groups == 1:  # the common layout, without a loop's set-up
            slot_blocks[0] = parts[0].end
            if MarkUse is ConsumeMarks:
                mark_of(parts[0].buffer)[0] = parts[0].end  # saved_dirty is set (plan_fast_segment)
        else:
            for group in range(num_groups):
                slot_blocks[group] = parts[group].end
                if MarkUse is ConsumeMarks:
                    mark_of(parts[group].buffer)[0] = parts[group].end
        if MarkUse is ConsumeMarks:
            (<Int32Buffer>tokens).dirty_from = size
        num_tokens += new_tokens
        num_blocks += new_blocks
        segment += num_groups
        parts += num_groups
        room -= num_groups
        job += 1
        index += 1
    totals[0] += index - first
    state.num_fast_rows += index - first
    totals[1] = num_tokens
    totals[2] = segment
    totals[3] = num_blocks
    totals[4] = num_direct
    return index


cdef void find_direct_output(DirectOutput* out, OutputArena arena, Py_ssize_t batch) noexcept:
    """Where the fast plan writes its rows of a report of ``batch`` rows: the arena's
    arrays found reusable (``arena.inspect()``, before the plan), when they hold the
    per-row columns (wide_layout's places); else nowhere
    (``out.request_ids`` NULL). Nothing but the arena references them, so nothing can see
    what a failed call leaves in them."""
    cdef int64_t* wide = <int64_t*>arena.wide.data
    # the per-row columns lie before block_offsets whatever the segments (none known yet)
    cdef WideLayout at = wide_layout(batch, 0)
    memset(out, 0, sizeof(DirectOutput))
    if (wide == NULL or arena.wide.capacity < at.start[WIDE_BLOCK_OFFSETS] or arena.narrow.data == NULL
            or arena.flags.data == NULL or arena.flags.capacity < batch):
        return
    out.request_ids = wide + at.start[WIDE_REQUEST_IDS]
    out.positions = wide + at.start[WIDE_POSITIONS]
    out.scheduled = wide + at.start[WIDE_SCHEDULED]
    out.replaced_tokens = wide + at.start[WIDE_REPLACED_TOKENS]
    out.token_ends = wide + at.start[WIDE_TOKEN_OFFSETS] + 1
    out.group_ends = wide + at.start[WIDE_GROUP_OFFSETS] + 1
    out.is_new = <unsigned char*>arena.flags.data
    out.tokens = <int32_t*>arena.narrow.data
    out.token_capacity = arena.narrow.capacity


cdef void move_direct_rows(OutputArena arena, const DirectOutput* out, Py_ssize_t batch, Py_ssize_t total_tokens) noexcept:
    """After ``arena.allocate()`` replaced some of the arrays the fast plan wrote its rows
    into (``out``'s, still alive: build() holds them): copy what it wrote into the new
    ones (the per-row columns, and the tokens, which all lie in the first
    ``min(total_tokens, out.token_capacity)`` entries)."""
    if arena.wide.data != <void*>out.request_ids:  # the per-row columns (find_direct_output's)
        memcpy(arena.wide.data, out.request_ids, wide_layout(batch, 0).start[WIDE_BLOCK_OFFSETS] * sizeof(int64_t))
    if arena.narrow.data != <void*>out.tokens:
        memcpy(arena.narrow.data, out.tokens, min(total_tokens, out.token_capacity) * sizeof(int32_t))
    if arena.flags.data != <void*>out.is_new:
        memcpy(arena.flags.data, out.is_new, batch)


cdef void uncommit(ReportState state, RowJob* job) noexcept:
    """Put back what the fast plan committed to a row's slot (the call failed); the
    slot is the manager's own memory, so this is safe whatever ran since."""
    cdef ReportSlot* slot = &state.table.slots[job.slot]
    cdef Py_ssize_t* slot_blocks = blocks_of(slot)
    cdef SegmentJob* part
    cdef Py_ssize_t group
    slot.matched = job.saved_matched
    slot.num_tokens = job.saved_tokens
    for group in range(job.num_groups):
        part = &state.segments[job.first_segment + group]
        slot_blocks[group] = part.begin + part.replaced


cdef void write_report(
    ReportState state,
    Py_ssize_t batch,
    Py_ssize_t num_segments,
    Py_ssize_t total_tokens,
    Py_ssize_t total_blocks,
    Py_ssize_t num_direct,       # rows whose columns and tokens the fast plan wrote (RowJob.direct)
    int64_t* wide,               # int64_entries(batch, num_segments) entries (wide_layout's)
    int32_t* narrow,             # the tokens, then the block ids
    unsigned char* is_new,       # batch entries
) noexcept nogil:
    """Pass 2: copy the planned deltas and commit; nothing here can fail.

    Only planned values are used (sizes, begins); the buffers' change marks were
    consumed in pass 1. The direct rows' per-row columns and tokens are in place already
    (written in pass 1 into these arrays, or moved into them by move_direct_rows). A
    request mutated by another thread during the report is the caller's race: the
    report shows it as it was at plan time (and tokens written into the old storage
    meanwhile may or may not show), but no memory is ever freed under this loop.
    """
    cdef Py_ssize_t row, group, count, segment, token_offset, block_offset = 0
    cdef WideLayout at = wide_layout(batch, num_segments)
    cdef int64_t* request_ids = wide + at.start[WIDE_REQUEST_IDS]
    cdef int64_t* positions = wide + at.start[WIDE_POSITIONS]
    cdef int64_t* scheduled = wide + at.start[WIDE_SCHEDULED]
    cdef int64_t* replaced_tokens = wide + at.start[WIDE_REPLACED_TOKENS]
    cdef int64_t* token_offsets = wide + at.start[WIDE_TOKEN_OFFSETS]
    cdef int64_t* group_offsets = wide + at.start[WIDE_GROUP_OFFSETS]
    cdef int64_t* block_offsets = wide + at.start[WIDE_BLOCK_OFFSETS]
    cdef int64_t* replaced_blocks = wide + at.start[WIDE_REPLACED_BLOCKS]
    cdef int64_t* released_blocks = wide + at.start[WIDE_RELEASED_BLOCKS]
    cdef int32_t* tokens = narrow
    cdef int32_t* block_ids = narrow + total_tokens
    cdef RowJob* job
    cdef const SegmentJob* part
    cdef ReportSlot* slot
    cdef Py_ssize_t* slot_blocks
    token_offsets[0] = 0
    group_offsets[0] = 0
    block_offsets[0] = 0
    if num_direct < batch:  # the rows the fast plan did not write already
        for row in range(batch):
            job = &state.rows[row]
            if job.direct:
                continue
            request_ids[row] = job.request_id
            is_new[row] = job.is_new
            positions[row] = job.position
            scheduled[row] = job.scheduled
            replaced_tokens[row] = job.replaced
            token_offset = token_offsets[row]  # written by the row before, in either pass
            count = job.end - job.begin
            debug_assert(0 <= count and token_offset + count <= total_tokens)
            if count == 1:
                tokens[token_offset] = job.data[job.begin]
            elif count:
                memcpy(tokens + token_offset, job.data + job.begin, count * sizeof(int32_t))
            token_offsets[row + 1] = token_offset + count
            group_offsets[row + 1] = job.first_segment + job.num_groups
            if not job.committed:  # a general row's slot is committed here (a fast row's was in pass 1)
                slot = &state.table.slots[job.slot]
                slot.num_tokens = job.end
                slot.num_pauses = job.num_pauses
                slot.matched = 0  # used by a context row, discarded by any other
                slot.reported = True
                slot.num_groups = <int16_t>job.num_groups
                slot_blocks = blocks_of(slot)
                for group in range(job.num_groups):
                    slot_blocks[group] = state.segments[job.first_segment + group].end
    part = state.segments
    for segment in range(num_segments):  # every row's groups, in row order
        count = part.end - part.begin
        debug_assert(0 <= count and block_offset + count <= total_blocks)
        if count:  # most often none
            if count == 1:
                block_ids[block_offset] = part.data[part.begin]
            else:
                memcpy(block_ids + block_offset, part.data + part.begin, count * sizeof(int32_t))
            block_offset += count
        block_offsets[segment + 1] = block_offset
        replaced_blocks[segment] = part.replaced
        released_blocks[segment] = part.released
        part += 1
    debug_assert(block_offset == total_blocks)
    debug_assert(token_offsets[batch] == total_tokens)
    debug_assert(group_offsets[batch] == num_segments)
