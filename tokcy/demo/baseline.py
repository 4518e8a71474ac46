"""The seed's "after" pattern of input preparation, for comparison on the same batches.

A per-request Python loop over the O(1)/O(range) accessors (``get_num_tokens``,
``get_tokens_range``, ``get_last_tokens``) that appends to Python lists and turns them into
numpy arrays at the end: what an engine does once it stops copying whole token lists,
but before it moves the loop out of Python. Same rows, same order, same fields as
``tokcy.executor.prepare_inputs`` for the row kinds the demo uses (context chunks,
generation with drafts, plain generation, device tokens, padding).

``prepare_inputs_after`` is the project's own baseline, ``tokcy._baselines.executor.after``
(the one the asv benchmarks time), for the context and generation rows, extended here in
the same style with the two row kinds it does not cover: device-token rows (overlap) and
CUDA-graph padding. ``prepare_inputs_after_demo`` is the demo's self-contained version of
the whole thing, used when that module is absent and to cross-check it.
"""

from types import SimpleNamespace

import numpy as np

try:
    from tokcy._baselines.executor import after as _project_after
except ImportError:  # an install without the benchmark baselines
    _project_after = None


def prepare_inputs_after(context_requests, generation_requests, *, device_token_requests=(), cuda_graph_batch_sizes=None):
    if _project_after is None:
        return prepare_inputs_after_demo(context_requests, generation_requests,
                                         device_token_requests=device_token_requests,
                                         cuda_graph_batch_sizes=cuda_graph_batch_sizes)
    arrays = _project_after(context_requests, generation_requests)
    num_host_rows = len(arrays["input_ids"])
    num_context_tokens = sum(int(length) for length in arrays["seq_lens"][: len(context_requests)])
    # the tail the project baseline does not build: device-token rows, then padding
    input_ids, positions, gather, seq_lens, cached, prompt_lens, request_ids, slots = [], [], [], [], [], [], [], []
    for request in device_token_requests:
        n = request.get_num_tokens(0)
        gather.append(num_host_rows + len(input_ids))
        input_ids.append(0)
        positions.append(n)
        seq_lens.append(1)
        cached.append(n)
        prompt_lens.append(request.prompt_len)
        request_ids.append(request.request_id)
        slots.append(request.seq_slot)
    num_sequences = len(arrays["seq_lens"]) + len(seq_lens)
    padded = _padded_size(num_sequences, context_requests, cuda_graph_batch_sizes)
    for _ in range(padded - num_sequences):
        input_ids.append(0)
        positions.append(0)
        seq_lens.append(1)
        cached.append(0)
        prompt_lens.append(0)
        request_ids.append(-1)
    if seq_lens:
        for name, tail in (("input_ids", input_ids), ("position_ids", positions), ("gather_ids", gather),
                           ("seq_lens", seq_lens), ("num_cached_tokens", cached), ("prompt_lens", prompt_lens),
                           ("request_ids", request_ids)):
            arrays[name] = np.concatenate((arrays[name], np.array(tail, dtype=arrays[name].dtype)))
        arrays["cu_seqlens"] = np.concatenate(([0], np.cumsum(arrays["seq_lens"]))).astype(np.int32)
    num_tokens = len(arrays["input_ids"])
    return SimpleNamespace(
        **arrays,
        device_token_slots=np.array(slots, dtype=np.int32),
        device_token_row_start=num_host_rows,
        num_context_requests=len(context_requests),
        num_context_tokens=num_context_tokens,
        num_generation_tokens=num_host_rows + len(device_token_requests) - num_context_tokens,
        num_tokens=num_tokens,
        num_sequences=num_sequences,
        padded_batch_size=padded,
    )


def _padded_size(num_sequences, context_requests, cuda_graph_batch_sizes):
    if cuda_graph_batch_sizes and not context_requests:
        fits = [size for size in sorted(cuda_graph_batch_sizes) if size >= num_sequences]
        if fits:
            return fits[0]
    return num_sequences


def prepare_inputs_after_demo(context_requests, generation_requests, *, device_token_requests=(),
                              cuda_graph_batch_sizes=None):
    input_ids, position_ids, gather_ids = [], [], []
    seq_lens, num_cached, prompt_lens, request_ids = [], [], [], []
    draft_tokens, draft_lens, device_slots = [], [], []

    for request in context_requests:
        begin = request.context_current_position
        chunk = request.context_chunk_size
        input_ids.extend(request.get_tokens_range(0, begin, begin + chunk))
        position_ids.extend(range(begin, begin + chunk))
        gather_ids.append(len(input_ids) - 1)
        seq_lens.append(chunk)
        num_cached.append(begin)
        prompt_lens.append(request.prompt_len)
        request_ids.append(request.request_id)
    num_context_tokens = len(input_ids)

    with_drafts = [request for request in generation_requests if request.has_draft_tokens]
    plain = [request for request in generation_requests if not request.has_draft_tokens]
    for request in with_drafts:
        n = request.get_num_tokens(0)
        drafts = request.draft_tokens
        first = len(input_ids)
        input_ids.append(request.get_last_tokens(0))
        input_ids.extend(drafts)
        position_ids.extend(range(n - 1, n + len(drafts)))
        gather_ids.extend(range(first, len(input_ids)))
        seq_lens.append(1 + len(drafts))
        num_cached.append(n - 1)
        prompt_lens.append(request.prompt_len)
        request_ids.append(request.request_id)
        draft_tokens.extend(drafts)
        draft_lens.append(len(drafts))
    for request in plain:
        n = request.max_beam_num_tokens
        for beam in range(request.beam_width):
            gather_ids.append(len(input_ids))
            input_ids.append(request.get_last_tokens(beam))
            position_ids.append(n - 1)
            seq_lens.append(1)
            num_cached.append(n - 1)
            prompt_lens.append(request.prompt_len)
            request_ids.append(request.request_id)
    device_row_start = len(input_ids)
    for request in device_token_requests:
        n = request.get_num_tokens(0)
        gather_ids.append(len(input_ids))
        input_ids.append(0)
        position_ids.append(n)
        seq_lens.append(1)
        num_cached.append(n)
        prompt_lens.append(request.prompt_len)
        request_ids.append(request.request_id)
        device_slots.append(request.seq_slot)

    num_sequences = len(seq_lens)
    padded = _padded_size(num_sequences, context_requests, cuda_graph_batch_sizes)
    for _ in range(padded - num_sequences):
        input_ids.append(0)
        position_ids.append(0)
        seq_lens.append(1)
        num_cached.append(0)
        prompt_lens.append(0)
        request_ids.append(-1)

    i32 = np.int32
    return SimpleNamespace(
        input_ids=np.array(input_ids, dtype=i32),
        position_ids=np.array(position_ids, dtype=i32),
        gather_ids=np.array(gather_ids, dtype=i32),
        seq_lens=np.array(seq_lens, dtype=i32),
        num_cached_tokens=np.array(num_cached, dtype=i32),
        prompt_lens=np.array(prompt_lens, dtype=i32),
        cu_seqlens=np.concatenate(([0], np.cumsum(seq_lens))).astype(i32),
        request_ids=np.array(request_ids, dtype=np.int64),
        draft_tokens=np.array(draft_tokens, dtype=i32),
        draft_lens=np.array(draft_lens, dtype=i32),
        device_token_slots=np.array(device_slots, dtype=i32),
        device_token_row_start=device_row_start,
        num_context_requests=len(context_requests),
        num_context_tokens=num_context_tokens,
        num_generation_tokens=device_row_start + len(device_token_requests) - num_context_tokens,
        num_tokens=len(input_ids),
        num_sequences=num_sequences,
        padded_batch_size=padded,
    )
