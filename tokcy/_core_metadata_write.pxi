# Pass 2 of the attention metadata (compiled): what InputWriter's GIL-free write (fill_rows()
# in _core_rows.pxi) writes of the metadata planned in pass 1 (_core_metadata.pxi), in the
# same sweep as the token rows. write_sequence() and write_padding() write any sequence;
# write_plain_metadata() the plain decode rows, in a loop of their own; write_deltas() the
# changed device-table entries after the used input ids. Nothing here can fail: pass 1
# checked every index they use.

from libc.string cimport memcpy, memset


cdef void start_write(AttentionMetadata meta) noexcept nogil:
    cdef Py_ssize_t group
    meta.max_query_len = 0
    meta.max_kv_len = 0
    meta.cu_kv_seqlens[0] = 0
    for group in range(meta.num_groups):
        meta.kv_indptr[group][0] = 0


cdef void write_sequence(AttentionMetadata meta, Py_ssize_t index, Py_ssize_t pos0, Py_ssize_t seq_len, Py_ssize_t row,
                         Py_ssize_t seq) noexcept nogil:
    """Sequence ``seq`` (planned as ``index``), rows [row, row + seq_len) at positions pos0...:
    its slots, KV length and both block-table layouts, for every group."""
    cdef const GroupSpec* spec
    cdef Py_ssize_t group, j, block, offset, num_blocks, first_live, live, start
    cdef int64_t block_size, base
    cdef int64_t* slots
    cdef int32_t* dense
    cdef int32_t kv_len = <int32_t>(pos0 + seq_len)
    debug_assert(row + seq_len <= meta.cap_tokens and seq < meta.cap_seqs)
    meta.kv_lens[seq] = kv_len
    meta.cu_kv_seqlens[seq + 1] = meta.cu_kv_seqlens[seq] + kv_len
    if seq_len > meta.max_query_len:
        meta.max_query_len = <int32_t>seq_len
    if kv_len > meta.max_kv_len:
        meta.max_kv_len = kv_len
    if meta.has_device_table:
        meta.table_slots[seq] = meta.sequence_slots[index]
    for group in range(meta.num_groups):
        spec = &meta.groups[index * meta.num_groups + group]
        block_size = meta.block_size[group]
        # slots: walk the blocks the rows cover (validated in plan_sequence)
        slots = meta.slot_mapping[group] + row
        block = block_of(pos0, block_size, meta.block_shift[group])
        offset = pos0 - block * block_size
        base = <int64_t>spec.blocks[block] * block_size
        for j in range(seq_len):
            slots[j] = base + offset
            offset += 1
            if offset == block_size and j + 1 < seq_len:
                offset = 0
                block += 1
                base = <int64_t>spec.blocks[block] * block_size
        # the blocks holding positions [0, kv_len); the CSR lists the live ones
        num_blocks = block_of(kv_len - 1, block_size, meta.block_shift[group]) + 1
        first_live = spec.num_released if spec.num_released < num_blocks else num_blocks
        live = num_blocks - first_live
        start = meta.kv_indptr[group][seq]
        meta.kv_indptr[group][seq + 1] = <int32_t>(start + live)
        meta.kv_last_page_len[group][seq] = <int32_t>(kv_len - (num_blocks - 1) * block_size)
        if meta.has_device_table:
            meta.gather_blocks[group][seq] = <int32_t>num_blocks
            meta.gather_live[group][seq] = live
            meta.gather_base[group][seq] = (<int64_t>meta.sequence_slots[index] * meta.width + num_blocks
                                            - (start + live))
        if meta.block_table[group] != NULL:
            dense = meta.block_table[group] + seq * meta.width
            memcpy(dense, spec.blocks, num_blocks * sizeof(int32_t))
            memset(dense + num_blocks, 0, (meta.width - num_blocks) * sizeof(int32_t))
            debug_assert(start + live <= meta.cap_indices[group])
            memcpy(meta.kv_indices[group] + start, spec.blocks + first_live, live * sizeof(int32_t))


cdef void write_padding(AttentionMetadata meta, Py_ssize_t row, Py_ssize_t seq) noexcept nogil:
    """A padding sequence: one row that writes no KV (slot -1), no KV, no blocks."""
    cdef Py_ssize_t group
    debug_assert(row < meta.cap_tokens and seq < meta.cap_seqs)
    meta.kv_lens[seq] = 0
    meta.cu_kv_seqlens[seq + 1] = meta.cu_kv_seqlens[seq]
    if 1 > meta.max_query_len:
        meta.max_query_len = 1
    if meta.has_device_table:
        meta.table_slots[seq] = 0
    for group in range(meta.num_groups):
        meta.slot_mapping[group][row] = -1
        meta.kv_indptr[group][seq + 1] = meta.kv_indptr[group][seq]
        meta.kv_last_page_len[group][seq] = 0
        if meta.has_device_table:  # no blocks, no live ones: its run start is never read
            meta.gather_blocks[group][seq] = 0
            meta.gather_live[group][seq] = 0
            meta.gather_base[group][seq] = -meta.kv_indptr[group][seq]  # (slot 0's row)
        if meta.block_table[group] != NULL:
            memset(meta.block_table[group] + seq * meta.width, 0, meta.width * sizeof(int32_t))


cdef void write_deltas(AttentionMetadata meta, Py_ssize_t num_tokens) noexcept nogil:
    """The changed entries planned with the sequences (plan_row_delta), after the used input
    ids: their flat indices into the (groups, max_slots, max_blocks_per_seq) table as
    int64 (what the device scatter indexes with, unconverted), then their int32 values
    (delta_start(), delta_end())."""
    cdef Py_ssize_t index, j, count = 0, total = meta.num_changed_entries
    cdef const GroupSpec* spec
    cdef int64_t* indices
    cdef int32_t* values
    cdef int64_t row_start
    debug_assert(delta_end(num_tokens, total) <= meta.delta_capacity)
    if total == 0:  # the area may end at the ids (delta_end): no pointer past it is formed
        return
    # aligned: delta_area is (bind_device_table) and delta_start() is even
    indices = <int64_t*>(meta.delta_area + delta_start(num_tokens))
    values = <int32_t*>(indices + total)
    for index in range(meta.num_changed_specs):
        spec = &meta.groups[meta.changed_specs[index]]
        row_start = <int64_t>spec.row * meta.width
        for j in range(spec.released_begin, spec.released_end):
            indices[count] = row_start + j
            values[count] = -1
            count += 1
        for j in range(spec.ids_begin, spec.num_blocks):
            indices[count] = row_start + j
            values[count] = spec.blocks[j]
            count += 1
        for j in range(spec.num_blocks, spec.zero_end):
            indices[count] = row_start + j
            values[count] = 0
            count += 1


cdef struct GroupRows:  # one layer group's outputs from a batch's first plain row on
    int64_t block_size
    int shift
    int64_t* slots
    int32_t* indptr
    int32_t* last_page_len
    int32_t* gather_blocks     # NULL without a device table
    int64_t* gather_live
    int64_t* gather_base
    int32_t* dense             # the host tables (NULL: the device gathers them)
    int32_t* indices
    int64_t width


cdef inline GroupRows group_rows(AttentionMetadata meta, Py_ssize_t group, Py_ssize_t row0,
                                 Py_ssize_t seq0) noexcept nogil:
    cdef GroupRows out
    out.block_size = meta.block_size[group]
    out.shift = meta.block_shift[group]
    out.slots = meta.slot_mapping[group] + row0
    out.indptr = meta.kv_indptr[group] + seq0
    out.last_page_len = meta.kv_last_page_len[group] + seq0
    out.gather_blocks = meta.gather_blocks[group] + seq0 if meta.has_device_table else NULL
    out.gather_live = meta.gather_live[group] + seq0 if meta.has_device_table else NULL
    out.gather_base = meta.gather_base[group] + seq0 if meta.has_device_table else NULL
    out.dense = meta.block_table[group]
    out.indices = meta.kv_indices[group]
    out.width = meta.width
    return out


cdef inline int32_t write_group_row(GroupRows out, const GroupSpec* spec, Py_ssize_t pos, Py_ssize_t index,
                                    int64_t row_start, int64_t table_row, int32_t live_sum,
                                    bint host_tables) noexcept nogil:
    """One plain row's entries of one group (as write_sequence()): its slot,
    CSR offset, last-page length, and what the device gather reads or (``host_tables``) the
    dense and CSR rows; ``row_start``: the sequence's row in the flat dense table (host
    tables), ``table_row``: its slot's row in the group's flat device table (the gather),
    ``live_sum``: the group's CSR offset before it, returned after it. (``out`` by value: a
    copy no output pointer can alias, so its fields stay in registers.)"""
    cdef Py_ssize_t block = block_of(pos, out.block_size, out.shift)
    cdef int32_t live = <int32_t>(block + 1 - spec.num_released)
    debug_assert(spec.num_released <= block and block < spec.num_blocks)  # plan_decode_run / plan_sequence
    out.slots[index] = <int64_t>spec.blocks[block] * out.block_size + (pos - block * out.block_size)
    out.indptr[index + 1] = live_sum + live
    out.last_page_len[index] = <int32_t>(pos + 1 - block * out.block_size)
    if out.gather_blocks != NULL:
        out.gather_blocks[index] = <int32_t>(block + 1)
        out.gather_live[index] = live
        out.gather_base[index] = table_row + (block + 1) - (live_sum + live)
    if host_tables:  # the row padded with zeros, the live blocks in the CSR
        memcpy(out.dense + row_start, spec.blocks, (block + 1) * sizeof(int32_t))
        memset(out.dense + row_start + block + 1, 0, (out.width - block - 1) * sizeof(int32_t))
        memcpy(out.indices + live_sum, spec.blocks + spec.num_released, live * sizeof(int32_t))
    return live_sum + live


cdef void write_plain_metadata(const PlainRow* rows, Py_ssize_t count, AttentionMetadata meta, Py_ssize_t row0,
                               Py_ssize_t seq0) noexcept nogil:
    """write_sequence(meta, row.meta_index, row.pos0, 1, row0 + i, seq0 + i) for each plain
    row: the same entries, in one loop for the per-sequence ones and groups 0 and 1, then one
    per other layer group, each keeping its running sums in registers. plain_rows_metadata()
    is inlined three times, each loop knowing what it writes: one group without host
    tables (the usual decode step), several, and host tables (bind() gives every group
    host tables, or none). (A fourth copy, for exactly two groups, made the compiler call
    it out of line, and the one-group loop lost its constants.)"""
    if meta.block_table[0] == NULL:
        if meta.num_groups == 1:
            plain_rows_metadata(rows, count, meta, row0, seq0, False, 1)
        else:
            plain_rows_metadata(rows, count, meta, row0, seq0, False, meta.num_groups)
    else:
        plain_rows_metadata(rows, count, meta, row0, seq0, True, meta.num_groups)


cdef inline void plain_rows_metadata(const PlainRow* rows, Py_ssize_t count, AttentionMetadata meta, Py_ssize_t row0,
                                     Py_ssize_t seq0, bint host_tables, Py_ssize_t num_groups) noexcept nogil:
    cdef Py_ssize_t index, group
    cdef int32_t* kv_lens = meta.kv_lens + seq0
    cdef int32_t* cu_kv_seqlens = meta.cu_kv_seqlens + seq0
    cdef int32_t* table_slots = meta.table_slots + seq0 if meta.has_device_table else NULL
    cdef int32_t kv_len, kv_sum = cu_kv_seqlens[0], max_kv_len = meta.max_kv_len
    cdef int64_t width = meta.width, row_start = seq0 * width  # the sequence's row in the flat dense table
    cdef int64_t table_row = 0  # its slot's row in the flat device table
    cdef GroupRows out = group_rows(meta, 0, row0, seq0)
    cdef int32_t live_sum = out.indptr[0]
    cdef GroupRows out1 = group_rows(meta, 1 if num_groups >= 2 else 0, row0, seq0)  # (read with two or more)
    cdef int32_t live_sum1 = out1.indptr[0]
    debug_assert(row0 + count <= meta.cap_tokens and seq0 + count <= meta.cap_seqs)
    for index in range(count):
        kv_len = rows[index].pos0 + 1
        kv_lens[index] = kv_len
        kv_sum += kv_len
        cu_kv_seqlens[index + 1] = kv_sum
        if kv_len > max_kv_len:
            max_kv_len = kv_len
        if table_slots != NULL:
            table_slots[index] = meta.sequence_slots[rows[index].meta_index]
            table_row = table_slots[index] * width
        live_sum = write_group_row(out, &meta.groups[rows[index].meta_index * num_groups], rows[index].pos0,
                                   index, row_start, table_row, live_sum, host_tables)
        if num_groups >= 2:  # group 1 in the same loop: the row's reads are at hand
            live_sum1 = write_group_row(out1, &meta.groups[rows[index].meta_index * num_groups + 1], rows[index].pos0,
                                        index, row_start, table_row, live_sum1, host_tables)
        row_start += width
    debug_assert(not host_tables or live_sum <= meta.cap_indices[0])
    debug_assert(num_groups < 2 or not host_tables or live_sum1 <= meta.cap_indices[1])
    meta.max_kv_len = max_kv_len
    if count and meta.max_query_len < 1:
        meta.max_query_len = 1
    for group in range(2, num_groups):
        out = group_rows(meta, group, row0, seq0)
        live_sum = out.indptr[0]
        row_start = seq0 * width
        for index in range(count):
            if table_slots != NULL:
                table_row = table_slots[index] * width
            live_sum = write_group_row(out, &meta.groups[rows[index].meta_index * num_groups + group],
                                       rows[index].pos0, index, row_start, table_row, live_sum, host_tables)
            row_start += width
        debug_assert(not host_tables or live_sum <= meta.cap_indices[group])
