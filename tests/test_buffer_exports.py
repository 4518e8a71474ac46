"""The memory behind the output arrays a writer is bound to (``HostBuffers.from_arrays``,
``MetadataBuffers.from_arrays``, a device table's arrays): the writers keep pointers into
it from one call to the next, so it must stay where it is, whatever caller code does.

- An ndarray subclass whose buffer export is its own: from Python 3.12 (PEP 688) a class's
  ``__buffer__`` method is what the buffer protocol calls, so such an array may export
  other memory, which lives only as long as the export. The writers take their pointers
  through plain views of the arrays (numpy's own export), never through the caller's
  class. Before, the compiled writers asked the array itself: every write then went into
  a temporary copy freed at the end of ``bind`` (under the sanitizer build, a
  heap-use-after-free), and the caller's arrays stayed as they were. Python 3.11 ignores a
  Python-level ``__buffer__``: those tests run on 3.12 and later (.ci/run runs the suite
  on the newest CPython it finds, 3.12 or later, as well).
- An array over another object's buffer (``np.frombuffer`` of a bytearray): numpy holds
  that export in a memoryview, its base, which a caller may ``release()``; the bytearray
  could then be resized under the writer. The writers hold a memoryview of their own over
  the same export (the compiled core, an export of it in C as well).
- The plain views a compiled writer writes through are reachable through the collector;
  a caller's ``__setstate__`` on one drops its base. The writers hold the caller's arrays
  themselves too.
"""

import gc
import sys
import weakref

import numpy as np
import pytest
from hostile_code import decode_requests

from tokcy.bench.backends import name_of
from tokcy.executor import HostBuffers, prepare_inputs
from tokcy.executor._host import ARRAY_FIELDS
from tokcy.executor._metadata import MetadataBuffers

needs_pep_688 = pytest.mark.skipif(sys.version_info < (3, 12),
                                   reason="a Python class's __buffer__ is the buffer protocol from Python 3.12 (PEP 688)")


class ExportsACopy(np.ndarray):
    """An array whose buffer export is a fresh copy of it, freed once the export is
    released; ``exports`` counts the exports asked of the class."""

    exports = 0

    def __buffer__(self, flags):
        type(self).exports += 1
        return memoryview(np.ndarray.view(self, np.ndarray).copy())


@pytest.fixture(autouse=True)
def _count_exports():
    ExportsACopy.exports = 0
    yield


def exporting(array):
    return array.view(ExportsACopy)


def plain_list(array):
    """What ``array`` holds, read through numpy (not through its class's export)."""
    return np.ndarray.view(array, np.ndarray).tolist()


@needs_pep_688
def test_host_buffers_and_metadata_write_into_the_callers_arrays_not_into_an_export(backend):
    """Token inputs and metadata (dense and CSR tables too) of two decode requests (prompt
    [10 + i, 20 + i, 30 + i], block i), block size 16: the values land in the caller's
    arrays (a worked example), and no buffer export was asked of the caller's class."""
    arrays = {name: exporting(np.full(8 if name != "cu_seqlens" else 9, -1, np.int64 if name == "request_ids"
                                      else np.int32)) for name in ARRAY_FIELDS}
    metadata = MetadataBuffers.from_arrays(
        max_blocks_per_seq=2, kv_lens=exporting(np.full(4, -1, np.int32)),
        cu_kv_seqlens=exporting(np.full(5, -1, np.int32)), slot_mapping=(exporting(np.full(8, -1, np.int64)),),
        kv_indptr=(exporting(np.full(5, -1, np.int32)),), kv_last_page_len=(exporting(np.full(4, -1, np.int32)),),
        block_table=(exporting(np.full((4, 2), -1, np.int32)),), kv_indices=(exporting(np.full(8, -1, np.int32)),))
    out = HostBuffers.from_arrays(metadata=metadata, **arrays)
    prepare_inputs([], decode_requests(backend, 2), out=out, block_size=16)
    assert plain_list(arrays["input_ids"])[:2] == [30, 31]
    assert plain_list(arrays["position_ids"])[:2] == [2, 2]
    assert plain_list(arrays["seq_lens"])[:2] == [1, 1]  # tokens scheduled this step
    assert plain_list(arrays["cu_seqlens"])[:3] == [0, 1, 2]
    assert plain_list(arrays["request_ids"])[:2] == [0, 1]
    assert plain_list(metadata.kv_lens)[:2] == [3, 3]
    assert plain_list(metadata.cu_kv_seqlens)[:3] == [0, 3, 6]
    assert plain_list(metadata.slot_mapping[0])[:2] == [2, 18]  # block 0 and block 1, position 2
    assert plain_list(metadata.kv_indptr[0])[:3] == [0, 1, 2]
    assert plain_list(metadata.kv_last_page_len[0])[:2] == [3, 3]
    assert plain_list(metadata.block_table[0])[:2] == [[0, 0], [1, 0]]  # zero past each sequence's blocks
    assert plain_list(metadata.kv_indices[0])[:2] == [0, 1]
    assert ExportsACopy.exports == 0


@needs_pep_688
def test_a_device_table_binds_its_arrays_through_numpy_not_the_callers_class(backend):
    """``bind_device_table``'s arrays are kept as pointers too: none is taken through an
    export asked of the caller's class."""
    metadata = backend.AttentionMetadata()
    metadata.bind(8, np.zeros(8, np.int32), np.zeros(9, np.int32), (np.zeros(64, np.int64),),
                  (np.zeros(9, np.int32),), (np.zeros(8, np.int32),))
    rows = backend.DeviceTableRows(8, 1, 8)
    delta_area = np.zeros(66, np.int32)  # 8-byte aligned (numpy's allocations are)
    metadata.bind_device_table(rows, exporting(np.zeros(8, np.int32)), exporting(delta_area),
                               (exporting(np.zeros(8, np.int32)),), (exporting(np.zeros(8, np.int64)),),
                               (exporting(np.zeros(8, np.int64)),))
    assert metadata.has_device_table
    assert ExportsACopy.exports == 0


def arrays_over_bytearrays(count):
    """HostBuffers' arrays of ``count`` rows, each over a bytearray of its own
    (``np.frombuffer``: the base is numpy's memoryview of it); and the bytearrays."""
    owners, arrays = {}, {}
    for name in ARRAY_FIELDS:
        dtype = np.dtype(np.int64 if name == "request_ids" else np.int32)
        owners[name] = bytearray((count + (name == "cu_seqlens")) * dtype.itemsize)
        arrays[name] = np.frombuffer(owners[name], dtype)
    return arrays, owners


def reachable_from(root, kind):
    """Every ``kind`` object the collector's introspection leads to from ``root`` (through
    tuples, lists, dicts and tokcy's own objects): what caller code can find and change."""
    found, seen, todo = [], set(), [root]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, kind):
            found.append(item)
        if item is root or isinstance(item, (tuple, list, dict)) or type(item).__module__.startswith("tokcy."):
            todo.extend(gc.get_referents(item))
    return found


def test_a_released_memoryview_behind_a_bound_array_leaves_its_memory_in_place(backend):
    """Outputs over bytearrays, bound by a first call; the caller releases numpy's
    memoryviews: the bytearrays still refuse to be resized (the writer holds an export of
    their memory), and the next call writes into them."""
    arrays, owners = arrays_over_bytearrays(8)
    owners["kv_lens"] = bytearray(4 * 8)
    kv_lens = np.frombuffer(owners["kv_lens"], np.int32)
    metadata = MetadataBuffers.from_arrays(
        max_blocks_per_seq=2, kv_lens=kv_lens, cu_kv_seqlens=np.zeros(9, np.int32),
        slot_mapping=(np.zeros(8, np.int64),), kv_indptr=(np.zeros(9, np.int32),), kv_last_page_len=(np.zeros(8, np.int32),))
    out = HostBuffers.from_arrays(metadata=metadata, **arrays)
    prepare_inputs([], decode_requests(backend, 2), out=out, block_size=16)
    for array in [*arrays.values(), kv_lens]:
        array.base.release()
    for owner in owners.values():
        with pytest.raises(BufferError):
            owner.clear()
    prepare_inputs([], decode_requests(backend, 3), out=out, block_size=16)
    assert np.frombuffer(owners["input_ids"], np.int32)[:3].tolist() == [30, 31, 32]
    assert np.frombuffer(owners["kv_lens"], np.int32)[:3].tolist() == [3, 3, 3]


def test_an_array_over_a_memoryview_released_before_binding_is_refused(backend):
    arrays, _ = arrays_over_bytearrays(8)
    arrays["seq_lens"].base.release()
    with pytest.raises(ValueError, match="^an array's memory comes from a memoryview that was released"):
        prepare_inputs([], decode_requests(backend, 2), out=HostBuffers.from_arrays(**arrays))


def test_no_memoryview_the_collector_leads_to_from_a_writer_can_be_released(backend):
    """The same outputs; caller code releases every memoryview it can reach from the
    writer through the collector, then numpy's own: the bytearrays still refuse to be
    resized. (The compiled writers hold an export of their own memoryviews in C.)"""
    if name_of(backend) == "python":
        pytest.xfail("the twin's hold on the export is a memoryview, which anyone who reaches it can release: "
                     "pure Python has no export that nothing can release (docs/invariants.md)")
    arrays, owners = arrays_over_bytearrays(8)
    out = HostBuffers.from_arrays(**arrays)
    prepare_inputs([], decode_requests(backend, 2), out=out)
    reachable = reachable_from(out.writer(backend), memoryview)
    assert reachable  # the writer's own, among its guards
    for view in reachable:
        with pytest.raises(BufferError):
            view.release()
    for array in arrays.values():
        array.base.release()
    for owner in owners.values():
        with pytest.raises(BufferError):
            owner.clear()


def test_a_writer_keeps_the_callers_arrays_whatever_is_done_to_its_views(backend):
    """The writers' arrays (token inputs and metadata), reached through the collector, each
    given memory of its own by ``__setstate__`` (dropping its base), the holders dropped:
    the caller's arrays (and the memory the writers write) stay alive as long as they."""
    arrays = {name: np.zeros(8 + (name == "cu_seqlens"), np.int64 if name == "request_ids" else np.int32)
              for name in ARRAY_FIELDS}
    outputs = {"kv_lens": np.zeros(8, np.int32), "cu_kv_seqlens": np.zeros(9, np.int32),
               "slot_mapping": (np.zeros(8, np.int64),), "kv_indptr": (np.zeros(9, np.int32),),
               "kv_last_page_len": (np.zeros(8, np.int32),)}
    alive = [weakref.ref(array) for array in [*arrays.values(), outputs["kv_lens"], *outputs["slot_mapping"]]]
    out = HostBuffers.from_arrays(**arrays)
    writers = [out.writer(backend), MetadataBuffers.from_arrays(max_blocks_per_seq=2, **outputs).bound(backend)]
    del out, arrays, outputs
    for writer in writers:
        for view in reachable_from(writer, np.ndarray):
            if view.base is not None:
                view.__setstate__(np.zeros(1, view.dtype).__reduce__()[2])
    gc.collect()
    assert all(ref() is not None for ref in alive)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="from Python 3.12 a collection starts only where bytecode "
                    "runs, never between the compiled bind's views and its pointers")
def test_a_view_given_other_memory_while_binding_is_refused(backend):
    """A collection's callback, at every collection while a writer binds, gives each plain
    view of the outputs it finds (in the tuple of the bind's views) memory of its own with
    ``__setstate__``: the bind is refused, nothing bound (before, the compiled writer kept
    pointers into the views' new memory: the caller's arrays were never written, and a
    second ``__setstate__`` freed what it wrote). A bind with no callback then writes into
    the caller's arrays."""
    if name_of(backend) == "python":
        pytest.skip("the twin writes through numpy, whose own methods crash when such a callback gives a view other "
                    "memory while they run: pure Python cannot keep numpy's methods from running callbacks (the "
                    "compiled check reads the arrays' fields in C; docs/invariants.md)")
    arrays = [np.zeros(8 + (name == "cu_seqlens"), np.int64 if name == "request_ids" else np.int32)
              for name in ARRAY_FIELDS]
    given = {id(array) for array in arrays}
    hits = []

    def give_views_other_memory(phase, info):
        if phase == "start":
            for item in gc.get_objects():
                if type(item) is tuple and len(item) == len(ARRAY_FIELDS):  # (not isinstance: it would ask
                    for view in item:                                          # other objects their __class__)
                        if type(view) is np.ndarray and id(view.base) in given:
                            view.__setstate__(np.zeros(9, view.dtype).__reduce__()[2])
                            hits.append(view)

    writer = backend.InputWriter()
    threshold = gc.get_threshold()
    gc.callbacks.append(give_views_other_memory)
    gc.set_threshold(1)
    try:
        with pytest.raises(RuntimeError, match="^an output array was given other memory by code that ran while it "
                                               "was bound: nothing was bound$"):
            writer.bind(*arrays)
    finally:
        gc.callbacks.remove(give_views_other_memory)
        gc.set_threshold(*threshold)
    assert hits
    with pytest.raises(RuntimeError, match="needs output arrays: call bind"):  # still unbound
        writer.prepare([], decode_requests(backend, 2), [], [], 0, None, 1)
    writer.bind(*arrays)
    writer.prepare([], decode_requests(backend, 2), [], [], 0, None, 1)
    assert arrays[0][:2].tolist() == [30, 31]


def test_arrays_over_an_owner_numpy_holds_no_export_of_keep_it_from_resizing(backend, tmp_path):
    """``np.ndarray(..., buffer=bytearray)`` (its base the bytearray, no export held) and a
    memmap (its base an mmap): bound, the bytearray refuses to resize and the mmap to
    close (before, both did: the writer's pointers then dangled)."""
    arrays, owners = {}, {}
    for name in ARRAY_FIELDS:
        dtype = np.dtype(np.int64 if name == "request_ids" else np.int32)
        owners[name] = bytearray((8 + (name == "cu_seqlens")) * dtype.itemsize)
        arrays[name] = np.ndarray(8 + (name == "cu_seqlens"), dtype, buffer=owners[name])
    arrays["input_ids"] = np.memmap(tmp_path / "input_ids", np.int32, "w+", shape=(8,))
    out = HostBuffers.from_arrays(**arrays)
    prepare_inputs([], decode_requests(backend, 2), out=out)
    for name, owner in owners.items():
        if name != "input_ids":
            with pytest.raises(BufferError):
                owner.extend(bytes(1 << 16))
    with pytest.raises(BufferError):
        np.ndarray.base.__get__(arrays["input_ids"]).close()
    prepare_inputs([], decode_requests(backend, 3), out=out)
    assert arrays["input_ids"][:3].tolist() == [30, 31, 32]


def test_a_refused_bind_leaves_the_metadata_as_it_was(backend):
    """A bind, or a device table's, refused for an array over a released memoryview: the
    metadata keeps its arrays, its device table and its plans (the twin released them
    first)."""
    metadata = backend.AttentionMetadata()
    per_group = ((np.zeros(64, np.int64),), (np.zeros(9, np.int32),), (np.zeros(8, np.int32),))
    metadata.bind(8, np.zeros(8, np.int32), np.zeros(9, np.int32), *per_group)
    gathers = ((np.zeros(8, np.int32),), (np.zeros(8, np.int64),), (np.zeros(8, np.int64),))
    metadata.bind_device_table(backend.DeviceTableRows(8, 1, 8), np.zeros(8, np.int32), np.zeros(66, np.int32),
                               *gathers)
    serial = metadata.plan_serial
    released = np.frombuffer(bytearray(32), np.int32)
    released.base.release()
    with pytest.raises(ValueError, match="^an array's memory comes from a memoryview that was released"):
        metadata.bind(8, released, np.zeros(9, np.int32), *per_group)
    with pytest.raises(ValueError, match="^an array's memory comes from a memoryview that was released"):
        metadata.bind_device_table(backend.DeviceTableRows(8, 1, 8), released, np.zeros(66, np.int32), *gathers)
    assert (metadata.has_device_table, metadata.plan_serial) == (True, serial)
