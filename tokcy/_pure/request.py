"""``Request`` in plain Python/numpy: the readable reference of the semantics.

The compiled ``tokcy._core`` implements exactly this, call for call and error for error.
Every method validates all of its arguments before it changes anything, so a call that
raises leaves the object as it was. Its ``BlockTable`` is in ``tokcy._pure.block_table``.
"""

import numpy as np

from tokcy import _invariants, _pickle, _repr
from tokcy._pure.block_table import BlockTable, signature_of_init
from tokcy._pure.buffer import Int32Buffer
from tokcy._state import RequestState
from tokcy._tokens import INT32_MAX, as_clamped_index, as_index, as_int32_array, as_integer, check_beam, check_token


class Request:
    """One request: per-beam int32 token buffers (prompt, then generated tokens), the
    chunked-prefill cursor, draft tokens and one ``BlockTable`` per layer group."""

    __slots__ = (
        "_request_id",
        "_beams",
        "_prompt_len",
        "_orig_prompt_len",
        "_max_new_tokens",
        "_state",
        "_seq_slot",
        "_context_position",
        "_chunk_size",
        "_draft_tokens",
        "_block_tables",
        "_num_pauses",
    )

    def __new__(cls, *args, **kwargs):
        # A blank request (id 0, one empty beam, no block tables) until __init__ runs, as
        # the compiled core's __cinit__ makes it: a subclass that skips super().__init__
        # gets the same object on both backends.
        self = super().__new__(cls)
        self._request_id = 0
        self._beams = [Int32Buffer(np.empty(0, dtype=np.int32))]
        self._prompt_len = self._orig_prompt_len = 0
        self._max_new_tokens = None
        self._state = RequestState.CONTEXT_INIT
        self._seq_slot = None
        self._context_position = self._chunk_size = 0
        self._draft_tokens = np.empty(0, dtype=np.int32)
        self._block_tables = ()
        self._num_pauses = 0
        return self

    def __init__(self, request_id, prompt, *, beam_width=1, max_new_tokens=None, num_layer_groups=1):
        request_id = as_integer(request_id, "request_id")
        tokens = _invariants.check_prompt(as_int32_array(prompt, "prompt"))
        beam_width = _invariants.check_beam_width(beam_width)
        if max_new_tokens is not None:
            max_new_tokens = as_integer(max_new_tokens, "max_new_tokens")
            if max_new_tokens < 0:
                raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        num_layer_groups = _invariants.check_num_layer_groups(num_layer_groups)
        # a second __init__ re-initialises everything, exactly as a new Request (both backends);
        # every new buffer and table is made before any field changes, as the compiled twin does
        beams = [Int32Buffer(tokens) for _ in range(beam_width)]
        drafts = np.empty(0, dtype=np.int32)
        tables = tuple(BlockTable() for _ in range(num_layer_groups))
        prompt_len = len(tokens)
        state = RequestState.CONTEXT_INIT  # (read first too: an attribute lookup may allocate)
        self._request_id = request_id
        self._beams = beams
        self._prompt_len = self._orig_prompt_len = prompt_len
        self._max_new_tokens = max_new_tokens
        self._state = state
        self._seq_slot = None
        self._context_position = 0
        self._chunk_size = prompt_len
        self._draft_tokens = drafts
        self._block_tables = tables
        self._num_pauses = 0

    __signature__ = signature_of_init(__init__)

    # ----------------------------------------------------------------- pickling, repr
    def _state_dict(self):
        return {
            "request_id": self._request_id,
            "beams": [beam.tolist(0, beam.size) for beam in self._beams],
            "dirty_from": [beam.dirty_from for beam in self._beams],
            "prompt_len": self._prompt_len,
            "orig_prompt_len": self._orig_prompt_len,
            "max_new_tokens": self._max_new_tokens,
            "state": int(self._state),
            "seq_slot": self._seq_slot,
            "context_current_position": self._context_position,
            "context_chunk_size": self._chunk_size,
            "draft_tokens": self._draft_tokens.tolist(),
            "block_tables": [table.__reduce__()[1][1:5] for table in self._block_tables],
            "num_pauses": self._num_pauses,
            "dict": None if type(self) is Request else _pickle.subclass_attributes(self, Request),
        }

    @classmethod
    def _from_state(cls, state):
        """A Request from the plain state of ``__reduce__``, every invariant checked first."""
        state = _invariants.checked_request_state(state)
        beams = []
        for tokens, dirty_from in zip(state["beams"], state["dirty_from"]):
            beam = Int32Buffer(tokens)
            beam.dirty_from = dirty_from
            beams.append(beam)
        tables = tuple(_pickle.restore_block_table(BlockTable, *table) for table in state["block_tables"])
        self = cls.__new__(cls)  # every buffer and table made first, as the compiled twin does
        self._request_id = state["request_id"]
        self._beams = beams
        self._prompt_len = state["prompt_len"]
        self._orig_prompt_len = state["orig_prompt_len"]
        self._max_new_tokens = state["max_new_tokens"]
        self._state = state["state"]
        self._seq_slot = state["seq_slot"]
        self._context_position = state["context_current_position"]
        self._chunk_size = state["context_chunk_size"]
        self._draft_tokens = state["draft_tokens"]
        self._block_tables = tables
        self._num_pauses = state["num_pauses"]
        if state["dict"]:
            _pickle.restore_subclass_attributes(self, Request, state["dict"])
        return self

    def __reduce__(self):
        cls = None if type(self) is Request else type(self)
        return (_pickle.restore_request, (cls, _pickle.read_whole(self._state_dict)))

    def __repr__(self):
        return _repr.request_repr(type(self).__name__, self)

    # ------------------------------------------------------------------ plain fields
    @property
    def request_id(self):
        return self._request_id

    @property
    def beam_width(self):
        return len(self._beams)

    @property
    def max_new_tokens(self):
        """The generation budget, or None for no limit; ``pause`` subtracts what became prompt."""
        return self._max_new_tokens

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

    @state.deleter
    def state(self):
        _invariants.no_deleter(self, "state")

    @property
    def seq_slot(self):
        """The engine's slot for this request (indexes the previous step's device tokens), or None."""
        return self._seq_slot

    @seq_slot.setter
    def seq_slot(self, value):
        if value is not None:
            value = as_integer(value, "seq_slot")
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
    def _beam(self, beam):
        """The buffer of ``beam`` (already an index); IndexError outside the beams."""
        check_beam(beam, len(self._beams))
        return self._beams[beam]

    def get_num_tokens(self, beam):
        """Tokens in ``beam``: O(1)."""
        return self._beam(as_index(beam)).size

    def get_tokens(self, beam=None):
        """A new list of the beam's tokens (all beams for no argument): O(n), compatibility only."""
        if beam is None:
            return [buffer.tolist(0, buffer.size) for buffer in self._beams]
        buffer = self._beam(as_index(beam))
        return buffer.tolist(0, buffer.size)

    def get_tokens_range(self, beam, begin, end):
        """Tokens ``[b, e)`` with b = clamp(begin, 0, n), e = clamp(end, b, n): O(e - b).

        Not Python slicing: a negative ``begin`` counts as 0 and ``begin >= end`` gives [].
        """
        beam, begin, end = as_index(beam), as_clamped_index(begin), as_clamped_index(end)
        buffer = self._beam(beam)
        return buffer.tolist(*buffer.clamp(begin, end))

    def get_tokens_view(self, beam=0, begin=0, end=None):
        """A read-only zero-copy numpy snapshot of ``[begin, end)`` clamped as in ``get_tokens_range``.

        The view never changes and never dangles: later writes that would touch what it
        shows go to fresh storage instead.
        """
        beam, begin = as_index(beam), as_clamped_index(begin)
        buffer = self._beam(beam)
        end = buffer.size if end is None else as_clamped_index(end)
        return buffer.view(*buffer.clamp(begin, end))

    def get_token(self, beam, pos):
        """One token; IndexError outside ``[0, n)``."""
        beam, pos = as_index(beam), as_index(pos)
        buffer = self._beam(beam)
        if not 0 <= pos < buffer.size:
            raise IndexError(f"token position {pos} is out of range for {buffer.size} tokens")
        return buffer.get(pos)

    def get_last_tokens(self, beam=None):
        """The last token of ``beam``, or a list of every beam's last token: O(1) / O(beams)."""
        if beam is None:
            return [self._last(index, buffer) for index, buffer in enumerate(self._beams)]
        beam = as_index(beam, "beam")
        return self._last(beam, self._beam(beam))

    @staticmethod
    def _last(beam, buffer):
        if buffer.size == 0:
            raise IndexError(f"beam {beam} has no tokens")
        return buffer.last()

    @property
    def max_beam_num_tokens(self):
        """Tokens in the longest beam."""
        return max(buffer.size for buffer in self._beams)

    @property
    def max_num_generated_tokens(self):
        """Tokens in the longest beam minus the prompt."""
        return self.max_beam_num_tokens - self._prompt_len

    @property
    def reached_max_new_tokens(self):
        """True when ``max_new_tokens`` is set and the longest beam has generated that many.

        tokcy never refuses a token because of the budget: the engine checks this (O(beams))
        after sampling and finishes the request.
        """
        return self._max_new_tokens is not None and self.max_num_generated_tokens >= self._max_new_tokens

    def add_new_token(self, token, beam=0):
        """Append one token to ``beam``; returns the beam's new length. Amortised O(1)."""
        beam = as_index(beam)
        token = check_token(token, "token")
        beams = self._beams
        buffer = self._beam(beam)
        self._append_to_beam(beams, buffer, token, "add_new_token")
        return buffer.size

    def add_new_tokens(self, per_beam):
        """Append one token to every beam (``per_beam[b]`` to beam b); returns beam 0's new length.

        All entries are checked before any beam changes.
        """
        beams = self._beams
        tokens = self._per_beam(per_beam)
        checked = [check_token(token, f"per_beam[{beam}]") for beam, token in enumerate(tokens)]
        self._same_beams(beams, "per_beam")
        if len(beams) == 1:
            self._append_to_beam(beams, beams[0], checked[0], "add_new_tokens")
            return beams[0].size
        # every beam's room and its token as an int32 array first: the writes allocate nothing
        rooms = [buffer.room(buffer.size, 1) for buffer in beams]
        values = np.array(checked, dtype=np.int32)
        tokens = [values[beam : beam + 1] for beam in range(len(beams))]
        if self._beams is not beams:  # an allocation ran code that re-initialised the request
            _invariants.changed_during("add_new_tokens", "re-initialised")
        for buffer, token, room in zip(beams, tokens, rooms):
            buffer.put(buffer.size, token, room)
        return beams[0].size

    def _append_to_beam(self, beams, buffer, token, call):
        """Append ``token`` to ``buffer``, one of ``beams`` (the request's beams when ``call``
        began). Growing it can run Python code (a weakref callback as the old storage goes)
        that re-initialises the request: refused then, before anything is written, as the
        write would go to a beam the request no longer has."""
        while not buffer.has_room(buffer.size, 1):  # (the code may also have grown or shared it)
            buffer.room(buffer.size, 1)
            if self._beams is not beams:
                _invariants.changed_during(call, "re-initialised")
        buffer.append(token)  # (room made: no allocation, no Python code)

    def set_generated_tokens(self, per_beam):
        """Replace everything after the prompt: beam b becomes prompt + ``per_beam[b]``."""
        beams = self._beams
        arrays = [
            as_int32_array(tokens, f"per_beam[{beam}]") for beam, tokens in enumerate(self._per_beam(per_beam))
        ]
        self._same_beams(beams, "per_beam")
        prompt_len = self._prompt_len
        # every beam's room first: the writes allocate nothing, so a failure changes no beam
        rooms = [buffer.room(prompt_len, len(tokens)) for buffer, tokens in zip(beams, arrays)]
        if self._beams is not beams or self._prompt_len != prompt_len:  # an allocation ran code that changed them
            _invariants.changed_during("set_generated_tokens")
        for buffer, tokens, room in zip(beams, arrays, rooms):
            buffer.put(prompt_len, tokens, room)

    def _same_beams(self, beams, argument):
        if self._beams is not beams:  # a conversion ran the caller's code, which re-initialised us
            _invariants.reinitialised_during(argument)

    def _per_beam(self, per_beam):
        if isinstance(per_beam, (str, bytes)) or not hasattr(per_beam, "__len__"):
            raise TypeError(f"per_beam must be a sequence with one entry per beam, not {type(per_beam).__name__}")
        per_beam = tuple(per_beam)  # owned: element conversion may run caller code
        if len(per_beam) != len(self._beams):
            raise ValueError(f"per_beam has {len(per_beam)} entries but beam_width is {len(self._beams)}")
        return per_beam

    def truncate(self, num_tokens, beam=None):
        """Drop the tail so the beam (every beam for None) keeps ``num_tokens``: O(1).

        Used to drop rejected draft tokens or to rewind; never below the prompt.
        """
        num_tokens = as_index(num_tokens, "num_tokens")
        buffers = self._beams if beam is None else [self._beam(as_index(beam))]
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
    def context_current_position(self, value):
        value = as_integer(value, "context_current_position")
        if not 0 <= value <= self._prompt_len:
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
    def context_chunk_size(self, value):
        value = as_integer(value, "context_chunk_size")
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
        position = self._context_position + self._chunk_size  # (both first: the writes allocate nothing)
        chunk = min(self._chunk_size, self._prompt_len - position)
        self._context_position = position
        self._chunk_size = chunk

    # ----------------------------------------------------------- speculative decoding
    @property
    def draft_tokens(self):
        """The draft tokens proposed for the next step, as a new list."""
        return self._draft_tokens.tolist()

    @draft_tokens.setter
    def draft_tokens(self, tokens):
        self._draft_tokens = as_int32_array(() if tokens is None else tokens, "draft_tokens")

    @draft_tokens.deleter
    def draft_tokens(self):
        _invariants.no_deleter(self, "draft_tokens")

    @property
    def num_draft_tokens(self):
        return len(self._draft_tokens)

    @property
    def has_draft_tokens(self):
        return len(self._draft_tokens) > 0

    # ---------------------------------------------------------------------- preemption
    def pause(self, max_input_len):
        """Preempt: generated tokens become prompt (up to ``max_input_len`` tokens), the
        cursor goes back to 0, state to CONTEXT_INIT; drafts, slot and blocks are dropped.

        With several beams the generated tokens are dropped instead (beam search restarts).
        Returns, per layer group, the block ids the tables held (entries a sliding window
        released, which read -1, left out), so that the engine can free them.
        """
        max_input_len = as_index(max_input_len, "max_input_len")
        if max_input_len < self._prompt_len:
            raise ValueError(f"max_input_len {max_input_len} is below prompt_len {self._prompt_len}")
        # every new value first: the writes below allocate nothing, so a failure changes nothing
        block_tables, prompt_before = self._block_tables, self._prompt_len
        held = [table._buffer.tolist(table._num_released, table._buffer.size) for table in block_tables]
        prompt_len, max_new_tokens = self._prompt_len, self._max_new_tokens
        if len(self._beams) == 1:
            prompt_len = min(max_input_len, self._beams[0].size)
            if max_new_tokens is not None:
                max_new_tokens = max(0, max_new_tokens - (prompt_len - self._prompt_len))
        drafts = np.empty(0, dtype=np.int32)
        state = RequestState.CONTEXT_INIT
        num_pauses = self._num_pauses + 1
        beams, tables = iter(self._beams), iter(block_tables)  # (a loop makes its iterator: made here)
        # code that ran meanwhile (a collection's callbacks, which only an allocation of a
        # tracked object starts) may have changed a table, whose added ids would be dropped
        # below without being returned, or the lists themselves (gc.get_objects finds them).
        # The lists are read as they are now, by the compiled twin's rules (a list per
        # table, of ints equal to its ids), making nothing tracked (numpy scalars, ints and
        # ranges are not)
        changed = (self._block_tables is not block_tables or self._prompt_len != prompt_before
                   or len(held) != len(block_tables))
        for group in range(0 if changed else len(block_tables)):
            table, ids = block_tables[group], held[group]
            buffer, begin = table._buffer, table._num_released
            storage = buffer.storage
            if type(ids) is not list or buffer.size - begin != len(ids):
                changed = True
                break
            for index in range(len(ids)):
                item = ids[index]
                if type(item) is not int or storage[begin + index] != item:
                    changed = True
                    break
        if changed:
            _invariants.changed_during("pause", "changed (its prompt or a block table)")
        self._prompt_len = prompt_len
        self._max_new_tokens = max_new_tokens
        for buffer in beams:
            buffer.truncate(prompt_len)
        self._state = state
        self._context_position = 0
        self._chunk_size = prompt_len
        self._draft_tokens = drafts
        self._seq_slot = None
        for table in tables:
            table._buffer.truncate(0)
            table._num_released = 0
        self._num_pauses = num_pauses
        return held

