"""Helpers for the executor tests: random batch descriptions and a naive reference.

The reference is written the way an engine without tokcy does it (TensorRT-LLM's code
before pull request #16791): per request, Python lists
built from ``get_tokens(0)`` (the whole sequence), sliced, then concatenated. It uses
only the public ``Request`` API and nothing from ``tokcy.executor``.
"""

import numpy as np

from tokcy import RequestState


def make_request(module, desc):
    """A ``module.Request`` from a plain description dict."""
    request = module.Request(desc["id"], desc["prompt"], beam_width=desc.get("beam_width", 1))
    if desc["kind"] == "context":
        request.context_current_position = desc["cursor"]
        request.context_chunk_size = desc["chunk"]
        request.state = desc.get("state", RequestState.CONTEXT_INIT)
        return request
    request.state = desc.get("state", RequestState.GENERATION_IN_PROGRESS)
    for beam, tokens in enumerate(desc.get("generated", ())):
        for token in tokens:
            request.add_new_token(token, beam)
    if desc.get("drafts"):
        request.draft_tokens = desc["drafts"]
    if desc.get("slot") is not None:
        request.seq_slot = desc["slot"]
    return request


def random_batch(rng, *, max_len=40):
    """A random batch description covering every row kind: (groups dict, max_draft_len, sizes)."""
    next_id = iter(range(rng.integers(0, 1000) * 100, 10**9))
    tokens = lambda count: [int(t) for t in rng.integers(0, 50_000, count)]  # noqa: E731
    groups = {"context": [], "generation": [], "first_draft": [], "device": []}
    max_draft_len = int(rng.integers(0, 5))
    for _ in range(rng.integers(0, 4)):
        prompt_len = int(rng.integers(1, max_len))
        cursor = int(rng.integers(0, prompt_len))
        chunk = int(rng.integers(1, prompt_len - cursor + 1))
        groups["context"].append({"kind": "context", "id": next(next_id), "prompt": tokens(prompt_len),
                                  "beam_width": int(rng.integers(1, 3)), "cursor": cursor, "chunk": chunk})
    for _ in range(rng.integers(0, 7)):
        with_drafts = max_draft_len > 0 and rng.random() < 0.4
        beam_width = 1 if with_drafts else int(rng.integers(1, 5))
        prompt_len = int(rng.integers(1, max_len))
        generated = [tokens(int(rng.integers(0, 6))) for _ in range(beam_width)]
        desc = {"kind": "generation", "id": next(next_id), "prompt": tokens(prompt_len), "beam_width": beam_width,
                "generated": generated}
        if with_drafts:
            desc["drafts"] = tokens(int(rng.integers(1, max_draft_len + 1)))
        groups["generation"].append(desc)
    for _ in range(rng.integers(0, 3)):
        groups["first_draft"].append({"kind": "first_draft", "id": next(next_id),
                                      "prompt": tokens(int(rng.integers(1, max_len))),
                                      "generated": [tokens(int(rng.integers(0, 3)))]})
    for _ in range(rng.integers(0, 4)):
        groups["device"].append({"kind": "device", "id": next(next_id), "prompt": tokens(int(rng.integers(1, max_len))),
                                 "generated": [tokens(int(rng.integers(0, 3)))], "slot": int(rng.integers(0, 16))})
    sizes = None
    if rng.random() < 0.5:
        sizes = sorted({int(s) for s in rng.integers(1, 40, int(rng.integers(1, 6)))})
        if rng.random() < 0.8:
            sizes.append(64)  # usually one size holds the batch
    if rng.random() < 0.3:  # decode-only batches: the ones CUDA-graph padding applies to
        groups["context"], groups["first_draft"] = [], []
    return groups, max_draft_len, sizes


def reference(context, generation, first_draft, device, max_draft_len, sizes):
    """The expected arrays and counts, the naive way (whole token lists per request)."""
    input_ids, positions, gather, seq_lens, cached, prompt_lens, request_ids = [], [], [], [], [], [], []
    draft_tokens, draft_lens, slots = [], [], []

    def sequence(rows, first_position, num_cached, request, gathered):
        start = len(input_ids)
        input_ids.extend(rows)
        positions.extend(range(first_position, first_position + len(rows)))
        gather.extend(start + offset for offset in gathered(len(rows)))
        seq_lens.append(len(rows))
        cached.append(num_cached)
        prompt_lens.append(request.prompt_len)
        request_ids.append(request.request_id)

    last = lambda count: [count - 1]  # noqa: E731
    every = lambda count: range(count)  # noqa: E731
    for request in context:
        all_tokens = request.get_tokens(0)
        begin = request.context_current_position
        chunk = all_tokens[begin : begin + request.context_chunk_size]
        sequence(chunk, begin, begin, request, last)
    num_context_tokens = len(input_ids)
    with_drafts = [request for request in generation if len(request.draft_tokens) > 0]
    plain = [request for request in generation if len(request.draft_tokens) == 0]
    for request in with_drafts:
        all_tokens = request.get_tokens(0)
        drafts = request.draft_tokens
        sequence([all_tokens[-1]] + drafts, len(all_tokens) - 1, len(all_tokens) - 1, request, every)
        draft_tokens.extend(drafts)
        draft_lens.append(len(drafts))
    for request in first_draft:
        all_tokens = request.get_tokens(0)
        begin = max(0, len(all_tokens) - max_draft_len - 1)
        sequence(all_tokens[begin:], begin, begin, request, last)
    for request in plain:
        beams = request.get_tokens()
        longest = max(len(tokens) for tokens in beams)
        for tokens in beams:
            sequence([tokens[-1]], longest - 1, longest - 1, request, last)
    device_row_start = len(input_ids)
    for request in device:
        length = len(request.get_tokens(0))
        sequence([0], length, length, request, last)
        slots.append(request.seq_slot)
    num_sequences = len(seq_lens)
    num_padding = 0
    if sizes is not None and not context and not first_draft:
        fitting = [size for size in sizes if size >= num_sequences]
        if not fitting:
            raise ValueError("no padding size")
        num_padding = min(fitting) - num_sequences
    for _ in range(num_padding):
        input_ids.append(0)
        positions.append(0)
        seq_lens.append(1)
        cached.append(0)
        prompt_lens.append(0)
        request_ids.append(-1)
    cu_seqlens = [0]
    for length in seq_lens:
        cu_seqlens.append(cu_seqlens[-1] + length)
    arrays = {
        "input_ids": np.array(input_ids, dtype=np.int32),
        "position_ids": np.array(positions, dtype=np.int32),
        "gather_ids": np.array(gather, dtype=np.int32),
        "seq_lens": np.array(seq_lens, dtype=np.int32),
        "num_cached_tokens": np.array(cached, dtype=np.int32),
        "prompt_lens": np.array(prompt_lens, dtype=np.int32),
        "cu_seqlens": np.array(cu_seqlens, dtype=np.int32),
        "request_ids": np.array(request_ids, dtype=np.int64),
        "draft_tokens": np.array(draft_tokens, dtype=np.int32),
        "draft_lens": np.array(draft_lens, dtype=np.int32),
        "device_token_slots": np.array(slots, dtype=np.int32),
    }
    counts = {
        "num_context_requests": len(context),
        "num_context_tokens": num_context_tokens,
        "num_generation_tokens": len(input_ids) - num_context_tokens - num_padding,
        "num_tokens": len(input_ids),
        "num_sequences": num_sequences,
        "padded_batch_size": len(seq_lens),
        "device_token_row_start": device_row_start,
    }
    return arrays, counts


def assert_matches(result, arrays, counts):
    for name, expected in arrays.items():
        actual = getattr(result, name)
        assert actual.dtype == expected.dtype, name
        np.testing.assert_array_equal(actual, expected, err_msg=name)
    for name, expected in counts.items():
        assert getattr(result, name) == expected, name
