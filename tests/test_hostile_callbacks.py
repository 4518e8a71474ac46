"""Python code that runs in the middle of a call: a conversion's ``__index__`` or
``__len__``, a garbage collection's callbacks (any allocation can start one), a resize
with ``refcheck=False``, a subclass's properties. Each test asserts the defined result or
a clean exception, the same on both backends; under the sanitizer build (.ci/run) a
regression shows as an AddressSanitizer report, not a wrong value.
"""

import gc
import pickle
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
    collection started there empties the table. The result is the table as it was when
    the call began (never memory past the storage that is left)."""
    def attempt(slack):
        request = backend.Request(1, [1, 2, 3])
        table = request.block_tables[0]
        table.extend(range(5000))
        spare = [[] for _ in range(200)]  # empties the interpreter's free list: the result list is allocated
        with at_next_collection(table.__init__, slack) as state:
            state["calling"] = True
            result = table.tolist() if how == "tolist" else request.pause(10)[0]
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


def holder(metadata):
    """A HostBuffers of 64 tokens and 8 sequences writing its metadata into ``metadata``."""
    return HostBuffers.from_arrays(metadata=metadata, **dict(zip(ARRAY_FIELDS, HostBuffers(64, 8).arrays)))


def metadata_arrays(kv_lens):
    return dict(kv_lens=kv_lens, cu_kv_seqlens=np.zeros(9, np.int32), slot_mapping=(np.zeros(64, np.int64),),
                kv_indptr=(np.zeros(9, np.int32),), kv_last_page_len=(np.zeros(8, np.int32),))


def test_metadata_outputs_must_be_numpy_arrays_and_cannot_be_resized_while_bound(backend):
    """An array.array (resizable once nothing exports it) is refused, the same way on both
    backends; a bound numpy metadata array cannot be resized."""
    with pytest.raises(ValueError, match="kv_lens must be a 1-D, C-contiguous, writable int32 numpy array"):
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
    metadata = backend.AttentionMetadata()
    old = (np.zeros(8, np.int32), np.zeros(9, np.int32), (np.zeros(64, np.int64),), (np.zeros(9, np.int32),),
           (np.zeros(8, np.int32),))
    metadata.bind(4, *old)
    writer = backend.InputWriter()
    writer.bind(*writer_arrays())
    writer.set_metadata(metadata)
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
