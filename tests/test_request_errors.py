"""Bad input: the exception type, a message that names the argument, and no change at all.

For every failing call, every observable of the request (tokens of every beam, cursor,
chunk, drafts, state, slot, prompt_len, max_new_tokens, block tables and their released
counts...) is snapshotted before the call and compared after it.
"""

import numpy as np
import pytest

from list_model import observe, observe_table
from tokcy import RequestState

BIG = 2**31
SMALL = -(2**31) - 1


def make_request(backend):
    """Two beams, prompt [1, 2, 3]; beam 0 = [1,2,3,4,5], beam 1 = [1,2,3,6]; every field set."""
    r = backend.Request(4, [1, 2, 3], beam_width=2, max_new_tokens=9, num_layer_groups=2)
    r.add_new_tokens([4, 6])
    r.add_new_token(5, 0)
    r.state = RequestState.GENERATION_IN_PROGRESS
    r.seq_slot = 2
    r.draft_tokens = [7, 8]
    r.context_chunk_size = 2
    r.move_to_next_context_chunk()  # cursor 2, chunk 1
    r.block_tables[0].extend([10, 11, 12])
    r.block_tables[0].release_front(1)
    r.block_tables[1].append(20)
    return r


EXPECTED_START = {
    "tokens": [[1, 2, 3, 4, 5], [1, 2, 3, 6]],
    "cursor": 2,
    "chunk": 1,
    "drafts": [7, 8],
    "state": 1,
    "seq_slot": 2,
    "max_new_tokens": 9,
    "prompt_len": 3,
}


def assert_fails_cleanly(target, snapshot, call, exc_type, names=()):
    """``call()`` raises exactly ``exc_type``, its message names every string of ``names``,
    and ``snapshot(target)`` is the same after the call as before it."""
    before = snapshot(target)
    with pytest.raises(exc_type) as info:
        call()
    assert type(info.value) is exc_type, f"{type(info.value).__name__}: {info.value}"
    message = str(info.value)
    for name in names:
        assert name in message, f"{name!r} not named in {message!r}"
    assert snapshot(target) == before


def test_fixture_request_is_as_described(backend):
    seen = observe(make_request(backend))
    for key, value in EXPECTED_START.items():
        assert seen[key] == value
    assert [t["ids"] for t in seen["block_tables"]] == [[-1, 11, 12], [20]]
    assert [t["num_released"] for t in seen["block_tables"]] == [1, 0]


# ------------------------------------------------------------------- wrong beam index
BEAM_CALLS = {
    "get_num_tokens": lambda r, b: r.get_num_tokens(b),
    "get_tokens": lambda r, b: r.get_tokens(b),
    "get_tokens_range": lambda r, b: r.get_tokens_range(b, 0, 2),
    "get_tokens_view": lambda r, b: r.get_tokens_view(b),
    "get_tokens_view_kw": lambda r, b: r.get_tokens_view(beam=b, begin=1, end=2),
    "get_token": lambda r, b: r.get_token(b, 0),
    "get_last_tokens": lambda r, b: r.get_last_tokens(b),
    "add_new_token": lambda r, b: r.add_new_token(9, b),
    "add_new_token_kw": lambda r, b: r.add_new_token(9, beam=b),
    "truncate": lambda r, b: r.truncate(3, b),
    "truncate_kw": lambda r, b: r.truncate(4, beam=b),
}


@pytest.mark.parametrize("accessor", sorted(BEAM_CALLS))
@pytest.mark.parametrize("beam", [2, 3, -1, -2, 1000, np.int64(2), np.int32(-1)], ids=str)
def test_wrong_beam_index_is_index_error(backend, accessor, beam):
    r = make_request(backend)
    assert_fails_cleanly(r, observe, lambda: BEAM_CALLS[accessor](r, beam), IndexError, ["beam"])


@pytest.mark.parametrize("accessor", sorted(BEAM_CALLS))
@pytest.mark.parametrize("beam", [0.0, 1.5, "0", [0], np.float64(0)], ids=repr)
def test_non_integer_beam_is_type_error(backend, accessor, beam):
    r = make_request(backend)
    assert_fails_cleanly(r, observe, lambda: BEAM_CALLS[accessor](r, beam), TypeError)


def test_beam_width_one_rejects_beam_one(backend):
    r = backend.Request(1, [1, 2])
    for call in BEAM_CALLS.values():
        assert_fails_cleanly(r, observe, lambda call=call: call(r, 1), IndexError, ["beam"])


# --------------------------------------------------------------------- positions, ranges
@pytest.mark.parametrize("pos", [5, 6, -1, -5, 10**6])
def test_get_token_out_of_range(backend, pos):
    r = make_request(backend)
    assert_fails_cleanly(r, observe, lambda: r.get_token(0, pos), IndexError)


def test_get_token_out_of_range_short_beam(backend):
    r = make_request(backend)
    assert_fails_cleanly(r, observe, lambda: r.get_token(1, 4), IndexError)


@pytest.mark.parametrize(
    "call",
    [
        lambda r: r.get_token(0, 1.0),
        lambda r: r.get_token(0, None),
        lambda r: r.get_tokens_range(0, 1.0, 3),
        lambda r: r.get_tokens_range(0, 0, 3.0),
        lambda r: r.get_tokens_range(0, None, 3),
        lambda r: r.get_tokens_range(0, 0, None),
        lambda r: r.get_tokens_view(0, None),
        lambda r: r.get_tokens_view(0, 0, 2.5),
        lambda r: r.get_tokens_view(0, "1"),
        lambda r: r.get_tokens_view(None),
    ],
)
def test_non_integer_positions_are_type_errors(backend, call):
    r = make_request(backend)
    assert_fails_cleanly(r, observe, lambda: call(r), TypeError)


def test_empty_beam_last_token(backend):
    r = backend.Request(1, [], beam_width=2)
    assert_fails_cleanly(r, observe, lambda: r.get_last_tokens(0), IndexError)
    assert_fails_cleanly(r, observe, lambda: r.get_last_tokens(), IndexError)
    assert_fails_cleanly(r, observe, lambda: r.get_token(0, 0), IndexError)


# --------------------------------------------------------------------------- token ids
BAD_TOKENS = [
    (BIG, OverflowError),
    (SMALL, OverflowError),
    (2**64, OverflowError),
    (-(2**70), OverflowError),
    (np.int64(BIG), OverflowError),
    (np.uint64(2**63), OverflowError),
    (1.0, TypeError),
    (np.float32(3), TypeError),
    (np.float64(3), TypeError),
    (None, TypeError),
    ("1", TypeError),
    ([1], TypeError),
]


@pytest.mark.parametrize("token, exc", BAD_TOKENS, ids=repr)
def test_add_new_token_bad_token(backend, token, exc):
    r = make_request(backend)
    assert_fails_cleanly(r, observe, lambda: r.add_new_token(token), exc, ["token"])
    assert_fails_cleanly(r, observe, lambda: r.add_new_token(token, 1), exc, ["token"])


@pytest.mark.parametrize("token, exc", BAD_TOKENS, ids=repr)
def test_add_new_tokens_bad_second_entry_changes_no_beam(backend, token, exc):
    r = make_request(backend)
    assert_fails_cleanly(r, observe, lambda: r.add_new_tokens([9, token]), exc, ["per_beam"])
    assert_fails_cleanly(r, observe, lambda: r.add_new_tokens((token, 9)), exc, ["per_beam"])


@pytest.mark.parametrize(
    "per_beam, exc",
    [
        ([9], ValueError),
        ([9, 9, 9], ValueError),
        ([], ValueError),
        (np.array([9, 9, 9]), ValueError),
        (9, TypeError),
        (None, TypeError),
        ("ab", TypeError),
        (np.array([1.0, 2.0]), TypeError),
        (np.array([BIG, 1], dtype=np.int64), OverflowError),
    ],
    ids=repr,
)
def test_add_new_tokens_bad_per_beam(backend, per_beam, exc):
    r = make_request(backend)
    assert_fails_cleanly(r, observe, lambda: r.add_new_tokens(per_beam), exc, ["per_beam"])


def test_add_new_tokens_2d_array_is_rejected(backend):
    # per_beam takes one scalar per beam, so a (beam_width, 1) array is not a valid
    # per_beam, though each of its rows holds one token. The backends may call that a
    # TypeError or a ValueError; only "rejected cleanly, naming per_beam" is asserted.
    r = make_request(backend)
    before = observe(r)
    with pytest.raises((TypeError, ValueError)) as info:
        r.add_new_tokens(np.array([[9], [9]]))
    assert "per_beam" in str(info.value)
    assert observe(r) == before


@pytest.mark.parametrize(
    "per_beam, exc, name",
    [
        ([[9]], ValueError, "per_beam"),
        ([[9], [9], [9]], ValueError, "per_beam"),
        ([[9], [1.5]], TypeError, "per_beam[1]"),
        ([[9], [None]], TypeError, "per_beam[1]"),
        ([[9], [BIG]], OverflowError, "per_beam[1]"),
        ([[SMALL], [9]], OverflowError, "per_beam[0]"),
        ([[9], np.array([1.0])], TypeError, "per_beam[1]"),
        ([[9], np.array([[1, 2]])], ValueError, "per_beam[1]"),
        ([[9], np.array([BIG], dtype=np.int64)], OverflowError, "per_beam[1]"),
        ([[9], None], TypeError, "per_beam[1]"),
        ([[9], 5], TypeError, "per_beam[1]"),
        ([[9], "ab"], TypeError, "per_beam[1]"),
        (5, TypeError, "per_beam"),
    ],
    ids=repr,
)
def test_set_generated_tokens_bad_input(backend, per_beam, exc, name):
    r = make_request(backend)
    assert_fails_cleanly(r, observe, lambda: r.set_generated_tokens(per_beam), exc, [name])


# ----------------------------------------------------------------------------- truncate
@pytest.mark.parametrize(
    "num_tokens, beam",
    [
        (6, 0),  # above beam 0's 5 tokens
        (5, 1),  # above beam 1's 4 tokens
        (5, None),  # fits beam 0 but not beam 1: no beam may change
        (2, None),  # below prompt_len
        (2, 0),
        (0, 1),
        (-1, None),
        (100, None),
    ],
)
def test_truncate_out_of_range(backend, num_tokens, beam):
    r = make_request(backend)
    assert_fails_cleanly(r, observe, lambda: r.truncate(num_tokens, beam), ValueError, ["num_tokens"])


def test_truncate_non_integer(backend):
    r = make_request(backend)
    assert_fails_cleanly(r, observe, lambda: r.truncate(4.0), TypeError)
    assert_fails_cleanly(r, observe, lambda: r.truncate(None), TypeError)


def test_truncate_after_pause_respects_new_prompt(backend):
    r = backend.Request(1, [1, 2])
    r.add_new_token(3)
    r.add_new_token(4)
    r.pause(3)
    r.add_new_token(5)
    assert_fails_cleanly(r, observe, lambda: r.truncate(2), ValueError, ["num_tokens"])


# --------------------------------------------------------------------- chunked prefill
@pytest.mark.parametrize("size", [-1, -100])
def test_negative_chunk_size(backend, size):
    r = make_request(backend)
    assert_fails_cleanly(
        r, observe, lambda: setattr(r, "context_chunk_size", size), ValueError, ["context_chunk_size"]
    )


@pytest.mark.parametrize("position", [-1, 4, 5, 100])
def test_cursor_outside_prompt(backend, position):
    r = make_request(backend)
    assert_fails_cleanly(
        r, observe, lambda: setattr(r, "context_current_position", position), ValueError, ["context_current_position"]
    )


@pytest.mark.parametrize("attribute", ["context_chunk_size", "context_current_position"])
@pytest.mark.parametrize("value", [1.0, None, "1"], ids=repr)
def test_chunk_fields_non_integer(backend, attribute, value):
    r = make_request(backend)
    assert_fails_cleanly(r, observe, lambda: setattr(r, attribute, value), TypeError)


# ------------------------------------------------------------------------------ drafts
@pytest.mark.parametrize(
    "drafts, exc",
    [
        ([1, 2.5], TypeError),
        ([None], TypeError),
        ([BIG], OverflowError),
        ([1, SMALL], OverflowError),
        (np.array([1.0, 2.0]), TypeError),
        (np.array([True]), TypeError),
        (np.zeros((2, 2), dtype=np.int32), ValueError),
        ([[1, 2], [3, 4]], ValueError),
        (np.array([BIG], dtype=np.int64), OverflowError),
        (5, TypeError),
        ("ab", TypeError),
    ],
    ids=repr,
)
def test_bad_draft_tokens(backend, drafts, exc):
    r = make_request(backend)
    assert_fails_cleanly(r, observe, lambda: setattr(r, "draft_tokens", drafts), exc, ["draft_tokens"])


# ------------------------------------------------------------------------ state, slot
@pytest.mark.parametrize("value, exc", [(3, ValueError), (-1, ValueError), (1.0, TypeError), ("x", TypeError)])
def test_bad_state(backend, value, exc):
    r = make_request(backend)
    names = ["state"] if exc is ValueError else []
    assert_fails_cleanly(r, observe, lambda: setattr(r, "state", value), exc, names)


@pytest.mark.parametrize("value, exc", [(-1, ValueError), (1.5, TypeError), ("2", TypeError)])
def test_bad_seq_slot(backend, value, exc):
    r = make_request(backend)
    names = ["seq_slot"] if exc is ValueError else []
    assert_fails_cleanly(r, observe, lambda: setattr(r, "seq_slot", value), exc, names)


@pytest.mark.parametrize(
    "attribute",
    ["request_id", "beam_width", "prompt_len", "orig_prompt_len", "max_new_tokens", "block_tables",
     "max_beam_num_tokens", "num_draft_tokens", "context_remaining_length"],
)
def test_read_only_fields(backend, attribute):
    r = make_request(backend)
    assert_fails_cleanly(r, observe, lambda: setattr(r, attribute, 1), AttributeError)


# ------------------------------------------------------------------------------- pause
@pytest.mark.parametrize("value, exc", [(2, ValueError), (0, ValueError), (-5, ValueError), (3.0, TypeError)])
def test_bad_pause(backend, value, exc):
    r = make_request(backend)
    names = ["max_input_len"] if exc is ValueError else []
    assert_fails_cleanly(r, observe, lambda: r.pause(value), exc, names)


# ------------------------------------------------------------------------- constructor
@pytest.mark.parametrize(
    "args, kwargs, exc, name",
    [
        ((1, [1, 2.5]), {}, TypeError, "prompt"),
        ((1, [1, None]), {}, TypeError, "prompt"),
        ((1, [BIG]), {}, OverflowError, "prompt"),
        ((1, [SMALL, 1]), {}, OverflowError, "prompt"),
        ((1, [2**80]), {}, OverflowError, "prompt"),
        ((1, np.array([BIG], dtype=np.int64)), {}, OverflowError, "prompt"),
        ((1, np.array([2**63], dtype=np.uint64)), {}, OverflowError, "prompt"),
        ((1, np.array([1.0, 2.0])), {}, TypeError, "prompt"),
        ((1, np.array([], dtype=np.float32)), {}, TypeError, "prompt"),
        ((1, np.array(["1"])), {}, TypeError, "prompt"),
        ((1, np.zeros((2, 3), dtype=np.int32)), {}, ValueError, "prompt"),
        ((1, np.int32(5)), {}, TypeError, "prompt"),
        ((1, [[1, 2], [3, 4]]), {}, ValueError, "prompt"),
        ((1, "123"), {}, TypeError, "prompt"),
        ((1, b"123"), {}, TypeError, "prompt"),
        ((1, 5), {}, TypeError, "prompt"),
        ((1, None), {}, TypeError, "prompt"),
        ((1, [1]), {"beam_width": 0}, ValueError, "beam_width"),
        ((1, [1]), {"beam_width": -2}, ValueError, "beam_width"),
        ((1, [1]), {"max_new_tokens": -1}, ValueError, "max_new_tokens"),
        ((1, [1]), {"num_layer_groups": 0}, ValueError, "num_layer_groups"),
    ],
    ids=repr,
)
def test_bad_constructor_arguments(backend, args, kwargs, exc, name):
    with pytest.raises(exc) as info:
        backend.Request(*args, **kwargs)
    assert type(info.value) is exc
    assert name in str(info.value)


@pytest.mark.parametrize(
    "args, kwargs",
    [((1.0, [1]), {}), ((None, [1]), {}), ((1, [1]), {"beam_width": 1.0}), ((1, [1]), {"max_new_tokens": 2.0})],
    ids=repr,
)
def test_constructor_non_integer_fields(backend, args, kwargs):
    with pytest.raises(TypeError):
        backend.Request(*args, **kwargs)


def test_constructor_rejects_unknown_and_positional_keywords(backend):
    with pytest.raises(TypeError):
        backend.Request(1, [1], 2)  # beam_width is keyword-only
    with pytest.raises(TypeError):
        backend.Request(1, [1], beam=2)


# ------------------------------------------------------------------------- block tables
def make_table(backend):
    """[-1, 11, 12, 13] with one released block."""
    t = backend.BlockTable([10, 11, 12, 13])
    t.release_front(1)
    return t


BLOCK_TABLE_FAILURES = [
    ("append-negative", lambda t: t.append(-1), ValueError, "block_id"),
    ("append-big", lambda t: t.append(BIG), OverflowError, "block_id"),
    ("append-float", lambda t: t.append(1.0), TypeError, "block_id"),
    ("append-none", lambda t: t.append(None), TypeError, "block_id"),
    ("extend-negative-late", lambda t: t.extend([5, 6, -3]), ValueError, "block_ids"),
    ("extend-negative-array", lambda t: t.extend(np.array([5, -1])), ValueError, "block_ids"),
    ("extend-float", lambda t: t.extend([5, 6.0]), TypeError, "block_ids"),
    ("extend-float-array", lambda t: t.extend(np.array([5.0])), TypeError, "block_ids"),
    ("extend-2d", lambda t: t.extend(np.array([[5, 6]])), ValueError, "block_ids"),
    ("extend-big", lambda t: t.extend([5, BIG]), OverflowError, "block_ids"),
    ("extend-scalar", lambda t: t.extend(5), TypeError, "block_ids"),
    ("extend-none", lambda t: t.extend(None), TypeError, "block_ids"),
    ("truncate-negative", lambda t: t.truncate(-1), ValueError, "num_blocks"),
    ("truncate-above", lambda t: t.truncate(5), ValueError, "num_blocks"),
    ("truncate-float", lambda t: t.truncate(1.0), TypeError, None),
    ("release-decrease", lambda t: t.release_front(0), ValueError, "num_released"),
    ("release-above", lambda t: t.release_front(5), ValueError, "num_released"),
    ("release-negative", lambda t: t.release_front(-1), ValueError, "num_released"),
    ("release-float", lambda t: t.release_front(2.0), TypeError, None),
    ("set-released", lambda t: t.__setitem__(0, 5), ValueError, "released"),
    ("set-released-negative-index", lambda t: t.__setitem__(-4, 5), ValueError, "released"),
    ("set-out-of-range", lambda t: t.__setitem__(4, 5), IndexError, None),
    ("set-out-of-range-negative", lambda t: t.__setitem__(-5, 5), IndexError, None),
    ("set-negative-id", lambda t: t.__setitem__(1, -1), ValueError, "block_id"),
    ("set-big-id", lambda t: t.__setitem__(1, BIG), OverflowError, "block_id"),
    ("set-float-id", lambda t: t.__setitem__(1, 2.0), TypeError, "block_id"),
    ("set-float-index", lambda t: t.__setitem__(1.0, 2), TypeError, None),
    ("get-out-of-range", lambda t: t[4], IndexError, None),
    ("get-out-of-range-negative", lambda t: t[-5], IndexError, None),
    ("get-float-index", lambda t: t[1.0], TypeError, None),
]


@pytest.mark.parametrize(
    "call, exc, name", [case[1:] for case in BLOCK_TABLE_FAILURES], ids=[case[0] for case in BLOCK_TABLE_FAILURES]
)
def test_block_table_failures(backend, call, exc, name):
    t = make_table(backend)
    assert_fails_cleanly(t, observe_table, lambda: call(t), exc, [name] if name else [])


@pytest.mark.parametrize(
    "call, exc, name", [case[1:] for case in BLOCK_TABLE_FAILURES], ids=[case[0] for case in BLOCK_TABLE_FAILURES]
)
def test_block_table_failures_inside_request(backend, call, exc, name):
    r = make_request(backend)
    t = r.block_tables[0]
    t.append(13)  # the same [-1, 11, 12, 13] with one released block
    assert_fails_cleanly(r, observe, lambda: call(t), exc, [name] if name else [])


def test_set_released_block_after_release_of_everything(backend):
    t = backend.BlockTable([1, 2])
    t.release_front(2)
    assert_fails_cleanly(t, observe_table, lambda: t.__setitem__(1, 3), ValueError)
    assert_fails_cleanly(t, observe_table, lambda: t.__setitem__(-1, 3), ValueError)


def test_empty_block_table(backend):
    t = backend.BlockTable()
    assert_fails_cleanly(t, observe_table, lambda: t[0], IndexError)
    assert_fails_cleanly(t, observe_table, lambda: t[-1], IndexError)
    assert_fails_cleanly(t, observe_table, lambda: t.__setitem__(0, 1), IndexError)
    assert_fails_cleanly(t, observe_table, lambda: t.release_front(1), ValueError, ["num_released"])
    assert_fails_cleanly(t, observe_table, lambda: t.truncate(1), ValueError, ["num_blocks"])


@pytest.mark.parametrize(
    "ids, exc",
    [([1, -1], ValueError), ([1.0], TypeError), ([BIG], OverflowError), (np.zeros((1, 1), dtype=np.int32), ValueError)],
    ids=repr,
)
def test_block_table_constructor_bad_ids(backend, ids, exc):
    with pytest.raises(exc) as info:
        backend.BlockTable(ids)
    assert type(info.value) is exc
    assert "block_ids" in str(info.value)


def test_block_table_not_hashable(backend):
    with pytest.raises(TypeError):
        hash(backend.BlockTable([1]))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(request_id="a"), "request_id must be an integer, not str"),
        (dict(request_id=1.0), "request_id must be an integer, not float"),
        (dict(max_new_tokens=2.5), "max_new_tokens must be an integer, not float"),
        (dict(beam_width="2"), "beam_width must be an integer, not str"),
        (dict(num_layer_groups=None), "num_layer_groups must be an integer, not NoneType"),
    ],
    ids=["request_id-str", "request_id-float", "max_new_tokens-float", "beam_width-str", "groups-None"],
)
def test_a_constructor_argument_that_is_no_integer_is_named(backend, kwargs, message):
    with pytest.raises(TypeError, match=f"^{message}$"):
        backend.Request(**{"request_id": 1, "prompt": [1, 2], **kwargs})


@pytest.mark.parametrize(
    "call, exc, message",
    [
        (lambda t: t.append(1.5), TypeError, "block_id must be an integer block id, not float"),
        (lambda t: t.extend("abc"), TypeError, "block_ids must be a sequence of integer block ids, not str"),
        (lambda t: t.extend([4, None]), TypeError, "block_ids[1] must be an integer block id, not NoneType"),
        (lambda t: t.__setitem__(0, 2**31), OverflowError, "block_id: block id 2147483648 does not fit in int32"),
    ],
    ids=["append float", "extend str", "extend None", "set past int32"],
)
def test_block_id_errors_say_block_id(backend, call, exc, message):
    """A block table's bad ids are named block ids, not token ids, on both backends."""
    t = backend.BlockTable([1, 2])
    with pytest.raises(exc) as info:
        call(t)
    assert str(info.value) == message
    assert t.tolist() == [1, 2]


@pytest.mark.parametrize("field", ["context_chunk_size", "context_current_position", "seq_slot", "state"])
@pytest.mark.parametrize("value, error, message", [
    (2.5, TypeError, "{field} must be an integer, not float"),
    ("3", TypeError, "{field} must be an integer, not str"),
    (2**70, OverflowError, "{field} 1180591620717411303424 does not fit in int"),
], ids=["float", "str", "huge"])
def test_an_integer_field_set_to_a_non_integer_names_the_field(backend, field, value, error, message):
    """Every integer field a caller sets names itself in the error, and keeps its value."""
    request = backend.Request(1, [1, 2, 3, 4])
    request.context_current_position = 1
    before = observe(request)
    with pytest.raises(error) as caught:
        setattr(request, field, value)
    assert str(caught.value).startswith(message.format(field=field))
    assert observe(request) == before
