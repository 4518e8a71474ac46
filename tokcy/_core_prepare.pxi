# Input preparation: one validating pass then one write; the readable twin is
# tokcy/_pure/prepare.py, with the same algorithm and the same errors (tokcy/_prepare_checks).
#
# InputWriter.prepare() runs in two passes:
#   1. plan, with the GIL: per request, read the C fields, validate them and store one
#      SeqSpec per emitted sequence (a PlainRow per plain generation row) in C scratch
#      arrays that only grow when a batch is larger than every batch before it. No Python
#      object is created per request.
#   2. write: fill_rows() (_core_rows.pxi) memcpy's the tokens from the beams' `data` and writes every output
#      array in one sweep. Cost O(batch + emitted tokens). A large write runs without the
#      GIL; a small one keeps it.
#
# Ownership: pass 2 reads pointers into the requests' storage arrays. plan() (followed by
# Python code before write()) holds a reference to each storage it points into. prepare()
# runs both passes with no Python code in between, so its plan only holds the batch's
# request sequences and borrows the storages: nothing can replace or free them while the
# GIL stays held; before a large write releases it, _take_refs() takes the references.

from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF, Py_XINCREF
from cpython.sequence cimport PySequence_Fast_ITEMS
from libc.stdlib cimport free, realloc
from libc.string cimport memset

from tokcy import _prepare_checks as _checks


@cython.final
cdef class InputWriter:
    """Fills the input arrays of one iteration: a validating pass, then the rows written
    over raw pointers without the GIL.

    ``bind(...)`` the eleven output arrays once, then per iteration ``prepare(...)``
    (= ``plan`` + ``write``) returns the counts. ``tokcy.executor`` is the public face.
    Not thread-safe: one writer per thread (a concurrent call raises RuntimeError).
    """

    cdef SeqSpec* _specs
    cdef Py_ssize_t _capacity
    cdef PlainRow* _plain
    cdef Py_ssize_t _plain_capacity, _num_plain
    cdef SeenIds _seen_ids              # the plan's request ids (_core_seen.pxi)
    # the planned batch
    cdef Py_ssize_t _num_specs, _num_context, _first_draft_end
    cdef Py_ssize_t _num_padding, _num_context_tokens, _num_tokens, _num_gather
    cdef Py_ssize_t _num_draft_tokens, _num_draft_requests, _num_device, _device_row_start
    cdef bint _planned, _busy
    cdef bint _owns_refs                # the specs hold references to the storages they point into
    cdef object _contexts, _generations, _first_drafts, _devices  # the planned batch, held until _release()
    cdef AttentionMetadata _metadata    # set_metadata(); None: no metadata outputs
    cdef AttentionMetadata _meta        # the planned call's: _metadata with block sizes, else None
    cdef int64_t _meta_serial           # _meta.plan_serial after this writer planned it
    # the bound outputs
    cdef Outputs _out
    cdef tuple _arrays                  # the plain views written through
    cdef BoundMemory _bound_memory      # their memory as bound, which every write checks first (None: unbound)
    cdef Py_ssize_t _cap_tokens, _cap_gather, _cap_seqs, _cap_drafts, _cap_draft_requests, _cap_device
    cdef readonly Py_ssize_t tokens_copied
    """Token ids the last write copied from request buffers (debug counter: O(emitted))."""

    def __cinit__(self):
        self._specs = NULL
        self._capacity = 0
        self._plain = NULL
        self._plain_capacity = 0
        self._num_plain = 0
        memset(&self._seen_ids, 0, sizeof(SeenIds))
        self._planned = False
        self._busy = False
        self._owns_refs = False
        self._arrays = None
        memset(&self._out, 0, sizeof(Outputs))

    def set_metadata(self, AttentionMetadata metadata):
        """Attention-metadata outputs (None: none), filled by calls that give block sizes."""
        if self._busy:
            _checks.busy()
        self._release()
        self._metadata = metadata

    def __dealloc__(self):
        self._release()
        free(self._specs)
        free(self._plain)
        free(self._seen_ids.entries)

    # ------------------------------------------------------------------ outputs
    def bind(self, input_ids, position_ids, gather_ids, seq_lens, num_cached_tokens, prompt_lens, cu_seqlens,
             request_ids, draft_tokens, draft_lens, device_token_slots):
        """Write into these contiguous numpy arrays (int32, request_ids int64) from now on;
        they cannot be resized while they are bound, and every write first checks that no
        ``__setstate__`` freed their memory: gave the numpy array that owns it (one of them,
        or a base) other memory (``_invariants.bound_memory``)."""
        if self._busy:
            _checks.busy()
        # busy for the whole call: the checks read the arrays' attributes, which may run
        # Python code that lets another thread in; its call (whose second pass may be
        # writing the bound arrays without the GIL) must not see them swapped
        self._busy = True
        try:
            arrays = (input_ids, position_ids, gather_ids, seq_lens, num_cached_tokens, prompt_lens, cu_seqlens,
                      request_ids, draft_tokens, draft_lens, device_token_slots)
            bound = bound_memory(arrays, _checks.BIND_ARRAYS)  # before any pointer is taken
            views = _checks.check_bind_arrays(arrays)  # plain views, written through (see _bind_views)
            retired = self._bind_views(arrays, views, bound)
        finally:
            self._busy = False
        # (the arrays bound before are released on return, after the guard: code their
        # release runs, a finalizer, may call this writer, which writes into the new ones)

    cdef object _bind_views(self, tuple arrays, tuple views, BoundMemory bound):
        """Bind ``views``, plain ndarrays of ``arrays`` (``_prepare_checks.plain_array``):
        the buffers they export are numpy's, over the arrays' own memory (a subclass's
        ``__buffer__`` is never asked), which ``bound`` keeps (it holds the arrays). Each
        pointer is checked to lie where its array's memory starts (check_still_over) before
        anything changes, and no Python code runs here. Returns the arrays bound before, for
        the caller to release once no pointer is theirs."""
        cdef int32_t[::1] input_ids = views[0], position_ids = views[1], gather_ids = views[2]
        cdef int32_t[::1] seq_lens = views[3], num_cached_tokens = views[4], prompt_lens = views[5]
        cdef int32_t[::1] cu_seqlens = views[6], draft_tokens = views[8], draft_lens = views[9]
        cdef int64_t[::1] request_ids = views[7]
        cdef int32_t[::1] device_token_slots = views[10]
        cdef void* memory[11]
        cdef Py_ssize_t index
        memory[0] = &input_ids[0] if input_ids.shape[0] else NULL
        memory[1] = &position_ids[0] if position_ids.shape[0] else NULL
        memory[2] = &gather_ids[0] if gather_ids.shape[0] else NULL
        memory[3] = &seq_lens[0] if seq_lens.shape[0] else NULL
        memory[4] = &num_cached_tokens[0] if num_cached_tokens.shape[0] else NULL
        memory[5] = &prompt_lens[0] if prompt_lens.shape[0] else NULL
        memory[6] = &cu_seqlens[0] if cu_seqlens.shape[0] else NULL
        memory[7] = &request_ids[0] if request_ids.shape[0] else NULL
        memory[8] = &draft_tokens[0] if draft_tokens.shape[0] else NULL
        memory[9] = &draft_lens[0] if draft_lens.shape[0] else NULL
        memory[10] = &device_token_slots[0] if device_token_slots.shape[0] else NULL
        for index in range(11):
            check_still_over(arrays[index], memory[index])
            bound.check_taken(arrays[index], memory[index])  # and over the memory ``bound`` keeps
        retired = (self._arrays, self._bound_memory)
        self._arrays = views
        self._bound_memory = bound
        self._out.input_ids = <int32_t*>memory[0]
        self._out.position_ids = <int32_t*>memory[1]
        self._out.gather_ids = <int32_t*>memory[2]
        self._out.seq_lens = <int32_t*>memory[3]
        self._out.num_cached_tokens = <int32_t*>memory[4]
        self._out.prompt_lens = <int32_t*>memory[5]
        self._out.cu_seqlens = <int32_t*>memory[6]
        self._out.request_ids = <int64_t*>memory[7]
        self._out.draft_tokens = <int32_t*>memory[8]
        self._out.draft_lens = <int32_t*>memory[9]
        self._out.device_token_slots = <int32_t*>memory[10]
        self._cap_tokens = min(input_ids.shape[0], position_ids.shape[0])
        self._cap_gather = gather_ids.shape[0]
        self._cap_seqs = min(seq_lens.shape[0], num_cached_tokens.shape[0], prompt_lens.shape[0],
                             request_ids.shape[0], cu_seqlens.shape[0] - 1)
        self._cap_drafts = draft_tokens.shape[0]
        self._cap_draft_requests = draft_lens.shape[0]
        self._cap_device = device_token_slots.shape[0]
        self._out.cap_tokens = self._cap_tokens
        self._out.cap_gather = self._cap_gather
        self._out.cap_seqs = self._cap_seqs
        self._out.cap_drafts = self._cap_drafts
        self._out.cap_draft_requests = self._cap_draft_requests
        self._out.cap_device = self._cap_device
        return retired

    # ------------------------------------------------------------------ scratch
    cdef int _grow(self, Py_ssize_t needed) except -1:
        cdef Py_ssize_t capacity = self._capacity
        cdef SeqSpec* grown
        if needed <= capacity:
            return 0
        capacity = max(needed, capacity * 2, 64)
        grown = <SeqSpec*>realloc(self._specs, capacity * sizeof(SeqSpec))
        if grown == NULL:
            raise MemoryError()
        self._specs = grown
        self._capacity = capacity
        return 0

    cdef inline bint _seen(self, int64_t key) noexcept:
        """Insert key into the plan's id set; True if it was already there. While the ids
        come in increasing order (the usual batch) a new one is larger than all before it:
        no hash probe. The first id out of order fills the hash set with the ids planned
        so far (each planned sequence's; a request's beam rows share one), then probes."""
        cdef Py_ssize_t index
        if seen_ascending(&self._seen_ids, key):
            return False
        if not self._seen_ids.hashing:
            self._seen_ids.hashing = True
            for index in range(self._num_specs):
                seen_probe(&self._seen_ids, self._specs[index].request_id)
            for index in range(self._num_plain):
                seen_probe(&self._seen_ids, self._plain[index].request_id)
        return seen_probe(&self._seen_ids, key)

    cdef void _release(self) noexcept:
        cdef Py_ssize_t index, num_specs = self._num_specs, num_plain = self._num_plain
        cdef bint owned = self._owns_refs, was_busy = self._busy
        # detached first: a reference dropped below can free a storage and so run Python
        # code (a weakref callback), which must find no plan to release again, and no call
        # may re-plan (reallocate the specs) while the loop reads them
        self._owns_refs = False
        self._num_specs = 0
        self._num_plain = 0
        if owned:
            self._busy = True
            for index in range(num_specs):
                Py_XDECREF(self._specs[index].src_owner)
                Py_XDECREF(self._specs[index].draft_owner)
            for index in range(num_plain):
                Py_XDECREF(self._plain[index].src_owner)
            self._busy = was_busy
        if self._meta is not None:
            self._meta.release()
            self._meta = None
        self._planned = False
        # last: dropping the batch may free requests, hence run Python code
        self._contexts = self._generations = self._first_drafts = self._devices = None

    cdef void _take_refs(self) noexcept:
        """Own every storage the planned specs point into (a plan made with own=False,
        when pass 2 is about to release the GIL). Valid only while no Python code has run
        since the plan: the borrowed pointers are still those the plan checked."""
        cdef Py_ssize_t index
        if self._owns_refs:
            return
        for index in range(self._num_specs):
            Py_XINCREF(self._specs[index].src_owner)
            Py_XINCREF(self._specs[index].draft_owner)
        for index in range(self._num_plain):
            Py_XINCREF(self._plain[index].src_owner)
        self._owns_refs = True
        if self._meta is not None:
            self._meta.take_refs()

    cdef inline SeqSpec* _add(self) except NULL:
        if self._num_specs >= self._capacity:
            self._grow(self._num_specs + 1)
        return &self._specs[self._num_specs]

    cdef int _grow_plain(self, Py_ssize_t needed) except -1:
        cdef Py_ssize_t capacity = self._plain_capacity
        cdef PlainRow* grown
        if needed <= capacity:
            return 0
        capacity = max(needed, capacity * 2, 64)
        grown = <PlainRow*>realloc(self._plain, capacity * sizeof(PlainRow))
        if grown == NULL:
            raise MemoryError()
        self._plain = grown
        self._plain_capacity = capacity
        return 0

    cdef inline void _add_plain(self, Int32Buffer buffer, Request request, Py_ssize_t pos0, int32_t meta_index,
                                bint own) noexcept:
        """One plain row: the newest token of ``buffer`` (a beam of ``request``) at ``pos0``.
        The caller has checked the buffer (1 <= size <= capacity) and grown the rows."""
        cdef PlainRow* row
        debug_assert(self._num_plain < self._plain_capacity)
        debug_assert(buffer.size >= 1)
        debug_assert(buffer.size <= buffer.capacity)
        row = &self._plain[self._num_plain]
        row.src = buffer.data + buffer.size - 1
        row.src_owner = <PyObject*>buffer.storage
        if own:
            Py_INCREF(buffer.storage)
        row.request_id = request._request_id
        row.pos0 = <int32_t>pos0
        row.prompt_len = <int32_t>request._prompt_len
        row.meta_index = meta_index
        self._num_plain += 1

    cdef Py_ssize_t _plan_decode_rows(self, PyObject** items, Py_ssize_t index, Py_ssize_t count, bint own,
                                      AttentionMetadata meta) except -1:
        """Plan the plain decode rows (an exact Request in generation, one beam with tokens,
        no drafts, a new id) of ``items`` from ``index`` on; return the index of the first
        request that is anything else, which plan_generation_request() then plans or
        refuses with its error. The requests are read through borrowed pointers (the plan holds the
        batch, and no Python code runs), and nothing is inserted for the one it stops at.
        With ``meta``, the rows' attention metadata is planned next, in order (its errors
        raise: every row is counted first, so that _release() drops what they hold)."""
        cdef PyObject* item
        cdef PyObject* buffer
        cdef PlainRow* row
        cdef Py_ssize_t n, start = index, first = index
        cdef int32_t meta_first = -1 if meta is None else <int32_t>meta.num_planned
        cdef Py_ssize_t end = min(count, index + self._plain_capacity - self._num_plain)  # rows fit
        while index < end:
            item = items[index]
            if <void*>item.ob_type != <void*>Request:
                break
            if ((<Request>item)._state_code != 1 or (<Request>item)._beam_width != 1
                    or (<Request>item)._draft_tokens.size != 0):
                break
            buffer = <PyObject*>(<Request>item)._beam0
            n = (<Int32Buffer>buffer).size
            if n == 0 or n > (<Int32Buffer>buffer).capacity:
                break
            if not seen_ascending(&self._seen_ids, (<Request>item)._request_id):
                self._count_plain_rows(index - start)  # the set is filled from the counted rows
                start = index
                if self._seen((<Request>item)._request_id):
                    break
            row = &self._plain[self._num_plain + index - start]
            row.src = (<Int32Buffer>buffer).data + n - 1
            row.src_owner = <PyObject*>(<Int32Buffer>buffer).storage
            if own:
                Py_INCREF(<object>row.src_owner)
            row.request_id = (<Request>item)._request_id
            row.pos0 = <int32_t>(n - 1)
            row.prompt_len = <int32_t>(<Request>item)._prompt_len
            row.meta_index = -1 if meta is None else meta_first + <int32_t>(index - first)  # planned in order
            index += 1
        self._count_plain_rows(index - start)
        if meta is not None:
            meta.plan_decode_rows(items, first, index)
        return index

    cdef inline void _count_plain_rows(self, Py_ssize_t count) noexcept:
        self._num_plain += count
        self._num_tokens += count
        self._num_gather += count

    # ------------------------------------------------------------------ pass 1
    cdef int _plan(self, object context_requests, object generation_requests, object first_draft_requests,
                   object device_token_requests, Py_ssize_t max_draft_len, object cuda_graph_batch_sizes,
                   Py_ssize_t max_beam_width, object block_sizes, bint own, Py_ssize_t device_slots) except -1:
        """Pass 1. ``own`` False (prepare(): pass 2 follows at once, with no Python code in
        between) borrows the storages: the batch's sequences are held instead, and _write()
        takes the references only if it releases the GIL. ``device_slots`` >= 0: every
        device-token request's seq_slot must be below it (-1: no bound)."""
        cdef AttentionMetadata meta = None
        cdef Py_ssize_t index, count
        cdef PyObject** items
        self._release()
        if max_draft_len < 0:
            _checks.negative_limit("max_draft_len", max_draft_len)
        if max_beam_width < 0:
            _checks.negative_limit("max_beam_width", max_beam_width)
        # whatever can run caller code first (an iterable group iterated, in argument order,
        # then the batch sizes); the lists and tuples are read after it, in place, and no
        # caller code runs from their first read to their last (the twin does the same)
        contexts = (context_requests if type(context_requests) in (list, tuple)
                    else _checks.request_group(context_requests, _checks.CONTEXT))
        generations = (generation_requests if type(generation_requests) in (list, tuple)
                       else _checks.request_group(generation_requests, _checks.GENERATION))
        first_drafts = (first_draft_requests if type(first_draft_requests) in (list, tuple)
                        else _checks.request_group(first_draft_requests, _checks.FIRST_DRAFT))
        devices = (device_token_requests if type(device_token_requests) in (list, tuple)
                   else _checks.request_group(device_token_requests, _checks.DEVICE_TOKEN))
        batch_sizes = None if cuda_graph_batch_sizes is None else _checks.owned_batch_sizes(cuda_graph_batch_sizes)
        self._contexts, self._generations, self._first_drafts, self._devices = (
            contexts, generations, first_drafts, devices)
        self._owns_refs = own
        seen_reset(&self._seen_ids, len(contexts) + len(generations) + len(first_drafts) + len(devices))
        self._grow(len(contexts) + len(first_drafts) + len(devices))
        self._grow_plain(len(generations))
        if block_sizes is not None:
            if self._metadata is None:
                _checks.metadata_not_bound()
            meta = self._metadata
            meta.configure(block_sizes)
            meta.begin(len(contexts) + len(generations) + len(first_drafts) + len(devices), own)
            self._meta = meta
            self._meta_serial = meta.plan_serial
        self._num_context_tokens = 0
        self._num_tokens = 0
        self._num_gather = 0
        self._num_draft_tokens = 0
        self._num_draft_requests = 0
        self._num_device = 0
        try:
            plan_contexts(self, contexts, meta, own)
            self._num_context = self._num_specs
            # generation: runs of plain decode rows take _plan_decode_rows, every other
            # request plan_generation_request() (which also refuses, with the error, what
            # that fast path stops at)
            items = PySequence_Fast_ITEMS(generations)
            count = len(generations)
            index = self._plan_decode_rows(items, 0, count, own, meta)
            while index < count:
                plan_generation_request(self, <object>items[index], index, max_draft_len, max_beam_width, meta, own)
                index = self._plan_decode_rows(items, index + 1, count, own, meta)
            plan_first_drafts(self, first_drafts, max_draft_len, meta, own)
            self._first_draft_end = self._num_specs
            plan_device_rows(self, devices, meta, own, device_slots)
            # padding up to a CUDA-graph batch size (decode-only batches)
            self._num_padding = 0
            if batch_sizes is not None and self._num_context == 0 and len(first_drafts) == 0:
                self._num_padding = padding_for(self._num_specs + self._num_plain, batch_sizes)
        except BaseException:
            self._release()
            raise
        self._device_row_start = self._num_context_tokens + self._num_tokens
        self._num_tokens += self._num_context_tokens + self._num_device + self._num_padding
        self.tokens_copied = self._num_tokens - self._num_device - self._num_padding
        self._planned = True
        return 0

    def plan(self, context_requests, generation_requests, first_draft_requests, device_token_requests,
             Py_ssize_t max_draft_len, cuda_graph_batch_sizes, Py_ssize_t max_beam_width, block_sizes=None,
             device_slots=None):
        """Pass 1: validate the batch and return the sizes it needs: (token rows, gathered
        rows, sequences incl. padding, draft tokens, draft requests, device-token rows).
        With ``block_sizes``, ``planned_blocks()`` then gives the metadata's sizes.
        ``device_slots``: the slots of the device tokens the placeholders are filled from
        (every device-token request's seq_slot must be below it), or None."""
        cdef Py_ssize_t slots = -1 if device_slots is None else _checks.device_slots_arg(device_slots)
        self._enter()
        try:
            self._plan(context_requests, generation_requests, first_draft_requests, device_token_requests,
                       max_draft_len, cuda_graph_batch_sizes, max_beam_width, block_sizes, True, slots)
        finally:
            self._leave()
        return (self._num_tokens, self._num_gather, self._num_specs + self._num_plain + self._num_padding,
                self._num_draft_tokens, self._num_draft_requests, self._num_device)

    # ------------------------------------------------------------------ pass 2
    cdef void _fill(self) noexcept nogil:
        fill_rows(self._specs, self._first_draft_end, self._num_specs, self._plain, self._num_plain, self._num_padding,
                  &self._out, self._meta)
        if self._meta is not None and self._meta.has_device_table:
            write_deltas(self._meta, self._num_tokens)

    cdef tuple _write(self):
        cdef Py_ssize_t padded, num_sequences, work
        if not self._planned:
            _checks.not_planned()
        if self._bound_memory is None:
            self._release()
            _checks.not_bound()
        padded = self._num_specs + self._num_plain + self._num_padding
        try:
            if self._num_tokens > self._cap_tokens:
                _checks.over_capacity("token rows", self._num_tokens, self._cap_tokens)
            if self._num_gather > self._cap_gather:
                _checks.over_capacity("gathered rows", self._num_gather, self._cap_gather)
            if padded > self._cap_seqs:
                _checks.over_capacity("sequences", padded, self._cap_seqs)
            if self._num_draft_tokens > self._cap_drafts:
                _checks.over_capacity("draft tokens", self._num_draft_tokens, self._cap_drafts)
            if self._num_draft_requests > self._cap_draft_requests:
                _checks.over_capacity("draft requests", self._num_draft_requests, self._cap_draft_requests)
            if self._num_device > self._cap_device:
                _checks.over_capacity("device-token rows", self._num_device, self._cap_device)
            if self._meta is not None:
                if self._meta.plan_serial != self._meta_serial:  # re-bound, or planned by another writer
                    self._meta = None
                    _checks.metadata_replanned()
                self._meta.check_capacity(self._num_tokens, padded)
            # last, as no Python code runs from here to the write (a caller's __setstate__
            # before it, even from a callback of this call, freed what is written)
            self._bound_memory.check()
            if self._meta is not None:
                self._meta.check_memory()
                if self._meta.has_device_table:
                    self._meta.commit_deltas(self._num_tokens)  # consumes the tables' marks: nothing fails after it
            work = self._num_tokens + (0 if self._meta is None else self._meta.write_work(padded))
            if work >= NOGIL_MIN_ENTRIES:
                self._take_refs()
                with nogil:
                    self._fill()
            else:  # small: releasing the GIL would cost more than the write
                self._fill()
        finally:
            num_sequences = self._num_specs + self._num_plain
            self._release()
        return (
            self._num_context,                                                  # num_context_requests
            self._num_context_tokens,                                           # num_context_tokens
            self._num_tokens - self._num_context_tokens - self._num_padding,    # num_generation_tokens
            self._num_tokens,                                                   # num_tokens
            num_sequences,                                                      # num_sequences
            padded,                                                             # padded_batch_size
            self._device_row_start,                                             # device_token_row_start
            self._num_gather,
            self._num_draft_tokens,
            self._num_draft_requests,
            self._num_device,
        )

    def write(self):
        """Pass 2: write the planned batch into the bound arrays; returns the counts
        (context requests, context tokens, generation tokens, tokens, sequences, padded
        batch, device-token row start, gathered rows, draft tokens, draft requests,
        device-token rows). ValueError, before anything is written, if it does not fit."""
        self._enter()
        try:
            if self._meta is not None and self._meta.has_device_table:
                self._release()
                _checks.device_table_needs_prepare()
            return self._write()
        finally:
            self._leave()

    def planned_blocks(self):
        """After plan() with block sizes: (longest block table, kv_indices length per group)."""
        if self._meta is None:
            return (0, ())
        return (self._meta.longest_table, self._meta.results()[3])

    def prepare(self, context_requests, generation_requests, first_draft_requests, device_token_requests,
                Py_ssize_t max_draft_len, cuda_graph_batch_sizes, Py_ssize_t max_beam_width, block_sizes=None,
                device_slots=None, *, make_result=None):
        """plan() then write(), in one call, under one busy guard. ``block_sizes``: a tuple,
        one block size per layer group, to write the attention metadata too (``set_metadata``
        first); ``device_slots`` as plan()'s. ``make_result``: called with the counts before
        the guard drops, and what it returns is returned instead of them, so that what it
        reads (the arrays, the metadata's ``results()``) is this call's."""
        cdef Py_ssize_t slots = -1 if device_slots is None else _checks.device_slots_arg(device_slots)
        self._enter()
        try:
            counts = self._plan_and_write(context_requests, generation_requests, first_draft_requests,
                                          device_token_requests, max_draft_len, cuda_graph_batch_sizes, max_beam_width,
                                          block_sizes, slots)
            return counts if make_result is None else make_result(counts)
        finally:
            self._leave()

    cdef tuple _plan_and_write(self, context_requests, generation_requests, first_draft_requests,
                               device_token_requests, Py_ssize_t max_draft_len, cuda_graph_batch_sizes,
                               Py_ssize_t max_beam_width, block_sizes, Py_ssize_t device_slots):
        """prepare()'s two passes, for a caller that holds the busy guard (_enter) until it
        has made what it returns from the counts."""
        self._plan(context_requests, generation_requests, first_draft_requests, device_token_requests,
                   max_draft_len, cuda_graph_batch_sizes, max_beam_width, block_sizes, False, device_slots)
        return self._write()

    cdef int _enter(self) except -1:
        """The busy guard: taken before any caller iterable is consumed (and before any
        Python code a batch can run), held for the whole public call. It covers the
        metadata too, which writers of several HostBuffers may share."""
        if self._busy:
            _checks.busy()
        if self._metadata is not None and self._metadata.busy:
            _checks.metadata_busy()
        self._busy = True
        if self._metadata is not None:  # set_metadata is refused while busy: the same one at _leave
            self._metadata.busy = True
        return 0

    cdef void _leave(self) noexcept:
        self._busy = False
        if self._metadata is not None:
            self._metadata.busy = False
