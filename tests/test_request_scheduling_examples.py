"""Exact small worked examples for a request's scheduling state in docs/request.md: the
chunked-prefill cursor, draft tokens, pause, the state and the sequence slot.

Every expected value is written out by hand; nothing is computed by the code under test.
Each test runs once per backend (fixture ``backend``).
"""

import numpy as np

from tokcy import RequestState


# ------------------------------------------------------------------ chunked prefill
def test_chunked_prefill_walk(backend):
    r = backend.Request(1, list(range(10)))
    assert (r.context_current_position, r.context_chunk_size, r.context_remaining_length) == (0, 10, 10)
    assert r.is_first_context_chunk is True
    assert r.is_last_context_chunk is True
    r.context_chunk_size = 9
    assert r.is_last_context_chunk is False  # 0 + 9 != 10
    r.context_chunk_size = 4
    assert r.context_chunk_size == 4
    assert r.is_last_context_chunk is False
    r.move_to_next_context_chunk()
    assert (r.context_current_position, r.context_chunk_size, r.context_remaining_length) == (4, 4, 6)
    assert r.is_first_context_chunk is False
    assert r.is_last_context_chunk is False
    r.move_to_next_context_chunk()
    # remaining 2 < 4: the chunk is clamped
    assert (r.context_current_position, r.context_chunk_size, r.context_remaining_length) == (8, 2, 2)
    assert r.is_last_context_chunk is True
    r.move_to_next_context_chunk()
    assert (r.context_current_position, r.context_chunk_size, r.context_remaining_length) == (10, 0, 0)
    assert r.is_last_context_chunk is True
    r.move_to_next_context_chunk()
    assert (r.context_current_position, r.context_chunk_size) == (10, 0)


def test_chunk_setter_stores_min_of_size_and_remaining(backend):
    r = backend.Request(1, list(range(10)))
    r.context_chunk_size = 25
    assert r.context_chunk_size == 10
    r.context_chunk_size = 0
    assert r.context_chunk_size == 0
    assert r.is_last_context_chunk is False
    r.context_current_position = 7
    r.context_chunk_size = 5
    assert r.context_chunk_size == 3


def test_cursor_setter_clamps_chunk(backend):
    r = backend.Request(1, list(range(10)))
    r.context_chunk_size = 6
    r.context_current_position = 8
    assert r.context_chunk_size == 2
    assert r.context_remaining_length == 2
    r.context_current_position = 1  # chunk does not grow back
    assert r.context_chunk_size == 2
    r.context_current_position = 10
    assert r.context_chunk_size == 0
    assert r.is_last_context_chunk is True
    r.context_current_position = 0
    assert r.context_chunk_size == 0
    assert r.is_first_context_chunk is True


def test_chunked_prefill_empty_prompt(backend):
    r = backend.Request(1, [])
    assert (r.context_current_position, r.context_chunk_size, r.context_remaining_length) == (0, 0, 0)
    assert r.is_first_context_chunk is True
    assert r.is_last_context_chunk is True
    r.move_to_next_context_chunk()
    assert (r.context_current_position, r.context_chunk_size) == (0, 0)


def test_generated_tokens_do_not_move_the_cursor(backend):
    r = backend.Request(1, [1, 2, 3])
    r.context_chunk_size = 2
    r.add_new_token(4)
    assert (r.context_current_position, r.context_chunk_size, r.context_remaining_length) == (0, 2, 3)


# -------------------------------------------------------------------------- drafts
def test_draft_tokens(backend):
    r = backend.Request(1, [1])
    r.draft_tokens = [5, 6, 7]
    assert r.draft_tokens == [5, 6, 7]
    assert r.num_draft_tokens == 3
    assert r.has_draft_tokens is True
    got = r.draft_tokens
    got.append(8)
    assert r.draft_tokens == [5, 6, 7]
    source = np.array([9, 10], dtype=np.int64)
    r.draft_tokens = source
    source[0] = 0
    assert r.draft_tokens == [9, 10]
    assert r.num_draft_tokens == 2
    r.draft_tokens = []
    assert r.draft_tokens == []
    assert r.num_draft_tokens == 0
    assert r.has_draft_tokens is False
    r.draft_tokens = (3,)
    r.draft_tokens = None
    assert r.draft_tokens == []
    assert r.get_tokens(0) == [1]  # drafts are not tokens


# --------------------------------------------------------------------------- pause
def test_pause_single_beam_folds_generated_tokens_into_prompt(backend):
    r = backend.Request(1, [1, 2, 3], max_new_tokens=10, num_layer_groups=2)
    for t in (4, 5, 6, 7):
        r.add_new_token(t)
    r.state = RequestState.GENERATION_IN_PROGRESS
    r.seq_slot = 3
    r.draft_tokens = [8, 9]
    r.context_chunk_size = 2
    r.move_to_next_context_chunk()
    r.block_tables[0].extend([1, 2, 3])
    r.block_tables[1].extend([4])
    r.block_tables[0].release_front(1)
    r.pause(100)
    assert r.prompt_len == 7
    assert r.orig_prompt_len == 3
    assert r.get_tokens() == [[1, 2, 3, 4, 5, 6, 7]]
    assert r.max_new_tokens == 6
    assert r.max_num_generated_tokens == 0
    assert r.state is RequestState.CONTEXT_INIT
    assert r.context_current_position == 0
    assert r.context_chunk_size == 7
    assert r.context_remaining_length == 7
    assert r.draft_tokens == []
    assert r.seq_slot is None
    assert [t.tolist() for t in r.block_tables] == [[], []]
    assert [t.num_released for t in r.block_tables] == [0, 0]


def test_pause_limited_by_max_input_len(backend):
    r = backend.Request(1, [1, 2, 3], max_new_tokens=10)
    for t in (4, 5, 6, 7):
        r.add_new_token(t)
    r.pause(5)
    assert r.prompt_len == 5
    assert r.get_tokens(0) == [1, 2, 3, 4, 5]
    assert r.max_new_tokens == 8
    assert r.context_chunk_size == 5


def test_pause_max_new_tokens_floor_and_none(backend):
    r = backend.Request(1, [1], max_new_tokens=2)
    for t in (2, 3, 4, 5):
        r.add_new_token(t)
    r.pause(5)
    assert r.prompt_len == 5
    assert r.max_new_tokens == 0
    n = backend.Request(1, [1])
    n.add_new_token(2)
    n.pause(9)
    assert n.max_new_tokens is None
    assert n.prompt_len == 2


def test_pause_twice(backend):
    r = backend.Request(1, [1, 2], max_new_tokens=5)
    r.add_new_token(3)
    r.pause(3)
    r.add_new_token(4)
    r.add_new_token(5)
    r.pause(4)
    assert r.prompt_len == 4
    assert r.orig_prompt_len == 2
    assert r.get_tokens(0) == [1, 2, 3, 4]
    assert r.max_new_tokens == 3


def test_pause_at_prompt_len(backend):
    r = backend.Request(1, [1, 2], max_new_tokens=5)
    r.add_new_token(3)
    r.pause(2)
    assert r.prompt_len == 2
    assert r.get_tokens(0) == [1, 2]
    assert r.max_new_tokens == 5


def test_pause_with_beams_drops_generated_tokens(backend):
    r = backend.Request(1, [1, 2], beam_width=2, max_new_tokens=4)
    r.add_new_tokens([3, 4])
    r.add_new_token(5, 1)
    r.pause(10)
    assert r.prompt_len == 2
    assert r.get_tokens() == [[1, 2], [1, 2]]
    assert r.max_new_tokens == 4
    assert r.context_chunk_size == 2
    assert r.state is RequestState.CONTEXT_INIT


# --------------------------------------------------------------------- state, slot
def test_state_read_write(backend):
    r = backend.Request(1, [1])
    r.state = RequestState.GENERATION_IN_PROGRESS
    assert r.state is RequestState.GENERATION_IN_PROGRESS
    r.state = 2
    assert r.state is RequestState.GENERATION_COMPLETE
    assert isinstance(r.state, RequestState)
    r.state = RequestState.CONTEXT_INIT
    assert r.state is RequestState.CONTEXT_INIT


def test_seq_slot_read_write(backend):
    r = backend.Request(1, [1])
    assert r.seq_slot is None
    r.seq_slot = 0
    assert r.seq_slot == 0
    r.seq_slot = np.int64(12)
    assert r.seq_slot == 12 and type(r.seq_slot) is int
    r.seq_slot = None
    assert r.seq_slot is None
