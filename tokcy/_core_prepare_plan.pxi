# Pass 1 of input preparation (InputWriter._plan, _core_prepare.pxi) for every request
# that is not a plain decode row: context chunks, generation rows with drafts or beams,
# first drafts, device-token rows, and the padding to a CUDA-graph batch size. Each
# validates one kind of request, in the order and with the errors of the readable twin
# (tokcy/_pure/prepare.py), and records its SeqSpec or PlainRow rows (and, with block
# sizes, its metadata sequence). They are functions of the writer, not its methods, only
# so that this file can hold them.


cdef int plan_contexts(InputWriter writer, object contexts, AttentionMetadata meta, bint own) except -1:
    """Context chunks: beam 0 tokens [p, p + c)."""
    cdef Request request
    cdef SeqSpec* spec
    cdef Py_ssize_t index = 0, start, chunk
    for item in contexts:
        if not isinstance(item, Request):
            _checks.not_a_request(_checks.CONTEXT, index, item, Request)
        request = <Request>item
        if writer._seen(request._request_id):
            _checks.duplicate(request._request_id)
        if request._state_code != 0:
            _checks.wrong_state(_checks.CONTEXT, request._request_id, request._state_code, 0)
        chunk = request._chunk_size
        start = request._context_position
        if chunk <= 0:
            _checks.empty_chunk(request._request_id, start, request._prompt_len)
        if start + chunk > request._prompt_len:
            _checks.chunk_past_prompt(request._request_id, start, chunk, request._prompt_len)
        spec = writer._add()
        set_spec(spec, request, request._beam0, start, chunk, chunk, start, KIND_CONTEXT, own)
        writer._num_specs += 1
        if meta is not None:
            spec.meta_index = <int32_t>meta.num_planned
            meta.plan_sequence(request, start, chunk)
        writer._num_context_tokens += chunk
        writer._num_gather += 1
        index += 1
    return 0


cdef int plan_generation_request(InputWriter writer, object item, Py_ssize_t index, Py_ssize_t max_draft_len,
                                 Py_ssize_t max_beam_width, AttentionMetadata meta, bint own) except -1:
    """Generation request ``index``: with drafts (one sequence of 1 + k rows) or plain (a
    row per beam)."""
    cdef Request request
    cdef Int32Buffer buffer
    cdef SeqSpec* spec
    cdef Py_ssize_t beam, n, k
    if not isinstance(item, Request):
        _checks.not_a_request(_checks.GENERATION, index, item, Request)
    request = <Request>item
    if writer._seen(request._request_id):
        _checks.duplicate(request._request_id)
    if request._state_code != 1:
        _checks.wrong_state(_checks.GENERATION, request._request_id, request._state_code, 1)
    k = request._draft_tokens.size
    if k:
        if request._beam_width != 1:
            _checks.needs_single_beam(_checks.GENERATION, request._request_id, request._beam_width)
        if k > max_draft_len:
            _checks.too_many_drafts(request._request_id, k, max_draft_len)
        buffer = request._beam0
        n = buffer.size
        if n == 0:
            _checks.no_tokens(_checks.GENERATION, request._request_id, 0)
        spec = writer._add()
        set_spec(spec, request, buffer, n - 1, 1, 1 + k, n - 1, KIND_DRAFT, own)
        writer._num_specs += 1
        if meta is not None:
            spec.meta_index = <int32_t>meta.num_planned
            meta.plan_sequence(request, n - 1, 1 + k)
        writer._num_tokens += 1 + k
        writer._num_gather += 1 + k
        writer._num_draft_tokens += k
        writer._num_draft_requests += 1
    elif request._beam_width == 1:  # the common decode row: beam 0 only
        buffer = request._beam0
        n = buffer.size
        if n == 0:
            _checks.no_tokens(_checks.GENERATION, request._request_id, 0)
        if n > buffer.capacity:  # the loop-boundary re-check (check_copy)
            outside_buffer(request, buffer, n - 1, 1)
        if meta is None:
            writer._add_plain(buffer, request, n - 1, -1, own)
        else:
            writer._add_plain(buffer, request, n - 1, <int32_t>meta.num_planned, own)
            meta.plan_sequence(request, n - 1, 1)
        writer._num_tokens += 1
        writer._num_gather += 1
    else:
        if meta is not None:
            _checks.beams_with_block_size(request._request_id, request._beam_width)
        if max_beam_width > 0 and request._beam_width > max_beam_width:
            _checks.too_many_beams(request._request_id, request._beam_width, max_beam_width)
        n = 0
        for beam in range(request._beam_width):
            buffer = <Int32Buffer>request._beams[beam]
            if buffer.size == 0:
                _checks.no_tokens(_checks.GENERATION, request._request_id, beam)
            if buffer.size > n:
                n = buffer.size
        writer._grow_plain(writer._num_plain + request._beam_width)
        for beam in range(request._beam_width):
            buffer = <Int32Buffer>request._beams[beam]
            check_copy(request, buffer, buffer.size - 1, 1)
            writer._add_plain(buffer, request, n - 1, -1, own)
        writer._num_tokens += request._beam_width
        writer._num_gather += request._beam_width
    return 0


cdef int plan_first_drafts(InputWriter writer, object first_drafts, Py_ssize_t max_draft_len, AttentionMetadata meta,
                           bint own) except -1:
    """First-draft requests: tokens [s, n), s = max(0, n - M - 1)."""
    cdef Request request
    cdef Int32Buffer buffer
    cdef SeqSpec* spec
    cdef Py_ssize_t index = 0, n, start
    for item in first_drafts:
        if not isinstance(item, Request):
            _checks.not_a_request(_checks.FIRST_DRAFT, index, item, Request)
        request = <Request>item
        if writer._seen(request._request_id):
            _checks.duplicate(request._request_id)
        if request._state_code != 1:
            _checks.wrong_state(_checks.FIRST_DRAFT, request._request_id, request._state_code, 1)
        if request._beam_width != 1:
            _checks.needs_single_beam(_checks.FIRST_DRAFT, request._request_id, request._beam_width)
        buffer = request._beam0
        n = buffer.size
        if n == 0:
            _checks.no_tokens(_checks.FIRST_DRAFT, request._request_id, 0)
        start = n - max_draft_len - 1
        if start < 0:
            start = 0
        spec = writer._add()
        set_spec(spec, request, buffer, start, n - start, n - start, start, KIND_FIRST_DRAFT, own)
        writer._num_specs += 1
        if meta is not None:
            spec.meta_index = <int32_t>meta.num_planned
            meta.plan_sequence(request, start, n - start)
        writer._num_tokens += n - start
        writer._num_gather += 1
        index += 1
    return 0


cdef int plan_device_rows(InputWriter writer, object devices, AttentionMetadata meta, bint own,
                          Py_ssize_t device_slots) except -1:
    """Device-token requests: a placeholder row at position n, filled on the device from
    the previous step's token at its seq_slot (below ``device_slots`` unless it is -1)."""
    cdef Request request
    cdef SeqSpec* spec
    cdef Py_ssize_t index = 0, n
    for item in devices:
        if not isinstance(item, Request):
            _checks.not_a_request(_checks.DEVICE_TOKEN, index, item, Request)
        request = <Request>item
        if writer._seen(request._request_id):
            _checks.duplicate(request._request_id)
        if request._state_code != 1:
            _checks.wrong_state(_checks.DEVICE_TOKEN, request._request_id, request._state_code, 1)
        if request._beam_width != 1:
            _checks.needs_single_beam(_checks.DEVICE_TOKEN, request._request_id, request._beam_width)
        if request._draft_tokens.size:
            _checks.device_with_drafts(request._request_id, request._draft_tokens.size)
        if request._seq_slot == NO_SLOT:
            _checks.missing_slot(request._request_id)
        if device_slots >= 0 and request._seq_slot >= device_slots:
            _checks.slot_beyond_device_tokens(request._request_id, request._seq_slot, device_slots)
        n = request._beam0.size
        spec = writer._add()
        set_spec(spec, request, None, 0, 0, 1, n, KIND_DEVICE, own)
        writer._num_specs += 1
        if meta is not None:
            spec.meta_index = <int32_t>meta.num_planned
            meta.plan_sequence(request, n, 1)
        writer._num_device += 1
        writer._num_gather += 1
        index += 1
    return 0


cdef Py_ssize_t padding_for(Py_ssize_t num_sequences, object batch_sizes) except -1:
    """The padding sequences up to the smallest of ``batch_sizes`` (checked, owned) that
    holds ``num_sequences``."""
    cdef Py_ssize_t best = -1, size
    for item in batch_sizes:
        size = item
        if size < 1 or size > INT32_MAX:
            _checks.bad_batch_size(size)
        if size >= num_sequences and (best < 0 or size < best):
            best = size
    if best < 0:
        _checks.no_padding_size(num_sequences, batch_sizes)
    return best - num_sequences
