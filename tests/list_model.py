"""An independent model of ``Request`` and ``BlockTable`` made of plain Python lists.

Written from the documented behaviour (docs/request.md: the accessor table, chunked
prefill, draft tokens, block tables; docs/threads-and-errors.md: the exception types), not
from either backend: it imports nothing from tokcy. Every beam is a plain list; a view is
a tuple copied when it is taken. Exceptions have the types those pages give; the
model validates every argument before it changes anything, so a failing call leaves it
as it was. Messages are not modelled (the differential test compares them between the
two backends instead).

``observe(obj)`` works on the model and on a real ``Request`` alike: it reads every
public observable into a plain dict so that two objects can be compared with ``==``.
"""

import operator

import numpy as np

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

CONTEXT_INIT = 0
GENERATION_IN_PROGRESS = 1
GENERATION_COMPLETE = 2
STATES = (CONTEXT_INIT, GENERATION_IN_PROGRESS, GENERATION_COMPLETE)


# ------------------------------------------------------------------------- validation
def index(value):
    """An integer argument (beam, position, count): anything with ``__index__``."""
    return operator.index(value)  # TypeError for floats, None, strings


def token(value):
    """One token / block id: an int (or numpy int) that fits int32."""
    if value is None or isinstance(value, (float, np.floating)):
        raise TypeError("token id must be an integer")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError("token id must be an integer") from None
    if not INT32_MIN <= number <= INT32_MAX:
        raise OverflowError("token id does not fit in int32")
    return number


def token_list(values):
    """A 1-D sequence or integer array of token ids, as a new list of ints."""
    if isinstance(values, (str, bytes, bytearray)) or not hasattr(values, "__len__"):
        raise TypeError("expected a sequence of token ids")
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise ValueError("expected a 1-D array")
        if values.dtype.kind not in "iu":
            raise TypeError("expected an integer array")
        out = [int(v) for v in values.tolist()]
        for v in out:
            if not INT32_MIN <= v <= INT32_MAX:
                raise OverflowError("token id does not fit in int32")
        return out
    # a nested list (2-D input) is a ValueError, a ragged one a TypeError on its element
    if len(values) and all(isinstance(v, (list, tuple, np.ndarray)) for v in values):
        lengths = {len(v) for v in values}
        if len(lengths) == 1:
            raise ValueError("expected 1-D input")
    return [token(v) for v in values]


def check_beam(beam, width):
    beam = index(beam)
    if not 0 <= beam < width:
        raise IndexError("beam out of range")
    return beam


def per_beam_entries(per_beam, width):
    if isinstance(per_beam, (str, bytes)) or not hasattr(per_beam, "__len__"):
        raise TypeError("per_beam must be a sequence")
    if isinstance(per_beam, np.ndarray) and per_beam.ndim != 1:
        per_beam = list(per_beam)
    if len(per_beam) != width:
        raise ValueError("per_beam needs one entry per beam")
    return per_beam


# ----------------------------------------------------------------------------- model
class ModelBlockTable:
    def __init__(self, block_ids=()):
        ids = token_list(block_ids)
        if any(i < 0 for i in ids):
            raise ValueError("negative block id")
        self.ids = ids
        self.num_released = 0

    def __len__(self):
        return len(self.ids)

    def _position(self, i):
        i = index(i)
        p = i + len(self.ids) if i < 0 else i
        if not 0 <= p < len(self.ids):
            raise IndexError("block table index out of range")
        return p

    def __getitem__(self, i):
        return self.ids[self._position(i)]

    def __setitem__(self, i, block_id):
        p = self._position(i)
        block_id = token(block_id)
        if block_id < 0:
            raise ValueError("negative block id")
        if p < self.num_released:
            raise ValueError("released block")
        self.ids[p] = block_id

    def append(self, block_id):
        block_id = token(block_id)
        if block_id < 0:
            raise ValueError("negative block id")
        self.ids.append(block_id)
        return len(self.ids)

    def extend(self, block_ids):
        ids = token_list(block_ids)
        if any(i < 0 for i in ids):
            raise ValueError("negative block id")
        self.ids.extend(ids)
        return len(self.ids)

    def truncate(self, n):
        n = index(n)
        if not 0 <= n <= len(self.ids):
            raise ValueError("num_blocks out of range")
        del self.ids[n:]
        self.num_released = min(self.num_released, n)

    def clear(self):
        self.truncate(0)

    def release_front(self, k):
        k = index(k)
        if k < self.num_released:
            raise ValueError("num_released may not decrease")
        if k > len(self.ids):
            raise ValueError("num_released exceeds the table")
        for p in range(k):
            self.ids[p] = -1
        self.num_released = k

    def tolist(self):
        return list(self.ids)

    def view(self):
        return tuple(self.ids)


class ModelRequest:
    def __init__(self, request_id, prompt, *, beam_width=1, max_new_tokens=None, num_layer_groups=1):
        request_id = index(request_id)
        prompt = token_list(prompt)
        beam_width = index(beam_width)
        if beam_width < 1:
            raise ValueError("beam_width")
        if max_new_tokens is not None:
            max_new_tokens = index(max_new_tokens)
            if max_new_tokens < 0:
                raise ValueError("max_new_tokens")
        num_layer_groups = index(num_layer_groups)
        if num_layer_groups < 1:
            raise ValueError("num_layer_groups")
        self.request_id = request_id
        self.beams = [list(prompt) for _ in range(beam_width)]
        self.prompt_len = self.orig_prompt_len = len(prompt)
        self.max_new_tokens = max_new_tokens
        self._state = CONTEXT_INIT
        self._seq_slot = None
        self.cursor = 0
        self.chunk = len(prompt)
        self.drafts = []
        self.block_tables = tuple(ModelBlockTable() for _ in range(num_layer_groups))

    @property
    def beam_width(self):
        return len(self.beams)

    # plain read-write fields
    @property
    def state(self):
        return self._state

    @state.setter
    def state(self, value):
        value = index(value)
        if value not in STATES:
            raise ValueError("state")
        self._state = value

    @property
    def seq_slot(self):
        return self._seq_slot

    @seq_slot.setter
    def seq_slot(self, value):
        if value is not None:
            value = index(value)
            if value < 0:
                raise ValueError("seq_slot")
        self._seq_slot = value

    # token accessors
    def get_num_tokens(self, beam):
        return len(self.beams[check_beam(beam, self.beam_width)])

    def get_tokens(self, beam=None):
        if beam is None:
            return [list(b) for b in self.beams]
        return list(self.beams[check_beam(beam, self.beam_width)])

    def _clamp(self, n, begin, end):
        b = min(max(begin, 0), n)
        e = min(max(end, b), n)
        return b, e

    def get_tokens_range(self, beam, begin, end):
        tokens = self.beams[check_beam(beam, self.beam_width)]
        b, e = self._clamp(len(tokens), index(begin), index(end))
        return tokens[b:e]

    def get_tokens_view(self, beam=0, begin=0, end=None):
        tokens = self.beams[check_beam(beam, self.beam_width)]
        begin = index(begin)
        end = len(tokens) if end is None else index(end)
        b, e = self._clamp(len(tokens), begin, end)
        return tuple(tokens[b:e])

    def get_token(self, beam, pos):
        tokens = self.beams[check_beam(beam, self.beam_width)]
        pos = index(pos)
        if not 0 <= pos < len(tokens):
            raise IndexError("token position out of range")
        return tokens[pos]

    def get_last_tokens(self, beam=None):
        beams = range(self.beam_width) if beam is None else [check_beam(beam, self.beam_width)]
        last = []
        for b in beams:
            if not self.beams[b]:
                raise IndexError("empty beam")
            last.append(self.beams[b][-1])
        return last if beam is None else last[0]

    @property
    def max_beam_num_tokens(self):
        return max(len(b) for b in self.beams)

    @property
    def max_num_generated_tokens(self):
        return self.max_beam_num_tokens - self.prompt_len

    @property
    def reached_max_new_tokens(self):
        return self.max_new_tokens is not None and self.max_num_generated_tokens >= self.max_new_tokens

    def add_new_token(self, tok, beam=0):
        tok = token(tok)
        beam = check_beam(beam, self.beam_width)
        self.beams[beam].append(tok)
        return len(self.beams[beam])

    def add_new_tokens(self, per_beam):
        entries = per_beam_entries(per_beam, self.beam_width)
        toks = [token(t) for t in entries]
        for b, t in zip(self.beams, toks):
            b.append(t)
        return len(self.beams[0])

    def set_generated_tokens(self, per_beam):
        entries = per_beam_entries(per_beam, self.beam_width)
        lists = [token_list(t) for t in entries]
        for b, new in zip(self.beams, lists):
            del b[self.prompt_len :]
            b.extend(new)

    def truncate(self, num_tokens, beam=None):
        num_tokens = index(num_tokens)
        targets = range(self.beam_width) if beam is None else [check_beam(beam, self.beam_width)]
        if num_tokens < self.prompt_len:
            raise ValueError("below prompt")
        if any(num_tokens > len(self.beams[b]) for b in targets):
            raise ValueError("above beam size")
        for b in targets:
            del self.beams[b][num_tokens:]

    # chunked prefill
    @property
    def context_current_position(self):
        return self.cursor

    @context_current_position.setter
    def context_current_position(self, value):
        value = index(value)
        if not 0 <= value <= self.prompt_len:
            raise ValueError("context_current_position")
        self.cursor = value
        self.chunk = min(self.chunk, self.prompt_len - value)

    @property
    def context_chunk_size(self):
        return self.chunk

    @context_chunk_size.setter
    def context_chunk_size(self, value):
        value = index(value)
        if value < 0:
            raise ValueError("context_chunk_size")
        self.chunk = min(value, self.prompt_len - self.cursor)

    @property
    def context_remaining_length(self):
        return self.prompt_len - self.cursor

    @property
    def is_first_context_chunk(self):
        return self.cursor == 0

    @property
    def is_last_context_chunk(self):
        return self.cursor + self.chunk == self.prompt_len

    def move_to_next_context_chunk(self):
        self.cursor += self.chunk
        self.chunk = min(self.chunk, self.prompt_len - self.cursor)

    # drafts
    @property
    def draft_tokens(self):
        return list(self.drafts)

    @draft_tokens.setter
    def draft_tokens(self, tokens):
        self.drafts = [] if tokens is None else token_list(tokens)

    @property
    def num_draft_tokens(self):
        return len(self.drafts)

    @property
    def has_draft_tokens(self):
        return bool(self.drafts)

    # preemption
    def pause(self, max_input_len):
        max_input_len = index(max_input_len)
        if max_input_len < self.prompt_len:
            raise ValueError("max_input_len below prompt_len")
        if self.beam_width == 1:
            new_prompt_len = min(max_input_len, len(self.beams[0]))
            if self.max_new_tokens is not None:
                self.max_new_tokens = max(0, self.max_new_tokens - (new_prompt_len - self.prompt_len))
            self.prompt_len = new_prompt_len
        for b in self.beams:
            del b[self.prompt_len :]
        self._state = CONTEXT_INIT
        self.cursor = 0
        self.chunk = self.prompt_len
        self.drafts = []
        self._seq_slot = None
        held = [list(t.ids[t.num_released :]) for t in self.block_tables]
        for t in self.block_tables:
            t.truncate(0)
        return held


# ------------------------------------------------------------------------- observing
def _try(call):
    try:
        return call()
    except (IndexError, ValueError, TypeError, OverflowError) as error:
        return ("raises", type(error).__name__)


def observe_table(table, views=True):
    n = len(table)
    seen = {
        "ids": table.tolist(),
        "len": n,
        "num_released": table.num_released,
        "items": [table[i] for i in range(n)],
        "negative_items": [table[i] for i in range(-n, 0)],
    }
    if views:
        seen["view"] = [int(v) for v in table.view()]
    return seen


def observe(request, views=True):
    """Every public observable of a Request (real or model) as a plain dict.

    ``views=False`` leaves out the numpy views, whose taking changes when the buffers
    must copy on write (so a test can also exercise the writes no view can see).
    """
    width = request.beam_width
    seen = {
        "request_id": request.request_id,
        "beam_width": width,
        "prompt_len": request.prompt_len,
        "orig_prompt_len": request.orig_prompt_len,
        "max_new_tokens": request.max_new_tokens,
        "state": int(request.state),
        "seq_slot": request.seq_slot,
        "tokens": request.get_tokens(),
        "beam_tokens": [request.get_tokens(b) for b in range(width)],
        "num_tokens": [request.get_num_tokens(b) for b in range(width)],
        "full_ranges": [request.get_tokens_range(b, 0, request.get_num_tokens(b)) for b in range(width)],
        "last": [_try(lambda b=b: request.get_last_tokens(b)) for b in range(width)],
        "last_all": _try(request.get_last_tokens),
        "max_beam_num_tokens": request.max_beam_num_tokens,
        "max_num_generated_tokens": request.max_num_generated_tokens,
        "reached_max_new_tokens": request.reached_max_new_tokens,
        "cursor": request.context_current_position,
        "chunk": request.context_chunk_size,
        "remaining": request.context_remaining_length,
        "is_first": request.is_first_context_chunk,
        "is_last": request.is_last_context_chunk,
        "drafts": request.draft_tokens,
        "num_drafts": request.num_draft_tokens,
        "has_drafts": request.has_draft_tokens,
        "block_tables": [observe_table(t, views) for t in request.block_tables],
    }
    if views:
        seen["full_views"] = [[int(v) for v in request.get_tokens_view(b)] for b in range(width)]
    return seen
