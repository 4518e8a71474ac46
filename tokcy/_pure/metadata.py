"""Attention metadata in plain Python/numpy: the readable twin of ``tokcy/_core_metadata.pxi``
(same algorithm, same errors from ``tokcy._prepare_checks``); docs/attention.md has the rules.

For every sequence of the batch and every layer group g with block size bs, the rows at
positions ``pos0 .. pos0 + seq_len - 1`` write their K/V to slot
``table[pos // bs] * bs + pos % bs``; the sequence's KV covers positions ``0 .. kv_len - 1``
with ``kv_len = pos0 + seq_len``, i.e. blocks ``0 .. ceil(kv_len / bs) - 1``: all of them in
the dense table (released ones read -1), the live ones in the CSR table.

Validation is O(1) per sequence and group (the rows cover a run of blocks); the write is
O(rows) for the slots plus O(blocks held) for the host tables. The device block table
costs O(changed entries): see ``plan_deltas``.
"""

import itertools

import numpy as np

from tokcy import _invariants
from tokcy import _prepare_checks as _checks

INT32_MAX = 2**31 - 1
_stamps = itertools.count(1)  # stamps handed out to device-table rows (process-wide)


def delta_start(num_tokens):
    """Where the changed entries start in the delta area (int32 words, the used input ids
    first): the first even word after the ids, so their int64 indices are aligned; their
    int32 values follow them, ``3 * entries`` words in all."""
    return num_tokens + (num_tokens & 1)


def delta_end(num_tokens, num_entries):
    """The delta area's words used: the ids, then the entries from ``delta_start`` (no
    padding word when no entry changed)."""
    return delta_start(num_tokens) + 3 * num_entries if num_entries else num_tokens


class _GroupPlan:
    """One sequence's table in one group, as planned (the storage and counts at plan time)
    and, for a device table, the entries of its row that changed."""

    __slots__ = ("buffer", "blocks", "num_blocks", "num_released", "row", "released_begin", "released_end",
                 "ids_begin", "zero_end")
    # set by the device-table planning, when there is one
    row: int
    released_begin: int
    released_end: int
    ids_begin: int
    zero_end: int

    def __init__(self, buffer, num_released):
        self.buffer = buffer
        self.blocks = buffer.storage
        self.num_blocks = buffer.size
        self.num_released = num_released


class DeviceTableRows:
    """What a device block table holds, per row (``num_groups * max_slots`` rows of
    ``width`` entries): the stamp of the table last sent into it, the entries sent and the
    leading entries sent as -1. Shared by the staging buffers of one ``InputPreparer``."""

    __reduce__ = _invariants.refuse_pickling  # as the compiled twin (a copy would describe no device table)

    def __init__(self, max_slots, num_groups, width):
        rows = max_slots * num_groups
        if max_slots < 1 or num_groups < 1 or width < 1:
            raise ValueError(f"max_slots, layer groups and max_blocks_per_seq must be >= 1, "
                             f"got {max_slots}, {num_groups}, {width}")
        if rows * width > INT32_MAX:
            raise ValueError(f"the device block table of {rows} x {width} entries is too large: "
                             f"it may hold at most {INT32_MAX} entries")
        self.max_slots, self.num_groups, self.width = max_slots, num_groups, width
        self.row_stamps = [0] * rows
        self.row_lengths = [0] * rows
        self.row_released = [0] * rows

    def forget(self):
        """Forget what every row holds: the next step sends each scheduled table whole, and
        zeros past it to the row's end (after a step whose changed entries were staged but
        may not have reached the device: a row may hold any of its tables since)."""
        self.row_stamps[:] = [0] * len(self.row_stamps)
        self.row_lengths[:] = [self.width] * len(self.row_lengths)


class AttentionMetadata:
    """Outputs and per-step state of the attention metadata; ``InputWriter.set_metadata``
    attaches one, ``prepare(..., block_sizes)`` fills it. ``tokcy.executor`` is the face."""

    __reduce__ = _invariants.refuse_pickling  # as the compiled twin (a copy would be a second writer of its arrays)

    def __init__(self):
        self._arrays = None
        self.busy = False  # a writer's call uses it (its busy guard): bind() refused meanwhile
        self._block_sizes = None
        self.has_device_table = False
        self.num_changed_entries = 0
        self.max_query_len = 0
        self.max_kv_len = 0
        self.longest_table = 0
        self.total_live = []  # per group, the kv_indices length of the last call (results())
        self.plan_serial = 0  # bumped by every begin() and release(): see InputWriter.write
        self._planned = []
        self._changed = []  # the plans whose rows need entries (plan_deltas)

    def bind(self, max_blocks_per_seq, kv_lens, cu_kv_seqlens, slot_mapping, kv_indptr, kv_last_page_len,
             block_table=None, kv_indices=None):
        """Write into these arrays (see the compiled twin's docstring)."""
        if self.busy:
            _checks.metadata_busy()
        self.busy = True  # for the whole call, as the compiled twin (its checks may run Python code)
        retired = dict(vars(self))  # what was bound is released after the guard, as the compiled twin
        try:
            self._bind(max_blocks_per_seq, kv_lens, cu_kv_seqlens, slot_mapping, kv_indptr, kv_last_page_len,
                       block_table, kv_indices)
        finally:
            self.busy = False
        del retired  # released here, after the guard

    def _bind(self, max_blocks_per_seq, kv_lens, cu_kv_seqlens, slot_mapping, kv_indptr, kv_last_page_len,
              block_table, kv_indices):
        # the groups' sequences as tuples first (what the checks count is what is bound), then
        # every argument checked, in one order for both backends, before anything changes
        slot_mapping, kv_indptr, kv_last_page_len = tuple(slot_mapping), tuple(kv_indptr), tuple(kv_last_page_len)
        block_table = None if block_table is None else tuple(block_table)
        kv_indices = None if kv_indices is None else tuple(kv_indices)
        max_blocks_per_seq = _checks.check_metadata_arrays(max_blocks_per_seq, kv_lens, cu_kv_seqlens, slot_mapping,
                                                           kv_indptr, kv_last_page_len, block_table, kv_indices)
        count = len(slot_mapping)
        # none can be resized while bound, and what owns their memory is recorded for every write to check (as
        # the compiled twin): from the caller's arrays, before anything changes (they may refuse an array)
        guards, watched, taken = _invariants.bound_memory(*_checks.named_arrays(
            kv_lens=kv_lens, cu_kv_seqlens=cu_kv_seqlens, slot_mapping=slot_mapping, kv_indptr=kv_indptr,
            kv_last_page_len=kv_last_page_len, block_table=block_table, kv_indices=kv_indices))
        plain = _checks.plain_array  # written through plain views: their lengths are numpy's, whatever a subclass says
        kv_lens, cu_kv_seqlens = plain(kv_lens), plain(cu_kv_seqlens)
        slot_mapping, kv_indptr = [plain(a) for a in slot_mapping], [plain(a) for a in kv_indptr]
        kv_last_page_len = [plain(a) for a in kv_last_page_len]
        if block_table is not None:
            block_table, kv_indices = [plain(a) for a in block_table], [plain(a) for a in kv_indices]
        # each over the memory the guards keep (as the compiled twin), in named_arrays' order
        _invariants.check_taken(taken, (kv_lens, cu_kv_seqlens, *slot_mapping, *kv_indptr, *kv_last_page_len,
                                        *(block_table or ()), *(kv_indices or ())))
        self.release()
        self.has_device_table = False  # the device table is bound to the old arrays: bind it again
        self._device_guards = self._device_watched = ()
        self._guards = guards
        self._watched = watched
        self.width = max_blocks_per_seq
        self.kv_lens, self.cu_kv_seqlens = kv_lens, cu_kv_seqlens
        self.slot_mapping, self.kv_indptr = tuple(slot_mapping), tuple(kv_indptr)
        self.kv_last_page_len = tuple(kv_last_page_len)
        self.block_table = None if block_table is None else tuple(block_table)
        self.kv_indices = None if kv_indices is None else tuple(kv_indices)
        self.cap_tokens = min(len(array) for array in slot_mapping)
        self.cap_seqs = min([len(kv_lens), len(cu_kv_seqlens) - 1] + [len(a) - 1 for a in kv_indptr]
                            + [len(a) for a in kv_last_page_len] + [len(a) for a in block_table or ()])
        self.cap_indices = [-1] * count if kv_indices is None else [len(a) for a in kv_indices]
        self.num_bound_groups = count
        self._arrays = True
        self._block_sizes = None

    def bind_device_table(self, rows, table_slots, delta_area, gather_blocks, gather_live, gather_base):
        """Keep the device block table whose rows ``rows`` describes (see the compiled twin)."""
        if self.busy:
            _checks.metadata_busy()
        self.busy = True  # for the whole call, as bind()
        retired = dict(vars(self))  # (as bind())
        try:
            self._bind_device_table(rows, table_slots, delta_area, gather_blocks, gather_live, gather_base)
        finally:
            self.busy = False
        del retired  # released here, after the guard

    def _bind_device_table(self, rows, table_slots, delta_area, gather_blocks, gather_live, gather_base):
        if self._arrays is None:
            raise RuntimeError("bind() the metadata arrays first")
        if not isinstance(rows, DeviceTableRows):
            raise TypeError(f"Argument 'rows' has incorrect type (expected tokcy._pure.metadata.DeviceTableRows, "
                            f"got {type(rows).__name__})")
        if rows.num_groups != self.num_bound_groups or rows.width != self.width:
            raise ValueError(f"the device table has {rows.num_groups} groups of {rows.width} columns, "
                             f"the outputs {self.num_bound_groups} of {self.width}")
        count = self.num_bound_groups
        gathers = (tuple(gather_blocks), tuple(gather_live), tuple(gather_base))  # counted as bound (see bind())
        if len(gathers[0]) != count or len(gathers[1]) != count or len(gathers[2]) != count:
            raise ValueError("one gather_blocks, gather_live and gather_base per layer group")
        _checks.check_device_table_arrays(table_slots, delta_area, gathers)  # as the compiled twin, in its order
        guards, watched, taken = _invariants.bound_memory(*_checks.named_arrays(  # as bind()
            table_slots=table_slots, delta_area=delta_area, gather_blocks=gathers[0], gather_live=gathers[1],
            gather_base=gathers[2]))
        plain = _checks.plain_array  # as bind()
        table_slots, delta_area = plain(table_slots), plain(delta_area)
        gathers = tuple(tuple(plain(array) for array in arrays) for arrays in gathers)
        _invariants.check_taken(taken, (table_slots, delta_area, *gathers[0], *gathers[1], *gathers[2]))
        self.release()
        self._device_guards = guards
        self._device_watched = watched
        self.rows = rows
        max_slots = rows.max_slots
        self.table_slots = table_slots
        self.gather_blocks, self.gather_live, self.gather_base = gathers
        self.cap_seqs = min([self.cap_seqs, len(table_slots)] + [len(array) for arrays in gathers for array in arrays])
        self.delta_area = delta_area
        self.max_slots = max_slots
        self.has_device_table = True

    # ------------------------------------------------------------------ pass 1
    def configure(self, block_sizes):
        """Take the call's block sizes (a tuple of ints, checked once per new tuple)."""
        if block_sizes is self._block_sizes:
            return
        if self._arrays is None:
            _checks.metadata_not_bound()
        if type(block_sizes) is not tuple or len(block_sizes) < 1:
            _checks.bad_block_sizes(block_sizes)
        if len(block_sizes) > self.num_bound_groups:
            _checks.too_many_groups(len(block_sizes), self.num_bound_groups)
        for item in block_sizes:
            if type(item) is not int or not 1 <= item <= INT32_MAX:
                _checks.bad_block_sizes(block_sizes)
        self.block_sizes = block_sizes
        self.num_groups = len(block_sizes)
        self._block_sizes = block_sizes

    def begin(self, num_sequences):
        """Start planning a batch."""
        self.release()
        self.total_live = [0] * self.num_groups
        self.total_kv = 0
        self.longest_table = 0
        self._slot_users = {}

    def plan_sequence(self, request, pos0, seq_len):
        """Validate one sequence's rows [pos0, pos0 + seq_len) against its block tables;
        returns its plan (kept for the write, in emission order by the caller)."""
        tables = request._block_tables
        request_id = request._request_id
        kv_len = pos0 + seq_len
        if len(tables) != self.num_groups:
            _checks.group_count(request_id, len(tables), self.num_groups)
        for group, (table, block_size) in enumerate(zip(tables, self.block_sizes)):
            size = table._buffer.size
            if size > self.width:
                _checks.too_many_blocks(request_id, group, size, self.width)
            last = (kv_len - 1) // block_size
            if last >= size:
                _checks.missing_block(request_id, group, max(pos0, size * block_size), last, size)
            first = pos0 // block_size
            if first < table._num_released:
                _checks.released_block(request_id, group, pos0, first)
        slot = -1
        if self.has_device_table:
            slot = request._seq_slot
            if slot is None:
                _checks.no_table_slot(request_id)
            if slot >= self.max_slots:
                _checks.table_slot_out_of_range(request_id, slot, self.max_slots)
            if slot in self._slot_users:
                _checks.duplicate_table_slot(slot, self._slot_users[slot], request_id)
            self._slot_users[slot] = request_id
        if self.total_kv + kv_len > INT32_MAX:
            _checks.kv_too_long(self.total_kv + kv_len)
        self.total_kv += kv_len
        plans = []
        for group, (table, block_size) in enumerate(zip(tables, self.block_sizes)):
            plan = _GroupPlan(table._buffer, table._num_released)
            self.longest_table = max(self.longest_table, plan.num_blocks)
            num_blocks = -(-kv_len // block_size)
            self.total_live[group] += num_blocks - min(plan.num_released, num_blocks)
            plans.append(plan)
        entry = (slot, plans)
        self._planned.append(entry)
        return entry

    def release(self):
        self.plan_serial += 1
        self._planned = []
        self._changed = []

    def check_memory(self):
        """The writer's last check before it writes these outputs (as the compiled twin's)."""
        moved = _invariants.moved_array(self._watched) or (self.has_device_table
                                                           and _invariants.moved_array(self._device_watched))
        if moved:
            _checks.memory_moved(moved)

    def check_capacity(self, num_tokens, padded):
        if num_tokens > self.cap_tokens:
            _checks.over_capacity("slot_mapping rows", num_tokens, self.cap_tokens)
        if padded > self.cap_seqs:
            _checks.over_capacity("metadata sequences", padded, self.cap_seqs)
        for group in range(self.num_groups):
            if self.cap_indices[group] >= 0 and self.total_live[group] > self.cap_indices[group]:
                _checks.over_capacity(f"kv_indices of group {group}", self.total_live[group], self.cap_indices[group])

    # ------------------------------------------------------------------ device-table deltas
    def plan_deltas(self, num_tokens):
        """Per planned sequence and group, the entries of its device-table row that differ
        from the table; then consume the tables' marks (docs/change-tracking.md)."""
        total = 0
        plans = []
        for slot, group_plans in self._planned:
            for group, plan in enumerate(group_plans):
                buffer = plan.buffer
                plan.row = row = group * self.max_slots + slot
                sent = self.rows.row_lengths[row]
                if buffer.table_stamp != 0 and buffer.table_stamp == self.rows.row_stamps[row]:
                    # the row holds this table as of its last read: only the marked tail
                    # and newly released leading entries can differ
                    start = min(buffer.table_dirty_from, sent)
                    plan.released_begin = self.rows.row_released[row]
                    plan.released_end = max(min(plan.num_released, start), plan.released_begin)
                else:  # another table (or none) is in the row: send it whole
                    start = 0
                    plan.released_begin = plan.released_end = 0
                plan.ids_begin = min(start, plan.num_blocks)
                plan.zero_end = max(sent, plan.num_blocks)
                count = (plan.released_end - plan.released_begin) + (plan.zero_end - plan.ids_begin)
                if count:  # a table that sends nothing is in its row already, its mark at its size
                    total += count
                    plans.append(plan)
        if delta_end(num_tokens, total) > len(self.delta_area):
            _checks.over_capacity("changed block-table entries", total,
                                  max(0, len(self.delta_area) - delta_start(num_tokens)) // 3)
        self._changed = plans
        # the new stamps first: the commit below allocates nothing, so it cannot stop half done
        commits = [(plan, next(_stamps)) for plan in plans]
        for plan, stamp in commits:  # commit, for the tables that send entries: new stamps, the rows' state, the marks consumed
            plan.buffer.table_stamp = stamp
            plan.buffer.table_dirty_from = plan.num_blocks
            self.rows.row_stamps[plan.row] = stamp
            self.rows.row_lengths[plan.row] = plan.num_blocks
            self.rows.row_released[plan.row] = plan.num_released
        self.num_changed_entries = total

    def results(self):
        """(max_query_len, max_kv_len, changed entries, kv_indices length per group) of the last call."""
        return (self.max_query_len, self.max_kv_len, self.num_changed_entries, tuple(self.total_live))

    # ------------------------------------------------------------------ pass 2
    def write(self, sequences, num_tokens, padded):
        """``sequences``: (metadata entry, pos0, seq_len, first row) in emission order; the
        rows past them up to ``padded`` sequences are padding."""
        count = len(sequences)
        pos0 = np.array([item[1] for item in sequences], dtype=np.int64)
        kv_lens = pos0 + np.array([item[2] for item in sequences], dtype=np.int64)
        self.kv_lens[:count] = kv_lens
        self.kv_lens[count:padded] = 0
        self.cu_kv_seqlens[0] = 0
        np.cumsum(self.kv_lens[:padded], out=self.cu_kv_seqlens[1 : padded + 1])
        self.max_query_len = max([item[2] for item in sequences] + [1] * (padded > count) + [0])
        self.max_kv_len = int(kv_lens.max()) if count else 0
        if self.has_device_table:
            self.table_slots[:count] = [entry[0] for entry, _, _, _ in sequences]
            self.table_slots[count:padded] = 0
            # where each sequence's row starts in its group's device table, flat: its slot's row
            row_starts = self.table_slots[:padded].astype(np.int64) * self.width
        for group, block_size in enumerate(self.block_sizes):
            slots = self.slot_mapping[group]
            indptr = self.kv_indptr[group]
            indptr[0] = 0
            for seq, ((_, plans), start, seq_len, row) in enumerate(sequences):
                plan = plans[group]
                positions = np.arange(start, start + seq_len, dtype=np.int64)
                blocks = plan.blocks[positions // block_size].astype(np.int64)
                slots[row : row + seq_len] = blocks * block_size + positions % block_size
                kv_len = start + seq_len
                num_blocks = -(-kv_len // block_size)
                first_live = min(plan.num_released, num_blocks)
                offset = int(indptr[seq])
                indptr[seq + 1] = offset + num_blocks - first_live
                self.kv_last_page_len[group][seq] = kv_len - (num_blocks - 1) * block_size
                if self.block_table is not None:
                    dense = self.block_table[group][seq]
                    dense[:num_blocks] = plan.blocks[:num_blocks]
                    dense[num_blocks:] = 0
                    live = plan.blocks[first_live:num_blocks]
                    self.kv_indices[group][offset : offset + len(live)] = live
            # padding: one row each, no KV written, no blocks
            slots[num_tokens - (padded - count) : num_tokens] = -1
            indptr[count + 1 : padded + 1] = indptr[count]
            self.kv_last_page_len[group][count:padded] = 0
            if self.block_table is not None:
                self.block_table[group][count:padded] = 0
            if self.has_device_table:  # what the device gather reads, per sequence (padding: no blocks)
                ends = indptr[1 : padded + 1]
                num_blocks = self.gather_blocks[group][:padded]
                num_blocks[:] = -(-self.kv_lens[:padded] // block_size)
                self.gather_live[group][:padded] = np.diff(indptr[: padded + 1])
                self.gather_base[group][:padded] = row_starts + num_blocks - ends
        if self.has_device_table:
            self._write_deltas(num_tokens)

    def _write_deltas(self, num_tokens):
        """The changed entries, after the used input ids: their flat indices into the
        (groups, max_slots, max_blocks_per_seq) table as int64 (what the device scatter
        indexes with, unconverted), then their int32 values (``delta_start``)."""
        total = self.num_changed_entries
        start = delta_start(num_tokens)
        indices = self.delta_area[start : start + 2 * total].view(np.int64)
        values = self.delta_area[start + 2 * total : start + 3 * total]
        count = 0
        for plan in self._changed:
            row_start = plan.row * self.width
            for begin, end, source in ((plan.released_begin, plan.released_end, -1),
                                       (plan.ids_begin, plan.num_blocks, plan.blocks),
                                       (plan.num_blocks, plan.zero_end, 0)):
                if end > begin:
                    indices[count : count + end - begin] = np.arange(row_start + begin, row_start + end)
                    values[count : count + end - begin] = source if type(source) is int else source[begin:end]
                    count += end - begin
