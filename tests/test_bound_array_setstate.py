"""Caller-owned output arrays given new memory by ``ndarray.__setstate__`` while a writer
is bound to them (``HostBuffers.from_arrays``, ``MetadataBuffers.from_arrays``).

numpy's ``__setstate__`` frees the memory an array owns and gives it other memory, whatever
views, buffer exports or weak references of it are alive: the compiled writer's pointers
and the twin's plain views would then point at freed memory (under the sanitizer build, a
heap-use-after-free; otherwise a corrupted heap). That happens to a bound array itself, or
to the numpy array its memory comes from (one packed staging buffer), between two calls or
from code a call runs before it writes (a generator of requests, an ``__index__``, a
collection's or a weak reference's callback). Each call checks, once no Python code can
run before its writes, that every numpy array owning the memory of a bound array still
owns it: RuntimeError naming the array, and nothing written, otherwise. (A bound view
given new memory frees nothing: the writer holds the memory it writes.)
"""

import gc
import pickle
import re
import weakref

import numpy as np
import pytest
from hostile_code import IndexRuns
from test_collector_reach import at_every_collection

from tokcy import RequestState
from tokcy.executor import ARRAY_FIELDS, HostBuffers, prepare_inputs
from tokcy.executor._host import capacity_lengths
from tokcy.executor._metadata import MetadataBuffers

SENTINEL = -7
CAPACITY = 2048  # token rows: every array holds more than the 1000 bytes below which numpy copies a state


def moved(name):
    return (rf"^out array {re.escape(name)} \(or the array its memory comes from\) was given new memory by "
            r"__setstate__ while bound: nothing was written; bind the arrays again$")


def dtype_of(name):
    return np.int64 if name == "request_ids" else np.int32


def owned_arrays():
    """Each output array owning its memory, filled with SENTINEL."""
    return {name: np.full(size, SENTINEL, dtype_of(name))
            for name, size in capacity_lengths(CAPACITY, CAPACITY // 4, 2).items()}


def views_of_one_buffer():
    """The output arrays as views of one packed int64 staging buffer (the int32 ones
    through ``view``), filled with SENTINEL; returns (arrays, buffer)."""
    lengths = capacity_lengths(CAPACITY, CAPACITY // 4, 2)
    words = {name: (size + 1) // 2 if dtype_of(name) is np.int32 else size for name, size in lengths.items()}
    staging = np.zeros(sum(words.values()), np.int64)
    arrays, start = {}, 0
    for name, size in lengths.items():
        view = staging[start : start + words[name]]
        arrays[name] = view if dtype_of(name) is np.int64 else view.view(np.int32)[:size]
        start += words[name]
    for array in arrays.values():
        array.fill(SENTINEL)
    return arrays, staging


def give_new_memory(array):
    """What unpickling into ``array`` does: ``__setstate__`` with its own state. numpy frees
    the memory ``array`` owned (its views' memory, if it owned none: they keep it) and shows
    the state's bytes object instead, a block that was alive before (never the old one)."""
    before = array.__array_interface__["data"][0]
    array.__setstate__(array.__reduce__()[2])
    assert array.__array_interface__["data"][0] != before


def decoding(backend, count=4, groups=1):
    requests = []
    for index in range(count):
        request = backend.Request(index, [10 + index, 20 + index, 30 + index], num_layer_groups=groups)
        request.state = RequestState.GENERATION_IN_PROGRESS
        for table in request.block_tables:
            table.extend([index])
        requests.append(request)
    return requests


def contents(arrays):
    return {name: np.array(array).tolist() for name, array in arrays.items()}


def expect_refused(name, call, arrays, requests):
    """``call()`` raises the RuntimeError naming ``name``; no array and no request changed."""
    before, states = contents(arrays), pickle.dumps(requests)
    with pytest.raises(RuntimeError, match=moved(name)):
        call()
    assert contents(arrays) == before
    assert pickle.dumps(requests) == states


@pytest.mark.parametrize("name", ARRAY_FIELDS)
def test_an_output_array_given_new_memory_between_calls_is_refused(backend, name):
    """The array's old memory is freed: before, the next call wrote into it."""
    arrays = owned_arrays()
    out = HostBuffers.from_arrays(max_draft_len=2, **arrays)
    requests = decoding(backend)
    assert prepare_inputs([], requests, out=out).input_ids.tolist() == [30, 31, 32, 33]
    for array in arrays.values():
        array.fill(SENTINEL)
    give_new_memory(arrays[name])
    expect_refused(name, lambda: prepare_inputs([], requests, out=out), arrays, requests)
    # bound again, the arrays as they are now are written
    assert prepare_inputs([], requests, out=HostBuffers.from_arrays(**arrays)).input_ids.tolist() == [30, 31, 32, 33]
    assert arrays["input_ids"][:4].tolist() == [30, 31, 32, 33]


def test_the_buffer_the_outputs_view_given_new_memory_is_refused(backend):
    """Views of one packed staging buffer: ``__setstate__`` on the buffer frees the memory
    every view shows. The first bound array whose memory comes from it is named."""
    arrays, staging = views_of_one_buffer()
    out = HostBuffers.from_arrays(max_draft_len=2, **arrays)
    requests = decoding(backend)
    prepare_inputs([], requests, out=out)
    for array in arrays.values():
        array.fill(SENTINEL)
    give_new_memory(staging)
    # (the views show freed memory now, numpy's doing: only the buffer can be read)
    expect_refused("input_ids", lambda: prepare_inputs([], requests, out=out), {"staging": staging}, requests)


def test_views_given_new_memory_keep_the_buffer_they_dropped(backend):
    """The caller keeps only the views; ``__setstate__`` on each gives it memory of its own
    and drops its base, the staging buffer, which nothing of the caller's holds then. That
    frees nothing the writer writes: it holds the buffer and goes on writing it (which the
    views no longer show: the caller's doing)."""
    arrays, staging = views_of_one_buffer()
    out = HostBuffers.from_arrays(max_draft_len=2, **arrays)
    alive = weakref.ref(staging)
    del staging
    requests = decoding(backend)
    prepare_inputs([], requests, out=out)
    for array in arrays.values():
        give_new_memory(array)
    gc.collect()
    churn = [np.full(4096, 99, np.int64) for _ in range(64)]  # would reuse a buffer freed by mistake
    for request in requests:
        request.add_new_token(40 + request.request_id)
    prepare_inputs([], requests, out=out)
    assert alive().view(np.int32)[:4].tolist() == [40, 41, 42, 43]  # input_ids, first in the buffer
    assert arrays["input_ids"][:4].tolist() == [30, 31, 32, 33] and not (churn[0] - 99).any()


def test_a_view_of_the_buffer_that_is_not_bound_changes_nothing(backend):
    """Only the numpy arrays that own the memory of bound arrays are checked: another view
    of the same buffer given new memory frees none of it."""
    arrays, staging = views_of_one_buffer()
    out = HostBuffers.from_arrays(max_draft_len=2, **arrays)
    give_new_memory(staging[-16:])
    assert prepare_inputs([], decoding(backend), out=out).input_ids.tolist() == [30, 31, 32, 33]


class Dropped:
    """An object a weak reference's callback watches."""


@pytest.mark.parametrize("how", ["generator", "__index__", "collection", "weakref callback"])
@pytest.mark.parametrize("owner", ["an output", "the staging buffer"])
def test_new_memory_given_by_code_the_call_runs_is_refused(backend, how, owner):
    """Python code that the call itself runs before it writes (iterating a generator of
    requests, converting ``max_draft_len``, a collection's callback on an allocation the
    call makes, a weak reference's callback as the call drops an object) gives the memory
    away: the call is refused before it writes anything."""
    if owner == "an output":
        arrays = owned_arrays()
        target, name, compared = arrays["gather_ids"], "gather_ids", arrays
    else:
        arrays, staging = views_of_one_buffer()
        # (the views show freed memory once the buffer is given new memory: only it can be read)
        target, name, compared = staging, "input_ids", {"staging": staging}
    out = HostBuffers.from_arrays(max_draft_len=2, **arrays)
    requests = decoding(backend)
    prepare_inputs([], requests, out=out)
    for array in arrays.values():
        array.fill(SENTINEL)
    started, given = [], []

    def give_once():  # once the call started (a collection may start before it too)
        if started and not given:
            given.append(True)
            give_new_memory(target)

    dropped = [Dropped()]
    watcher = weakref.ref(dropped[0], lambda _: give_once())  # (kept to the end: a dead one calls nothing back)

    def generation():
        started.append(True)
        if how == "generator":
            give_once()
        elif how == "weakref callback":
            dropped.clear()
        yield from list(requests)  # (the list allocates: a collection may start)

    if how == "__index__":
        started.append(True)
        call = lambda: prepare_inputs([], requests, max_draft_len=IndexRuns(2, give_once), out=out)
    else:
        call = lambda: prepare_inputs([], generation(), out=out)
    if how == "collection":
        with at_every_collection(give_once):
            expect_refused(name, call, compared, requests)
    else:
        expect_refused(name, call, compared, requests)
    assert given
    del watcher


def metadata_arrays(groups=1, width=4):
    """Caller-owned metadata outputs (each owning its memory), filled with SENTINEL."""
    seqs = CAPACITY // 4
    return {
        "kv_lens": np.full(seqs, SENTINEL, np.int32),
        "cu_kv_seqlens": np.full(seqs + 1, SENTINEL, np.int32),
        "slot_mapping": tuple(np.full(CAPACITY, SENTINEL, np.int64) for _ in range(groups)),
        "kv_indptr": tuple(np.full(seqs + 1, SENTINEL, np.int32) for _ in range(groups)),
        "kv_last_page_len": tuple(np.full(seqs, SENTINEL, np.int32) for _ in range(groups)),
        "block_table": tuple(np.full((seqs, width), SENTINEL, np.int32) for _ in range(groups)),
        "kv_indices": tuple(np.full(seqs * width, SENTINEL, np.int32) for _ in range(groups)),
    }


def flat(metadata, inputs):
    """Every array of the metadata outputs and the token inputs, by name."""
    arrays = dict(inputs)
    for name, value in metadata.items():
        if isinstance(value, tuple):
            arrays.update({f"{name}[{group}]": array for group, array in enumerate(value)})
        else:
            arrays[name] = value
    return arrays


@pytest.mark.parametrize("name", ["kv_lens", "cu_kv_seqlens", "slot_mapping[1]", "kv_indptr[0]",
                                  "kv_last_page_len[1]", "block_table[0]", "kv_indices[1]"])
def test_a_metadata_array_given_new_memory_is_refused(backend, name):
    """The same for the attention metadata's outputs, in a call that writes them; a call
    that does not (no block size) still writes the token inputs."""
    metadata, inputs = metadata_arrays(groups=2), owned_arrays()
    out = HostBuffers.from_arrays(max_draft_len=2, metadata=MetadataBuffers.from_arrays(4, **metadata), **inputs)
    requests = decoding(backend, groups=2)
    prepare_inputs([], requests, block_sizes=(16, 16), out=out)
    arrays = flat(metadata, inputs)
    for array in arrays.values():
        array.fill(SENTINEL)
    give_new_memory(arrays[name])
    expect_refused(name, lambda: prepare_inputs([], requests, block_sizes=(16, 16), out=out), arrays, requests)
    assert prepare_inputs([], requests, out=out).input_ids.tolist() == [30, 31, 32, 33]


def test_a_metadata_view_given_new_memory_keeps_the_buffer_it_dropped(backend):
    """A metadata output that is a view of a staging buffer the caller no longer holds:
    ``__setstate__`` on the view drops the buffer's last reference but the writer's (before,
    the compiled metadata held none: the buffer was freed under its pointer)."""
    staging = np.zeros(4 * CAPACITY, np.int32)
    seqs = CAPACITY // 4
    kv_lens = staging[:seqs]
    metadata = MetadataBuffers.from_arrays(4, kv_lens, np.zeros(seqs + 1, np.int32), [np.zeros(CAPACITY, np.int64)],
                                           [np.zeros(seqs + 1, np.int32)], [np.zeros(seqs, np.int32)])
    out = HostBuffers.from_arrays(metadata=metadata, **owned_arrays())
    alive = weakref.ref(staging)
    del staging
    requests = decoding(backend)
    prepare_inputs([], requests, block_size=16, out=out)
    give_new_memory(kv_lens)
    gc.collect()
    churn = [np.full(4096, 99, np.int32) for _ in range(64)]  # would reuse a buffer freed by mistake
    for request in requests:
        request.add_new_token(40)
    prepare_inputs([], requests, block_size=16, out=out)
    assert alive()[:4].tolist() == [4, 4, 4, 4]  # the KV lengths, written where kv_lens was bound
    assert not (churn[0] - 99).any()


@pytest.mark.parametrize("name", ["table_slots", "delta_area", "gather_blocks[0]", "gather_live[0]", "gather_base[0]"])
def test_a_device_table_array_given_new_memory_is_refused(backend, name):
    """The arrays a device block table is bound to (``bind_device_table``; an
    ``InputPreparer``'s own, here the caller's): refused before the tables' change marks
    are consumed, which the requests keep."""
    seqs = CAPACITY // 4
    metadata = backend.AttentionMetadata()
    metadata.bind(8, np.zeros(seqs, np.int32), np.zeros(seqs + 1, np.int32), (np.zeros(CAPACITY, np.int64),),
                  (np.zeros(seqs + 1, np.int32),), (np.zeros(seqs, np.int32),))
    device = {"table_slots": np.zeros(seqs, np.int32), "delta_area": np.zeros(4 * CAPACITY, np.int32),
              "gather_blocks[0]": np.zeros(seqs, np.int32), "gather_live[0]": np.zeros(seqs, np.int64),
              "gather_base[0]": np.zeros(seqs, np.int64)}
    metadata.bind_device_table(backend.DeviceTableRows(8, 1, 8), device["table_slots"], device["delta_area"],
                               [device["gather_blocks[0]"]], [device["gather_live[0]"]], [device["gather_base[0]"]])
    inputs = owned_arrays()
    writer = backend.InputWriter()
    writer.bind(*(inputs[field] for field in ARRAY_FIELDS))
    writer.set_metadata(metadata)
    requests = decoding(backend)
    for slot, request in enumerate(requests):
        request.seq_slot = slot
    writer.prepare([], requests, [], [], 0, None, 0, (16,))
    for request in requests:
        request.block_tables[0].append(40)  # a change the next call would send
    arrays = {**inputs, **device}
    for array in arrays.values():
        array.fill(SENTINEL)
    give_new_memory(device[name])
    expect_refused(name, lambda: writer.prepare([], requests, [], [], 0, None, 0, (16,)), arrays, requests)


def owner_of(array):
    """The numpy array that owns ``array``'s memory (asserting that one does, with no
    memoryview or other object on the way)."""
    while not array.flags.owndata:
        array = array.base
        assert isinstance(array, np.ndarray)
    return array


def test_holder_arrays_without_the_compiled_core_lie_in_one_block_a_numpy_array_owns(backend, monkeypatch):
    """A pure install (no compiled core) allocates a holder's arrays as views of one block a
    numpy array owns, and its metadata's as views of another: no memoryview stands behind
    them that a caller could release (a bytearray's would free the memory under them),
    ``__setstate__`` of one of them frees nothing, and the twin's check before each write
    reads one owner per holder. That owner given new memory is refused as any bound one is."""
    from tokcy.executor import _memory

    monkeypatch.setattr(_memory, "_zeroed_array", None)
    holder = HostBuffers(64, 8, 2, max_blocks_per_seq=4)
    metadata = holder.metadata
    meta_arrays = [metadata.kv_lens, metadata.cu_kv_seqlens]
    for name in ("slot_mapping", "kv_indptr", "kv_last_page_len", "block_table", "kv_indices"):
        meta_arrays += getattr(metadata, name)  # one per layer group
    owners = []
    for arrays in (list(holder.arrays), meta_arrays):
        for array in arrays:
            assert array.flags.writeable and array.flags.aligned and not array.any()
        assert len({id(owner_of(array)) for array in arrays}) == 1
        owners.append(owner_of(arrays[0]))
    assert owners[0] is not owners[1]
    request = backend.Request(1, [3, 4, 5])
    request.state = RequestState.GENERATION_IN_PROGRESS
    request.block_tables[0].extend([9])
    prepare_inputs([], [request], out=holder, block_size=4)  # binds the arrays
    for array in list(holder.arrays) + meta_arrays:
        give_new_memory(array)  # frees nothing: the writer still writes the block it holds
    inputs = prepare_inputs([], [request], out=holder, block_size=4)
    assert inputs.input_ids.tolist() == [5] and inputs.slot_mapping.tolist() == [38]
    give_new_memory(owners[0])
    with pytest.raises(RuntimeError, match=moved("input_ids")):
        prepare_inputs([], [request], out=holder, block_size=4)


def test_holder_arrays_without_the_compiled_core_keep_their_memory_whatever_is_released(backend, monkeypatch):
    """Once the holder is gone, releasing every memoryview an output array's bases lead to
    (as any caller may) leaves its memory alive: a pure install's arrays once lay in a
    bytearray, which numpy shows through a memoryview whose ``release()`` freed it."""
    from tokcy.executor import _memory

    monkeypatch.setattr(_memory, "_zeroed_array", None)
    holder = HostBuffers(4096, 8)
    array = holder.input_ids
    array[:] = 7
    del holder
    found = array.base
    while found is not None:  # (no memoryview is found: each would be released)
        following = found.obj if isinstance(found, memoryview) else getattr(found, "base", None)
        if isinstance(found, memoryview):
            found.release()
        found = following
    churn = [bytearray(4096 * 4) for _ in range(50)]  # would take a block freed by mistake
    assert (array == 7).all() and len(churn) == 50
