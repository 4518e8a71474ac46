"""Python code run in the middle of binding or running a writer, on the arrays it is bound to.

``HostBuffers``' arrays and the attention-metadata outputs an ``InputWriter`` and an
``AttentionMetadata`` are bound to: a resize with ``refcheck=False``, array subclasses that
misreport their base, length, shape or alignment, a ``len()`` that changes, an iteration,
a collection's callbacks or a conversion that calls a writer while it binds or runs
(alone, or sharing one set of metadata outputs with another), a finalizer of the arrays
bound before, and a refused block size (the sizes a writer plans and writes with stay those
given before).

Each test asserts the defined result or a clean exception, the same on both backends; under
the sanitizer build (.ci/run) a regression shows as an AddressSanitizer report, not a wrong
value.
"""

import weakref
from array import array

import numpy as np
import pytest
from hostile_code import IndexRuns, at_next_collection, decode_requests

from tokcy import RequestState
from tokcy.executor import HostBuffers, prepare_inputs
from tokcy.executor._host import ARRAY_FIELDS
from tokcy.executor._metadata import MetadataBuffers


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

    padded_to = IndexRuns(8, other_writer)
    result = prepare_inputs([], requests, out=first, block_size=16, cuda_graph_batch_sizes=[padded_to])
    assert errors == ["these attention-metadata outputs are in use by another call (a writer that shares them)"]
    assert result.kv_lens[:4].tolist() == [3] * 4
    # once the first call is over, the second writer runs
    assert prepare_inputs([], requests[:2], out=second, block_size=16).kv_lens[:2].tolist() == [3, 3]


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
