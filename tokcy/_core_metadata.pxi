# Attention metadata (compiled), written by InputWriter in the same pass as the token
# inputs when the call gives block sizes: per layer group the slot mapping, the dense
# and CSR block tables, and the device block table's deltas; per sequence the KV lengths.
# tokcy/_pure/metadata.py is the readable twin (same algorithm, same errors, from
# tokcy/_prepare_checks); docs/attention.md states the semantics.
#
# Pass 1 (plan, with the GIL): plan_sequence() validates each sequence's blocks (O(1) per
# sequence and group: the rows of a sequence cover a run of blocks) and records one
# GroupSpec per sequence and group, holding the table's storage and buffer when the
# writer's pass 2 may follow Python code or release the GIL (owns_refs; take_refs()).
# plan_decode_run() is the same plan for runs of the common decode sequence (one row, an
# exact BlockTable per layer group), group 0's totals in locals (group 1's too, with two
# groups); where a run stops, plan_sequence() plans that sequence (or raises its error).
# Device table: each planned sequence compares its table's device-table stamp with the
# stamp its row got at the last step and takes the range that changed (plan_row_delta);
# commit_deltas() (with the GIL, just before pass 2, once nothing can fail) consumes the
# tables' marks (docs/change-tracking.md). No Python code runs between the plan and the
# commit: InputWriter keeps a device table only in prepare(), never in plan() + write().
# Pass 2 (write, without the GIL) is in _core_metadata_write.pxi: write_sequence() and
# write_padding() fill the arrays (the plain decode rows: write_plain_metadata()),
# write_deltas() the changed entries after the used input ids (delta_start(), delta_end()).
#
# The pieces of the plan (GroupSpec, the device table's rows, one row's delta) are in
# _core_metadata_plan.pxi, included just before this file; binding the outputs (bind(),
# bind_device_table()) in _core_metadata_bind.pxi, included just after it.


@cython.final
cdef class AttentionMetadata:
    """Outputs and per-step state of the attention metadata; ``InputWriter.set_metadata``
    attaches one, ``prepare(..., block_sizes)`` fills it. ``tokcy.executor`` is the face."""

    cdef Py_ssize_t width, num_bound_groups, num_groups
    cdef int64_t block_size[MAX_LAYER_GROUPS]
    cdef int block_shift[MAX_LAYER_GROUPS]   # log2(block_size), or -1 if it is not a power of two
    cdef object _block_sizes           # the tuple last configured (identity fast path)
    cdef tuple _arrays                 # every bound array, owned
    cdef BoundMemory _bound_memory     # their memory as bound, which every write of them checks first
    cdef tuple _device_arrays          # bind_device_table's arrays, owned while it is bound
    cdef BoundMemory _device_memory    # their memory, likewise
    cdef int32_t* kv_lens
    cdef int32_t* cu_kv_seqlens
    cdef int64_t* slot_mapping[MAX_LAYER_GROUPS]
    cdef int32_t* kv_indptr[MAX_LAYER_GROUPS]
    cdef int32_t* kv_last_page_len[MAX_LAYER_GROUPS]
    cdef int32_t* block_table[MAX_LAYER_GROUPS]   # NULL: the device gathers it
    cdef int32_t* kv_indices[MAX_LAYER_GROUPS]    # NULL likewise
    cdef Py_ssize_t cap_tokens, cap_seqs
    cdef Py_ssize_t cap_indices[MAX_LAYER_GROUPS]
    # the planned batch
    cdef GroupSpec* groups             # num_groups per planned sequence, in plan order
    cdef Py_ssize_t group_capacity, num_planned
    cdef bint owns_refs                # the GroupSpecs hold their buffers and storages
    cdef Py_ssize_t total_live[MAX_LAYER_GROUPS]
    cdef int64_t total_kv
    cdef readonly int64_t plan_serial
    """Bumped by every begin() and release(): a writer checks at write() that the plan is still its own."""
    cdef readonly Py_ssize_t longest_table
    """The longest block table of the planned batch (its dense table's width, without out=)."""
    # the device block table (bind_device_table)
    cdef readonly bint has_device_table
    cdef DeviceTableRows rows
    cdef Py_ssize_t max_slots
    cdef int32_t* table_slots          # per sequence: the row it reads (0 for padding)
    cdef int32_t* delta_area           # the staging tail from input_ids (8-byte aligned): deltas go after the used ids
    cdef Py_ssize_t delta_capacity
    # per sequence and group, what the device gather reads: the blocks holding the KV, the
    # live ones (the CSR row's length) and where its CSR run starts in the group's flat
    # device table (its slot's row)
    cdef int32_t* gather_blocks[MAX_LAYER_GROUPS]
    cdef int64_t* gather_live[MAX_LAYER_GROUPS]
    cdef int64_t* gather_base[MAX_LAYER_GROUPS]
    cdef int32_t* sequence_slots       # per planned sequence: its seq_slot
    cdef Py_ssize_t planned_changes    # entries the planned sequences' rows need (plan_row_delta)
    cdef int32_t* changed_specs        # the GroupSpecs (indices into groups) whose rows need entries
    cdef Py_ssize_t num_changed_specs
    cdef readonly Py_ssize_t num_changed_entries
    """Entries of the device block table the last call sent (each an index and a value)."""
    cdef readonly int32_t max_query_len
    cdef readonly int32_t max_kv_len
    cdef public bint busy
    """True while a writer's call uses it (the writer's busy guard): bind() and another
    writer's call are refused (RuntimeError) meanwhile."""

    def __dealloc__(self):
        self.release()
        free(self.groups)
        free(self.sequence_slots)
        free(self.changed_specs)

    def bind(self, max_blocks_per_seq, kv_lens, cu_kv_seqlens, slot_mapping, kv_indptr, kv_last_page_len,
             block_table=None, kv_indices=None):
        """Write into these arrays: per sequence ``kv_lens``, ``cu_kv_seqlens``; per group (a
        tuple each) ``slot_mapping`` (int64), ``kv_indptr``, ``kv_last_page_len`` and, unless
        None (a device gathers them), ``block_table`` (2-D, max_blocks_per_seq columns) and
        ``kv_indices``. Every array C-contiguous and writable."""
        bind_outputs(self, max_blocks_per_seq, kv_lens, cu_kv_seqlens, slot_mapping, kv_indptr, kv_last_page_len,
                     block_table, kv_indices)

    def bind_device_table(self, rows, table_slots, delta_area, gather_blocks, gather_live, gather_base):
        """Keep the device block table whose rows ``rows`` describes: per sequence write the
        row it reads into ``table_slots``, the changed entries into ``delta_area``, and per
        group (a sequence of arrays each) what the device gather reads: ``gather_blocks``
        (the blocks holding its KV), ``gather_live`` (int64: its live blocks) and ``gather_base``
        (int64: where its slot's row starts in the group's flat device table, plus its
        blocks, minus its CSR end: CSR entry ``k`` of the sequence is table entry base + k).
        ``delta_area`` must be 8-byte aligned: the changed entries' indices are int64."""
        bind_device_outputs(self, rows, table_slots, delta_area, gather_blocks, gather_live, gather_base)

    # ------------------------------------------------------------------ pass 1
    cdef int configure(self, object block_sizes) except -1:
        """Take the call's block sizes (a tuple of ints, checked once per new tuple). Every
        size is checked before any is taken: a plan of another writer sharing this metadata
        may be waiting for its write, which reads the sizes (a refused tuple changes none)."""
        cdef Py_ssize_t group
        cdef int64_t size
        if block_sizes is self._block_sizes:
            return 0
        if self._arrays is None:
            _checks.metadata_not_bound()
        if type(block_sizes) is not tuple or len(block_sizes) < 1:
            _checks.bad_block_sizes(block_sizes)
        if len(block_sizes) > self.num_bound_groups:
            _checks.too_many_groups(len(block_sizes), self.num_bound_groups)
        for item in block_sizes:
            if type(item) is not int or not 1 <= item <= INT32_MAX:
                _checks.bad_block_sizes(block_sizes)
        for group in range(len(block_sizes)):
            size = block_sizes[group]
            self.block_size[group] = size
            self.block_shift[group] = -1
            if size & (size - 1) == 0:
                self.block_shift[group] = 0
                while (<int64_t>1) << self.block_shift[group] != size:
                    self.block_shift[group] += 1
        self.num_groups = len(block_sizes)
        self._block_sizes = block_sizes
        return 0

    cdef int begin(self, Py_ssize_t num_sequences, bint own) except -1:
        """Start planning a batch of at most ``num_sequences`` sequences; ``own``: hold the
        tables' buffers and storages (as the writer's own=True plan)."""
        cdef Py_ssize_t needed = num_sequences * self.num_groups
        cdef GroupSpec* grown
        cdef int32_t* slots
        cdef Py_ssize_t group
        self.release()
        if needed > self.group_capacity:
            needed = max(needed, 2 * self.group_capacity, 64)
            grown = <GroupSpec*>realloc(self.groups, needed * sizeof(GroupSpec))
            if grown == NULL:
                raise MemoryError()
            self.groups = grown
            slots = <int32_t*>realloc(self.sequence_slots, needed * sizeof(int32_t))
            if slots == NULL:
                raise MemoryError()
            self.sequence_slots = slots
            slots = <int32_t*>realloc(self.changed_specs, needed * sizeof(int32_t))
            if slots == NULL:
                raise MemoryError()
            self.changed_specs = slots
            self.group_capacity = needed
        for group in range(self.num_groups):
            self.total_live[group] = 0
        self.total_kv = 0
        self.longest_table = 0
        self.planned_changes = 0
        self.num_changed_specs = 0
        self.owns_refs = own
        if self.has_device_table:
            self.rows.plan_stamp += 1
        return 0

    cdef int plan_sequence(self, Request request, Py_ssize_t pos0, Py_ssize_t seq_len) except -1:
        """Validate one sequence's rows [pos0, pos0 + seq_len) against its block tables and
        record them; the planned sequences must follow the writer's specs one for one."""
        cdef tuple tables = request._block_tables
        # borrowed (no reference counts written): the writer holds the batch, the request
        # its tables tuple, the tuple its tables; no Python code runs during the plan
        cdef PyObject* table
        cdef PyObject* buffer
        cdef GroupSpec* specs = &self.groups[self.num_planned * self.num_groups]
        cdef Py_ssize_t group, size, released, first, last
        cdef Py_ssize_t kv_len = pos0 + seq_len   # >= 1: every sequence has a row
        cdef int64_t block_size, slot = 0
        cdef DeviceTableRows rows = self.rows
        if len(tables) != self.num_groups:
            _checks.group_count(request._request_id, len(tables), self.num_groups)
        for group in range(self.num_groups):
            table = PyTuple_GET_ITEM(tables, group)
            if <void*>table.ob_type != <void*>BlockTable:
                as_block_table(<object>table)  # TypeError unless a BlockTable subclass
            buffer = <PyObject*>(<BlockTable>table)._buffer
            size = (<Int32Buffer>buffer).size
            released = (<Int32Buffer>buffer).num_released
            block_size = self.block_size[group]
            if size > self.width:
                _checks.too_many_blocks(request._request_id, group, size, self.width)
            first = block_of(pos0, block_size, self.block_shift[group])
            last = block_of(kv_len - 1, block_size, self.block_shift[group])
            if last >= size:
                _checks.missing_block(request._request_id, group, max(pos0, size * block_size), last, size)
            if first < released:
                _checks.released_block(request._request_id, group, pos0, first)
            set_group_spec(&specs[group], buffer, size, released)
        if self.has_device_table:
            slot = request._seq_slot
            if slot == NO_SLOT:
                _checks.no_table_slot(request._request_id)
            if slot >= self.max_slots:
                _checks.table_slot_out_of_range(request._request_id, slot, self.max_slots)
            if rows.slot_seen[slot] == rows.plan_stamp:
                _checks.duplicate_table_slot(slot, rows.slot_request[slot], request._request_id)
            rows.slot_seen[slot] = rows.plan_stamp
            rows.slot_request[slot] = request._request_id
            self.sequence_slots[self.num_planned] = <int32_t>slot
        if self.total_kv + kv_len > INT32_MAX:
            _checks.kv_too_long(self.total_kv + kv_len)
        self.total_kv += kv_len
        # valid: count it (and own what pass 2 reads, when this plan owns)
        for group in range(self.num_groups):
            last = block_of(kv_len - 1, self.block_size[group], self.block_shift[group])  # blocks: last + 1
            self.planned_changes += self.count_group(&specs[group], group, last, slot)
        self.num_planned += 1
        return 0

    cdef Py_ssize_t count_group(self, GroupSpec* spec, Py_ssize_t group, Py_ssize_t last_block,
                                int64_t slot) noexcept:
        """A valid sequence's ``spec`` of ``group`` (its blocks 0..``last_block`` hold its KV)
        counted: owned when the plan owns, the totals, and its row's device-table delta
        (record_delta(): the entries returned)."""
        if self.owns_refs:
            Py_INCREF(<object>spec.storage_owner)
            Py_INCREF(<object>spec.buffer_owner)
        if spec.num_blocks > self.longest_table:
            self.longest_table = spec.num_blocks
        self.total_live[group] += last_block + 1 - min(spec.num_released, last_block + 1)
        return self.record_delta(spec, group, slot) if self.has_device_table else 0

    cdef inline Py_ssize_t record_delta(self, GroupSpec* spec, Py_ssize_t group, int64_t slot) noexcept:
        """The entries of ``group``'s row of ``slot`` that differ from ``spec``'s table
        (plan_row_delta()); a spec that sends some is recorded, in plan order (commit and
        write follow it: group by group within a sequence)."""
        cdef Py_ssize_t count = plan_row_delta(spec, spec.buffer_owner, self.rows.row_stamps, self.rows.row_lengths,
                                               self.rows.row_released, group * self.max_slots + slot)
        if count:
            self.changed_specs[self.num_changed_specs] = <int32_t>(spec - self.groups)
            self.num_changed_specs += 1
        return count

    cdef int plan_decode_rows(self, PyObject** items, Py_ssize_t begin, Py_ssize_t end) except -1:
        """The sequences of InputWriter's plain decode rows ``items[begin:end]`` (exact
        Requests it checked, one row each at its newest token), in order: runs of the
        common sequence by plan_decode_run(), every other one by plan_sequence() (which
        plans it or raises its error)."""
        cdef Py_ssize_t index = begin
        cdef PyObject* item
        while index < end:
            index = self.plan_decode_run(items, index, end)
            if index < end:
                item = items[index]
                self.plan_sequence(<Request>item, (<Request>item)._beam0.size - 1, 1)
                index += 1
        return 0

    cdef Py_ssize_t plan_decode_run(self, PyObject** items, Py_ssize_t index, Py_ssize_t end) noexcept:
        """plan_sequence(request, n - 1, 1) for each request of ``items[index:end]`` while it
        is the common decode sequence (as many layer groups as the call, each an exact
        BlockTable whose blocks cover the row, a free device-table slot); returns the index
        of the first that is not, for which nothing is recorded. Group 0's running totals stay
        in locals (with two groups, group 1's too); the requests and their tables are
        borrowed (the writer holds the batch, each request its tables tuple, and nothing here
        runs Python code). Group 0 is planned inline (its ids are the request's _blocks0), and
        so is group 1 of a two-group call (_blocks1); more groups are planned by
        plan_decode_groups()."""
        cdef PyObject* request
        cdef PyObject* buffer
        cdef PyObject* buffer1
        cdef Py_ssize_t num_groups = self.num_groups
        cdef GroupSpec* spec = &self.groups[self.num_planned * num_groups]
        cdef int32_t* sequence_slots = self.sequence_slots + self.num_planned
        cdef Py_ssize_t first = index, pos, size, released, block, count, size1, released1, block1
        cdef Py_ssize_t width = self.width, max_slots = self.max_slots, changes = self.planned_changes
        cdef Py_ssize_t longest = self.longest_table, total_live = self.total_live[0]
        cdef Py_ssize_t total_live1 = self.total_live[1] if num_groups == 2 else 0
        cdef int64_t total_kv = self.total_kv, block_size = self.block_size[0], slot = 0, plan_stamp = 0
        cdef int64_t block_size1 = self.block_size[1] if num_groups == 2 else 1
        cdef int shift = self.block_shift[0], shift1 = self.block_shift[1] if num_groups == 2 else 0
        cdef bint device = self.has_device_table, owns = self.owns_refs
        cdef int64_t* slot_seen = NULL
        cdef int64_t* slot_request = NULL
        cdef const int64_t* row_stamps = NULL
        cdef const Py_ssize_t* row_lengths = NULL
        cdef const Py_ssize_t* row_released = NULL
        if device:
            slot_seen = self.rows.slot_seen
            slot_request = self.rows.slot_request
            plan_stamp = self.rows.plan_stamp
            row_stamps, row_lengths, row_released = self.rows.row_stamps, self.rows.row_lengths, self.rows.row_released
        while index < end:
            request = items[index]
            if (<Request>request)._num_groups != num_groups:
                break
            buffer = <PyObject*>(<Request>request)._blocks0  # group 0's ids (None: not a plain BlockTable)
            if <void*>buffer.ob_type != <void*>Int32Buffer:
                break
            size = (<Int32Buffer>buffer).size
            released = (<Int32Buffer>buffer).num_released
            pos = (<Request>request)._beam0.size - 1
            block = block_of(pos, block_size, shift)
            if not covers_row(size, released, block, width) or total_kv + pos + 1 > INT32_MAX:
                break
            if device:
                slot = (<Request>request)._seq_slot
                if slot < 0 or slot >= max_slots or slot_seen[slot] == plan_stamp:
                    break
            set_group_spec(spec, buffer, size, released)
            if num_groups == 2:  # (a hybrid model's usual two) group 1 as group 0, from _blocks1
                buffer1 = <PyObject*>(<Request>request)._blocks1
                if <void*>buffer1.ob_type != <void*>Int32Buffer:
                    break
                size1 = (<Int32Buffer>buffer1).size
                released1 = (<Int32Buffer>buffer1).num_released
                block1 = block_of(pos, block_size1, shift1)
                if not covers_row(size1, released1, block1, width):
                    break
                set_group_spec(spec + 1, buffer1, size1, released1)  # nothing fails after this
                if device:  # group 0's delta first (as plan_sequence() orders them)
                    if not row_holds(buffer, size, released, row_stamps, row_lengths, row_released, slot):
                        changes += self.record_delta(spec, 0, slot)
                    if not row_holds(buffer1, size1, released1, row_stamps, row_lengths, row_released,
                                     max_slots + slot):
                        changes += self.record_delta(spec + 1, 1, slot)
                if owns:
                    Py_INCREF(<object>spec[1].storage_owner)
                    Py_INCREF(<object>buffer1)
                if size1 > longest:
                    longest = size1
                total_live1 += block1 + 1 - released1
            elif num_groups > 1:  # the other groups, and every group's delta (nothing fails after this)
                count = self.plan_decode_groups(<Request>request, pos, spec, slot)
                if count < 0:
                    break
                changes += count
            elif device and not row_holds(buffer, size, released, row_stamps, row_lengths, row_released, slot):
                changes += self.record_delta(spec, 0, slot)  # group 0's row of the slot sends entries
            if device:
                slot_seen[slot] = plan_stamp
                slot_request[slot] = (<Request>request)._request_id
                sequence_slots[index - first] = <int32_t>slot
            if owns:
                Py_INCREF(<object>spec.storage_owner)
                Py_INCREF(<object>buffer)
            if size > longest:
                longest = size
            total_live += block + 1 - released
            total_kv += pos + 1
            spec += num_groups
            index += 1
        self.num_planned += index - first
        self.total_kv = total_kv
        self.total_live[0] = total_live
        if num_groups == 2:
            self.total_live[1] = total_live1
        if longest > self.longest_table:  # (plan_decode_groups() keeps it too)
            self.longest_table = longest
        self.planned_changes = changes
        return index

    cdef Py_ssize_t plan_decode_groups(self, Request request, Py_ssize_t pos, GroupSpec* specs,
                                       int64_t slot) noexcept:
        """plan_decode_run()'s groups 1 and up of ``request``'s row at ``pos`` (in ``slot``;
        group 0's spec set): -1, recording nothing, unless each is an exact BlockTable whose
        blocks cover the row; else their specs set and counted, and every group's
        device-table delta recorded, group 0's first (as plan_sequence() orders them), the
        entries returned. Out of the run's loop, which keeps group 0's totals in registers."""
        cdef PyObject* table
        cdef PyObject* buffer
        cdef PyObject* tables = <PyObject*>request._block_tables  # borrowed, as the run's requests
        cdef Py_ssize_t group, size, released, block, changes = 0
        for group in range(1, self.num_groups):
            table = PyTuple_GET_ITEM(<object>tables, group)
            if <void*>table.ob_type != <void*>BlockTable:
                return -1
            buffer = <PyObject*>(<BlockTable>table)._buffer
            size = (<Int32Buffer>buffer).size
            released = (<Int32Buffer>buffer).num_released
            block = block_of(pos, self.block_size[group], self.block_shift[group])
            if not covers_row(size, released, block, self.width):
                return -1
            set_group_spec(&specs[group], buffer, size, released)
        if self.has_device_table:  # every group covers the row: counted (its own totals stay with the run)
            changes = self.record_delta(specs, 0, slot)
        for group in range(1, self.num_groups):
            changes += self.count_group(&specs[group], group, block_of(pos, self.block_size[group],
                                                                        self.block_shift[group]), slot)
        return changes

    cdef void release(self) noexcept:
        cdef Py_ssize_t index, count = self.num_planned * self.num_groups
        cdef bint owned = self.owns_refs, was_busy = self.busy
        self.plan_serial += 1
        # detached first, and busy while the references drop (as InputWriter._release)
        self.owns_refs = False
        self.num_planned = 0
        if owned:
            self.busy = True
            for index in range(count):
                Py_XDECREF(self.groups[index].storage_owner)
                Py_XDECREF(self.groups[index].buffer_owner)
            self.busy = was_busy

    cdef void take_refs(self) noexcept:
        """Own what a borrowing plan points into (InputWriter._take_refs: no Python code has
        run since the plan)."""
        cdef Py_ssize_t index
        if self.owns_refs:
            return
        for index in range(self.num_planned * self.num_groups):
            Py_XINCREF(self.groups[index].storage_owner)
            Py_XINCREF(self.groups[index].buffer_owner)
        self.owns_refs = True

    cdef Py_ssize_t write_work(self, Py_ssize_t padded) noexcept:
        """Entries pass 2 writes beyond the token rows (the writer's GIL decision)."""
        cdef Py_ssize_t group, work = padded
        for group in range(self.num_groups):
            work += padded
            if self.block_table[group] != NULL:
                work += padded * self.width + self.total_live[group]
        if self.has_device_table:
            work += self.num_changed_entries
        return work

    cdef int check_memory(self) except -1:
        """The writer's last check before it writes these outputs (BoundMemory.check()): every
        bound array still has the memory it had when bound."""
        if self._bound_memory is None or (self.has_device_table and self._device_memory is None):
            _checks.metadata_not_bound()  # (only while a collection clears this object)
        self._bound_memory.check()
        if self.has_device_table:
            self._device_memory.check()
        return 0

    cdef int check_capacity(self, Py_ssize_t num_tokens, Py_ssize_t padded) except -1:
        cdef Py_ssize_t group
        if num_tokens > self.cap_tokens:
            _checks.over_capacity("slot_mapping rows", num_tokens, self.cap_tokens)
        if padded > self.cap_seqs:
            _checks.over_capacity("metadata sequences", padded, self.cap_seqs)
        for group in range(self.num_groups):
            if self.cap_indices[group] >= 0 and self.total_live[group] > self.cap_indices[group]:
                _checks.over_capacity(f"kv_indices of group {group}", self.total_live[group], self.cap_indices[group])
        return 0

    # ------------------------------------------------------------------ device-table deltas
    cdef int commit_deltas(self, Py_ssize_t num_tokens) except -1:
        """With the GIL, right before pass 2: check that the changed entries planned with
        the sequences fit, then give each table that sends entries and its row a new stamp
        and consume the table's mark (nothing can fail after this). A table that sends
        nothing keeps its stamp and mark: its row already holds it, and its mark is at or
        past its size."""
        global last_table_stamp
        cdef GroupSpec* spec
        cdef PyObject* buffer
        cdef Py_ssize_t index, total = self.planned_changes
        cdef DeviceTableRows rows = self.rows
        if delta_end(num_tokens, total) > self.delta_capacity:
            _checks.over_capacity("changed block-table entries", total,
                                  max(0, self.delta_capacity - delta_start(num_tokens)) // 3)
        for index in range(self.num_changed_specs):
            spec = &self.groups[self.changed_specs[index]]
            buffer = spec.buffer_owner
            last_table_stamp += 1
            (<Int32Buffer>buffer).table_stamp = last_table_stamp
            (<Int32Buffer>buffer).table_dirty_from = spec.num_blocks
            rows.row_stamps[spec.row] = last_table_stamp
            rows.row_lengths[spec.row] = spec.num_blocks
            rows.row_released[spec.row] = spec.num_released
        self.num_changed_entries = total
        return 0

    def results(self):
        """(max_query_len, max_kv_len, changed entries, kv_indices length per group) of the last call."""
        cdef Py_ssize_t group
        if self.num_groups == 1:  # every step: the common case without a list
            live = (self.total_live[0],)
        else:
            values = []
            for group in range(self.num_groups):  # (a loop: no list comprehension in the core, _core.pyx)
                values.append(self.total_live[group])
            live = tuple(values)
        return (self.max_query_len, self.max_kv_len, self.num_changed_entries, live)
