# The rows of one iteration: what input preparation's pass 1 records per sequence
# (SeqSpec; PlainRow for the plain generation rows, one per beam) and the GIL-free pass 2
# that writes them into the output arrays in row order (fill_rows). InputWriter, in
# _core_prepare.pxi, plans them; tokcy/_pure/prepare.py is the readable twin.

from cpython.ref cimport PyObject, Py_INCREF
from libc.string cimport memcpy, memset

cdef enum:
    KIND_CONTEXT = 0
    KIND_DRAFT = 1
    KIND_FIRST_DRAFT = 2
    KIND_DEVICE = 3


cdef struct SeqSpec:
    const int32_t* src         # tokens copied first (ncopy of them)
    const int32_t* draft       # then the draft tokens (ndraft of them)
    PyObject* src_owner        # numpy storage behind src / draft (held, or borrowed: _core_prepare.pxi)
    PyObject* draft_owner
    Py_ssize_t ncopy
    Py_ssize_t ndraft
    Py_ssize_t seq_len         # rows; rows past ncopy + ndraft are the placeholder 0
    Py_ssize_t pos0            # first position; also the cached tokens, for every row kind
    int64_t request_id
    int32_t prompt_len
    int32_t slot
    int32_t meta_index         # its sequence in the attention metadata's plan (-1: none)
    int kind


cdef struct PlainRow:          # a plain generation row (one per beam): the newest token of a beam
    const int32_t* src         # the token
    PyObject* src_owner        # its storage, held like SeqSpec.src_owner
    int64_t request_id
    int32_t pos0               # the row's position (the longest beam's newest)
    int32_t prompt_len
    int32_t meta_index

cdef struct Outputs:
    int32_t* input_ids
    int32_t* position_ids
    int32_t* gather_ids
    int32_t* seq_lens
    int32_t* num_cached_tokens
    int32_t* prompt_lens
    int32_t* cu_seqlens
    int64_t* request_ids
    int32_t* draft_tokens
    int32_t* draft_lens
    int32_t* device_token_slots
    # capacities, checked by debug_assert() only (plan/write validate the batch first)
    Py_ssize_t cap_tokens
    Py_ssize_t cap_gather
    Py_ssize_t cap_seqs
    Py_ssize_t cap_drafts
    Py_ssize_t cap_draft_requests
    Py_ssize_t cap_device


cdef inline void emit_seq(const SeqSpec* spec, Outputs* out, Py_ssize_t* counters) noexcept nogil:
    # counters: row, seq, gather, draft token, draft request, device row
    cdef Py_ssize_t row = counters[0]
    cdef Py_ssize_t seq = counters[1]
    cdef Py_ssize_t j
    cdef Py_ssize_t filled = spec.ncopy + spec.ndraft
    cdef int32_t* ids = out.input_ids + row
    cdef int32_t* positions = out.position_ids + row
    cdef int32_t pos0 = <int32_t>spec.pos0
    debug_assert(row + spec.seq_len <= out.cap_tokens and seq < out.cap_seqs)
    debug_assert(counters[3] + spec.ndraft <= out.cap_drafts)
    debug_assert(counters[2] + (spec.seq_len if spec.kind == KIND_DRAFT else 1) <= out.cap_gather)
    if spec.ncopy == 1:
        ids[0] = spec.src[0]
    elif spec.ncopy:
        memcpy(ids, spec.src, spec.ncopy * sizeof(int32_t))
    if spec.ndraft:
        memcpy(ids + spec.ncopy, spec.draft, spec.ndraft * sizeof(int32_t))
        memcpy(out.draft_tokens + counters[3], spec.draft, spec.ndraft * sizeof(int32_t))
        counters[3] += spec.ndraft
    if spec.kind == KIND_DRAFT:
        debug_assert(counters[4] < out.cap_draft_requests)
        out.draft_lens[counters[4]] = <int32_t>spec.ndraft
        counters[4] += 1
    for j in range(filled, spec.seq_len):
        ids[j] = 0
    for j in range(spec.seq_len):
        positions[j] = pos0 + <int32_t>j
    if spec.kind == KIND_DRAFT:  # every row's logits: the drafts are verified
        for j in range(spec.seq_len):
            out.gather_ids[counters[2] + j] = <int32_t>(row + j)
        counters[2] += spec.seq_len
    else:  # the last row's
        out.gather_ids[counters[2]] = <int32_t>(row + spec.seq_len - 1)
        counters[2] += 1
    if spec.kind == KIND_DEVICE:
        debug_assert(counters[5] < out.cap_device)
        out.device_token_slots[counters[5]] = spec.slot
        counters[5] += 1
    out.seq_lens[seq] = <int32_t>spec.seq_len
    out.num_cached_tokens[seq] = <int32_t>spec.pos0
    out.prompt_lens[seq] = spec.prompt_len
    out.request_ids[seq] = spec.request_id
    out.cu_seqlens[seq + 1] = <int32_t>(row + spec.seq_len)
    counters[0] = row + spec.seq_len
    counters[1] = seq + 1


cdef inline void emit(const SeqSpec* specs, Py_ssize_t index, Outputs* out, Py_ssize_t* counters,
                      AttentionMetadata meta) noexcept nogil:
    """One sequence's rows, and its attention metadata when the call has block sizes."""
    cdef Py_ssize_t row = counters[0], seq = counters[1]
    emit_seq(&specs[index], out, counters)
    if meta is not None:
        meta.write_sequence(specs[index].meta_index, specs[index].pos0, specs[index].seq_len, row, seq)


cdef void emit_plain_rows(const PlainRow* rows, Py_ssize_t count, Outputs* out, Py_ssize_t* counters,
                          AttentionMetadata meta) noexcept nogil:
    """The plain generation rows: one token, one row, one sequence each."""
    cdef Py_ssize_t row = counters[0], seq = counters[1], gather = counters[2], index
    cdef const PlainRow* plain
    debug_assert(row + count <= out.cap_tokens and seq + count <= out.cap_seqs and gather + count <= out.cap_gather)
    for index in range(count):
        plain = &rows[index]
        out.input_ids[row] = plain.src[0]
        out.position_ids[row] = plain.pos0
        out.gather_ids[gather] = <int32_t>row
        out.seq_lens[seq] = 1
        out.num_cached_tokens[seq] = plain.pos0
        out.prompt_lens[seq] = plain.prompt_len
        out.request_ids[seq] = plain.request_id
        out.cu_seqlens[seq + 1] = <int32_t>(row + 1)
        row += 1
        seq += 1
        gather += 1
    if meta is not None:  # loops of their own: the rows' loop stays branch-free
        write_plain_metadata(rows, count, meta, counters[0], counters[1])
    counters[0] = row
    counters[1] = seq
    counters[2] = gather


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
                                    int64_t row_start, int32_t live_sum, bint host_tables) noexcept nogil:
    """One plain row's entries of one group (as AttentionMetadata.write_sequence): its slot,
    CSR offset, last-page length, and what the device gather reads or (``host_tables``) the
    dense and CSR rows; ``row_start``: the sequence's row in the flat dense table,
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
        out.gather_base[index] = row_start + (block + 1) - (live_sum + live)
    if host_tables:  # the row padded with zeros, the live blocks in the CSR
        memcpy(out.dense + row_start, spec.blocks, (block + 1) * sizeof(int32_t))
        memset(out.dense + row_start + block + 1, 0, (out.width - block - 1) * sizeof(int32_t))
        memcpy(out.indices + live_sum, spec.blocks + spec.num_released, live * sizeof(int32_t))
    return live_sum + live


cdef void write_plain_metadata(const PlainRow* rows, Py_ssize_t count, AttentionMetadata meta, Py_ssize_t row0,
                               Py_ssize_t seq0) noexcept nogil:
    """meta.write_sequence(row.meta_index, row.pos0, 1, row0 + i, seq0 + i) for each plain
    row: the same entries, in one loop for the per-sequence ones and group 0, then one per
    other layer group, each keeping its running sums in registers. plain_rows_metadata()
    is inlined three times, each loop knowing what it writes: one group without host
    tables (the usual decode step), several, and host tables (bind() gives every group
    host tables, or none)."""
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
    cdef GroupRows out = group_rows(meta, 0, row0, seq0)
    cdef int32_t live_sum = out.indptr[0]
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
        live_sum = write_group_row(out, &meta.groups[rows[index].meta_index * num_groups], rows[index].pos0,
                                   index, row_start, live_sum, host_tables)
        row_start += width
    debug_assert(not host_tables or live_sum <= meta.cap_indices[0])
    meta.max_kv_len = max_kv_len
    if count and meta.max_query_len < 1:
        meta.max_query_len = 1
    for group in range(1, num_groups):
        out = group_rows(meta, group, row0, seq0)
        live_sum = out.indptr[0]
        row_start = seq0 * width
        for index in range(count):
            live_sum = write_group_row(out, &meta.groups[rows[index].meta_index * num_groups + group],
                                       rows[index].pos0, index, row_start, live_sum, host_tables)
            row_start += width
        debug_assert(not host_tables or live_sum <= meta.cap_indices[group])


cdef void fill_rows(const SeqSpec* specs, Py_ssize_t first_draft_end, Py_ssize_t device_end, const PlainRow* plain,
                    Py_ssize_t num_plain, Py_ssize_t num_padding, Outputs* out,
                    AttentionMetadata meta) noexcept nogil:
    """Pass 2: the rows in output order (context chunks, generation rows with drafts,
    first drafts, plain generation rows, device-token rows, padding). specs holds, in
    call order, the context sequences, the generation sequences with drafts and the
    first-draft ones up to first_draft_end, the device ones after; ``plain`` the plain
    generation rows, in call order.
    ``meta``: None, or the attention metadata to write in the same sweep."""
    cdef Py_ssize_t counters[6]
    cdef Py_ssize_t index, row, seq
    memset(counters, 0, sizeof(counters))
    out.cu_seqlens[0] = 0
    if meta is not None:
        meta.start_write()
    for index in range(first_draft_end):  # context chunks, generation with drafts, first drafts
        emit(specs, index, out, counters, meta)
    emit_plain_rows(plain, num_plain, out, counters, meta)
    for index in range(first_draft_end, device_end):
        emit(specs, index, out, counters, meta)
    row = counters[0]
    seq = counters[1]
    for index in range(num_padding):
        debug_assert(row < out.cap_tokens and seq < out.cap_seqs)
        if meta is not None:
            meta.write_padding(row, seq)
        out.input_ids[row] = 0
        out.position_ids[row] = 0
        out.seq_lens[seq] = 1
        out.num_cached_tokens[seq] = 0
        out.prompt_lens[seq] = 0
        out.request_ids[seq] = -1
        out.cu_seqlens[seq + 1] = <int32_t>(row + 1)
        row += 1
        seq += 1


cdef inline int set_spec(SeqSpec* spec, Request request, Int32Buffer source, Py_ssize_t begin, Py_ssize_t ncopy,
                         Py_ssize_t seq_len, Py_ssize_t pos0, int kind, bint own) except -1:
    """Describe one sequence. ``own``: hold a reference to each storage it points into
    until _release(), for a pass 2 that may run after Python code or without the GIL
    (otherwise _take_refs() does it later, if needed)."""
    cdef Int32Buffer drafts
    check_copy(request, source, begin, ncopy)
    if source is None:
        spec.src = NULL
        spec.src_owner = NULL
    else:
        spec.src = source.data + begin
        spec.src_owner = <PyObject*>source.storage
        if own:
            Py_INCREF(source.storage)
    if kind == KIND_DRAFT:
        drafts = request._draft_tokens
        spec.draft = drafts.data
        spec.draft_owner = <PyObject*>drafts.storage
        if own:
            Py_INCREF(drafts.storage)
        spec.ndraft = drafts.size
    else:
        spec.draft = NULL
        spec.draft_owner = NULL
        spec.ndraft = 0
    spec.ncopy = ncopy
    spec.seq_len = seq_len
    spec.pos0 = pos0
    spec.request_id = request._request_id
    spec.prompt_len = <int32_t>request._prompt_len
    spec.slot = <int32_t>request._seq_slot if kind == KIND_DEVICE else -1
    spec.kind = kind
    spec.meta_index = -1


cdef inline int check_copy(Request request, Int32Buffer source, Py_ssize_t begin, Py_ssize_t ncopy) except -1:
    """The loop-boundary re-check: the copy stays inside what the buffer holds, whatever
    state the request is in (cheap: a few compares per sequence)."""
    if source is not None and (begin < 0 or ncopy < 0 or begin > source.size - ncopy
                               or source.size > source.capacity):
        return outside_buffer(request, source, begin, ncopy)
    return 0


cdef int outside_buffer(Request request, Int32Buffer source, Py_ssize_t begin, Py_ssize_t ncopy) except -1:
    """check_copy's error, out of line: the inline check stays a few instructions."""
    _checks.outside_buffer(request._request_id, begin, ncopy, source.size)
    return -1
