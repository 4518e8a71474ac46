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
        write_sequence(meta, specs[index].meta_index, specs[index].pos0, specs[index].seq_len, row, seq)


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
        start_write(meta)
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
            write_padding(meta, row, seq)
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
