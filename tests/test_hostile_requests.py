"""Python code run in the middle of a call on a request, its block tables or its token buffers.

The code: a conversion's ``__index__`` or ``__len__``, a garbage collection's callbacks
(any allocation can start one), a weak reference's callback as a buffer's old storage goes
(inside a write that makes storage), a subclass's properties; and what the collector
hands out of a request or a report, an array subclass that misreports its values and dtype.

Each test asserts the defined result or a clean exception, the same on both backends; under
the sanitizer build (.ci/run) a regression shows as an AddressSanitizer report, not a wrong
value.
"""

import gc
import pickle
import sys

import numpy as np
import pytest
from hostile_code import at_next_collection, when_storage_retires

from tokcy import RequestState
from tokcy.connector import SchedulerOutputManager


def inside_a_call(attempt, slacks=range(-2, 40)):
    """Run ``attempt(slack)`` (which checks its own outcome and returns where the
    collection ran) for each slack; at least one collection must land inside the call."""
    places = [attempt(slack) for slack in slacks]
    assert "inside" in places, places


class Reinitialises:
    """A token whose conversion re-initialises ``request`` with 64 beams first."""

    def __init__(self, request, value):
        self.request, self.value = request, value

    def __index__(self):
        self.request.__init__(9, [1, 2, 3], beam_width=64)
        return self.value


class ReinitialisingLength(list):
    def __init__(self, request, values):
        super().__init__(values)
        self.request = request

    def __len__(self):
        self.request.__init__(9, [1, 2, 3], beam_width=64)
        return super().__len__()


def test_add_new_tokens_refuses_a_request_reinitialised_by_a_conversion(backend):
    request = backend.Request(1, [5, 6], beam_width=2)
    with pytest.raises(RuntimeError, match="re-initialised while per_beam was converted: nothing was changed"):
        request.add_new_tokens([7, Reinitialises(request, 8)])
    # what the re-initialisation made, and nothing of the refused call
    assert request.beam_width == 64
    assert request.get_tokens() == [[1, 2, 3]] * 64


def test_add_new_tokens_of_one_beam_refuses_it_too(backend):
    request = backend.Request(1, [5, 6])
    with pytest.raises(RuntimeError, match="re-initialised while per_beam"):
        request.add_new_tokens([Reinitialises(request, 8)])
    assert request.get_tokens() == [[1, 2, 3]] * 64


def test_set_generated_tokens_refuses_a_request_reinitialised_by_a_conversion(backend):
    request = backend.Request(1, [5, 6], beam_width=2)
    with pytest.raises(RuntimeError, match="re-initialised while per_beam was converted"):
        request.set_generated_tokens([[7], ReinitialisingLength(request, [8, 9])])
    assert request.get_tokens() == [[1, 2, 3]] * 64


@pytest.mark.parametrize("call", ["set_generated_tokens", "add_new_tokens"])
def test_a_request_paused_or_reinitialised_while_a_write_makes_room_is_left_as_that_code_left_it(backend, call):
    """Beam 0 is viewed, so the write makes new storage, and Python code runs as the old
    storage goes: here it adds five tokens and pauses the request (set_generated_tokens:
    the prompt grows to 13), or re-initialises it (add_new_tokens). The call is refused
    (RuntimeError) and the request is as that code left it: set_generated_tokens cut the
    beam to the prompt length read before (8 of its 13 tokens), add_new_tokens wrote into
    the beams it had before."""
    request = backend.Request(1, list(range(8)), beam_width=1 if call == "set_generated_tokens" else 2)
    view = request.get_tokens_view(0)

    def pause():
        for token in range(100, 105):
            request.add_new_token(token)
        request.pause(1000)

    def reinitialise():
        request.__init__(2, [7, 7], beam_width=2)

    state = when_storage_retires(view, pause if call == "set_generated_tokens" else reinitialise)
    del view
    change = "re-initialised or paused" if call == "set_generated_tokens" else "re-initialised"
    with pytest.raises(RuntimeError, match=f"^the request was {change} by code that ran during {call}: "
                                           "nothing was changed$"):
        if call == "set_generated_tokens":
            request.set_generated_tokens([[1, 2, 3]])
        else:
            request.add_new_tokens([5, 6])
    assert state["ran"]
    if call == "set_generated_tokens":
        assert (request.prompt_len, request.get_tokens(0)) == (13, list(range(8)) + list(range(100, 105)))
    else:
        assert (request.request_id, request.get_tokens()) == (2, [[7, 7], [7, 7]])


@pytest.mark.backend_free("the compiled core's unchecked reads (the twin's containers are Python's, checked)")
def test_what_the_collector_hands_out_of_compiled_objects_cannot_change_what_they_read(monkeypatch):
    """gc.get_referents hands out an object's containers: a request's beams are a tuple
    (were a list whose clearing made the next read go past it), and a report's columns
    hand out nothing (their list of made columns, cleared, made a read go past it). The
    twin's are Python lists, which only break the twin's own Python, never memory."""
    from tests.conftest import compiled_backend
    from tokcy import _backend

    backend = compiled_backend()
    monkeypatch.setattr(_backend, "module", backend)  # the manager's backend, whichever is live
    request = backend.Request(1, [1, 2, 3], beam_width=2)
    output = SchedulerOutputManager().build_scheduler_output([request], [])
    assert not [item for item in gc.get_referents(request) if isinstance(item, (list, dict, set, bytearray))]
    assert gc.get_referents(output._source) == [] and not gc.is_tracked(output._source)
    for item in gc.get_referents(request) + gc.get_referents(output._source):
        if isinstance(item, list):
            item.clear()
    assert request.get_tokens(1) == [1, 2, 3] and request.add_new_tokens([4, 5]) == 4
    assert output.tokens.tolist() == [1, 2, 3] and output.request_ids.tolist() == [1]


@pytest.mark.parametrize("change", ["append", "replace"])
def test_pause_returns_every_block_id_it_drops_whatever_a_collection_changes_meanwhile(backend, change):
    """pause lists each table's ids (allocations: a collection's callbacks may run), then
    empties the tables. A callback that adds block 777 to table 0, or replaces its last
    five ids by 50..54 (the same size): pause is refused (RuntimeError, the request as the
    callback left it), or returns the ids as the callback left them; or the callback ran
    once the tables were emptied, and the table holds what it wrote. Never an id dropped
    without being returned (the twin dropped them, and its first fix missed a same-size
    replacement)."""
    before = list(range(10))
    outcomes = set()
    for slack in range(-2, 40):
        request = backend.Request(1, [1, 2, 3], num_layer_groups=3)
        request.add_new_token(4)
        for table in request.block_tables:
            table.extend(range(10))
        written = []

        def callback(table=request.block_tables[0], written=written):
            ids = table.tolist()
            table.clear()
            table.extend(ids + [777] if change == "append" else ids[:5] + list(range(50, 50 + min(len(ids), 5))))
            written.append(table.tolist())

        drained = [[] for _ in range(100)]  # lists held: the lists pause makes are new (no free list), counted
        with at_next_collection(callback, slack) as state:
            state["calling"] = True
            try:
                held = request.pause(100)
            except RuntimeError as error:
                assert str(error) == ("the request was changed (its prompt or a block table) by code that ran "
                                      "during pause: nothing was changed")
                assert state["ran"] == "inside"
                assert [table.tolist() for table in request.block_tables] == [written[0], before, before]
                assert request.prompt_len == 3  # not paused
                outcomes.add("refused")
                continue
            finally:
                state["calling"] = False
        del drained
        assert request.prompt_len == 4 and [len(table) for table in request.block_tables[1:]] == [0, 0]
        left = request.block_tables[0].tolist()
        if not written:
            assert (held[0], left) == (before, [])
        else:  # listed after the callback, or the callback wrote into the emptied table
            assert (held[0], left) in ((written[0], []), (before, written[0])), (slack, held[0], left)
        outcomes.add(state["ran"])
    if sys.version_info < (3, 12):
        assert "refused" in outcomes, outcomes
    else:  # a collection starts only where bytecode runs, not inside an allocation: inside the
        # compiled pause, where it calls Python code, never between its listing and its check
        assert outcomes & {"refused", "inside"}, outcomes


def test_a_grow_survives_python_code_that_grows_the_same_buffer(backend):
    """Beam 0 is full (16 of 16): appending makes new storage, and Python code run as the
    old storage goes replaces the generated tokens with 4,096 more. The append lands after
    them; nothing is lost, duplicated or written past the storage."""
    request = backend.Request(1, list(range(16)))
    view = request.get_tokens_view(0)
    state = when_storage_retires(view, lambda: request.set_generated_tokens([list(range(100, 4196))]))
    del view
    length = request.add_new_token(5)
    expected = list(range(16)) + list(range(100, 4196)) + [5]
    assert state["ran"] and (length, request.get_tokens(0)) == (len(expected), expected)


def test_a_compiled_write_that_makes_storage_starts_no_collection(backend):
    """Making storage allocates nothing the garbage collector tracks on the compiled core,
    so no collection (no Python code) starts inside a grow; the twin's storage is Python
    objects, and one can."""
    def attempt(slack):
        request = backend.Request(1, list(range(16)))
        with at_next_collection(lambda: None, slack) as state:
            state["calling"] = True
            request.add_new_token(5)
        return state["ran"]

    places = [attempt(slack) for slack in range(-2, 40)]
    assert ("inside" in places) == (backend.__name__ != "tokcy._core"), places


@pytest.mark.parametrize("how", ["tolist", "pause"])
def test_block_table_reads_survive_a_collection_that_reinitialises_the_table(backend, how):
    """tolist() and pause() take the table's bounds, then allocate their result; a
    collection started there empties the table. tolist's result is the table as it was
    when the call began (never memory past the storage that is left); pause is refused
    (RuntimeError), the request as the collection left it, when the table changed after
    it read it (its ids are the engine's to free: it may have freed them already)."""
    def attempt(slack):
        request = backend.Request(1, [1, 2, 3])
        table = request.block_tables[0]
        table.extend(range(5000))
        spare = [[] for _ in range(200)]  # empties the interpreter's free list: the result list is allocated
        with at_next_collection(table.__init__, slack) as state:
            state["calling"] = True
            try:
                result = table.tolist() if how == "tolist" else request.pause(10)[0]
            except RuntimeError as error:
                assert how == "pause" and state["ran"] == "inside"
                assert str(error).endswith("by code that ran during pause: nothing was changed")
                assert (table.tolist(), request.prompt_len) == ([], 3)
                return "refused"
        del spare
        if how == "tolist" or state["ran"] != "inside":
            assert result == ([] if state["ran"] == "outside" else list(range(5000))), (state["ran"], len(result))
        else:  # inside pause, before or after it reads the table
            assert result in ([], list(range(5000)))
        assert table.tolist() == ([] if how == "pause" or state["ran"] else list(range(5000)))
        return "inside" if state["ran"] == "inside" and len(result) == 5000 else state["ran"]

    places = [attempt(slack) for slack in range(-2, 40)]
    if how == "tolist":  # (pause's collections here fall before or after its reads: its results still checked)
        assert "inside" in places, places


def test_a_view_made_while_a_collection_grows_the_buffer_is_never_cached_stale(backend):
    def attempt(slack):
        request = backend.Request(1, list(range(16)))
        with at_next_collection(lambda: request.set_generated_tokens([list(range(40))]), slack) as state:
            state["calling"] = True
            first = request.get_tokens_view(0)
        grown = list(range(16)) + list(range(40))
        assert first.tolist() in (list(range(16)), grown)
        assert request.get_tokens_view(0).tolist() == (list(range(16)) if state["ran"] is None else grown)
        request.add_new_token(99)
        assert request.get_tokens_view(0).tolist()[-1] == 99
        return state["ran"]

    if backend.__name__ == "tokcy._pure":
        inside_a_call(attempt)
    else:  # the compiled view allocates nothing the collector tracks: no collection starts inside it
        for slack in range(-2, 40):
            attempt(slack)


def test_release_front_keeps_a_write_made_by_python_code_inside_it(backend):
    """A view shared the table, so release_front copies it first, and Python code run as
    the old storage goes rewrites block 30. The release never restores the change marks
    over that write: the connector's next report carries it (its mirror equals the table)."""
    request = backend.Request(1, list(range(8)))
    request.state = RequestState.GENERATION_IN_PROGRESS
    table = request.block_tables[0]
    table.extend(range(100, 140))
    manager = SchedulerOutputManager()
    mirror = np.asarray(manager.build_scheduler_output([], [request]).new_requests[0].new_block_ids_by_group[0])
    view = table.view()
    state = when_storage_retires(view, lambda: table.__setitem__(30, 7))
    del view
    table.release_front(2)
    expected = [-1, -1] + list(range(102, 140))
    expected[30] = 7
    assert state["ran"] and (table.tolist(), table.num_released) == (expected, 2)
    mirror = apply_cached(mirror, manager.build_scheduler_output([], [request]))
    assert mirror[2:].tolist() == expected[2:]


def apply_cached(mirror, output):
    """Group 0's block ids after a report's cached delta."""
    for data in output.cached_requests:
        replaced = int(data.num_replaced_blocks_by_group[0])
        mirror = np.concatenate([mirror[: len(mirror) - replaced], np.asarray(data.new_block_ids_by_group[0])])
    return mirror


@pytest.mark.parametrize("call, refused", [
    ("release_front", "num_released 10 exceeds the 0 blocks in the table"),
    ("setitem", "position 5 is past the 0 entries left by code that ran meanwhile"),
])
def test_a_table_write_checks_its_position_again_after_python_code_truncated_it(backend, call, refused):
    """A view shared the table, so the write copies it first, and Python code run as the
    old storage goes empties the table. The write is then refused (nothing written, the
    table consistent and picklable), as it would be had the truncation come first."""
    table = backend.BlockTable(list(range(40)))
    view = table.view()
    state = when_storage_retires(view, lambda: table.truncate(0))
    del view
    with pytest.raises((ValueError, IndexError), match=refused):
        table.release_front(10) if call == "release_front" else table.__setitem__(5, 9)
    assert state["ran"] and (table.tolist(), table.num_released) == ([], 0)
    assert pickle.loads(pickle.dumps(table)).tolist() == []


def test_unpickling_a_subclass_restores_its_fields_without_its_properties(backend):
    """A subclass overriding ``state`` (read-only) and ``seq_slot`` (a logging setter):
    unpickling restores the fields exactly and calls neither, on both backends."""
    calls = []

    class Tracked(backend.Request):
        @property
        def state(self):
            return backend.Request.state.__get__(self)

        @property
        def seq_slot(self):
            return backend.Request.seq_slot.__get__(self)

        @seq_slot.setter
        def seq_slot(self, value):
            calls.append(value)
            backend.Request.seq_slot.__set__(self, None if value is None else value + 1000)

    globals()["Tracked"] = Tracked  # picklable by name
    Tracked.__qualname__ = "Tracked"
    try:
        request = Tracked(1, [1, 2, 3])
        backend.Request.state.__set__(request, RequestState.GENERATION_IN_PROGRESS)
        backend.Request.seq_slot.__set__(request, 3)
        restored = pickle.loads(pickle.dumps(request))
    finally:
        del globals()["Tracked"]
    assert type(restored) is Tracked
    assert (restored.state, restored.seq_slot, calls) == (RequestState.GENERATION_IN_PROGRESS, 3, [])


class SaysItFits(np.ndarray):
    """An array that says its values lie in 0..1 (min, max) and that it holds int64."""

    def min(self, *args, **kwargs):
        return 0

    def max(self, *args, **kwargs):
        return 1

    @property
    def dtype(self):
        return np.dtype(np.int64)


def test_token_and_block_ids_are_checked_by_what_numpy_says_not_by_a_subclass(backend):
    """Ids past int32 and floats, in arrays that say they are small ints: refused as in a
    plain array (they were wrapped and truncated into the buffers)."""
    with pytest.raises(OverflowError, match=r"^prompt: token id 4294967301 does not fit in int32$"):
        backend.Request(1, np.array([2**32 + 5, 7]).view(SaysItFits))
    with pytest.raises(OverflowError, match=r"^block_ids: block id 4294967303 does not fit in int32$"):
        backend.BlockTable(np.array([2**32 + 7]).view(SaysItFits))
    with pytest.raises(TypeError, match=r"^prompt must hold integers, got an array of dtype float64$"):
        backend.Request(1, np.array([1.9, 2.7]).view(SaysItFits))
    request = backend.Request(1, [1, 2, 3])
    with pytest.raises(OverflowError, match=r"^per_beam\[0\]: token id -1099511627776 does not fit in int32$"):
        request.add_new_tokens(np.array([-(2**40)]).view(SaysItFits))
    assert request.get_tokens(0) == [1, 2, 3]
