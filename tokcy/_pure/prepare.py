"""Input preparation in plain Python/numpy: the readable twin of
``tokcy/_core_prepare.pxi`` (same algorithm, same errors from ``tokcy._prepare_checks``).

Pass 1 validates the batch and records one spec per emitted sequence; pass 2 writes the
rows in the documented order (docs/executor.md). Tokens are copied as numpy slices of the buffers' storage, so
the cost is O(batch + emitted tokens), never O(sequence length).
"""

from itertools import accumulate
from operator import itemgetter

from tokcy import _invariants
from tokcy import _prepare_checks as _checks
from tokcy._pure.metadata import AttentionMetadata
from tokcy._pure.request import Request
from tokcy._state import RequestState
from tokcy._tokens import INT32_MAX, as_index

__all__ = ["InputWriter", "prepare_inputs_entry"]

_CONTEXT, _DRAFT, _FIRST_DRAFT, _PLAIN, _DEVICE = range(5)
_SEQ_LEN = itemgetter(5)  # a spec's rows
_CONTEXT_INIT = RequestState.CONTEXT_INIT
_IN_PROGRESS = RequestState.GENERATION_IN_PROGRESS



def _check_request(item, group, index, seen, expected_state):
    if not issubclass(type(item), Request):  # its real type, as the compiled core checks (not __class__)
        _checks.not_a_request(group, index, item, Request)
    request_id = item._request_id
    if request_id in seen:
        _checks.duplicate(request_id)
    seen.add(request_id)
    if item._state is not expected_state:  # RequestState members are singletons
        _checks.wrong_state(group, request_id, int(item._state), int(expected_state))
    return request_id


class InputWriter:
    """Fills the input arrays of one iteration (input preparation); see docs/executor.md.

    ``bind(...)`` the eleven output arrays once, then per iteration ``prepare(...)``
    (= ``plan`` + ``write``) returns the counts. ``tokcy.executor`` is the public face.
    """

    __reduce__ = _invariants.refuse_pickling  # as the compiled twin (a copy would be a second writer of its arrays)

    def __init__(self):
        self._arrays = None
        self._guards = ()
        self._watched = ()  # what every write checks first (_invariants.bound_memory)
        self._plan_state = None
        self._busy = False
        self._metadata = None
        self._meta = None  # the planned call's metadata (None: no block sizes)
        self.tokens_copied = 0

    def _enter(self):
        """The busy guard: taken before any caller iterable is consumed, held for the whole
        call; it covers the metadata too, which writers of several HostBuffers may share."""
        if self._busy:
            _checks.busy()
        if self._metadata is not None and self._metadata.busy:
            _checks.metadata_busy()
        self._busy = True
        if self._metadata is not None:  # set_metadata is refused while busy: the same one when it drops
            self._metadata.busy = True

    def set_metadata(self, metadata):
        """Attention-metadata outputs (None: none), filled by calls that give block sizes."""
        if self._busy:
            _checks.busy()
        if metadata is not None and not isinstance(metadata, AttentionMetadata):
            raise TypeError(f"Argument 'metadata' has incorrect type (expected "
                            f"tokcy._pure.metadata.AttentionMetadata, got {type(metadata).__name__})")
        self._plan_state = None
        self._metadata = metadata

    def bind(self, input_ids, position_ids, gather_ids, seq_lens, num_cached_tokens, prompt_lens,
             cu_seqlens, request_ids, draft_tokens, draft_lens, device_token_slots):
        """Write into these contiguous arrays (int32, request_ids int64) from now on (see
        the compiled twin's docstring)."""
        if self._busy:
            _checks.busy()
        self._busy = True  # for the whole call, as the compiled twin (its checks may run Python code)
        retired = dict(vars(self))  # what was bound is released after the guard, as the compiled twin
        try:
            arrays = (input_ids, position_ids, gather_ids, seq_lens, num_cached_tokens, prompt_lens,
                      cu_seqlens, request_ids, draft_tokens, draft_lens, device_token_slots)
            # as the compiled twin: none can be resized while bound, and what owns their memory is recorded
            # (before any view of it is taken) for every write to check
            guards, watched, taken = _invariants.bound_memory(arrays, _checks.BIND_ARRAYS)
            # plain views of the same memory: their lengths are numpy's (a subclass's len() may lie)
            views = _checks.check_bind_arrays(arrays)
            _invariants.check_taken(taken, views)  # over the memory the guards keep (as the compiled twin)
            arrays = views
            (input_ids, position_ids, gather_ids, seq_lens, num_cached_tokens, prompt_lens, cu_seqlens, request_ids,
             draft_tokens, draft_lens, device_token_slots) = arrays
            self._guards = guards
            self._watched = watched
            self._arrays = arrays
            self._cap_tokens = min(len(input_ids), len(position_ids))
            self._cap_gather = len(gather_ids)
            self._cap_seqs = min(len(seq_lens), len(num_cached_tokens), len(prompt_lens), len(request_ids),
                                 len(cu_seqlens) - 1)
            self._cap_drafts = len(draft_tokens)
            self._cap_draft_requests = len(draft_lens)
            self._cap_device = len(device_token_slots)
        finally:
            self._busy = False
        del retired  # released here, after the guard

    # ------------------------------------------------------------------ pass 1
    def plan(self, context_requests, generation_requests, first_draft_requests, device_token_requests,
             max_draft_len, cuda_graph_batch_sizes, max_beam_width, block_sizes=None, device_slots=None):
        """Pass 1: validate the batch and return the sizes it needs: (token rows, gathered
        rows, sequences incl. padding, draft tokens, draft requests, device-token rows).
        With ``block_sizes``, ``planned_blocks()`` then gives the metadata's sizes.
        ``device_slots``: the slots of the device tokens the placeholders are filled from
        (every device-token request's seq_slot must be below it), or None."""
        max_draft_len = as_index(max_draft_len)
        max_beam_width = as_index(max_beam_width)
        device_slots = _checks.device_slots_arg(device_slots)
        self._enter()
        try:
            return self._plan(context_requests, generation_requests, first_draft_requests, device_token_requests,
                              max_draft_len, cuda_graph_batch_sizes, max_beam_width, block_sizes, device_slots)
        finally:  # the guard dropped inline: an asynchronous exception (Ctrl-C) lands at a call, not here
            self._busy = False
            if self._metadata is not None:
                self._metadata.busy = False

    def _plan(self, context_requests, generation_requests, first_draft_requests, device_token_requests,
              max_draft_len, cuda_graph_batch_sizes, max_beam_width, block_sizes, device_slots):
        # the compiled twin's order: its typed limits convert first (in the public method);
        # then whatever can run caller code (each group that is not a list or tuple
        # iterated, in argument order, then the batch sizes); the lists and tuples given
        # are read after all of it
        if max_draft_len < 0:
            _checks.negative_limit("max_draft_len", max_draft_len)
        if max_beam_width < 0:
            _checks.negative_limit("max_beam_width", max_beam_width)
        groups = [group if type(group) in (list, tuple) else _checks.request_group(group, name) for group, name in
                  zip((context_requests, generation_requests, first_draft_requests, device_token_requests),
                      _checks.GROUP_NAMES)]
        batch_sizes = _checks.owned_batch_sizes(cuda_graph_batch_sizes)
        groups = [tuple(group) for group in groups]  # no caller code runs from here on
        context_requests, generation_requests, first_draft_requests, device_token_requests = groups
        self._plan_state = None
        meta = None
        if block_sizes is not None:
            if self._metadata is None:
                _checks.metadata_not_bound()
            meta = self._metadata
            meta.configure(block_sizes)
            meta.begin(sum(len(group) for group in groups))
            self._meta_serial = meta.plan_serial
        self._meta = meta
        plan_sequence = meta.plan_sequence if meta is not None else (lambda request, pos0, seq_len: None)
        seen = set()
        # spec: (kind, source array, begin, ncopy, draft array, seq_len, pos0, cached, request id, prompt len, slot)
        context, drafted, first_draft, plain, device = [], [], [], [], []
        num_gather = 0
        for index, item in enumerate(context_requests):
            request_id = _check_request(item, _checks.CONTEXT, index, seen, _CONTEXT_INIT)
            chunk, start = item._chunk_size, item._context_position
            if chunk <= 0:
                _checks.empty_chunk(request_id, start, item._prompt_len)
            if start + chunk > item._prompt_len:
                _checks.chunk_past_prompt(request_id, start, chunk, item._prompt_len)
            if start < 0 or start + chunk > item._beams[0].size:  # the copy's re-check
                _checks.outside_buffer(request_id, start, chunk, item._beams[0].size)
            context.append((_CONTEXT, item._beams[0].storage, start, chunk, None, chunk, start, start,
                            request_id, item._prompt_len, -1, plan_sequence(item, start, chunk)))
            num_gather += 1
        for index, item in enumerate(generation_requests):
            request_id = _check_request(item, _checks.GENERATION, index, seen, _IN_PROGRESS)
            beams = item._beams
            drafts = item._draft_tokens
            k = len(drafts)
            if not k and len(beams) == 1:  # the usual decode row: the newest token of beam 0
                buffer = beams[0]
                n = buffer.size
                if n == 0:
                    _checks.no_tokens(_checks.GENERATION, request_id, 0)
                plain.append((_PLAIN, buffer.storage, n - 1, 1, None, 1, n - 1, n - 1, request_id, item._prompt_len,
                              -1, None if meta is None else plan_sequence(item, n - 1, 1)))
                num_gather += 1
            elif k:
                if len(beams) != 1:
                    _checks.needs_single_beam(_checks.GENERATION, request_id, len(beams))
                if k > max_draft_len:
                    _checks.too_many_drafts(request_id, k, max_draft_len)
                n = beams[0].size
                if n == 0:
                    _checks.no_tokens(_checks.GENERATION, request_id, 0)
                drafted.append((_DRAFT, beams[0].storage, n - 1, 1, drafts, 1 + k, n - 1, n - 1,
                                request_id, item._prompt_len, -1, plan_sequence(item, n - 1, 1 + k)))
                num_gather += 1 + k
            else:
                if meta is not None and len(beams) != 1:
                    _checks.beams_with_block_size(request_id, len(beams))
                if max_beam_width > 0 and len(beams) > max_beam_width:
                    _checks.too_many_beams(request_id, len(beams), max_beam_width)
                for beam, buffer in enumerate(beams):
                    if buffer.size == 0:
                        _checks.no_tokens(_checks.GENERATION, request_id, beam)
                n = max(buffer.size for buffer in beams)
                for buffer in beams:
                    plain.append((_PLAIN, buffer.storage, buffer.size - 1, 1, None, 1, n - 1, n - 1,
                                  request_id, item._prompt_len, -1, None))
                if meta is not None:  # one beam (checked above)
                    plain[-1] = plain[-1][:11] + (plan_sequence(item, n - 1, 1),)
                num_gather += len(beams)
        for index, item in enumerate(first_draft_requests):
            request_id = _check_request(item, _checks.FIRST_DRAFT, index, seen, _IN_PROGRESS)
            if len(item._beams) != 1:
                _checks.needs_single_beam(_checks.FIRST_DRAFT, request_id, len(item._beams))
            n = item._beams[0].size
            if n == 0:
                _checks.no_tokens(_checks.FIRST_DRAFT, request_id, 0)
            start = max(0, n - max_draft_len - 1)
            first_draft.append((_FIRST_DRAFT, item._beams[0].storage, start, n - start, None, n - start, start,
                                start, request_id, item._prompt_len, -1, plan_sequence(item, start, n - start)))
            num_gather += 1
        for index, item in enumerate(device_token_requests):
            request_id = _check_request(item, _checks.DEVICE_TOKEN, index, seen, _IN_PROGRESS)
            if len(item._beams) != 1:
                _checks.needs_single_beam(_checks.DEVICE_TOKEN, request_id, len(item._beams))
            if len(item._draft_tokens):
                _checks.device_with_drafts(request_id, len(item._draft_tokens))
            if item._seq_slot is None:
                _checks.missing_slot(request_id)
            if device_slots >= 0 and item._seq_slot >= device_slots:
                _checks.slot_beyond_device_tokens(request_id, item._seq_slot, device_slots)
            n = item._beams[0].size
            device.append((_DEVICE, None, 0, 0, None, 1, n, n, request_id, item._prompt_len, item._seq_slot,
                           plan_sequence(item, n, 1)))
            num_gather += 1
        specs = context + drafted + first_draft + plain + device
        num_padding = 0
        if batch_sizes is not None and not context and not first_draft:
            best = -1
            for size in batch_sizes:
                if size < 1 or size > INT32_MAX:
                    _checks.bad_batch_size(size)
                if size >= len(specs) and (best < 0 or size < best):
                    best = size
            if best < 0:
                _checks.no_padding_size(len(specs), batch_sizes)
            num_padding = best - len(specs)
        num_context_tokens = sum(map(_SEQ_LEN, context))
        num_tokens = sum(map(_SEQ_LEN, specs)) + num_padding
        num_draft_tokens = sum(map(_SEQ_LEN, drafted)) - len(drafted)
        self.tokens_copied = num_tokens - len(device) - num_padding
        self._plan_state = (specs, len(context), num_context_tokens, num_tokens, num_gather, num_padding,
                            num_draft_tokens, len(drafted), len(device),
                            num_tokens - num_padding - len(device))
        return (num_tokens, num_gather, len(specs) + num_padding, num_draft_tokens, len(drafted), len(device))

    # ------------------------------------------------------------------ pass 2
    def write(self):
        """Pass 2: write the planned batch into the bound arrays; returns the counts
        (context requests, context tokens, generation tokens, tokens, sequences, padded
        batch, device-token row start, gathered rows, draft tokens, draft requests,
        device-token rows). ValueError, before anything is written, if it does not fit."""
        self._enter()
        try:
            if self._plan_state is not None and self._meta is not None and self._meta.has_device_table:
                self._plan_state = None
                _checks.device_table_needs_prepare()
            return self._write()
        finally:  # the guard dropped inline: an asynchronous exception (Ctrl-C) lands at a call, not here
            self._busy = False
            if self._metadata is not None:
                self._metadata.busy = False

    def planned_blocks(self):
        """After plan() with block sizes: (longest block table, kv_indices length per group)."""
        if self._plan_state is None or self._meta is None:
            return (0, ())
        return (self._meta.longest_table, self._meta.results()[3])

    def _write(self):
        if self._plan_state is None:
            _checks.not_planned()
        plan, self._plan_state = self._plan_state, None
        if self._arrays is None:
            _checks.not_bound()
        (specs, num_context, num_context_tokens, num_tokens, num_gather, num_padding,
         num_draft_tokens, num_draft_requests, num_device, device_row_start) = plan
        num_sequences = len(specs)
        padded = num_sequences + num_padding
        if num_tokens > self._cap_tokens:
            _checks.over_capacity("token rows", num_tokens, self._cap_tokens)
        if num_gather > self._cap_gather:
            _checks.over_capacity("gathered rows", num_gather, self._cap_gather)
        if padded > self._cap_seqs:
            _checks.over_capacity("sequences", padded, self._cap_seqs)
        if num_draft_tokens > self._cap_drafts:
            _checks.over_capacity("draft tokens", num_draft_tokens, self._cap_drafts)
        if num_draft_requests > self._cap_draft_requests:
            _checks.over_capacity("draft requests", num_draft_requests, self._cap_draft_requests)
        if num_device > self._cap_device:
            _checks.over_capacity("device-token rows", num_device, self._cap_device)
        meta = self._meta
        if meta is not None:
            if meta.plan_serial != self._meta_serial:  # re-bound, or planned by another writer
                self._meta = None
                _checks.metadata_replanned()
            meta.check_capacity(num_tokens, padded)
        counts = (num_context, num_context_tokens, num_tokens - num_context_tokens - num_padding, num_tokens,
                  num_sequences, padded, device_row_start, num_gather, num_draft_tokens, num_draft_requests,
                  num_device)  # (made first: an allocation that fails here changes nothing)
        # the last check, as the compiled twin's, with the collector paused from it to the last write (a
        # collection's callback that gave an array other memory meanwhile would have the rows written into
        # freed memory)
        with _invariants.collector_paused():
            moved = _invariants.moved_array(self._watched)
            if moved:
                _checks.memory_moved(moved)
            if meta is not None:
                meta.check_memory()
            self._fill(specs, num_tokens, num_gather, num_padding, padded, meta)
        return counts

    def _fill(self, specs, num_tokens, num_gather, num_padding, padded, meta):
        """Pass 2's writes (the compiled twin's ``_fill``), once every check passed."""
        if meta is not None and meta.has_device_table:
            meta.plan_deltas(num_tokens)  # consumes the tables' marks
        try:
            (input_ids, position_ids, gather_ids, seq_lens, num_cached_tokens, prompt_lens, cu_seqlens,
             request_ids, draft_tokens, draft_lens, device_token_slots) = self._arrays

            # the specs' fields as columns (one tuple per field, in row order), then one
            # assignment per output array: a numpy call costs more than a list element
            (kinds, sources, begins, ncopies, drafts, lens, pos0s, cached, ids, prompts, slots,
             _) = zip(*specs) if specs else ((),) * 12
            starts = list(accumulate(lens, initial=0))  # each sequence's first row
            pad_rows = (0,) * num_padding
            seq_lens[:padded] = lens + (1,) * num_padding
            num_cached_tokens[:padded] = cached + pad_rows
            prompt_lens[:padded] = prompts + pad_rows
            request_ids[:padded] = ids + (-1,) * num_padding
            cu_seqlens[: padded + 1] = starts + list(range(starts[-1] + 1, starts[-1] + 1 + num_padding))
            if starts[-1] == len(specs):  # one row per sequence (a decode batch)
                position_ids[:num_tokens] = pos0s + pad_rows
                gather_ids[:num_gather] = starts[:-1]
            else:
                position_ids[:num_tokens] = [pos0 + j for pos0, seq_len in zip(pos0s, lens) for j in range(seq_len)] + [0] * num_padding
                gather_ids[:num_gather] = [row for kind, start, seq_len in zip(kinds, starts, lens)
                                           for row in (range(start, start + seq_len) if kind == _DRAFT else (start + seq_len - 1,))]
            # tokens: one fancy assignment for the single-token copies, a slice per longer one
            single = [index for index, ncopy in enumerate(ncopies) if ncopy == 1]
            if len(single) == starts[-1]:  # every row is a single-token copy: rows 0, 1, ...
                input_ids[: len(single)] = [source.item(begin) for source, begin in zip(sources, begins)]
            elif single:
                input_ids[[starts[index] for index in single]] = [sources[index].item(begins[index]) for index in single]
            draft_offset = draft_index = device_index = 0
            for index, kind in enumerate(kinds):
                row, ncopy = starts[index], ncopies[index]
                if ncopy > 1:
                    input_ids[row : row + ncopy] = sources[index][begins[index] : begins[index] + ncopy]
                if kind == _DRAFT:
                    k = lens[index] - 1
                    input_ids[row + 1 : row + 1 + k] = drafts[index]
                    draft_tokens[draft_offset : draft_offset + k] = drafts[index]
                    draft_lens[draft_index] = k
                    draft_offset += k
                    draft_index += 1
                elif kind == _DEVICE:
                    input_ids[row] = 0
                    device_token_slots[device_index] = slots[index]
                    device_index += 1
            if num_padding:
                input_ids[num_tokens - num_padding : num_tokens] = 0
            if meta is not None:
                meta.write([(spec[11], spec[6], spec[5], start) for spec, start in zip(specs, starts)], num_tokens, padded)
                meta.release()
        except BaseException:  # (only an allocation can fail here) what the consumed marks said is lost: the next
            if meta is not None and meta.has_device_table:  # step sends each scheduled table whole
                meta.rows.forget()
            raise

    def prepare(self, context_requests, generation_requests, first_draft_requests, device_token_requests,
                max_draft_len, cuda_graph_batch_sizes, max_beam_width, block_sizes=None, device_slots=None, *,
                make_result=None):
        """plan() then write(), in one call, under one busy guard. ``block_sizes``: a tuple,
        one block size per layer group, to write the attention metadata too (``set_metadata``
        first); ``device_slots`` as plan()'s. ``make_result``: called with the counts before
        the guard drops, and what it returns is returned instead of them, so that what it
        reads (the arrays, the metadata's ``results()``) is this call's."""
        max_draft_len = as_index(max_draft_len)
        max_beam_width = as_index(max_beam_width)
        device_slots = _checks.device_slots_arg(device_slots)
        self._enter()
        try:
            self._plan(context_requests, generation_requests, first_draft_requests, device_token_requests,
                       max_draft_len, cuda_graph_batch_sizes, max_beam_width, block_sizes, device_slots)
            counts = self._write()
            return counts if make_result is None else make_result(counts)
        finally:  # the guard dropped inline: an asynchronous exception (Ctrl-C) lands at a call, not here
            self._busy = False
            if self._metadata is not None:
                self._metadata.busy = False


def prepare_inputs_entry(python_prepare_inputs, host_buffers, prepared_inputs, backend_choice):
    """tokcy.executor's ``prepare_inputs`` on this backend: the Python function itself (the
    compiled backend returns a compiled one that runs its common step in C)."""
    return python_prepare_inputs
