"""Python code that runs in the middle of a call: a conversion's ``__index__`` or
``__len__``, a garbage collection's callbacks (any allocation can start one), a resize
with ``refcheck=False``, a subclass's properties. Each test asserts the defined result or
a clean exception, the same on both backends; under the sanitizer build (.ci/run) a
regression shows as an AddressSanitizer report, not a wrong value.
"""

import gc
import pickle
from array import array
from contextlib import contextmanager

import numpy as np
import pytest

from tokcy import RequestState
from tokcy.executor import HostBuffers, prepare_inputs
from tokcy.executor._host import ARRAY_FIELDS
from tokcy.executor._metadata import MetadataBuffers


@contextmanager
def at_next_collection(action, slack=1):
    """Run ``action`` once, from a gc callback, at the next collection: it starts once
    ``slack`` more tracked objects are allocated than freed (1: the next one). Yields a
    list that holds True once the action ran."""
    ran = []

    def callback(phase, info):
        if phase == "start" and not ran:
            ran.append(True)
            action()

    threshold = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(gc.get_count()[0] + slack)
    try:
        yield ran
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(callback)


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


def test_a_grow_survives_a_collection_that_grows_the_same_buffer(backend):
    """Beam 0 is full (16 of 16): appending allocates new storage, and the collection that
    allocation starts replaces the generated tokens with 4,096 more. The append lands
    after them; nothing is lost, duplicated or written past the storage."""
    request = backend.Request(1, list(range(16)))
    for _ in range(3):  # prime the allocations on the way, so the collection falls in the grow
        gc.collect()
    with at_next_collection(lambda: request.set_generated_tokens([list(range(100, 4196))])) as ran:
        length = request.add_new_token(5)
    assert ran
    expected = list(range(16)) + list(range(100, 4196)) + [5]
    assert (length, request.get_tokens(0)) == (len(expected), expected)


@pytest.mark.parametrize("how", ["tolist", "pause"])
def test_block_table_reads_survive_a_collection_that_reinitialises_the_table(backend, how):
    """tolist() and pause() take the table's bounds, then allocate their result; a
    collection started there empties the table. The result is then the table as it was
    (never memory past the storage that is left); a collection before the call empties
    it first."""
    inside = 0
    for slack in range(-2, 24):  # which allocation starts the collection
        request = backend.Request(1, [1, 2, 3])
        table = request.block_tables[0]
        table.extend(range(5000))
        spare = [[] for _ in range(200)]  # empties the interpreter's free list: the result list is allocated
        with at_next_collection(table.__init__, slack) as ran:
            result = table.tolist() if how == "tolist" else request.pause(10)[0]
        del spare
        assert result in (list(range(5000)), []), (slack, len(result))
        if how == "pause" or ran:
            assert table.tolist() == []
        inside += bool(ran) and len(result) == 5000
    if how == "tolist":  # (pause's collections fall before or after its reads here: its results still checked)
        assert inside


def test_a_view_made_while_a_collection_grows_the_buffer_is_never_cached_stale(backend):
    request = backend.Request(1, list(range(16)))
    with at_next_collection(lambda: request.set_generated_tokens([list(range(40))])) as ran:
        first = request.get_tokens_view(0)
    assert ran
    assert first.tolist() in (list(range(16)), list(range(16)) + list(range(40)))
    assert request.get_tokens_view(0).tolist() == list(range(16)) + list(range(40))
    request.add_new_token(99)
    assert request.get_tokens_view(0).tolist() == list(range(16)) + list(range(40)) + [99]


def storage_behind(view):
    """The numpy array at the end of a view's chain of bases (the buffer's storage)."""
    found, obj = [], view
    while obj is not None:
        if isinstance(obj, np.ndarray):
            found.append(obj)
            obj = obj.base
        elif isinstance(obj, memoryview):
            obj = obj.obj
        else:
            break
    return found[-1]


@pytest.mark.parametrize("owner", ["tokens", "block_table"])
def test_the_storage_behind_a_view_cannot_be_resized(backend, owner):
    """``resize(refcheck=False)`` ignores buffer exports and would free the memory the
    compiled core points into; a buffer's storage refuses it on both backends."""
    request = backend.Request(1, list(range(16)))
    request.block_tables[0].extend(range(8))
    view = request.get_tokens_view(0) if owner == "tokens" else request.block_tables[0].view()
    storage = storage_behind(view)
    with pytest.raises(ValueError, match="cannot resize"):
        storage.resize(1, refcheck=False)
    for token in range(2_000):  # grows past the old storage: it is copied, never freed under us
        request.add_new_token(token)
        request.block_tables[0].append(token)
    assert request.get_tokens(0) == list(range(16)) + list(range(2_000))
    assert request.block_tables[0].tolist() == list(range(8)) + list(range(2_000))
    assert view.tolist() == (list(range(16)) if owner == "tokens" else list(range(8)))


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
