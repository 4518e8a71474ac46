"""Memory errors the compiled core once had, through the memory behind a view or an output array.

What a view's bases, or the garbage collector, lead to from a request, a token view, a
block table's view or a ``HostBuffers`` array cannot free, write or rebuild the memory a
buffer or a writer uses: released memoryviews, grown bytearrays, numpy's
``resize(refcheck=False)`` and ``__setstate__``, copies of the object behind a view.

The numbers in the tests' names count fifteen such ways in, one test each, across
test_memory_safety_calls.py, test_memory_safety_state.py and test_memory_safety_views.py.

Each asserts a clean exception or a defined result, the same on both backends, and that
every observable is unchanged after a refused call. Under the sanitizer build (.ci/run,
docs/invariants.md) a regression shows as an AddressSanitizer report, not a wrong value.
"""

import gc

import numpy as np
import pytest

from tokcy.executor import HostBuffers, prepare_inputs


def reachable_through_the_collector(start, depth=4):
    """Every object ``gc.get_referents`` leads to from ``start``, ``depth`` steps deep."""
    seen, frontier = {}, [start]
    for _ in range(depth):
        frontier = [item for obj in frontier for item in gc.get_referents(obj) if id(item) not in seen]
        seen.update((id(item), item) for item in frontier)
    return list(seen.values())


def test_15_nothing_a_caller_can_reach_frees_the_memory_a_buffer_writes(backend):
    """What the garbage collector's introspection leads to from a request, and what a
    view's bases lead to: releasing every memoryview among them and growing every
    bytearray must not free the memory the buffers write and read (the compiled storage
    holds its export in C; it was a memoryview that the collector handed out, and whose
    release freed the bytearray under the buffer)."""
    request = backend.Request(1, list(range(1000)))
    request.block_tables[0].extend(range(100))
    view = request.get_tokens_view(0)
    reached = reachable_through_the_collector(request) + [view.base]
    reached += [obj.obj for obj in reached if isinstance(obj, memoryview)]
    reached += [obj.base for obj in reached if isinstance(obj, np.ndarray) and obj.base is not None]
    reached += [obj.obj for obj in reached if isinstance(obj, memoryview)]
    kinds = {type(obj).__name__ for obj in reached}
    # the walk reached the storage: the twin's bytearray (through a memoryview), the
    # compiled core's ArraySource (which keeps the storage; no memoryview in between,
    # nothing that leads to the bytearray)
    assert kinds & {"bytearray", "ArraySource"}, kinds
    if backend.__name__ == "tokcy._pure":
        pytest.xfail("the twin's storage is numpy's frombuffer of a bytearray, whose export numpy keeps in a "
                     "memoryview anyone can release: pure Python cannot hold an export nothing can release "
                     "(docs/invariants.md)")
    for obj in reached:
        if isinstance(obj, memoryview):
            try:
                obj.release()
            except BufferError:  # exported further: it cannot be released
                pass
    del view
    for obj in reached:
        if isinstance(obj, bytearray):
            with pytest.raises(BufferError):  # still the live storage, exported by its owner
                obj.extend(bytes(4096))
    churn = [bytearray(4000) for _ in range(200)]  # reuses any block freed by mistake
    request.add_new_token(5)
    request.block_tables[0].append(7)
    del churn
    assert request.get_tokens(0) == list(range(1000)) + [5]
    assert request.block_tables[0].tolist() == list(range(100)) + [7]


def test_17_nothing_a_views_bases_lead_to_writes_the_tokens(backend):
    """A view is a read-only snapshot, and so is everything its bases lead to: no object
    reached from a token view or a block table's view exports its memory writable (the
    compiled views lead to an ArraySource, which shows the storage read-only; they
    led to the bytearray, through which a caller rewrote a table's released entry)."""
    request = backend.Request(1, [1, 2, 3])
    table = request.block_tables[0]
    table.extend([5, 6, 7])
    table.release_front(1)
    reached = []
    for view in (request.get_tokens_view(0), table.view()):
        found = view.base
        while found is not None and len(reached) < 16:
            reached.append(found)
            found = found.obj if isinstance(found, memoryview) else getattr(found, "base", None)
    assert reached
    if backend.__name__ == "tokcy._pure":
        pytest.xfail("the twin's views are numpy's read-only views of a bytearray, which their memoryview's obj "
                     "names: pure Python has no read-only exporter of writable memory (docs/invariants.md)")
    for found in reached:
        try:
            exported = memoryview(found)
        except TypeError:  # exports no buffer
            continue
        assert exported.readonly, type(found).__name__
        with pytest.raises(ValueError, match="cannot set WRITEABLE flag"):  # nor made writable through numpy
            np.frombuffer(found, dtype=np.uint8).setflags(write=True)
    assert request.get_tokens(0) == [1, 2, 3] and table.view().tolist() == [-1, 6, 7]


def release_every_memoryview_behind(array):
    """Release each memoryview that ``array``'s chain of bases leads to (as any caller may)."""
    found = array.base
    while found is not None:
        following = found.obj if isinstance(found, memoryview) else getattr(found, "base", None)
        if isinstance(found, memoryview):
            found.release()
        found = following


def test_18_a_view_keeps_its_memory_whatever_its_bases_release(backend):
    """A view alone keeps the storage it shows once the buffer moved to new storage:
    releasing every memoryview its bases lead to must not free it (the compiled views'
    bases held numpy's memoryview of the storage, whose release() freed it: the view then
    read other requests' tokens)."""
    request = backend.Request(1, list(range(64)))
    view = request.get_tokens_view(0)
    for _ in range(256):  # the buffer moves to new storage: only the view keeps the old one
        request.add_new_token(7)
    if backend.__name__ == "tokcy._pure":
        pytest.xfail("the twin's views lead to numpy's memoryviews, which anyone can release: pure Python has "
                     "no exporter that keeps memory whatever is released (docs/invariants.md)")
    release_every_memoryview_behind(view)
    others = [backend.Request(2, [123_456] * 64) for _ in range(50)]  # reuses any block freed by mistake
    assert view.tolist() == list(range(64)) and others[0].get_tokens(0)[0] == 123_456


def test_18b_an_output_array_keeps_its_memory_whatever_its_bases_release(backend):
    """The same for an array a HostBuffers allocated, once the holder is gone: it lies in
    the compiled core's memory, and its bases must keep that memory (they held numpy's
    memoryview of it, whose release() freed it under the array)."""
    holder = HostBuffers(4096, 8)
    array = holder.input_ids
    array[:] = 7
    del holder
    release_every_memoryview_behind(array)
    churn = [bytearray(4096 * 4) for _ in range(50)]  # reuses any block freed by mistake
    assert (array == 7).all() and len(churn) == 50


@pytest.mark.parametrize("holder", ["HostBuffers", "MetadataBuffers"])
def test_16_an_output_array_given_other_memory_does_not_free_what_its_writer_writes(backend, holder):
    """``__setstate__`` gives a numpy array new memory and frees the old if the array owned
    it, whatever exports or weak references exist. A holder's own arrays lie in memory the
    compiled core owns, which its writers keep: the next call still writes there (not into
    freed memory, which zeroed bytearrays allocated meanwhile would take). The holder then
    shows the replaced array, so its result is the caller's to discard (the twin, which
    writes through the arrays, may refuse the call)."""
    request = backend.Request(1, list(range(3000)))
    request.block_tables[0].extend(range(200))
    request.context_chunk_size = 3000
    out = HostBuffers(4096, 8, max_blocks_per_seq=256)
    prepare_inputs([request], [], out=out, block_size=16)
    target = out.input_ids if holder == "HostBuffers" else out.metadata.slot_mapping[0]
    target.__setstate__((1, (1,), target.dtype, False, bytes(target.dtype.itemsize)))
    churn = [bytearray(target.dtype.itemsize * 4096) for _ in range(64)]  # would take the freed memory
    try:
        prepare_inputs([request], [], out=out, block_size=16)
    except ValueError:
        assert backend.__name__ == "tokcy._pure"  # its write into the 1-entry array
    assert not any(any(block) for block in churn)
    fresh = prepare_inputs([request], [], out=HostBuffers(4096, 8, max_blocks_per_seq=256), block_size=16)
    assert fresh.input_ids.tolist() == list(range(3000)) and fresh.slot_mapping[-1] == 2999


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


@pytest.mark.backend_free("tokcy._core.zeroed_array is the compiled core's own (the twin's arrays are numpy's)")
def test_zeroed_array_takes_plain_number_dtypes_of_a_size_that_fits():
    """The compiled core's output memory: a dtype of no bytes (which divided by zero when
    numpy read the array's interface) or of Python objects (raw zeros read as
    references) is refused, as is a size whose bytes overflow."""
    from tests.conftest import compiled_backend

    zeroed_array = compiled_backend().zeroed_array
    for dtype in ("S0", "V0", object, "U1", "M8[s]"):
        with pytest.raises(ValueError, match="^zeroed_array needs a boolean, integer or float dtype, got "):
            zeroed_array(4, dtype)
    with pytest.raises(OverflowError, match="do not fit in memory"):
        zeroed_array(2**62, np.int32)
    for dtype in (np.int32, np.int64, np.bool_, np.float32):
        array = zeroed_array(3, dtype)
        assert array.dtype == dtype and array.tolist() == [0, 0, 0] and array.flags.writeable


@pytest.mark.backend_free("the compiled core's ArraySource (the twin's views lead to numpy's own objects)")
@pytest.mark.parametrize("copy_of", ["copy", "state"])
def test_what_a_view_leads_to_cannot_be_rebuilt_with_other_fields(copy_of):
    """A token view's bases lead to the object that shows numpy the memory (the compiled
    core's ArraySource). It cannot be copied or given a pickle's state: Cython's own
    pickling of it (__reduce_cython__, __setstate_cython__) rebuilt it from any fields
    given, a writable array of another dtype eight times past the storage (a heap
    overflow) or of another object's memory. (pickle.dumps refused it before too.)"""
    import copy

    from tests.conftest import compiled_backend

    request = compiled_backend().Request(1, list(range(16)))
    view = request.get_tokens_view(0)
    source = view.base
    while isinstance(source, np.ndarray):
        source = source.base
    assert type(source).__name__ == "ArraySource"
    if copy_of == "state":
        assert not hasattr(source, "__setstate_cython__") and not hasattr(source, "__setstate__")
        assert not hasattr(source, "__reduce_cython__")
    else:
        with pytest.raises(TypeError):
            copy.copy(source)
    assert np.asarray(source).tolist() == list(range(16)) and view.tolist() == list(range(16))
