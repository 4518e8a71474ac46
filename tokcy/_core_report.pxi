# The KV-connector report (what each request gained since the last report), compiled.
#
# tokcy/_pure/report.py is the readable twin and documents the rules; this file is the
# same algorithm with the per-request state in C:
#
# * ReportSlot: what one request has reported so far (beam-0 tokens, blocks per group,
#   pause count at the last report, pending connector-matched tokens). Slots live in one
#   growable C array with a free list; a C open-addressing hash table (linear probing,
#   backward-shift deletion) maps request id -> slot (the SlotTable, _core_report_slots.pxi),
#   so the batch loop never creates a Python int (or any other object) per request. Each Request remembers its slot number
#   as a hint (Request._report_slot), used when that slot is live and holds the request's
#   id (the table maps an id to one slot only, so the hint is then right), probed otherwise.
# * build(): pass 1, with the GIL, validates the whole batch, checks every planned copy
#   against its buffer and plans one copy job per token buffer and per block table (fresh
#   slots inserted for never-seen ids are undone if anything fails); pass 2 copies the
#   deltas into the output arena (tokcy/_core_report_output.pxi: arrays reused while
#   nobody else references them) and commits the slots. A failing call changes neither
#   the manager nor any request. The report's object is made before the plan, so nothing
#   can fail from pass 2 on: a report once written is returned, never lost.
# * The common row (a generation or device-token row of an exact Request, reported before
#   and not paused since, its slot hint valid, its group count unchanged) takes a fast
#   plan (plan_fast_rows, in _core_report_fast.pxi): borrowed pointers, no check that can raise, its slot
#   committed at once (undone from the job if the call fails, the slot being the
#   manager's own memory). When the arena's arrays were found reusable before the plan,
#   it writes the row's per-row columns (request id, is_new, position, scheduled,
#   replaced tokens, token and group offsets: places that depend on the batch size
#   alone) and its tokens straight into them, and pass 2 writes only its segments (block
#   columns, whose places depend on totals known after the plan); if those arrays are
#   then replaced (too small, or far too large), what was written moves into the new
#   ones before pass 2. Nobody but the arena references them, so a failed call leaves
#   only unused entries changed. Every other row takes the
#   general plan (_plan_row), which raises the errors; the fast plan stops at anything it
#   does not handle, having changed nothing for that row.
# * Change marks: the connector is one of two readers of each buffer's changes (the
#   device block table is the other, with its own mark: docs/change-tracking.md). Pass 1
#   consumes the connector's mark (dirty_from) of each buffer as it reads it, with the
#   GIL, and puts it back if the call fails; pass 2 never writes it. The fast plan
#   consumes its rows' marks as it goes while no general row has been met (no Python code
#   can have run); at the first general row it gives them back, in C, before that row's
#   checks can run Python code, and every mark is then consumed once the whole batch is
#   valid, as for any batch with a general row. So a change another
#   thread makes while pass 2 runs without the GIL lowers the mark again and shows in the
#   next report: it is never lost.
# * Memory safety: pass 2 runs without the GIL when it copies at least NOGIL_MIN_ENTRIES
#   entries, with it otherwise. Between the passes Python code can run only when the
#   arena must allocate an array (an allocation can run the garbage collector, hence
#   Python code and other threads): then, and whenever pass 2 runs without the GIL, the
#   end of pass 1 takes a strong reference (held, a C array of PyObject*) to every
#   Int32Buffer a job writes and to every storage array a job's data pointer reads, and
#   drops them after pass 2. A small report into reused arrays runs no Python code from
#   the first read of a request to the last write, so its borrowed pointers stay valid
#   without references. Pass 2 reads only values planned in pass 1 (and the token
#   offsets of the rows before, in the arena's arrays). A second build /
#   record_matched_tokens / reset_request / request_finished on the same state while a
#   build runs raises RuntimeError (busy) instead of moving slots, rows or segments under
#   the writer. A request mutated by another thread during a report is the caller's race
#   (the report shows it as at plan time), never a use-after-free.
# * Errors: tokcy/_report_checks.py, shared with the pure twin.
# * The per-request slot, the copy jobs and their helpers: _core_report_jobs.pxi; the
#   slot table: _core_report_slots.pxi; the fast plan and pass 2's writer: _core_report_fast.pxi.

from cpython.list cimport PyList_GET_ITEM
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from libc.stdlib cimport free, malloc, realloc

from tokcy import _report_checks

@cython.final
cdef class ReportState:
    """Per-request report state of one ``tokcy.connector.SchedulerOutputManager`` and its batch loop."""

    cdef SlotTable table                # request id -> slot (_core_report_slots.pxi)
    cdef int64_t stamp
    cdef RowJob* rows                   # CACHE_LINE-aligned, in rows_block
    cdef void* rows_block
    cdef Py_ssize_t row_capacity
    cdef SegmentJob* segments
    cdef Py_ssize_t segment_capacity
    cdef Py_ssize_t* fresh              # slots inserted by the current build(), undone on failure
    cdef PyObject** held                # strong references owned by the current build()
    cdef Py_ssize_t num_held
    cdef Py_ssize_t held_capacity
    cdef bint busy                      # a build() is running (maybe in pass 2, without the GIL)
    cdef OutputArena arena              # the arrays the reports are written into, reused
    cdef bint fast_plan                 # False: every row takes the general plan (tests compare the two)
    cdef Py_ssize_t num_fast_rows       # rows the fast plan has planned so far (a counter for tests)

    def __cinit__(self):
        self.fast_plan = True
        self.arena = OutputArena()
        slot_table_init(&self.table)

    def __dealloc__(self):
        slot_table_free(&self.table)
        free(self.rows_block)
        free(self.segments)
        free(self.fresh)
        self._release_held()
        free(self.held)

    # ------------------------------------------------------------------ scratch space
    cdef int _reserve_rows(self, Py_ssize_t count) except -1:
        """Room for ``count`` row jobs (called before a plan: the old jobs are not kept)."""
        cdef void* block
        cdef Py_ssize_t* fresh
        cdef Py_ssize_t capacity
        debug_assert(sizeof(RowJob) == 2 * CACHE_LINE)  # (RowJob's layout)
        if count > self.row_capacity:
            capacity = grown_capacity(self.row_capacity, count)
            block = malloc(capacity * sizeof(RowJob) + CACHE_LINE - 1)
            if block == NULL:
                raise MemoryError()
            free(self.rows_block)
            self.rows_block = block
            self.rows = <RowJob*>line_aligned(block)
            self.row_capacity = 0  # until fresh has the room too
            fresh = <Py_ssize_t*>realloc(self.fresh, capacity * sizeof(Py_ssize_t))
            if fresh == NULL:
                raise MemoryError()
            self.fresh = fresh
            self.row_capacity = capacity
        return 0

    cdef int _reserve_segments(self, Py_ssize_t count) except -1:
        cdef SegmentJob* segments
        cdef Py_ssize_t capacity
        if count > self.segment_capacity:
            capacity = grown_capacity(self.segment_capacity, count)
            segments = <SegmentJob*>realloc(self.segments, capacity * sizeof(SegmentJob))
            if segments == NULL:
                raise MemoryError()
            self.segments = segments
            self.segment_capacity = capacity
        return 0

    cdef int _reserve_groups(self, Py_ssize_t number, Py_ssize_t num_groups) except -1:
        cdef ReportSlot* slot = &self.table.slots[number]
        cdef Py_ssize_t* counts
        cdef Py_ssize_t group
        debug_assert(num_groups < (1 << 15))  # a Request's tables: at most 1,024 (tokcy._invariants)
        if num_groups > slot.group_capacity:
            if slot.group_capacity > INLINE_GROUPS:
                counts = <Py_ssize_t*>realloc(slot.blocks.heap, num_groups * sizeof(Py_ssize_t))
            else:  # the counts move out of the slot (a live slot's: it holds INLINE_GROUPS)
                debug_assert(slot.group_capacity == INLINE_GROUPS)  # (a live slot's)
                counts = <Py_ssize_t*>malloc(num_groups * sizeof(Py_ssize_t))
                if counts != NULL:
                    memcpy(counts, slot.blocks.counts, INLINE_GROUPS * sizeof(Py_ssize_t))
            if counts == NULL:
                raise MemoryError()
            for group in range(slot.group_capacity, num_groups):
                counts[group] = 0  # never read before written; zero all the same
            slot.blocks.heap = counts
            slot.group_capacity = <int16_t>num_groups
        return 0

    # ------------------------------------------------------------------ owned references
    cdef bint _reserve_held(self, Py_ssize_t count) noexcept:
        """Room for ``count`` more references in ``held``; False (and no exception set) if
        memory is short, so the caller can undo C-only work before anything raises."""
        cdef PyObject** held
        cdef Py_ssize_t capacity
        if self.num_held + count > self.held_capacity:
            capacity = grown_capacity(self.held_capacity, self.num_held + count)
            held = <PyObject**>realloc(self.held, capacity * sizeof(PyObject*))
            if held == NULL:
                return False
            self.held = held
            self.held_capacity = capacity
        return True

    cdef inline int _hold(self, object obj) except -1:
        """Keep ``obj`` alive until ``_release_held`` (a strong reference, in C)."""
        cdef PyObject** held
        cdef Py_ssize_t capacity
        if self.num_held == self.held_capacity:
            capacity = grown_capacity(self.held_capacity, self.held_capacity + 1)
            held = <PyObject**>realloc(self.held, capacity * sizeof(PyObject*))
            if held == NULL:
                raise MemoryError()
            self.held = held
            self.held_capacity = capacity
        Py_INCREF(obj)
        self.held[self.num_held] = <PyObject*>obj
        self.num_held += 1
        return 0

    cdef void _release_held(self) noexcept:
        while self.num_held:
            self.num_held -= 1
            Py_XDECREF(self.held[self.num_held])
            self.held[self.num_held] = NULL

    cdef int _hold_buffer(self, PyObject* pointer, bint reads) except -1:
        """Own a planned buffer (its ``dirty_from`` is written) and, if its data is read, its storage."""
        cdef Int32Buffer buffer = <Int32Buffer>pointer
        self._hold(buffer)
        if reads:
            self._hold(buffer.storage)
        return 0

    cdef int _hold_jobs(self, Py_ssize_t batch, Py_ssize_t num_segments) except -1:
        cdef Py_ssize_t number
        cdef RowJob* job
        cdef SegmentJob* part
        for number in range(batch):
            job = &self.rows[number]
            self._hold_buffer(job.buffer, not job.direct and job.end > job.begin)  # pass 2 reads no direct row's tokens
        for number in range(num_segments):
            part = &self.segments[number]
            self._hold_buffer(part.buffer, part.end > part.begin)
        return 0

    # ------------------------------------------------------------------ pass 1, one row
    cdef inline Py_ssize_t _slot_of(self, Request request, Py_ssize_t* num_fresh) except -1:
        """The request's slot: its hint if valid, else the table's (a fresh one, undone if the
        call fails, for an id not seen yet); the hint is updated."""
        cdef Py_ssize_t number = request._report_slot
        if 0 <= number < self.table.num_slots_used and is_live(&self.table.slots[number]) and \
                self.table.slots[number].request_id == request._request_id:
            return number
        number = slot_table_find(&self.table, request._request_id)
        if number == NO_ENTRY:
            number = slot_table_insert(&self.table, request._request_id)
            self.fresh[num_fresh[0]] = number
            num_fresh[0] += 1
        request._report_slot = <int32_t>number if number <= INT32_MAX else -1  # a hint: none is safe
        return number

    cdef inline int _plan_row(self, Request request, Py_ssize_t kind, Py_ssize_t number, int64_t stamp,
                              RowJob* job, Py_ssize_t* total_segments) except -1:
        """Validate one request and plan its copies (the row's job, its segments' jobs);
        changes nothing but the slot's stamp. Runs no Python code but to raise."""
        cdef Py_ssize_t group, num_groups, begin, reported, size, dirty_from
        cdef ReportSlot* slot = &self.table.slots[number]
        cdef PyObject* tables = <PyObject*>request._block_tables  # a tuple (Request's field)
        cdef PyObject* table
        cdef PyObject* block_ids
        cdef SegmentJob* part
        if request._state_code == 2:
            _report_checks.finished(request._request_id)
        if slot.stamp == stamp:
            _report_checks.duplicate(request._request_id)
        slot.stamp = stamp
        num_groups = tuple_size(tables)
        if slot.num_groups != NEVER_REPORTED and slot.num_groups != num_groups:
            _report_checks.group_count(request._request_id, num_groups, slot.num_groups)
        if kind == 0 and slot.matched > request._context_position:
            _report_checks.matched_past_position(request._request_id, slot.matched, request._context_position)
        if num_groups > slot.group_capacity:
            self._reserve_groups(number, num_groups)
            slot = &self.table.slots[number]
        if total_segments[0] + num_groups > self.segment_capacity:
            self._reserve_segments(total_segments[0] + num_groups)
        job.slot = number
        job.request_id = request._request_id
        job.committed = False
        job.direct = False
        job.is_new = not slot.reported or slot.num_pauses != request._num_pauses
        job.num_pauses = request._num_pauses
        size = request._beam0.size
        begin = 0
        job.replaced = 0
        if not job.is_new:
            dirty_from = request._beam0.dirty_from
            begin = slot.num_tokens if slot.num_tokens < dirty_from else dirty_from
            if begin > size:
                begin = size
            job.replaced = slot.num_tokens - begin
        check_span(job.request_id, begin, size, size, request._beam0.capacity)
        job.buffer = <PyObject*>request._beam0
        job.data = request._beam0.data
        job.begin = begin
        job.end = size
        if kind == 0:  # context: the cursor, less connector-matched tokens
            job.position = request._context_position - slot.matched
            job.scheduled = request._chunk_size
        elif kind == 1:  # generation: the newest host token is re-fed
            job.position = size - 1
            job.scheduled = 1 + request._draft_tokens.size
        else:  # device token: the newest token, at position n, is on the device
            job.position = size
            job.scheduled = 1
        job.first_segment = total_segments[0]
        job.num_groups = <int32_t>num_groups  # at most MAX_LAYER_GROUPS (the tables tuple's bound)
        for group in range(num_groups):
            table = tuple_item(tables, group)
            if <void*>table.ob_type != <void*>BlockTable and not isinstance(<object>table, BlockTable):  # never
                raise TypeError(f"layer group {group} of request {request._request_id} is not a BlockTable")
            block_ids = <PyObject*>(<BlockTable>table)._buffer
            size = (<Int32Buffer>block_ids).size
            reported = 0
            begin = 0
            if not job.is_new:
                reported = blocks_of(slot)[group]
                dirty_from = (<Int32Buffer>block_ids).dirty_from
                begin = reported if reported < dirty_from else dirty_from
                if begin > size:
                    begin = size
            check_span(job.request_id, begin, size, size, (<Int32Buffer>block_ids).capacity)
            part = &self.segments[total_segments[0]]
            part.buffer = block_ids
            part.data = (<Int32Buffer>block_ids).data
            part.begin = begin
            part.end = size
            part.replaced = reported - begin
            part.released = (<Int32Buffer>block_ids).num_released
            total_segments[0] += 1
        return 0

    # ------------------------------------------------------------------ public calls
    def build(self, context_requests, generation_requests, device_token_requests=()):
        """Report one iteration; returns the report's columns: a ReportColumns, whose
        ``arrays()`` are tokcy.connector.SchedulerOutput's columns (``num_context``: its
        context rows)."""
        cdef list groups
        cdef Py_ssize_t kind
        cdef Py_ssize_t index
        cdef Py_ssize_t row = 0, group, number, num_groups, num_fresh = 0
        cdef Py_ssize_t batch, num_context
        cdef Py_ssize_t total_tokens = 0, total_segments = 0, total_blocks = 0
        cdef list items
        cdef PyObject* item
        cdef RowJob* job
        cdef OutputArena arena = self.arena
        cdef ReportColumns columns
        cdef int64_t stamp
        cdef bint release_gil = False, claimed
        cdef Py_ssize_t consumed = 0         # rows whose marks this call consumed
        # the fast plan consumes its rows' marks as it goes, until the first general row
        cdef bint in_place = True
        cdef Py_ssize_t count
        cdef Py_ssize_t totals[5]
        cdef Py_ssize_t num_direct = 0       # rows the fast plan wrote into the output (RowJob.direct)
        cdef DirectOutput direct
        if self.busy:
            _report_checks.busy()
        self.busy = True
        try:
            # the groups are read inside the guard: an iterator that calls back is refused
            # too. A list is read in place: nothing below runs Python code before the plan
            # is complete, so it cannot change under pass 1, and pass 2 never reads it.
            groups = [as_list(context_requests, 0), as_list(generation_requests, 1), as_list(device_token_requests, 2)]
            # the report's object now, while a failure loses nothing: from pass 2 on nothing can fail
            columns = ReportColumns.__new__(ReportColumns)
            arena.inspect()  # before the plan: this may run Python code (numpy's buffer export)
            # the lists' lengths once no Python code can change them before the plan reads them
            num_context = len(<list>groups[0])
            batch = num_context + len(<list>groups[1]) + len(<list>groups[2])
            self._reserve_rows(batch)
            find_direct_output(&direct, arena, batch)  # where the fast plan may write its rows
            self.stamp += 1
            stamp = self.stamp
            try:
                # pass 1 (with the GIL): validate the whole batch and plan the copies. Sizes
                # and low-water marks are read here, once: the report is the state at plan
                # time. Nothing is committed but the requests' slot hints (hints only). The
                # jobs' buffer/data/dirty pointers are borrowed: this loop runs no Python
                # code and drops no reference, so nothing it points into can change or be
                # freed before pass 2, or before _hold_jobs below owns it if anything runs
                # in between. An error aborts the loop, and building its message runs
                # Python code (which may free a planned request's buffers): so the marks
                # are consumed only once the whole batch is valid, and never written after
                # an error unless their buffers are owned.
                for kind in range(3):
                    items = <list>groups[kind]
                    count = len(items)
                    index = 0
                    while True:
                        if kind != 0 and self.fast_plan:  # runs of common rows, then one general row, and so on
                            totals[0], totals[1], totals[2], totals[3], totals[4] = \
                                row, total_tokens, total_segments, total_blocks, num_direct
                            index = plan_fast_rows(self, items, index, kind, stamp, totals, in_place, &direct)
                            row, total_tokens, total_segments, total_blocks, num_direct = \
                                totals[0], totals[1], totals[2], totals[3], totals[4]
                        if index >= count:
                            break
                        if in_place:
                            # the general checks below may run Python code (to raise), which
                            # may free a request planned so far: give the fast rows' marks
                            # back now, and consume every row's once the batch is valid
                            for number in range(row):
                                give_back_marks(&self.rows[number], &self.segments[self.rows[number].first_segment])
                            in_place = False
                        # borrowed: the list holds the request, the request its buffers and
                        # tables (no reference count is touched per request)
                        item = PyList_GET_ITEM(items, index)
                        if not isinstance(<object>item, Request):
                            _report_checks.not_a_request(_report_checks.GROUPS[kind], index, <object>item, Request)
                        number = self._slot_of(<Request>item, &num_fresh)
                        self._plan_row(<Request>item, kind, number, stamp, &self.rows[row], &total_segments)
                        job = &self.rows[row]
                        total_tokens += job.end - job.begin
                        for group in range(job.first_segment, total_segments):
                            total_blocks += self.segments[group].end - self.segments[group].begin
                        row += 1
                        index += 1
                if in_place:
                    consumed = batch
                # The output goes into the arena's arrays when nothing else references
                # them (found before the plan; no Python code runs to claim them). A new array is allocated
                # otherwise, and an allocation can run the garbage collector, hence Python
                # code (__del__, gc callbacks) and other threads, which may append to
                # (reallocate) or drop a request: so first own every buffer a job writes
                # (dirty_from) and every storage array a job reads. A large copy runs
                # without the GIL, owning them likewise; a small one keeps it (releasing it
                # would cost more than the copy, and getting it back can wait a whole switch
                # interval), and with no Python code since pass 1 it needs no reference.
                release_gil = total_tokens + total_blocks >= NOGIL_MIN_ENTRIES
                claimed = arena.claim(int64_entries(batch, total_segments), total_tokens + total_blocks, batch)
                if not claimed or release_gil:
                    if not self._reserve_held(2 * (batch + total_segments)):
                        for index in range(consumed):  # nothing has run since they were consumed
                            give_back_marks(&self.rows[index], &self.segments[self.rows[index].first_segment])
                        consumed = 0
                        raise MemoryError()
                    self._hold_jobs(batch, total_segments)  # cannot fail: the room is reserved
                if not in_place:
                    # the batch is valid and no Python code has run since its marks were
                    # read: consume them (restore_marks() puts them back if the allocation
                    # fails; the buffers are owned by then)
                    for index in range(batch):
                        consume_marks(&self.rows[index], &self.segments[self.rows[index].first_segment])
                    consumed = batch
                if not claimed:
                    if num_direct:
                        # keep the arrays the direct rows were written into until their entries
                        # are copied into the new ones (a rare path: a small array or a shrink):
                        # the memory they were written into, which the allocation replaces in
                        # the arena, held in C (nothing a gc callback can find or free)
                        self._hold(arena.int64_memory)
                        self._hold(arena.int32_memory)
                        self._hold(arena.bool_memory)
                    arena.allocate(int64_entries(batch, total_segments), total_tokens + total_blocks, batch)
                    if num_direct:
                        move_direct_rows(arena, &direct, batch, total_tokens)
            except BaseException:
                for index in range(consumed):
                    restore_marks(&self.rows[index], &self.segments[self.rows[index].first_segment])
                for index in range(row):
                    if self.rows[index].committed:
                        uncommit(self, &self.rows[index])
                while num_fresh:
                    num_fresh -= 1
                    slot_table_remove(&self.table, self.table.slots[self.fresh[num_fresh]].request_id)
                raise
            # pass 2: the slots, rows and segments cannot move (busy); without the GIL, every
            # pointer the jobs hold is into an object owned since pass 1, and the arena's
            # arrays are referenced by the arena alone
            if release_gil:
                with nogil:
                    write_report(self, batch, total_segments, total_tokens, total_blocks, num_direct,
                                <int64_t*>arena.wide.data, <int32_t*>arena.narrow.data,
                                <unsigned char*>arena.flags.data)
            else:
                write_report(self, batch, total_segments, total_tokens, total_blocks, num_direct,
                            <int64_t*>arena.wide.data, <int32_t*>arena.narrow.data,
                            <unsigned char*>arena.flags.data)
            # the report takes its arrays before the guard drops: from then on the arena
            # sees them referenced and writes the next report elsewhere (a build let in
            # earlier, by Python code run here, would write into them)
            arena.fill(columns, num_context, batch, total_segments, total_tokens, total_blocks)
        finally:
            self._release_held()
            self.busy = False
        return columns

    def record_matched_tokens(self, request_id, num_tokens):
        cdef int64_t key = _tokens.as_integer(request_id, "request_id")
        cdef Py_ssize_t count = _tokens.as_integer(num_tokens, "num_tokens")
        cdef Py_ssize_t number
        if count < 0:
            _report_checks.negative_matched(count)
        if self.busy:
            _report_checks.busy()
        number = slot_table_find(&self.table, key)
        if number == NO_ENTRY:
            number = slot_table_insert(&self.table, key)
        self.table.slots[number].matched = count

    def reset_request(self, request_id):
        cdef int64_t key = _tokens.as_integer(request_id, "request_id")
        cdef Py_ssize_t number
        if self.busy:
            _report_checks.busy()
        number = slot_table_find(&self.table, key)
        if number != NO_ENTRY:
            self.table.slots[number].reported = False

    def request_finished(self, request_id):
        cdef int64_t key = _tokens.as_integer(request_id, "request_id")
        if self.busy:
            _report_checks.busy()
        slot_table_remove(&self.table, key)

    @property
    def num_tracked_requests(self):
        return self.table.num_live

    @property
    def num_output_allocations(self):
        """Output arrays allocated so far (reports reuse them when nobody holds them)."""
        return self.arena.num_allocations

    @property
    def _fast_plan(self):
        """Whether the common rows take the fast plan (the default); for tests, which
        compare it with the general plan that every other row takes."""
        return self.fast_plan

    @_fast_plan.setter
    def _fast_plan(self, value):
        self.fast_plan = bool(value)

    @property
    def _num_fast_rows(self):
        """Rows the fast plan has planned so far (for tests)."""
        return self.num_fast_rows

    def tracked_request_ids(self):
        cdef Py_ssize_t number
        ids = []
        for number in range(self.table.num_slots_used):  # (a loop: no list comprehension in the core, _core.pyx)
            if is_live(&self.table.slots[number]):
                ids.append(self.table.slots[number].request_id)
        ids.sort()
        return ids
