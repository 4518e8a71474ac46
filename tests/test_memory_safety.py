"""Fifteen ways into memory errors that the compiled core once had, one test each.

Each asserts a clean exception or a defined result, the same on both backends, and that
every observable is unchanged after a refused call. Under the sanitizer build (.ci/run,
docs/invariants.md) a regression shows as an AddressSanitizer report, not a wrong value.
"""

import gc
import pickle

import numpy as np
import pytest

from tokcy import RequestState, _pickle
from tokcy.connector import SchedulerOutputManager
from tokcy.executor import HostBuffers, prepare_inputs


def observe(request):
    """Every public observable of a request (tokens, fields, block tables)."""
    return (
        request.request_id,
        request.beam_width,
        request.get_tokens(),
        request.prompt_len,
        request.orig_prompt_len,
        request.max_new_tokens,
        int(request.state),
        request.seq_slot,
        request.context_current_position,
        request.context_chunk_size,
        request.draft_tokens,
        [(table.tolist(), table.num_released) for table in request.block_tables],
    )


class Crafted:
    """Pickles as a call of ``function(*args)``: a pickle anyone could have written."""

    def __init__(self, function, *args):
        self.reduced = (function, args)

    def __reduce__(self):
        return self.reduced


def valid_request(cls):
    request = cls(7, [1, 2, 3, 4, 5], beam_width=2, num_layer_groups=2)
    request.block_tables[0].extend([3, 4, 5])
    request.block_tables[0].release_front(1)
    return request


def valid_state(backend):
    return valid_request(backend.Request).__reduce__()[1][1]


# ----------------------------------------------------------------- through the public API
def test_1_small_report_owns_what_it_reads_while_gc_runs_python_code(backend):
    """A gc callback (Python code run by any allocation) replaces and frees the storage
    the report planned to copy: the report owns it, so it shows the plan-time tokens."""
    prompt = np.arange(4096, dtype=np.int32) % 1000
    request = backend.Request(1, prompt)
    request.block_tables[0].extend(range(64))
    fired = []

    def replace_storage(phase, info):
        if phase == "start" and armed:
            view = request.get_tokens_view(0)  # the next write copies; the old storage is then the view's
            request.set_generated_tokens([[len(fired)] * 8])
            table_view = request.block_tables[0].view()
            request.block_tables[0][0] = 1000 + len(fired)
            del view, table_view  # frees the old storage arrays, unless the report holds them
            fired.append(phase)

    armed = False
    thresholds = gc.get_threshold()
    gc.callbacks.append(replace_storage)
    try:
        for _ in range(20):
            manager = SchedulerOutputManager()
            garbage = [[] for _ in range(8)]  # live allocations: the next one collects
            gc.set_threshold(1, 1, 1)
            armed = True
            output = manager.build_scheduler_output([], [request])
            armed = False
            gc.set_threshold(*thresholds)
            del garbage
            tokens = output.tokens.tolist()
            assert tokens[:4096] == prompt.tolist()
            assert len(tokens) in (4096, 4104) and len(set(tokens[4096:])) <= 1
            blocks = output.block_ids.tolist()
            assert len(blocks) == 64 and blocks[1:] == list(range(1, 64)) and (blocks[0] == 0 or blocks[0] >= 1000)
    finally:
        armed = False
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(replace_storage)
    assert fired


def test_2_the_busy_guard_covers_the_whole_prepare_call(backend):
    """A batch-size entry whose __index__ calls prepare_inputs again on the same buffers:
    the inner call is refused (RuntimeError) and the outer one is exact."""
    buffers = HostBuffers(64, 8)
    requests = [backend.Request(i, [10 * i + 1, 10 * i + 2, 10 * i + 3]) for i in range(3)]
    for request in requests:
        request.state = RequestState.GENERATION_IN_PROGRESS
    refused = []

    class Reentrant:
        def __index__(self):
            try:
                prepare_inputs([], requests[:1], out=buffers)
            except RuntimeError as error:
                refused.append(str(error))
            return 4

    inputs = prepare_inputs([], requests, cuda_graph_batch_sizes=[Reentrant()], out=buffers)
    assert refused == ["this InputWriter is in use by another call (another thread's, or one re-entered from "
                       "code this call runs)"]
    assert inputs.input_ids.tolist() == [3, 13, 23, 0]
    assert inputs.position_ids.tolist() == [2, 2, 2, 0]
    assert inputs.request_ids.tolist() == [0, 1, 2, -1]
    assert inputs.num_tokens == 4 and inputs.padded_batch_size == 4


def test_3_add_new_tokens_copies_the_callers_list_before_converting(backend):
    request = backend.Request(1, [1, 2], beam_width=4)
    per_beam = []

    class Clearing:
        def __index__(self):
            per_beam.clear()
            return 5

    per_beam.extend([Clearing(), 6, 7, 8])
    assert request.add_new_tokens(per_beam) == 3
    assert request.get_tokens() == [[1, 2, 5], [1, 2, 6], [1, 2, 7], [1, 2, 8]]


def test_3_set_generated_tokens_copies_the_callers_list_before_converting(backend):
    request = backend.Request(1, [1, 2], beam_width=4)
    per_beam = []

    class Clearing(list):
        def __len__(self):
            per_beam.clear()
            return super().__len__()

    per_beam.extend([Clearing([5, 5]), [6], [7], [8, 8, 8]])
    request.set_generated_tokens(per_beam)
    assert request.get_tokens() == [[1, 2, 5, 5], [1, 2, 6], [1, 2, 7], [1, 2, 8, 8, 8]]


def test_4_a_blank_request_reported_is_not_never_reported(backend):
    manager = SchedulerOutputManager()
    blank = backend.Request.__new__(backend.Request)
    first = manager.build_scheduler_output([blank], [])
    assert first.request_ids.tolist() == [0] and first.block_offsets.tolist() == [0]
    real = backend.Request(0, [1, 2, 3])
    real.block_tables[0].extend([4, 5])
    before = observe(real)
    with pytest.raises(ValueError, match="request 0 has 1 layer groups but its earlier reports had 0"):
        manager.build_scheduler_output([real], [])
    assert observe(real) == before and manager.tracked_request_ids() == [0]
    manager.request_finished(0)
    (data,) = manager.build_scheduler_output([real], []).new_requests
    assert data.new_block_ids == [4, 5]


@pytest.mark.parametrize(
    "keyword, message",
    [
        ("beam_width", "beam_width 2147483648 exceeds the maximum of 1024"),
        ("num_layer_groups", "num_layer_groups 2147483648 exceeds the maximum of 1024"),
    ],
    ids=["beam_width", "num_layer_groups"],
)
def test_5_sizes_have_an_upper_bound(backend, keyword, message):
    with pytest.raises(ValueError, match=message):
        backend.Request(1, [1, 2], **{keyword: 2**31})
    assert backend.Request(1, [1], **{keyword: 1024}).beam_width == (1024 if keyword == "beam_width" else 1)


# ----------------------------------------------------------- through restored or crafted state
def test_7_a_negative_released_count_is_refused_on_restore(backend):
    crafted = pickle.dumps(Crafted(_pickle.restore_block_table, None, [1, 2], -4096))
    with pytest.raises(ValueError, match=r"num_released -4096 is outside \[0, 2\]"):
        pickle.loads(crafted).release_front(1)  # accepted, this would write before the buffer
    table = backend.BlockTable([1, 2])
    with pytest.raises(ValueError, match=r"num_released 3 is outside \[0, 2\]"):
        table._restore([1, 2], 3, 0)
    with pytest.raises(ValueError, match="the first 1 entries are released and must read -1"):
        _pickle.restore_block_table(None, [1, 2], 1)
    assert (table.tolist(), table.num_released) == ([1, 2], 0)
    restored = _pickle.restore_block_table(None, [-1, 2], 1)
    restored.release_front(2)
    assert (restored.tolist(), restored.num_released) == ([-1, -1], 2)


def crafted_request(backend, **fields):
    state = dict(valid_state(backend), **fields)
    return pickle.dumps(Crafted(_pickle.restore_request, None, state))


def prefill(request):
    prepare_inputs([request], [])  # copies the chunk [cursor, cursor + chunk) of beam 0


def regenerate(request):
    request.set_generated_tokens([[1]] * request.beam_width)


def rewind_and_grow(request):
    request.truncate(request.prompt_len)
    request.add_new_token(1)


def report_again(request):
    """A first report of a valid request with the same id, then the restored one's."""
    manager = SchedulerOutputManager()
    manager.build_scheduler_output([valid_request(type(request))], [])
    manager.build_scheduler_output([request], [])


# Each crafted state, and what an attacker does next with it: where the state is refused,
# the second step never runs; on a build that accepted it, that step is the memory error
# (a read or write outside the buffer) which the sanitizer build reports.
@pytest.mark.parametrize(
    "fields, message, use",
    [
        ({"prompt_len": 6}, r"prompt_len 6 is outside \[0, 5\]", prefill),  # 8: past the tokens
        ({"prompt_len": 6, "context_chunk_size": 1, "context_current_position": 5}, r"prompt_len 6 is outside", prefill),
        ({"beams": [[1, 2, 3, 4, 5], [1, 2]], "prompt_len": 5}, r"prompt_len 5 is outside \[0, 2\]", regenerate),
        ({"prompt_len": -1}, r"prompt_len -1 is outside \[0, 5\]", rewind_and_grow),  # 9
        ({"context_current_position": -2}, r"context_current_position -2 is outside \[0, 5\]", prefill),  # 10
        ({"context_chunk_size": 6}, r"context_chunk_size 6 is outside \[0, 5\]", prefill),
        ({"dirty_from": [-4096, 0]}, r"dirty_from\[0\] -4096 is outside \[0, 5\]", report_again),  # 11
        ({"dirty_from": [0, 6]}, r"dirty_from\[1\] 6 is outside \[0, 5\]", report_again),
        ({"block_tables": [([-1, 4, 5], 1, -4096), ([], 0)]}, r"dirty_from -4096 is outside \[0, 3\]", report_again),
        ({"beams": [], "dirty_from": []}, r"beams: 0 beams is outside \[1, 1024\]", prefill),  # 12
        ({"beams": [[1]] * 1025, "dirty_from": [0] * 1025, "prompt_len": 0}, r"1025 beams is outside \[1, 1024\]", None),
        ({"block_tables": [([], 0)] * 1025}, "1025 layer groups is above 1024", None),
        ({"orig_prompt_len": 5, "prompt_len": 4}, r"orig_prompt_len 5 is outside \[0, 4\]", None),
        ({"seq_slot": 2**31}, r"seq_slot 2147483648 is outside \[0, 2147483647\]", None),
        ({"state": 9}, "state must be a RequestState, got 9", None),
        ({"num_pauses": -1}, r"num_pauses -1 is outside", None),
        ({"max_new_tokens": -1}, r"max_new_tokens -1 is outside", None),
    ],
    ids=lambda value: "-".join(f"{key}={value[key]}"[:24] for key in value).replace(" ", "") if isinstance(value, dict) else "",
)
def test_8_to_12_crafted_request_states_are_refused(backend, fields, message, use):
    crafted = crafted_request(backend, **fields)
    with pytest.raises(ValueError, match=message):
        request = pickle.loads(crafted)
        if use is not None:
            use(request)
    with pytest.raises(ValueError, match=message):
        backend.Request._from_state(dict(valid_state(backend), **fields))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"beams": "abc"}, "beams must be a sequence, not str"),
        ({"beams": [[1.5]], "dirty_from": [0]}, r"beams\[0\]\[0\] must be an integer token id, not float"),
        ({"prompt_len": 2.0}, "prompt_len must be an integer, not float"),
        ({"dict": [1]}, "dict must be a dict or None, not list"),
    ],
    ids=["beams-str", "beams-float", "prompt_len-float", "dict-list"],
)
def test_crafted_state_of_the_wrong_type_is_a_type_error(backend, fields, message):
    with pytest.raises(TypeError, match=message):
        pickle.loads(crafted_request(backend, **fields))


def test_a_state_missing_a_field_names_it(backend):
    state = valid_state(backend)
    del state["dirty_from"]
    with pytest.raises(ValueError, match="lacks the field"):
        backend.Request._from_state(state)
    with pytest.raises(TypeError, match="Request state must be a dict, not list"):
        backend.Request._from_state([])


def test_12_every_valid_state_round_trips_on_both_backends(both_backends):
    compiled, pure = both_backends
    for module in both_backends:
        state = valid_state(module)
        for target in both_backends:
            assert observe(target.Request._from_state(state)) == observe(module.Request._from_state(state))
    blank = compiled.Request.__new__(compiled.Request)
    assert observe(pickle.loads(pickle.dumps(blank))) == observe(pure.Request.__new__(pure.Request))


# ------------------------------------------------------------------------------- parity
def test_13_init_called_again_reinitialises_exactly_as_a_new_request(backend):
    request = backend.Request(1, [1, 2, 3, 4], beam_width=1, max_new_tokens=9)
    request.add_new_token(5)
    request.pause(10)  # a pause count, and a prompt longer than the original
    request.state = RequestState.GENERATION_IN_PROGRESS
    request.seq_slot = 3
    request.draft_tokens = [7, 8]
    request.context_chunk_size = 2
    request.block_tables[0].extend([1, 2])
    request.block_tables[0].release_front(1)
    view = request.get_tokens_view(0)
    request.__init__(2, [9, 9], num_layer_groups=2)
    assert observe(request) == observe(backend.Request(2, [9, 9], num_layer_groups=2))
    assert view.tolist() == [1, 2, 3, 4, 5]
    table = backend.BlockTable([1, 2, 3])
    table.release_front(2)
    table.__init__([4])
    assert (table.tolist(), table.num_released) == ([4], 0)
    with pytest.raises(ValueError, match=r"beam_width 0|beam_width must be >= 1"):
        request.__init__(3, [1], beam_width=0)
    assert observe(request) == observe(backend.Request(2, [9, 9], num_layer_groups=2))


def test_13_reinit_between_reports_keeps_the_mirror_right(backend):
    manager = SchedulerOutputManager()
    request = backend.Request(1, [1, 2, 3])
    request.block_tables[0].extend([5, 6])
    manager.build_scheduler_output([request], [])
    request.__init__(1, [4])
    (data,) = manager.build_scheduler_output([request], []).cached_requests
    assert (data.num_replaced_tokens, data.new_tokens) == (3, [4])
    assert (data.num_replaced_blocks_by_group, data.new_block_ids) == ([2], [])


@pytest.mark.parametrize("name", ["state", "seq_slot", "context_current_position", "context_chunk_size", "draft_tokens"])
def test_14_deleting_a_settable_property_is_an_attribute_error(backend, name):
    request = backend.Request(1, [1, 2, 3])
    before = observe(request)
    with pytest.raises(AttributeError, match=f"property '{name}' of 'Request' object has no deleter"):
        delattr(request, name)
    assert observe(request) == before


def test_14_deleting_a_block_table_entry_is_a_type_error(backend):
    table = backend.BlockTable([1, 2, 3])
    with pytest.raises(TypeError, match="BlockTable entries cannot be deleted: use truncate"):
        del table[0]
    assert table.tolist() == [1, 2, 3]


def test_setitem_rechecks_the_position_after_converting_the_block_id(backend):
    table = backend.BlockTable([1, 2, 3])

    class Shrinking:
        def __index__(self):
            table.truncate(1)
            return 9

    with pytest.raises(IndexError, match="block table index 2 is out of range for 1 blocks"):
        table[2] = Shrinking()
    assert table.tolist() == [1]


def test_2_a_second_thread_is_refused_while_the_first_consumes_its_generator(backend):
    """Thread A's prepare is inside its busy guard while it consumes a generator that
    blocks; thread B's prepare on the same buffers is refused, and A's result is exact."""
    import threading

    buffers = HostBuffers(64, 8)
    first = [backend.Request(i, [i, i + 1]) for i in range(2)]
    other = backend.Request(9, [5, 6, 7])
    for request in first + [other]:
        request.state = RequestState.GENERATION_IN_PROGRESS
    inside, release, results = threading.Event(), threading.Event(), {}

    def blocking_generator():
        yield first[0]
        inside.set()
        release.wait(10)
        yield first[1]

    def thread_a():
        results["a"] = prepare_inputs([], blocking_generator(), out=buffers).input_ids.tolist()

    worker = threading.Thread(target=thread_a)
    worker.start()
    assert inside.wait(10)
    with pytest.raises(RuntimeError, match="in use by another call"):
        prepare_inputs([], [other], out=buffers)
    release.set()
    worker.join()
    assert results["a"] == [1, 2]


@pytest.mark.parametrize("group", ["context_requests", "generation_requests"])
def test_a_failed_report_never_writes_into_a_buffer_freed_by_its_error(backend, group):
    """The report plans its first request, then meets a non-Request whose type's module
    name runs Python code (the error message reads it) that re-initialises the first request,
    freeing the buffers the plan pointed into. The failed call must not write into them
    (it consumes no mark before the whole batch is valid, and the compiled fast plan of a
    generation row gives back the marks it consumed before that code runs; under the
    sanitizer build a write would be a heap-use-after-free report), and the re-initialised
    request's next report is whole."""
    manager = SchedulerOutputManager()
    first = backend.Request(1, list(range(100)))
    first.block_tables[0].extend(range(8))

    def report(*requests):
        groups = {"context_requests": [], "generation_requests": [], group: list(requests)}
        return manager.build_scheduler_output(**groups)

    report(first)
    first.add_new_token(5)  # a change for the next report to carry

    class Module:
        """A module name whose comparison runs Python code (the error message compares it)."""

        def __eq__(self, other):
            first.__init__(1, [7, 8, 9])  # the old buffers lose their last reference
            first.block_tables[0].extend([40])
            return False

        __hash__ = object.__hash__

        def __str__(self):
            return "hostile"

    class Hostile:
        pass

    Hostile.__module__ = Module()

    with pytest.raises(TypeError, match=rf"{group}\[1\] must be a Request, not .*Hostile"):
        report(first, Hostile())
    output = report(first)
    assert output.tokens.tolist() == [7, 8, 9] and output.block_ids.tolist() == [40]
    assert output.num_replaced_tokens.tolist() == [0 if output.is_new[0] else 100]


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
