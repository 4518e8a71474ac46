# Request (compiled core). Same behaviour and errors as tokcy/_pure/request.py, the
# readable reference: every argument is validated before anything changes; error messages
# come from tokcy._tokens so both backends say the same. BlockTable: _core_block_table.pxi;
# the functions the methods share: _core_request_fields.pxi.

from libc.stdint cimport int16_t

from tokcy import _invariants

cdef int32_t NO_SLOT = -1
cdef int64_t NO_LIMIT = -1


# A request without draft tokens points at this one empty buffer (no buffer is ever
# mutated in place as drafts: setting them makes a new one), so reading its size touches
# memory shared by the whole batch rather than one more object per request.
cdef Int32Buffer NO_DRAFTS = Int32Buffer()


cdef class Request:
    """Request(request_id, prompt, *, beam_width=1, max_new_tokens=None, num_layer_groups=1)
--

One request: per-beam int32 token buffers (prompt, then generated tokens), the
    chunked-prefill cursor, draft tokens and one ``BlockTable`` per layer group."""

    # The fields the hot loops read come first, together (C keeps the declaration order):
    # everything the connector's row reads of a one-group request, the type included, lies
    # in bytes 8 to 63 (more groups add the tables tuple); the executor's decode row adds
    # _beam_width and _prompt_len on the next line, its device rows _seq_slot, and a
    # two-group decode row _blocks1 (the second table's ids, with no tuple or table to
    # read). The class has no C methods (so no vtable pointer at byte 16: the helpers below
    # the class are functions), and with the pad the object is 176 bytes, 192 with the
    # collector's header: CPython's small-object allocator then starts every Request on a
    # 64-byte line (as Int32Buffer's note says), so the connector reads one line per request
    # where it read two. Only speed depends on this.
    cdef int64_t _request_id
    cdef Int32Buffer _beam0          # _beams[0], for the hot loops
    # the block ids of _block_tables[0] (its buffer, which a BlockTable never replaces)
    # when that is an exact BlockTable, else None: the hot loops read no table object
    cdef Int32Buffer _blocks0
    cdef Int32Buffer _draft_tokens   # NO_DRAFTS (shared, never mutated) when there are none
    cdef Py_ssize_t _num_pauses      # bumped by pause(): the connector then reports anew
    # the connector's report slot for this request, a hint only: a ReportState uses it when
    # its slot of that number is live and holds this request id (else it probes its table);
    # -1 for none (a slot number past int32 is never kept)
    cdef int32_t _report_slot
    cdef int16_t _state_code         # int(_state), readable without the GIL
    cdef int16_t _num_groups         # len(_block_tables): at most MAX_LAYER_GROUPS (1,024)
    cdef Py_ssize_t _beam_width
    cdef Py_ssize_t _prompt_len
    cdef int64_t _seq_slot           # NO_SLOT for None
    cdef Int32Buffer _blocks1        # as _blocks0, of _block_tables[1] (None without one, or not exact)
    cdef Py_ssize_t _chunk_size
    cdef tuple _block_tables         # set only by set_block_tables (with _num_groups, _blocks0, _blocks1)
    cdef Py_ssize_t _context_position
    cdef tuple _beams                # Int32Buffer per beam (a tuple: gc.get_referents hands it out, and a list
                                     # could then be changed under the loops that read it unchecked)
    cdef Py_ssize_t _orig_prompt_len
    cdef int64_t _max_new_tokens     # NO_LIMIT for None
    cdef object _state               # RequestState member
    cdef Py_ssize_t _layout_pad[3]

    def __cinit__(self, *args, **kwargs):
        # One empty beam until __init__ runs, so that even an object whose __init__ was
        # skipped (a subclass not calling super().__init__) is safe for the hot loops.
        self._beam0 = Int32Buffer()
        self._beams = (self._beam0,)
        self._beam_width = 1
        self._state = CONTEXT_INIT
        self._state_code = 0
        self._seq_slot = NO_SLOT
        self._max_new_tokens = NO_LIMIT
        self._draft_tokens = NO_DRAFTS
        set_block_tables(self, ())
        self._report_slot = -1

    @cython.embedsignature(False)  # the class docstring carries the signature for inspect/help
    def __init__(self, request_id, prompt, *, beam_width=1, max_new_tokens=None, num_layer_groups=1):
        request_id = _tokens.as_integer(request_id, "request_id")
        tokens = _invariants.check_prompt(_tokens.as_int32_array(prompt, "prompt"))
        beam_width = _invariants.check_beam_width(beam_width)
        if max_new_tokens is not None:
            max_new_tokens = _tokens.as_integer(max_new_tokens, "max_new_tokens")
            if max_new_tokens < 0:
                raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        num_layer_groups = _invariants.check_num_layer_groups(num_layer_groups)
        # a second __init__ re-initialises everything, exactly as a new Request (both backends)
        beams = []
        for _ in range(beam_width):  # (a loop: no list comprehension in the core, _core.pyx)
            beams.append(Int32Buffer(tokens))
        beams = tuple(beams)
        tables = tuple(BlockTable() for _ in range(num_layer_groups))
        retired = retire_fields(self)  # no Python code from here to the return
        self._request_id = request_id
        self._beams = beams
        self._beam0 = beams[0]
        self._beam_width = beam_width
        self._prompt_len = self._orig_prompt_len = len(tokens)
        self._max_new_tokens = NO_LIMIT if max_new_tokens is None else max_new_tokens
        self._context_position = 0
        self._chunk_size = len(tokens)
        self._state = CONTEXT_INIT
        self._state_code = 0
        self._seq_slot = NO_SLOT
        self._draft_tokens = NO_DRAFTS
        set_block_tables(self, tables)
        self._num_pauses = 0

    # ----------------------------------------------------------------- pickling, repr
    def _state_dict(self):
        cdef Int32Buffer buffer
        beams, marks, tables = [], [], []
        for buffer in self._beams:  # (loops: no list comprehension in the core, _core.pyx)
            beams.append(buffer.tolist(0, buffer.size))
            marks.append(buffer.dirty_from)
        for table in self._block_tables:
            tables.append(table.__reduce__()[1][1:5])
        return {
            "request_id": self._request_id,
            "beams": beams,
            "dirty_from": marks,
            "prompt_len": self._prompt_len,
            "orig_prompt_len": self._orig_prompt_len,
            # the private fields, as the twin does: a subclass's properties are not what pickles
            "max_new_tokens": None if self._max_new_tokens == NO_LIMIT else self._max_new_tokens,
            "state": self._state_code,
            "seq_slot": None if self._seq_slot == NO_SLOT else self._seq_slot,
            "context_current_position": self._context_position,
            "context_chunk_size": self._chunk_size,
            "draft_tokens": self._draft_tokens.tolist(0, self._draft_tokens.size),
            "block_tables": tables,
            "num_pauses": self._num_pauses,
            "dict": None if type(self) is Request else _pickle.subclass_attributes(self, Request),
        }

    @classmethod
    def _from_state(cls, state):
        """A Request from the plain state of ``__reduce__``, every invariant checked first."""
        cdef Request self
        cdef Int32Buffer buffer
        state = _invariants.checked_request_state(state)
        beams = []
        for tokens, dirty_from in zip(state["beams"], state["dirty_from"]):
            buffer = Int32Buffer(tokens)
            buffer.dirty_from = dirty_from
            beams.append(buffer)
        beams = tuple(beams)
        drafts = Int32Buffer(state["draft_tokens"]) if len(state["draft_tokens"]) else NO_DRAFTS
        tables = tuple(_pickle.restore_block_table(BlockTable, *table) for table in state["block_tables"])
        self = cls.__new__(cls)
        retired = retire_fields(self)  # no Python code from here to a subclass's attributes
        self._beams = beams
        self._beam0 = beams[0]
        self._beam_width = len(beams)
        self._request_id = state["request_id"]
        self._prompt_len = state["prompt_len"]
        self._orig_prompt_len = state["orig_prompt_len"]
        self._max_new_tokens = NO_LIMIT if state["max_new_tokens"] is None else state["max_new_tokens"]
        # the private fields, as the twin does: a subclass's properties are not restore paths
        self._state = state["state"]
        self._state_code = self._state
        self._seq_slot = NO_SLOT if state["seq_slot"] is None else state["seq_slot"]
        self._context_position = state["context_current_position"]
        self._chunk_size = state["context_chunk_size"]
        self._draft_tokens = drafts
        set_block_tables(self, tables)
        self._num_pauses = state["num_pauses"]
        if state["dict"]:
            _pickle.restore_subclass_attributes(self, Request, state["dict"])
        return self

    def __reduce__(self):
        cls = None if type(self) is Request else type(self)
        cdef bint was_enabled = PyGC_Disable()  # as _pickle.read_whole: the fields of one state
        try:
            state = self._state_dict()
        finally:
            if was_enabled:
                PyGC_Enable()
        return (_pickle.restore_request, (cls, state))

    def __repr__(self):
        return _repr.request_repr(type(self).__name__, self)

    # ------------------------------------------------------------------ plain fields
    @property
    def request_id(self):
        return self._request_id

    @property
    def beam_width(self):
        return self._beam_width

    @property
    def max_new_tokens(self):
        """The generation budget, or None for no limit; ``pause`` subtracts what became prompt."""
        return None if self._max_new_tokens == NO_LIMIT else self._max_new_tokens

    @property
    def prompt_len(self):
        """Tokens treated as prompt: the original prompt, plus what ``pause`` folded into it."""
        return self._prompt_len

    @property
    def orig_prompt_len(self):
        return self._orig_prompt_len

    @property
    def state(self):
        return self._state

    @state.setter
    def state(self, value):
        self._state = _invariants.checked_state(value)
        self._state_code = self._state

    @state.deleter
    def state(self):
        _invariants.no_deleter(self, "state")

    @property
    def seq_slot(self):
        """The engine's slot for this request (indexes the previous step's device tokens), or None."""
        return None if self._seq_slot == NO_SLOT else self._seq_slot

    @seq_slot.setter
    def seq_slot(self, value):
        if value is None:
            self._seq_slot = NO_SLOT
            return
        value = _tokens.as_integer(value, "seq_slot")
        if value < 0:
            raise ValueError(f"seq_slot must be >= 0 or None, got {value}")
        if value > INT32_MAX:
            raise OverflowError(f"seq_slot {value} does not fit in int32")
        self._seq_slot = value

    @seq_slot.deleter
    def seq_slot(self):
        _invariants.no_deleter(self, "seq_slot")

    @property
    def block_tables(self):
        """One ``BlockTable`` per layer group (attention-window group)."""
        return self._block_tables

    # ------------------------------------------------------------------ token buffer
    def get_num_tokens(self, Py_ssize_t beam):
        """Tokens in ``beam``: O(1)."""
        return beam_of(self, beam).size

    def get_tokens(self, beam=None):
        """A new list of the beam's tokens (all beams for no argument): O(n), compatibility only."""
        cdef Int32Buffer buffer
        if beam is None:
            tokens = []
            for buffer in self._beams:  # (a loop: no list comprehension in the core, _core.pyx)
                tokens.append(buffer.tolist(0, buffer.size))
            return tokens
        buffer = beam_of(self, beam)
        return buffer.tolist(0, buffer.size)

    def get_tokens_range(self, Py_ssize_t beam, begin, end):
        """Tokens ``[b, e)`` with b = clamp(begin, 0, n), e = clamp(end, b, n): O(e - b).

        Not Python slicing: a negative ``begin`` counts as 0 and ``begin >= end`` gives [].
        """
        cdef Py_ssize_t first = clamped_index(begin), stop = clamped_index(end)
        cdef Int32Buffer buffer = beam_of(self, beam)
        first = buffer.clamp_begin(first)
        return buffer.tolist(first, buffer.clamp_end(first, stop))

    def get_tokens_view(self, Py_ssize_t beam=0, begin=0, end=None):
        """A read-only zero-copy numpy snapshot of ``[begin, end)`` clamped as in ``get_tokens_range``.

        The view never changes and never dangles: later writes that would touch what it
        shows go to fresh storage instead.
        """
        cdef Py_ssize_t first = clamped_index(begin)
        cdef Int32Buffer buffer = beam_of(self, beam)
        cdef Py_ssize_t stop = buffer.size if end is None else clamped_index(end)
        first = buffer.clamp_begin(first)
        return buffer.view(first, buffer.clamp_end(first, stop))

    def get_token(self, Py_ssize_t beam, Py_ssize_t pos):
        """One token; IndexError outside ``[0, n)``."""
        cdef Int32Buffer buffer = beam_of(self, beam)
        if pos < 0 or pos >= buffer.size:
            raise IndexError(f"token position {pos} is out of range for {buffer.size} tokens")
        return buffer.data[pos]

    def get_last_tokens(self, beam=None):
        """The last token of ``beam``, or a list of every beam's last token: O(1) / O(beams)."""
        cdef Py_ssize_t index
        if beam is None:
            tokens = []
            for index in range(self._beam_width):  # (a loop: no list comprehension in the core, _core.pyx)
                tokens.append(last_token(self, index))
            return tokens
        return last_token(self, beam)

    @property
    def max_beam_num_tokens(self):
        """Tokens in the longest beam."""
        return longest_beam(self)

    @property
    def max_num_generated_tokens(self):
        """Tokens in the longest beam minus the prompt."""
        return longest_beam(self) - self._prompt_len

    @property
    def reached_max_new_tokens(self):
        """True when ``max_new_tokens`` is set and the longest beam has generated that many.

        tokcy never refuses a token because of the budget: the engine checks this (O(beams))
        after sampling and finishes the request.
        """
        return self._max_new_tokens != NO_LIMIT and longest_beam(self) - self._prompt_len >= self._max_new_tokens

    def add_new_token(self, token, Py_ssize_t beam=0):
        """Append one token to ``beam``; returns the beam's new length. Amortised O(1)."""
        cdef int32_t value = token_arg(token, "token")
        cdef tuple beams = self._beams
        cdef Int32Buffer buffer = beam_of(self, beam)
        append_to_beam(self, beams, buffer, value, "add_new_token")
        return buffer.size

    def add_new_tokens(self, per_beam):
        """Append one token to every beam (``per_beam[b]`` to beam b); returns beam 0's new length.

        All entries are checked before any beam changes.
        """
        cdef Py_ssize_t beam
        cdef Int32Buffer buffer
        cdef tuple beams = self._beams
        cdef int32_t single
        tokens = checked_per_beam(self, per_beam)
        if len(tokens) == 1:
            single = token_arg(tokens[0], "per_beam[0]")
            same_beams(self, beams, "per_beam")
            buffer = <Int32Buffer>beams[0]
            append_to_beam(self, beams, buffer, single, "add_new_tokens")
            return buffer.size
        checked = []
        for beam in range(len(tokens)):  # (a loop: no list comprehension in the core, _core.pyx)
            checked.append(token_arg(tokens[beam], f"per_beam[{beam}]"))
        same_beams(self, beams, "per_beam")
        # `beams` and `checked` have one entry per beam, and neither changes below; every
        # beam's room first, so that the writes allocate nothing (a failure changes no beam)
        while not beams_have_room(beams, -1, NULL):
            for beam in range(len(checked)):
                buffer = <Int32Buffer>beams[beam]
                buffer.reserve(buffer.size, 1)
        if self._beams is not beams:  # a reserve ran code that re-initialised the request
            _invariants.changed_during("add_new_tokens", "re-initialised")
        for beam in range(len(checked)):
            buffer = <Int32Buffer>beams[beam]
            buffer.append(<int32_t>checked[beam])
        return (<Int32Buffer>beams[0]).size

    def set_generated_tokens(self, per_beam):
        """Replace everything after the prompt: beam b becomes prompt + ``per_beam[b]``."""
        cdef Int32Buffer buffer
        cdef Py_ssize_t beam, num_beams
        cdef tuple beams = self._beams
        cdef const int32_t[::1] memory
        arrays = []
        for beam, tokens in enumerate(checked_per_beam(self, per_beam)):  # (a loop: no list comprehension in the core, _core.pyx)
            arrays.append(_tokens.as_int32_array(tokens, f"per_beam[{beam}]"))
        same_beams(self, beams, "per_beam")
        cdef Py_ssize_t prompt_len = self._prompt_len
        num_beams = len(arrays)
        # where each beam's tokens are (the arrays, tokcy's own, stay alive and unresized
        # in `arrays`), then every beam's room: all that allocates, before any beam changes
        cdef Py_ssize_t few_counts[8]
        cdef const int32_t* few_sources[8]
        cdef Py_ssize_t* counts = few_counts
        cdef const int32_t** sources = few_sources
        cdef Storage places
        if num_beams > 8:  # (a beam search's few beams need no allocation)
            places = new_byte_storage(num_beams * (sizeof(Py_ssize_t) + sizeof(int32_t*)))
            counts = <Py_ssize_t*>places.data
            sources = <const int32_t**>(counts + num_beams)
        for beam in range(num_beams):
            memory = arrays[beam]
            counts[beam] = memory.shape[0]
            sources[beam] = &memory[0] if counts[beam] else NULL
        while not beams_have_room(beams, prompt_len, counts):
            for beam in range(num_beams):
                (<Int32Buffer>beams[beam]).reserve(prompt_len, counts[beam])
        if self._beams is not beams or self._prompt_len != prompt_len:  # a reserve ran code that changed them
            _invariants.changed_during("set_generated_tokens")
        for beam in range(num_beams):
            buffer = <Int32Buffer>beams[beam]
            buffer.truncate(prompt_len)
            buffer.extend(sources[beam], counts[beam])

    def truncate(self, Py_ssize_t num_tokens, beam=None):
        """Drop the tail so the beam (every beam for None) keeps ``num_tokens``: O(1).

        Used to drop rejected draft tokens or to rewind; never below the prompt.
        """
        cdef Int32Buffer buffer
        buffers = self._beams if beam is None else [beam_of(self, beam)]
        if num_tokens < self._prompt_len:
            raise ValueError(f"num_tokens {num_tokens} is below prompt_len {self._prompt_len}")
        for buffer in buffers:
            if num_tokens > buffer.size:
                raise ValueError(f"num_tokens {num_tokens} exceeds the {buffer.size} tokens in the beam")
        for buffer in buffers:
            buffer.truncate(num_tokens)

    # ---------------------------------------------------------------- chunked prefill
    @property
    def context_current_position(self):
        """The chunked-prefill cursor: prompt tokens already computed."""
        return self._context_position

    @context_current_position.setter
    def context_current_position(self, value_arg):
        cdef Py_ssize_t value = _tokens.as_integer(value_arg, "context_current_position")  # (named in its errors)
        if value < 0 or value > self._prompt_len:
            raise ValueError(f"context_current_position {value} is outside [0, prompt_len={self._prompt_len}]")
        self._context_position = value
        self._chunk_size = min(self._chunk_size, self._prompt_len - value)

    @context_current_position.deleter
    def context_current_position(self):
        _invariants.no_deleter(self, "context_current_position")

    @property
    def context_chunk_size(self):
        """Prompt tokens in the next chunk; setting stores min(size, remaining)."""
        return self._chunk_size

    @context_chunk_size.setter
    def context_chunk_size(self, value_arg):
        cdef Py_ssize_t value = _tokens.as_integer(value_arg, "context_chunk_size")  # (named in its errors)
        if value < 0:
            raise ValueError(f"context_chunk_size must be >= 0, got {value}")
        self._chunk_size = min(value, self._prompt_len - self._context_position)

    @context_chunk_size.deleter
    def context_chunk_size(self):
        _invariants.no_deleter(self, "context_chunk_size")

    @property
    def context_remaining_length(self):
        return self._prompt_len - self._context_position

    @property
    def is_first_context_chunk(self):
        return self._context_position == 0

    @property
    def is_last_context_chunk(self):
        return self._context_position + self._chunk_size == self._prompt_len

    def move_to_next_context_chunk(self):
        """Advance the cursor past the current chunk; the next chunk keeps its size, clamped."""
        self._context_position += self._chunk_size
        self._chunk_size = min(self._chunk_size, self._prompt_len - self._context_position)

    # ----------------------------------------------------------- speculative decoding
    @property
    def draft_tokens(self):
        """The draft tokens proposed for the next step, as a new list."""
        return self._draft_tokens.tolist(0, self._draft_tokens.size)

    @draft_tokens.setter
    def draft_tokens(self, tokens):
        drafts = _tokens.as_int32_array(() if tokens is None else tokens, "draft_tokens")
        self._draft_tokens = Int32Buffer(drafts) if len(drafts) else NO_DRAFTS

    @draft_tokens.deleter
    def draft_tokens(self):
        _invariants.no_deleter(self, "draft_tokens")

    @property
    def num_draft_tokens(self):
        return self._draft_tokens.size

    @property
    def has_draft_tokens(self):
        return self._draft_tokens.size > 0

    # ---------------------------------------------------------------------- preemption
    def pause(self, Py_ssize_t max_input_len):
        """Preempt: generated tokens become prompt (up to ``max_input_len`` tokens), the
        cursor goes back to 0, state to CONTEXT_INIT; drafts, slot and blocks are dropped.

        With several beams the generated tokens are dropped instead (beam search restarts).
        Returns, per layer group, the block ids the tables held (entries a sliding window
        released, which read -1, left out), so that the engine can free them.
        """
        cdef Int32Buffer buffer
        cdef Py_ssize_t new_prompt_len
        cdef BlockTable table
        cdef tuple tables = self._block_tables
        cdef Py_ssize_t prompt_len = self._prompt_len
        if max_input_len < prompt_len:
            raise ValueError(f"max_input_len {max_input_len} is below prompt_len {self._prompt_len}")
        held = []  # first: the lists are all this allocates, so a failure changes nothing
        for table in tables:  # (a loop: no list comprehension in the core, _core.pyx)
            held.append(table._buffer.tolist(table._buffer.num_released, table._buffer.size))
        # making them can run code (a collection's callbacks) that changed a table: the ids
        # it added would be dropped below without being returned (refused instead)
        if self._block_tables is not tables or self._prompt_len != prompt_len or not lists_hold_tables(held, tables):
            _invariants.changed_during("pause", "changed (its prompt or a block table)")
        if self._beam_width == 1:
            new_prompt_len = min(max_input_len, self._beam0.size)
            if self._max_new_tokens != NO_LIMIT:
                self._max_new_tokens = max(0, self._max_new_tokens - (new_prompt_len - self._prompt_len))
            self._prompt_len = new_prompt_len
        for buffer in self._beams:
            buffer.truncate(self._prompt_len)
        self._state = CONTEXT_INIT
        self._state_code = 0
        self._context_position = 0
        self._chunk_size = self._prompt_len
        self._draft_tokens = NO_DRAFTS
        self._seq_slot = NO_SLOT
        for table in tables:  # BlockTable.truncate(0), inline
            buffer = table._buffer
            buffer.truncate(0)
            buffer.num_released = 0
        self._num_pauses += 1
        return held
