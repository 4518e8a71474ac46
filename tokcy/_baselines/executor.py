"""Baselines for the executor benchmark (asv_bench/benchmarks/bench_executor.py).

Each one builds, for a batch of context chunks and generation requests (with or without
draft tokens), exactly the arrays ``tokcy.executor.prepare_inputs`` builds, the way an
engine without tokcy would. They cover the row kinds of the benchmark batch only
(context chunks, generation with drafts, plain single-beam generation).

* ``before``: seed 000's "before" code: ``request.get_tokens(0)`` (the whole sequence as
  a new Python list) per request per iteration, then slicing and ``len()``.
* ``after``: seed 000's fixed code: a per-request Python loop over ``get_num_tokens``,
  ``get_tokens_range`` and ``get_last_tokens`` (O(1)/O(range)) building lists, then
  ``np.array`` at the end.
* ``NumpyInputBatch``: vLLM's ``InputBatch`` approach: a persistent
  ``[max_requests, max_len]`` int32 token array kept up to date by the engine, and the
  inputs gathered from it with vectorised numpy (``np.repeat`` / ``take``), as in
  vLLM's ``GPUModelRunner._prepare_inputs``.
"""

import numpy as np


def _split(generation_requests):
    drafted = [request for request in generation_requests if request.num_draft_tokens]
    plain = [request for request in generation_requests if not request.num_draft_tokens]
    return drafted, plain


def _arrays(input_ids, positions, gather, seq_lens, cached, prompt_lens, request_ids, drafts, draft_lens):
    cu_seqlens = np.zeros(len(seq_lens) + 1, dtype=np.int32)
    np.cumsum(seq_lens, out=cu_seqlens[1:])
    return {
        "input_ids": np.array(input_ids, dtype=np.int32),
        "position_ids": np.array(positions, dtype=np.int32),
        "gather_ids": np.array(gather, dtype=np.int32),
        "seq_lens": np.array(seq_lens, dtype=np.int32),
        "num_cached_tokens": np.array(cached, dtype=np.int32),
        "prompt_lens": np.array(prompt_lens, dtype=np.int32),
        "cu_seqlens": cu_seqlens,
        "request_ids": np.array(request_ids, dtype=np.int64),
        "draft_tokens": np.array(drafts, dtype=np.int32),
        "draft_lens": np.array(draft_lens, dtype=np.int32),
    }


def before(context_requests, generation_requests):
    """Seed 000, "before": the whole token list of every request, every iteration."""
    input_ids, positions, gather, seq_lens, cached, prompt_lens, request_ids = [], [], [], [], [], [], []
    drafts, draft_lens = [], []
    for request in context_requests:
        all_tokens = request.get_tokens(0)  # O(sequence length)
        begin = request.context_current_position
        end = begin + request.context_chunk_size
        chunk = all_tokens[begin:end]
        input_ids.extend(chunk)
        positions.extend(range(begin, end))
        gather.append(len(input_ids) - 1)
        seq_lens.append(len(chunk))
        cached.append(begin)
        prompt_lens.append(request.prompt_len)
        request_ids.append(request.request_id)
    drafted, plain = _split(generation_requests)
    for request in drafted:
        all_tokens = request.get_tokens(0)  # O(sequence length)
        past = len(all_tokens) - 1
        draft = request.draft_tokens
        gather.extend(range(len(input_ids), len(input_ids) + 1 + len(draft)))
        input_ids.append(all_tokens[-1])
        input_ids.extend(draft)
        positions.extend(range(past, past + 1 + len(draft)))
        seq_lens.append(1 + len(draft))
        cached.append(past)
        prompt_lens.append(request.prompt_len)
        request_ids.append(request.request_id)
        drafts.extend(draft)
        draft_lens.append(len(draft))
    for request in plain:
        all_tokens = request.get_tokens(0)  # O(sequence length)
        gather.append(len(input_ids))
        input_ids.append(all_tokens[-1])
        positions.append(len(all_tokens) - 1)
        seq_lens.append(1)
        cached.append(len(all_tokens) - 1)
        prompt_lens.append(request.prompt_len)
        request_ids.append(request.request_id)
    return _arrays(input_ids, positions, gather, seq_lens, cached, prompt_lens, request_ids, drafts, draft_lens)


def after(context_requests, generation_requests):
    """Seed 000, "after": O(1)/O(range) accessors, still a Python loop per request."""
    input_ids, positions, gather, seq_lens, cached, prompt_lens, request_ids = [], [], [], [], [], [], []
    drafts, draft_lens = [], []
    for request in context_requests:
        begin = request.context_current_position
        end = begin + request.context_chunk_size
        chunk = request.get_tokens_range(0, begin, end)  # O(chunk)
        input_ids.extend(chunk)
        positions.extend(range(begin, end))
        gather.append(len(input_ids) - 1)
        seq_lens.append(len(chunk))
        cached.append(begin)
        prompt_lens.append(request.prompt_len)
        request_ids.append(request.request_id)
    drafted, plain = _split(generation_requests)
    for request in drafted:
        past = request.get_num_tokens(0) - 1  # O(1)
        draft = request.draft_tokens
        gather.extend(range(len(input_ids), len(input_ids) + 1 + len(draft)))
        input_ids.append(request.get_last_tokens(0))  # O(1)
        input_ids.extend(draft)
        positions.extend(range(past, past + 1 + len(draft)))
        seq_lens.append(1 + len(draft))
        cached.append(past)
        prompt_lens.append(request.prompt_len)
        request_ids.append(request.request_id)
        drafts.extend(draft)
        draft_lens.append(len(draft))
    for request in plain:
        past = request.get_num_tokens(0) - 1
        gather.append(len(input_ids))
        input_ids.append(request.get_last_tokens(0))
        positions.append(past)
        seq_lens.append(1)
        cached.append(past)
        prompt_lens.append(request.prompt_len)
        request_ids.append(request.request_id)
    return _arrays(input_ids, positions, gather, seq_lens, cached, prompt_lens, request_ids, drafts, draft_lens)


class NumpyInputBatch:
    """vLLM-style persistent state: a ``[requests, max_len]`` int32 token array (tokens,
    then the draft tokens written after them, as vLLM stores spec tokens) and per-request
    numpy columns. Built once (the engine keeps it up to date incrementally); ``prepare``
    is the per-iteration vectorised work."""

    def __init__(self, context_requests, generation_requests):
        drafted, plain = _split(generation_requests)
        requests = list(context_requests) + drafted + plain
        num = len(requests)
        max_len = max(request.get_num_tokens(0) + request.num_draft_tokens for request in requests)
        self.token_ids = np.zeros((num, max_len), dtype=np.int32)
        self.num_computed = np.zeros(num, dtype=np.int64)  # cached tokens
        self.num_scheduled = np.zeros(num, dtype=np.int64)  # rows this iteration
        self.gather_all = np.zeros(num, dtype=bool)
        self.prompt_lens = np.zeros(num, dtype=np.int32)
        self.request_ids = np.zeros(num, dtype=np.int64)
        self.num_drafts = np.zeros(num, dtype=np.int64)
        for index, request in enumerate(requests):
            n = request.get_num_tokens(0)
            self.token_ids[index, :n] = request.get_tokens_view(0)
            if index < len(context_requests):
                self.num_computed[index] = request.context_current_position
                self.num_scheduled[index] = request.context_chunk_size
            else:
                k = request.num_draft_tokens
                self.token_ids[index, n : n + k] = request.draft_tokens
                self.num_computed[index] = n - 1
                self.num_scheduled[index] = 1 + k
                self.gather_all[index] = k > 0
                self.num_drafts[index] = k
            self.prompt_lens[index] = request.prompt_len
            self.request_ids[index] = request.request_id
        self.num_context = len(context_requests)
        self.max_len = max_len
        self.flat_tokens = self.token_ids.reshape(-1)

    def prepare(self):
        num_scheduled = self.num_scheduled
        total = int(num_scheduled.sum())
        cu_seqlens = np.zeros(len(num_scheduled) + 1, dtype=np.int32)
        np.cumsum(num_scheduled, out=cu_seqlens[1:])
        request_index = np.repeat(np.arange(len(num_scheduled)), num_scheduled)
        offsets = np.arange(total) - np.repeat(cu_seqlens[:-1], num_scheduled)
        positions = self.num_computed[request_index] + offsets
        input_ids = self.flat_tokens.take(positions + request_index * self.max_len)
        last_row = np.zeros(total, dtype=bool)
        last_row[cu_seqlens[1:] - 1] = True
        gather_ids = np.flatnonzero(last_row | self.gather_all[request_index]).astype(np.int32)
        is_draft = (offsets > 0) & self.gather_all[request_index]
        draft_lens = self.num_drafts[self.gather_all].astype(np.int32)
        return {
            "input_ids": input_ids,
            "position_ids": positions.astype(np.int32),
            "gather_ids": gather_ids,
            "seq_lens": num_scheduled.astype(np.int32),
            "num_cached_tokens": self.num_computed.astype(np.int32),
            "prompt_lens": self.prompt_lens.copy(),
            "cu_seqlens": cu_seqlens,
            "request_ids": self.request_ids.copy(),
            "draft_tokens": input_ids[is_draft],
            "draft_lens": draft_lens,
        }


CONTEXT_CHUNK = 8192
NUM_GENERATION = 255


def make_batch(module, seq_len, num_drafts, *, chunk=CONTEXT_CHUNK, num_generation=NUM_GENERATION, seed=0):
    """The benchmark batch on ``module`` (tokcy._core or tokcy._pure): one context request
    whose chunk of ``chunk`` tokens starts at position ``seq_len``, and ``num_generation``
    generation requests of ``seq_len`` tokens, each with ``num_drafts`` draft tokens."""
    from tokcy import RequestState

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 128_000, seq_len + chunk, dtype=np.int32)
    context = module.Request(0, tokens)
    context.context_current_position = seq_len
    context.context_chunk_size = chunk
    generation = []
    for index in range(num_generation):
        request = module.Request(1 + index, tokens[: seq_len - 1])
        request.state = RequestState.GENERATION_IN_PROGRESS
        request.add_new_token(int(tokens[seq_len - 1 + index % 2]))
        if num_drafts:
            request.draft_tokens = [index, index + 1, index + 2, index + 3][:num_drafts]
        generation.append(request)
    return [context], generation
