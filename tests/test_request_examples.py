"""Exact small worked examples for every row of the accessor table in docs/request.md.

Every expected value is written out by hand; nothing is computed by the code under test.
Each test runs once per backend (fixture ``backend``).
"""

import pickle

import numpy as np
import pytest

import tokcy
from tokcy import RequestState

PROMPT = [11, 12, 13]


@pytest.fixture
def req(backend):
    """Request 7, prompt [11, 12, 13], two beams: beam 0 = [11,12,13,21,22], beam 1 = [11,12,13,31]."""
    r = backend.Request(7, PROMPT, beam_width=2, max_new_tokens=10)
    assert r.add_new_tokens([21, 31]) == 4
    assert r.add_new_token(22, 0) == 5
    return r


# ----------------------------------------------------------------------- construction
def test_constructor_defaults(backend):
    r = backend.Request(5, [1, 2, 3, 4])
    assert r.request_id == 5
    assert r.beam_width == 1
    assert r.max_new_tokens is None
    assert r.prompt_len == 4
    assert r.orig_prompt_len == 4
    assert r.state is RequestState.CONTEXT_INIT
    assert r.seq_slot is None
    assert r.get_tokens() == [[1, 2, 3, 4]]
    assert r.get_tokens(0) == [1, 2, 3, 4]
    assert r.context_current_position == 0
    assert r.context_chunk_size == 4
    assert r.draft_tokens == []
    assert r.num_draft_tokens == 0
    assert r.has_draft_tokens is False
    assert isinstance(r.block_tables, tuple)
    assert len(r.block_tables) == 1
    assert isinstance(r.block_tables[0], backend.BlockTable)
    assert r.block_tables[0].tolist() == []


@pytest.mark.parametrize(
    "prompt",
    [
        [1, 2, 3],
        (1, 2, 3),
        np.array([1, 2, 3], dtype=np.int32),
        np.array([1, 2, 3], dtype=np.int64),
        np.array([1, 2, 3], dtype=np.uint8),
        np.array([1, 2, 3], dtype=np.int16),
        [np.int64(1), np.int32(2), np.uint16(3)],
        range(1, 4),
    ],
    ids=["list", "tuple", "int32", "int64", "uint8", "int16", "np-scalars", "range"],
)
def test_prompt_accepts_int_sequences_and_arrays(backend, prompt):
    r = backend.Request(1, prompt)
    assert r.get_tokens(0) == [1, 2, 3]
    assert r.prompt_len == 3


def test_prompt_is_copied(backend):
    prompt = [1, 2, 3]
    array = np.array([4, 5, 6], dtype=np.int32)
    r1 = backend.Request(1, prompt)
    r2 = backend.Request(2, array)
    prompt[0] = 99
    array[0] = 99
    assert r1.get_tokens(0) == [1, 2, 3]
    assert r2.get_tokens(0) == [4, 5, 6]


def test_int32_limits_are_accepted(backend):
    r = backend.Request(1, [-(2**31), 2**31 - 1])
    assert r.get_tokens(0) == [-2147483648, 2147483647]
    assert r.add_new_token(2**31 - 1) == 3
    assert r.add_new_token(-(2**31)) == 4
    assert r.get_tokens(0) == [-2147483648, 2147483647, 2147483647, -2147483648]
    assert r.get_tokens_view().tolist() == [-2147483648, 2147483647, 2147483647, -2147483648]


def test_beams_start_as_independent_copies_of_the_prompt(backend):
    r = backend.Request(1, [5, 6], beam_width=3)
    assert r.get_tokens() == [[5, 6], [5, 6], [5, 6]]
    assert r.add_new_token(9, 1) == 3
    assert r.get_tokens() == [[5, 6], [5, 6, 9], [5, 6]]


# --------------------------------------------------------------------- get_num_tokens
def test_get_num_tokens(req):
    assert req.get_num_tokens(0) == 5
    assert req.get_num_tokens(1) == 4


def test_get_num_tokens_numpy_int_beam(req):
    assert req.get_num_tokens(np.int64(1)) == 4


# ------------------------------------------------------------------------- get_tokens
def test_get_tokens_one_beam_and_all(req):
    assert req.get_tokens(0) == [11, 12, 13, 21, 22]
    assert req.get_tokens(1) == [11, 12, 13, 31]
    assert req.get_tokens() == [[11, 12, 13, 21, 22], [11, 12, 13, 31]]


def test_get_tokens_returns_new_plain_lists(req):
    a = req.get_tokens(0)
    assert type(a) is list
    assert all(type(t) is int for t in a)
    a.append(999)
    a[0] = -5
    assert req.get_tokens(0) == [11, 12, 13, 21, 22]
    everything = req.get_tokens()
    assert type(everything) is list and all(type(x) is list for x in everything)
    everything[1].clear()
    assert req.get_tokens(1) == [11, 12, 13, 31]


# ------------------------------------------------------------------- get_tokens_range
@pytest.mark.parametrize(
    "begin, end, expected",
    [
        (0, 5, [11, 12, 13, 21, 22]),
        (1, 3, [12, 13]),
        (3, 5, [21, 22]),
        (4, 5, [22]),
        (-2, 2, [11, 12]),  # negative begin counts as 0, not Python slicing
        (-100, 100, [11, 12, 13, 21, 22]),
        (2, 100, [13, 21, 22]),  # end > n is clamped
        (3, 3, []),  # begin == end
        (4, 2, []),  # begin > end
        (5, 9, []),  # begin == n
        (7, 9, []),  # begin > n
        (0, 0, []),
        (0, -1, []),  # negative end is not Python slicing either
        (-3, -1, []),
        (2, -1, []),
    ],
)
def test_get_tokens_range_clamping(req, begin, end, expected):
    assert req.get_tokens_range(0, begin, end) == expected


def test_get_tokens_range_other_beam(req):
    assert req.get_tokens_range(1, 2, 10) == [13, 31]
    assert req.get_tokens_range(1, 3, 4) == [31]


def test_get_tokens_range_empty_prompt(backend):
    r = backend.Request(1, [])
    assert r.get_tokens_range(0, 0, 0) == []
    assert r.get_tokens_range(0, -1, 5) == []
    assert r.get_tokens_range(0, 3, 1) == []
    r.add_new_token(4)
    assert r.get_tokens_range(0, -1, 5) == [4]


def test_get_tokens_range_big_positions_clamp(req):
    assert req.get_tokens_range(0, -(2**40), 2**40) == [11, 12, 13, 21, 22]
    assert req.get_tokens_range(0, 2**40, 2**41) == []


# -------------------------------------------------------------------------- get_token
def test_get_token(req):
    assert req.get_token(0, 0) == 11
    assert req.get_token(0, 4) == 22
    assert req.get_token(1, 3) == 31
    assert type(req.get_token(0, 2)) is int


@pytest.mark.parametrize("beam, pos", [(0, 5), (0, -1), (1, 4), (1, -1), (0, 100), (0, -6)])
def test_get_token_out_of_range(req, beam, pos):
    with pytest.raises(IndexError):
        req.get_token(beam, pos)


def test_get_token_empty_prompt(backend):
    r = backend.Request(1, [])
    with pytest.raises(IndexError):
        r.get_token(0, 0)


# ------------------------------------------------------------------- get_last_tokens
def test_get_last_tokens(req):
    assert req.get_last_tokens(0) == 22
    assert req.get_last_tokens(1) == 31
    assert req.get_last_tokens() == [22, 31]
    assert type(req.get_last_tokens(0)) is int


def test_get_last_tokens_of_prompt_only(backend):
    r = backend.Request(1, [3, 4, 5], beam_width=3)
    assert r.get_last_tokens() == [5, 5, 5]
    assert r.get_last_tokens(2) == 5


def test_get_last_tokens_empty(backend):
    r = backend.Request(1, [])
    with pytest.raises(IndexError):
        r.get_last_tokens(0)
    with pytest.raises(IndexError):
        r.get_last_tokens()


# --------------------------------------------------------- max_beam / max_generated
def test_max_counts(req):
    assert req.max_beam_num_tokens == 5
    assert req.max_num_generated_tokens == 2
    req.add_new_token(32, 1)
    req.add_new_token(33, 1)
    assert req.max_beam_num_tokens == 6
    assert req.max_num_generated_tokens == 3


def test_max_counts_prompt_only(backend):
    r = backend.Request(1, [1, 2], beam_width=2)
    assert r.max_beam_num_tokens == 2
    assert r.max_num_generated_tokens == 0
    e = backend.Request(1, [])
    assert e.max_beam_num_tokens == 0
    assert e.max_num_generated_tokens == 0


# --------------------------------------------------------- add_new_token(s)
def test_add_new_token_returns_length(backend):
    r = backend.Request(1, [1], beam_width=2)
    assert r.add_new_token(2) == 2
    assert r.add_new_token(3) == 3
    assert r.add_new_token(4, 1) == 2
    assert r.add_new_token(np.int64(5), beam=1) == 3
    assert r.get_tokens() == [[1, 2, 3], [1, 4, 5]]


def test_add_new_tokens_returns_beam0_length(backend):
    r = backend.Request(1, [1], beam_width=3)
    r.add_new_token(9, 0)
    assert r.add_new_tokens([2, 3, 4]) == 3
    assert r.add_new_tokens(np.array([5, 6, 7], dtype=np.int64)) == 4
    assert r.add_new_tokens((8, 9, 10)) == 5
    assert r.get_tokens() == [[1, 9, 2, 5, 8], [1, 3, 6, 9], [1, 4, 7, 10]]


def test_add_many_tokens_grow(backend):
    r = backend.Request(1, [0])
    for i in range(1, 1001):
        assert r.add_new_token(i) == i + 1
    assert r.get_num_tokens(0) == 1001
    assert r.get_tokens(0) == list(range(1001))
    assert r.get_tokens_range(0, 995, 2000) == [995, 996, 997, 998, 999, 1000]


# ------------------------------------------------------------ set_generated_tokens
def test_set_generated_tokens(req):
    req.set_generated_tokens([[41, 42, 43], []])
    assert req.get_tokens() == [[11, 12, 13, 41, 42, 43], [11, 12, 13]]
    req.set_generated_tokens([np.array([7], dtype=np.int32), (8, 9)])
    assert req.get_tokens() == [[11, 12, 13, 7], [11, 12, 13, 8, 9]]
    assert req.prompt_len == 3


def test_set_generated_tokens_2d_array(backend):
    r = backend.Request(1, [1], beam_width=2)
    r.set_generated_tokens(np.array([[2, 3], [4, 5]]))
    assert r.get_tokens() == [[1, 2, 3], [1, 4, 5]]


# ------------------------------------------------------------------------ truncate
def test_truncate_all_beams(req):
    req.truncate(4)
    assert req.get_tokens() == [[11, 12, 13, 21], [11, 12, 13, 31]]
    req.truncate(3)
    assert req.get_tokens() == [[11, 12, 13], [11, 12, 13]]


def test_truncate_one_beam(req):
    req.truncate(3, beam=0)
    assert req.get_tokens() == [[11, 12, 13], [11, 12, 13, 31]]
    req.truncate(4, 1)
    assert req.get_tokens(1) == [11, 12, 13, 31]


def test_truncate_then_append_rewrites(backend):
    r = backend.Request(1, [1, 2])
    r.add_new_token(3)
    r.add_new_token(4)
    r.truncate(3)
    assert r.get_tokens(0) == [1, 2, 3]
    assert r.add_new_token(8) == 4
    assert r.get_tokens(0) == [1, 2, 3, 8]
    assert r.get_last_tokens(0) == 8


def test_truncate_at_current_length_is_a_no_op(req):
    req.truncate(5, beam=0)
    assert req.get_tokens(0) == [11, 12, 13, 21, 22]


# ---------------------------------------------------------------------------- views
def test_view_whole_beam(req):
    v = req.get_tokens_view()
    assert isinstance(v, np.ndarray)
    assert v.dtype == np.int32
    assert v.ndim == 1
    assert v.tolist() == [11, 12, 13, 21, 22]
    assert not v.flags.writeable
    with pytest.raises(ValueError):
        v[0] = 1


def test_view_cannot_be_made_writable(req):
    """A view never changes under its holder, and its holder cannot change the request."""
    v = req.get_tokens_view()
    with pytest.raises(ValueError):
        v.flags.writeable = True
    with pytest.raises(ValueError):
        v[0] = 1
    assert req.get_tokens(0) == [11, 12, 13, 21, 22]
    table = req.block_tables[0]
    table.extend([1, 2])
    tv = table.view()
    with pytest.raises(ValueError):
        tv.flags.writeable = True
    assert table.tolist() == [1, 2]


@pytest.mark.parametrize(
    "args, expected",
    [
        ((1,), [11, 12, 13, 31]),
        ((0, 3), [21, 22]),
        ((0, 1, 3), [12, 13]),
        ((0, -5, 2), [11, 12]),
        ((0, 2, 100), [13, 21, 22]),
        ((0, 4, 2), []),
        ((0, 2, 2), []),
        ((0, 9), []),
        ((1, 3, None), [31]),
    ],
)
def test_view_ranges(req, args, expected):
    v = req.get_tokens_view(*args)
    assert v.tolist() == expected
    assert v.dtype == np.int32
    assert not v.flags.writeable


def test_view_keywords(req):
    assert req.get_tokens_view(beam=1, begin=1, end=3).tolist() == [12, 13]


def test_view_is_a_snapshot(backend):
    r = backend.Request(1, [1, 2, 3])
    r.add_new_token(4)
    whole = r.get_tokens_view()
    tail = r.get_tokens_view(0, 2)
    r.truncate(3)
    r.add_new_token(40)  # rewrites position 3 that both views can see
    r.add_new_token(50)
    assert whole.tolist() == [1, 2, 3, 4]
    assert tail.tolist() == [3, 4]
    assert r.get_tokens(0) == [1, 2, 3, 40, 50]
    r.set_generated_tokens([[7]])
    assert whole.tolist() == [1, 2, 3, 4]
    assert r.get_tokens(0) == [1, 2, 3, 7]
    r.pause(10)
    r.add_new_token(60)
    assert whole.tolist() == [1, 2, 3, 4]
    assert r.get_tokens(0) == [1, 2, 3, 7, 60]


def test_view_survives_growth_and_deletion(backend):
    r = backend.Request(1, [1, 2])
    v = r.get_tokens_view()
    for i in range(500):
        r.add_new_token(i)
    assert v.tolist() == [1, 2]
    del r
    assert v.tolist() == [1, 2]


def test_view_empty_prompt(backend):
    r = backend.Request(1, [])
    v = r.get_tokens_view()
    assert v.tolist() == []
    assert v.dtype == np.int32


# ------------------------------------------------------------------- pickle, repr
def test_request_pickle_round_trip(backend):
    r = backend.Request(9, [1, 2, 3], beam_width=2, max_new_tokens=7, num_layer_groups=2)
    r.add_new_tokens([4, 5])
    r.state = RequestState.GENERATION_IN_PROGRESS
    r.seq_slot = 4
    r.draft_tokens = [6, 7]
    r.context_chunk_size = 2
    r.move_to_next_context_chunk()
    r.block_tables[1].extend([3, 4, 5])
    r.block_tables[1].release_front(1)
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        s = pickle.loads(pickle.dumps(r, protocol=protocol))
        assert type(s) is backend.Request
        assert s.request_id == 9
        assert s.get_tokens() == [[1, 2, 3, 4], [1, 2, 3, 5]]
        assert s.prompt_len == 3 and s.orig_prompt_len == 3
        assert s.max_new_tokens == 7
        assert s.state is RequestState.GENERATION_IN_PROGRESS
        assert s.seq_slot == 4
        assert s.draft_tokens == [6, 7]
        assert (s.context_current_position, s.context_chunk_size) == (2, 1)
        assert [t.tolist() for t in s.block_tables] == [[], [-1, 4, 5]]
        assert [t.num_released for t in s.block_tables] == [0, 1]
        s.add_new_token(99)
        assert r.get_tokens(0) == [1, 2, 3, 4]


def test_request_repr(backend):
    r = backend.Request(3, [1, 2, 3], beam_width=2)
    r.add_new_token(4, 1)
    assert repr(r) == (
        "Request(request_id=3, state=CONTEXT_INIT, prompt_len=3, num_tokens=[3, 4], "
        "context=0+3, draft_tokens=0, seq_slot=None)"
    )


def test_module_exposes_backend(backend):
    assert tokcy.BACKEND == ("cython" if backend.__name__ == "tokcy._core" else "python")
