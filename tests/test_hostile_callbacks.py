"""Python code that runs in the middle of a call: a conversion's ``__index__`` or
``__len__``, a garbage collection's callbacks (any allocation can start one), a resize
with ``refcheck=False``, a subclass's properties. Each test asserts the defined result or
a clean exception, the same on both backends; under the sanitizer build (.ci/run) a
regression shows as an AddressSanitizer report, not a wrong value.
"""

import gc
import pickle
import sys
import weakref
from array import array
from contextlib import contextmanager

import numpy as np
import pytest

from tokcy import RequestState
from tokcy.connector import SchedulerOutputManager
from tokcy.executor import HostBuffers, prepare_inputs
from tokcy.executor._host import ARRAY_FIELDS
from tokcy.executor._metadata import MetadataBuffers


@contextmanager
def at_next_collection(action, slack=1):
    """Run ``action`` once, from a gc callback, at the next collection: it starts once
    ``slack`` more tracked objects are allocated than freed. Yields a dict: set its
    "calling" to True just before the call under test (a store that allocates nothing);
    "ran" then says where the action ran: None (no collection), "inside" or "outside"."""
    state = {"calling": False, "ran": None}

    def callback(phase, info):
        if phase == "start" and state["ran"] is None:
            state["ran"] = "inside" if state["calling"] else "outside"
            action()

    threshold = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(max(gc.get_count()[0] + slack, 1))
    try:
        yield state
    finally:
        state["calling"] = False
        gc.set_threshold(*threshold)
        gc.callbacks.remove(callback)


def inside_a_call(attempt, slacks=range(-2, 40)):
    """Run ``attempt(slack)`` (which checks its own outcome and returns where the
    collection ran) for each slack; at least one collection must land inside the call."""
    places = [attempt(slack) for slack in slacks]
    assert "inside" in places, places


def when_storage_retires(view, action):
    """Run ``action`` once, from a weak reference's callback, when the array ``view`` was
    sliced from (its base, which the buffer keeps) is dropped: the buffer drops it inside
    the next write that moves it to new storage, once the caller has dropped ``view`` (a
    write copies first while a view may exist). This is how Python code runs inside a
    write that makes storage: the compiled core allocates nothing there that could start
    a collection. Returns a dict: "ran"."""
    state = {"ran": False}

    def callback(_):
        state["ran"] = True
        action()

    state["guard"] = weakref.ref(view.base, callback)
    return state


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


def chain_behind(view):
    """The objects a view's data comes through: its bases, down to the one that owns it."""
    chain, obj = [], view.base
    while obj is not None:
        chain.append(obj)
        obj = obj.obj if isinstance(obj, memoryview) else getattr(obj, "base", None)
    return chain


@pytest.mark.parametrize("owner", ["tokens", "block_table"])
def test_nothing_a_view_leads_to_can_free_the_memory_the_buffer_writes(backend, owner):
    """numpy's resize(refcheck=False) and __setstate__ ignore buffer exports and would
    free the memory under the compiled core's pointers. A view's chain of bases ends at the
    compiled core's ArraySource (which keeps the storage and shows no way to it) or
    the twin's bytearray, which refuses to resize while it is exported, and no numpy array
    in it owns that memory: replacing their data with __setstate__ changes what those
    arrays show, never the buffer (both backends)."""
    request = backend.Request(1, list(range(16)))
    request.block_tables[0].extend(range(8))
    view = request.get_tokens_view(0) if owner == "tokens" else request.block_tables[0].view()
    chain = chain_behind(view)
    assert type(chain[-1]).__name__ == ("bytearray" if backend.__name__ == "tokcy._pure" else "ArraySource")
    if isinstance(chain[-1], bytearray):
        with pytest.raises(BufferError):
            chain[-1].extend(bytes(4096))
    arrays = [view] + [obj for obj in chain if isinstance(obj, np.ndarray)]
    for array in arrays:
        with pytest.raises(ValueError, match="cannot resize"):
            array.resize(1, refcheck=False)
    for array in arrays:
        array.__setstate__((1, (1,), np.dtype(np.int32), False, bytes(4)))
    del view, chain, arrays
    churn = [bytearray(64) for _ in range(2_000)]  # reuses any block freed by mistake
    for token in range(2_000):  # grows past the old storage: it is copied, never read after being freed
        request.add_new_token(token)
        request.block_tables[0].append(token)
    del churn
    assert request.get_tokens(0) == list(range(16)) + list(range(2_000))
    assert request.block_tables[0].tolist() == list(range(8)) + list(range(2_000))


def decode_requests(backend, count):
    requests = []
    for index in range(count):
        request = backend.Request(index, [10 + index, 20 + index, 30 + index])
        request.state = RequestState.GENERATION_IN_PROGRESS
        request.block_tables[0].extend([index])
        requests.append(request)
    return requests


def test_bound_output_arrays_and_their_base_cannot_be_resized(backend):
    """HostBuffers' arrays, views of one packed buffer, are bound to the writer: neither
    they nor the buffer they view can be resized under it (refcheck=False included)."""
    sizes = dict(input_ids=64, position_ids=64, gather_ids=64, seq_lens=8, num_cached_tokens=8, prompt_lens=8,
                 cu_seqlens=9, draft_tokens=8, draft_lens=8, device_token_slots=8)
    packed = np.zeros(sum(sizes.values()), np.int32)
    arrays, start = {}, 0
    for name, size in sizes.items():
        arrays[name] = packed[start:start + size]
        start += size
    out = HostBuffers.from_arrays(request_ids=np.zeros(8, np.int64), **arrays)
    requests = decode_requests(backend, 4)
    assert prepare_inputs([], requests, out=out).input_ids.tolist() == [30, 31, 32, 33]
    for victim in (packed, out.arrays[7]):
        with pytest.raises(ValueError, match="cannot resize"):
            victim.resize(1 << 20, refcheck=False)
    for request in requests:
        request.add_new_token(99)
    assert prepare_inputs([], requests, out=out).input_ids.tolist() == [99] * 4


class HidesItsBase(np.ndarray):
    @property
    def base(self):
        return None


def test_the_memory_behind_a_bound_array_that_hides_its_base_cannot_be_resized(backend):
    """An output array whose base property says None: the array its memory comes from is
    still guarded (numpy's own base is followed), so it cannot be resized, freeing the
    memory under the writer, even with refcheck=False."""
    memory = np.zeros(64, np.int32)
    arrays = writer_arrays()
    arrays[0] = memory[:64].view(HidesItsBase)
    writer = backend.InputWriter()
    writer.bind(*arrays)
    with pytest.raises(ValueError, match="cannot resize"):
        memory.resize(1 << 20, refcheck=False)
    assert writer.prepare([], decode_requests(backend, 2), (), (), 0, None, 0, None)[3] == 2
    assert memory[:2].tolist() == [30, 31]


def holder(metadata):
    """A HostBuffers of 64 tokens and 8 sequences writing its metadata into ``metadata``."""
    return HostBuffers.from_arrays(metadata=metadata, **dict(zip(ARRAY_FIELDS, HostBuffers(64, 8).arrays)))


def metadata_arrays(kv_lens):
    return dict(kv_lens=kv_lens, cu_kv_seqlens=np.zeros(9, np.int32), slot_mapping=(np.zeros(64, np.int64),),
                kv_indptr=(np.zeros(9, np.int32),), kv_last_page_len=(np.zeros(8, np.int32),))


def test_metadata_outputs_must_be_numpy_arrays_and_cannot_be_resized_while_bound(backend):
    """An array.array (resizable once nothing exports it) is refused, the same way on both
    backends; a bound numpy metadata array cannot be resized."""
    with pytest.raises(ValueError, match="kv_lens must be a 1-D, C-contiguous, writable, aligned int32 numpy array"):
        metadata = MetadataBuffers.from_arrays(max_blocks_per_seq=4, **metadata_arrays(array("i", [0] * 8)))
        holder(metadata).writer()
    kv_lens = np.zeros(8, np.int32)
    metadata = MetadataBuffers.from_arrays(max_blocks_per_seq=4, **metadata_arrays(kv_lens))
    out = holder(metadata)
    requests = decode_requests(backend, 4)
    assert prepare_inputs([], requests, out=out, block_size=16).kv_lens.tolist() == [3] * 4
    with pytest.raises(ValueError, match="cannot resize"):
        kv_lens.resize(1 << 20, refcheck=False)
    for request in requests:
        request.add_new_token(99)
    assert prepare_inputs([], requests, out=out, block_size=16).kv_lens.tolist() == [4] * 4


class SaysEight(np.ndarray):
    """An array that says it holds 8 entries (len and shape), 8 columns when 2-D, and an
    8-byte aligned address, whatever it holds and wherever it lies."""

    def __len__(self):
        return 8

    @property
    def shape(self):
        return (8,) if self.ndim == 1 else (8, 8)

    @property
    def ctypes(self):
        class Aligned:
            data = 8
        return Aligned()


def test_metadata_arrays_are_sized_by_numpy_not_by_what_a_subclass_says(backend):
    """kv_lens of 1 entry saying it holds 8: a batch of 8 sequences is refused for the
    room it really has, and nothing is written past it (the compiled core took the length
    from len(); its second pass wrote 7 entries into the array next to it)."""
    backing = np.full(16, -7, np.int32)
    metadata = MetadataBuffers.from_arrays(max_blocks_per_seq=4, **metadata_arrays(backing[:1].view(SaysEight)))
    with pytest.raises(ValueError, match="^the batch needs 8 metadata sequences but the output has room for 1$"):
        prepare_inputs([], decode_requests(backend, 8), out=holder(metadata), block_size=16)
    assert backing.tolist() == [-7] * 16
    assert prepare_inputs([], decode_requests(backend, 1), out=holder(metadata), block_size=16).kv_lens.tolist() == [3]
    assert backing.tolist() == [3] + [-7] * 15


def test_a_dense_table_and_a_delta_area_are_checked_by_what_numpy_says(backend):
    """A dense table of 3 columns saying 8, and a delta area 4 bytes off an 8-byte line
    saying it is aligned: both refused with the check's message, on both backends."""
    arrays = metadata_arrays(np.zeros(8, np.int32))
    metadata = backend.AttentionMetadata()
    with pytest.raises(ValueError, match=r"^block_table\[0\] must have 8 columns, got 3$"):
        metadata.bind(8, *arrays.values(), (np.zeros((8, 3), np.int32).view(SaysEight),), (np.zeros(64, np.int32),))
    metadata.bind(8, *arrays.values())
    rows = backend.DeviceTableRows(8, 1, 8)
    gathers = ((np.zeros(8, np.int32),), (np.zeros(8, np.int64),), (np.zeros(8, np.int64),))
    memory = np.zeros(33, np.int64).view(np.int32)
    misaligned = memory[1:].view(SaysEight)
    with pytest.raises(ValueError, match=r"^delta_area must be 8-byte aligned \(the changed entries' indices are "
                                         r"int64\)$"):
        metadata.bind_device_table(rows, np.zeros(8, np.int32), misaligned, *gathers)
    assert not metadata.has_device_table


class LengthChanges(list):
    """A list whose len() says 1 for its first ``lies`` calls, then the truth."""

    def __init__(self, items, lies):
        super().__init__(items)
        self.lies = lies

    def __len__(self):
        self.lies -= 1
        return 1 if self.lies >= 0 else super().__len__()


@pytest.mark.parametrize("lies", range(6))
def test_bind_counts_the_groups_it_binds_once(backend, lies):
    """17 groups of metadata arrays in lists whose len() says 1 at first: bind counts the
    tuples it keeps (17: refused, the arrays bound before kept), never a len() read before
    its checks (the compiled core wrote 17 groups' pointers into arrays of 16)."""
    first = list(metadata_arrays(np.zeros(8, np.int32)).values())
    metadata, writer = writer_with_metadata(backend, first)
    groups = [LengthChanges((np.zeros(n, dtype) for _ in range(17)), lies)
              for n, dtype in ((64, np.int64), (9, np.int32), (8, np.int32))]
    with pytest.raises(ValueError, match="^between 1 and 16 layer groups, got 17$"):
        metadata.bind(4, np.zeros(8, np.int32), np.zeros(9, np.int32), *groups)
    writer.prepare([], decode_requests(backend, 2), (), (), 0, None, 0, (16,))
    assert first[0][:2].tolist() == [3, 3]  # still writing the arrays bound before


class CallsBack(list):
    """A sequence of arrays whose iteration first runs ``call``."""

    def __init__(self, arrays, call):
        super().__init__(arrays)
        self.call = call

    def __iter__(self):
        self.call()
        return super().__iter__()


def test_a_call_from_code_that_bind_runs_is_refused(backend):
    """Binding runs caller code (here the iteration of a group's arrays, and a collection's
    callbacks); a writer's call from there is refused with RuntimeError: another thread's,
    whose second pass may write the bound outputs without the GIL, must not see them
    swapped mid-call (it saw the old guard down and ran: a use-after-free under the
    sanitizer, with a thread whose call started in the gap)."""
    requests = decode_requests(backend, 4)
    arrays = list(metadata_arrays(np.zeros(8, np.int32)).values())
    metadata, writer = writer_with_metadata(backend, arrays)
    refused = []

    def prepare():
        try:
            writer.prepare([], requests, (), (), 0, None, 0, (16,))
        except RuntimeError as error:
            refused.append(str(error))

    arrays[2] = CallsBack(arrays[2], prepare)  # slot_mapping
    metadata.bind(4, *arrays)
    assert refused == ["these attention-metadata outputs are in use by another call (a writer that shares them)"]
    assert writer.prepare([], requests, (), (), 0, None, 0, (16,))[3] == 4  # bound, and usable

    refused.clear()
    for slack in range(-2, 40):  # a collection somewhere in the writer's bind, which allocates
        new = writer_arrays()
        with at_next_collection(prepare, slack) as state:
            state["calling"] = True
            writer.bind(*new)
            state["calling"] = False
    assert refused and {message.split(" (")[0] for message in refused} == {
        "this InputWriter is in use by another call"}, refused


class CallsOtherWriter:
    """A CUDA-graph batch size whose conversion runs another writer on the shared metadata."""

    def __init__(self, value, call):
        self.value, self.call = value, call

    def __index__(self):
        self.call()
        return self.value


def test_writers_sharing_metadata_outputs_are_refused_while_one_runs(backend):
    """Two HostBuffers over one MetadataBuffers: while one writer's call runs, the other's
    is refused (RuntimeError), so no call re-plans what another is writing."""
    metadata = MetadataBuffers(8, 8, 4)
    first, second = holder(metadata), holder(metadata)
    requests = decode_requests(backend, 4)
    errors = []

    def other_writer():
        try:
            prepare_inputs([], requests[:2], out=second, block_size=16)
        except RuntimeError as error:
            errors.append(str(error))

    padded_to = CallsOtherWriter(8, other_writer)
    result = prepare_inputs([], requests, out=first, block_size=16, cuda_graph_batch_sizes=[padded_to])
    assert errors == ["these attention-metadata outputs are in use by another call (a writer that shares them)"]
    assert result.kv_lens[:4].tolist() == [3] * 4
    # once the first call is over, the second writer runs
    assert prepare_inputs([], requests[:2], out=second, block_size=16).kv_lens[:2].tolist() == [3, 3]


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


def writer_arrays(num_tokens=64, batch=8):
    """InputWriter.bind's eleven arrays, in its order."""
    return ([np.zeros(num_tokens, np.int32) for _ in range(3)] + [np.zeros(batch, np.int32) for _ in range(3)]
            + [np.zeros(batch + 1, np.int32), np.zeros(batch, np.int64), np.zeros(num_tokens, np.int32),
               np.zeros(batch, np.int32), np.zeros(batch, np.int32)])


def writer_with_metadata(backend, arrays):
    """(an AttentionMetadata bound to ``arrays``, a writer bound to writer_arrays() writing it)."""
    metadata = backend.AttentionMetadata()
    metadata.bind(4, *arrays)
    writer = backend.InputWriter()
    writer.bind(*writer_arrays())
    writer.set_metadata(metadata)
    return metadata, writer


def test_rebinding_a_writer_releases_the_old_arrays_only_once_the_new_ones_are_bound(backend):
    """Freeing the arrays bound before can run Python code (here a finalizer that prepares
    a step): it must find the writer writing into the new arrays, not into the freed ones."""
    requests = decode_requests(backend, 4)
    writer = backend.InputWriter()
    old = writer_arrays()
    writer.bind(*old)
    seen = []

    def on_free():
        writer.prepare([], requests, (), (), 0, None, 0, None)
        seen.append(new[0][:4].tolist())

    weakref.finalize(old[0], on_free)
    del old
    new = writer_arrays()
    writer.bind(*new)
    assert seen == [[30, 31, 32, 33]]


def test_rebinding_metadata_releases_the_old_arrays_only_once_the_new_ones_are_bound(backend):
    requests = decode_requests(backend, 4)
    old = (np.zeros(8, np.int32), np.zeros(9, np.int32), (np.zeros(64, np.int64),), (np.zeros(9, np.int32),),
           (np.zeros(8, np.int32),))
    metadata, writer = writer_with_metadata(backend, old)
    seen = []

    def on_free():
        writer.prepare([], requests, (), (), 0, None, 0, (16,))
        seen.append(new[0][:4].tolist())

    weakref.finalize(old[0], on_free)
    del old
    new = (np.zeros(8, np.int32), np.zeros(9, np.int32), (np.zeros(64, np.int64),), (np.zeros(9, np.int32),),
           (np.zeros(8, np.int32),))
    metadata.bind(4, *new)
    assert seen == [[3, 3, 3, 3]]


def two_group_request(backend, length):
    """Request 1 decoding at position ``length - 1``, tables [100, 101, 102, 103] in both groups."""
    request = backend.Request(1, list(range(length)), num_layer_groups=2)
    request.state = RequestState.GENERATION_IN_PROGRESS
    for table in request.block_tables:
        table.extend([100, 101, 102, 103])
    return request


def test_a_refused_block_size_changes_no_size_another_writers_plan_will_write_with(backend):
    """Two holders share metadata outputs. The first writer plans (block 16: position 60 is
    in block 3, id 103, slot 103 * 16 + 12 = 1660); the second call is refused for its
    second block size; the first writer's write still uses 16 (a refused tuple used to
    leave its first size behind: the write then read block 60 of a 4-block table)."""
    metadata = MetadataBuffers(64, 8, 4, num_layer_groups=2)
    first, second = holder(metadata), holder(metadata)
    request = two_group_request(backend, 61)
    writer = first.writer()
    writer.plan([], [request], [], [], 0, None, 0, (16, 16))
    with pytest.raises(ValueError, match=r"block_sizes must be a tuple of integers .* got \(1, 2147483648\)"):
        prepare_inputs([], [request], out=second, block_sizes=(1, 2**31))
    writer.write()
    assert [group[:1].tolist() for group in metadata.slot_mapping] == [[1660], [1660]]
    assert [group[:1].tolist() for group in metadata.kv_last_page_len] == [[13], [13]]
    assert [group[0].tolist() for group in metadata.block_table] == [[100, 101, 102, 103]] * 2


def test_a_refused_block_size_leaves_the_sizes_of_the_tuple_used_before(backend):
    """The same tuple object before and after a refused call: the same metadata (block 16:
    position 39 in block 2, id 102, slot 102 * 16 + 7 = 1639)."""
    sizes = (16, 16)
    request = two_group_request(backend, 40)
    out = HostBuffers(64, 8, max_blocks_per_seq=8, num_layer_groups=2)
    for _ in range(2):  # the first call makes the writers; the second hands the compiled one this tuple
        prepare_inputs([], [request], out=out, block_sizes=sizes)
    with pytest.raises(ValueError, match="one per layer group"):
        prepare_inputs([], [request], out=out, block_sizes=(8, 2**31))
    after = prepare_inputs([], [request], out=out, block_sizes=sizes)
    assert [group.slot_mapping.tolist() for group in after.groups] == [[1639], [1639]]
    assert after.kv_indices.tolist() == [100, 101, 102] and after.kv_last_page_len.tolist() == [8]


class Converts:
    """A CUDA-graph batch size of 4 whose conversion runs ``action``."""

    def __init__(self, action):
        self.action = action

    def __index__(self):
        self.action()
        return 4


@pytest.mark.parametrize("given, change, request_ids, input_ids", [
    (1, lambda batch, requests: batch.extend(requests[1:]), [0, 1, 2, -1], [3, 4, 5, 0]),
    (3, lambda batch, requests: batch.clear(), [-1, -1, -1, -1], [0, 0, 0, 0]),
    (2, lambda batch, requests: batch.append(batch[0]), None, None),
], ids=["grown", "cleared", "duplicated"])
@pytest.mark.parametrize("holder", ["out", "no out, block size"])
def test_a_list_of_requests_is_read_after_the_conversions_that_can_change_it(backend, given, change, request_ids,
                                                                           input_ids, holder):
    """A batch-size conversion changes the list of requests the call was given (its first
    ``given`` of three): both backends read the list as that left it (request r's last
    token is 3 + r; the batch padded to 4), into a holder or into arrays the call makes
    (with a block size, which plans the batch twice)."""
    requests = decode_requests(backend, 3)
    for number, request in enumerate(requests):
        request.add_new_token(3 + number)
    batch = requests[:given]
    where = {"out": HostBuffers(16, 8)} if holder == "out" else {"block_size": 16}
    convert = Converts(lambda: change(batch, requests))
    if request_ids is None:
        with pytest.raises(ValueError, match="request 0 is given twice in the batch"):
            prepare_inputs([], batch, cuda_graph_batch_sizes=[convert], **where)
        return
    prepared = prepare_inputs([], batch, cuda_graph_batch_sizes=[convert], **where)
    assert prepared.request_ids.tolist() == request_ids and prepared.input_ids.tolist() == input_ids


@pytest.mark.parametrize("holder_type", ["HostBuffers", "MetadataBuffers"])
def test_a_holders_fields_are_read_only(backend, holder_type):
    """Its writers are bound to its arrays when made: replacing one would leave them
    writing the old ones (a block-size conversion that tried it now fails before anything
    is written)."""
    out = HostBuffers(16, 8, max_blocks_per_seq=4)
    target = out if holder_type == "HostBuffers" else out.metadata
    names = (["arrays", "max_num_tokens", "max_batch_size", "max_draft_len", "max_beam_width", "metadata"]
             if holder_type == "HostBuffers" else
             ["max_blocks_per_seq", "num_layer_groups", "kv_lens", "cu_kv_seqlens", "slot_mapping", "block_table",
              "kv_indptr", "kv_indices", "kv_last_page_len"])
    for name in names:
        before = getattr(target, name)
        with pytest.raises(AttributeError, match=f"{holder_type}.{name} is read-only"):
            setattr(target, name, None)
        assert getattr(target, name) is before
    requests = decode_requests(backend, 2)
    prepare_inputs([], requests, out=out, block_size=16)
    out.input_ids[:] = -7

    class SwapsMetadata:
        def __index__(self):
            out.metadata = MetadataBuffers(16, 8, 4)
            return 16

    with pytest.raises(AttributeError, match="HostBuffers.metadata is read-only"):
        prepare_inputs([], requests, out=out, block_size=SwapsMetadata())
    assert out.input_ids.tolist() == [-7] * 16


def test_a_report_built_from_a_collection_inside_another_never_shares_its_arrays(backend):
    """Python code that runs as a report is finished (a collection's callback, or another
    thread given the GIL there) may build the manager's next report: it is refused while
    the first is being built, and once accepted writes arrays of its own. The first report
    shows its own rows, and the next one carries on from them (no token lost)."""
    manager = SchedulerOutputManager()
    first = backend.Request(1, [10, 11, 12])
    second = backend.Request(2, [20, 21, 22])
    for request in (first, second):
        request.state = RequestState.GENERATION_IN_PROGRESS
    manager.build_scheduler_output([], [first])  # the arena's arrays exist
    first.add_new_token(13)
    inner, refused = [], []

    def build_inner(phase, info):
        if phase == "start" and not inner:
            try:
                inner.append(manager.build_scheduler_output([], [second]))
            except RuntimeError:
                refused.append(True)

    threshold = gc.get_threshold()
    gc.callbacks.append(build_inner)
    gc.set_threshold(1)
    try:
        outer = manager.build_scheduler_output([], [first])
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(build_inner)
    assert refused or inner  # the callback ran
    assert (outer.request_ids.tolist(), outer.tokens.tolist()) == ([1], [13])
    if inner:
        assert (inner[0].request_ids.tolist(), inner[0].tokens.tolist()) == ([2], [20, 21, 22])
    first.add_new_token(14)
    later = manager.build_scheduler_output([], [first])
    assert (later.tokens.tolist(), later.num_replaced_tokens.tolist()) == ([14], [0])


def test_two_first_calls_on_a_holder_share_one_writer_and_one_metadata(backend):
    """HostBuffers.writer() and MetadataBuffers.bound() keep the first one made: a call
    that made its own meanwhile (another thread's first call, here a collection's
    callback) gets the kept one, so the busy guard covers both and the metadata written is
    the metadata read."""
    holder = HostBuffers(16, 4, max_blocks_per_seq=4)
    made = {}

    def first_use_inside():
        made["writer"] = holder.writer(backend)
        made["metadata"] = holder.metadata.bound(backend)

    with at_next_collection(first_use_inside) as state:
        state["calling"] = True
        writer = holder.writer(backend)
    metadata = holder.metadata.bound(backend)
    assert state["ran"] == "inside"  # (making the writer allocates what the collector tracks)
    assert made["writer"] is writer and made["metadata"] is metadata
    assert holder.writer(backend) is writer
    decode = backend.Request(1, list(range(9)))
    decode.state = RequestState.GENERATION_IN_PROGRESS
    decode.block_tables[0].extend([5, 6, 7])
    inputs = prepare_inputs([], [decode], block_size=4, out=holder)
    assert (inputs.max_kv_len, inputs.kv_indices.tolist(), inputs.slot_mapping.tolist()) == (9, [5, 6, 7], [28])


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
