"""Baselines for the executor benchmark (asv_bench/benchmarks/bench_executor.py).

Each one builds, for a batch of context chunks and generation requests (with or without
draft tokens), exactly the arrays ``tokcy.executor.prepare_inputs`` builds, the way an
engine without tokcy would. They cover the row kinds of the benchmark batch (context
chunks, generation with drafts, plain single-beam generation); ``after`` also covers the
device-token rows and padding the demo engine (``python -m tokcy demo``) compares against.

``before`` and ``after`` return the arrays and counts of ``PreparedInputs.asdict()``.

* ``before``: the "before" code of the TensorRT-LLM pull request #16791:
  ``request.get_tokens(0)`` (the whole sequence as a new Python list) per request per
  iteration, then slicing and ``len()``.
* ``after``: #16791's fixed code: a per-request Python loop over ``get_num_tokens``,
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


class _Rows:
    """The Python lists both patterns append to, a method per row kind, in
    ``prepare_inputs``'s row order; ``result()`` turns them into its arrays and counts."""

    def __init__(self):
        self.input_ids, self.positions, self.gather, self.seq_lens, self.cached = [], [], [], [], []
        self.prompt_lens, self.request_ids, self.drafts, self.draft_lens, self.slots = [], [], [], [], []
        self.num_context_requests = self.num_context_tokens = self.num_padding = 0

    def _sequence(self, request, seq_len, cached):
        self.seq_lens.append(seq_len)
        self.cached.append(cached)
        self.prompt_lens.append(request.prompt_len)
        self.request_ids.append(request.request_id)

    def context(self, request, begin, end, chunk):
        """Context chunk [begin, end): its tokens, gathered at its last row."""
        self.input_ids.extend(chunk)
        self.positions.extend(range(begin, end))
        self.gather.append(len(self.input_ids) - 1)
        self._sequence(request, len(chunk), begin)
        self.num_context_requests += 1
        self.num_context_tokens += len(chunk)

    def drafted(self, request, last, past):
        """Generation with drafts: the last token and the k drafts, every row gathered."""
        input_ids, draft = self.input_ids, request.draft_tokens
        self.gather.extend(range(len(input_ids), len(input_ids) + 1 + len(draft)))
        input_ids.append(last)
        input_ids.extend(draft)
        self.positions.extend(range(past, past + 1 + len(draft)))
        self._sequence(request, 1 + len(draft), past)
        self.drafts.extend(draft)
        self.draft_lens.append(len(draft))

    def plain(self, request, last, past):
        """Single-beam generation: the last token."""
        self.gather.append(len(self.input_ids))
        self.input_ids.append(last)
        self.positions.append(past)
        self._sequence(request, 1, past)

    def device(self, request, num_tokens):
        """Device-token row (overlap): a placeholder the device fills at ``seq_slot``."""
        self.gather.append(len(self.input_ids))
        self.input_ids.append(0)
        self.positions.append(num_tokens)
        self._sequence(request, 1, num_tokens)
        self.slots.append(request.seq_slot)

    def pad(self, cuda_graph_batch_sizes):
        """CUDA-graph padding: one-token rows (request id -1) up to the smallest size that
        holds the batch, for batches without context requests."""
        num_sequences = len(self.seq_lens)
        if not cuda_graph_batch_sizes or self.num_context_requests:
            return
        fits = [size for size in sorted(cuda_graph_batch_sizes) if size >= num_sequences]
        self.num_padding = fits[0] - num_sequences if fits else 0
        for _ in range(self.num_padding):
            self.input_ids.append(0)
            self.positions.append(0)
            self.seq_lens.append(1)
            self.cached.append(0)
            self.prompt_lens.append(0)
            self.request_ids.append(-1)

    def result(self):
        cu_seqlens = np.zeros(len(self.seq_lens) + 1, dtype=np.int32)
        np.cumsum(self.seq_lens, out=cu_seqlens[1:])
        num_tokens = len(self.input_ids)
        padded = len(self.seq_lens)
        return {
            "input_ids": np.array(self.input_ids, dtype=np.int32),
            "position_ids": np.array(self.positions, dtype=np.int32),
            "gather_ids": np.array(self.gather, dtype=np.int32),
            "seq_lens": np.array(self.seq_lens, dtype=np.int32),
            "num_cached_tokens": np.array(self.cached, dtype=np.int32),
            "prompt_lens": np.array(self.prompt_lens, dtype=np.int32),
            "cu_seqlens": cu_seqlens,
            "request_ids": np.array(self.request_ids, dtype=np.int64),
            "draft_tokens": np.array(self.drafts, dtype=np.int32),
            "draft_lens": np.array(self.draft_lens, dtype=np.int32),
            "device_token_slots": np.array(self.slots, dtype=np.int32),
            "num_context_requests": self.num_context_requests,
            "num_context_tokens": self.num_context_tokens,
            "num_generation_tokens": num_tokens - self.num_padding - self.num_context_tokens,
            "num_tokens": num_tokens,
            "num_sequences": padded - self.num_padding,
            "padded_batch_size": padded,
            "device_token_row_start": num_tokens - self.num_padding - len(self.slots),
        }


def before(context_requests, generation_requests):
    """TensorRT-LLM before #16791: the whole token list of every request, every iteration."""
    rows = _Rows()
    for request in context_requests:
        all_tokens = request.get_tokens(0)  # O(sequence length)
        begin = request.context_current_position
        end = begin + request.context_chunk_size
        rows.context(request, begin, end, all_tokens[begin:end])
    drafted, plain = _split(generation_requests)
    for request in drafted:
        all_tokens = request.get_tokens(0)  # O(sequence length)
        rows.drafted(request, all_tokens[-1], len(all_tokens) - 1)
    for request in plain:
        all_tokens = request.get_tokens(0)  # O(sequence length)
        rows.plain(request, all_tokens[-1], len(all_tokens) - 1)
    return rows.result()


def after(context_requests, generation_requests, *, device_token_requests=(), cuda_graph_batch_sizes=None):
    """TensorRT-LLM after #16791: O(1)/O(range) accessors, still a Python loop per request.

    Also builds, in the same style, the two row kinds the demo engine uses beyond the
    benchmark batch: ``device_token_requests`` rows (overlap) and padding up to
    ``cuda_graph_batch_sizes`` (as ``prepare_inputs`` does)."""
    rows = _Rows()
    for request in context_requests:
        begin = request.context_current_position
        end = begin + request.context_chunk_size
        rows.context(request, begin, end, request.get_tokens_range(0, begin, end))  # O(chunk)
    drafted, plain = _split(generation_requests)
    for request in drafted:
        rows.drafted(request, request.get_last_tokens(0), request.get_num_tokens(0) - 1)  # O(1)
    for request in plain:
        rows.plain(request, request.get_last_tokens(0), request.get_num_tokens(0) - 1)  # O(1)
    for request in device_token_requests:
        rows.device(request, request.get_num_tokens(0))  # O(1)
    rows.pad(cuda_graph_batch_sizes)
    return rows.result()


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
