"""Memory errors the compiled core once had, reached through the public API's calls.

Caller code that a call runs (a gc callback, ``__index__``, ``__len__``, a type's module
name), sizes past their bounds, ``__init__`` called again, deleted properties and entries,
a second thread on the same buffers.

The numbers in the tests' names count fifteen such ways in, one test each, across
test_memory_safety_calls.py, test_memory_safety_state.py and test_memory_safety_views.py.

Each asserts a clean exception or a defined result, the same on both backends, and that
every observable is unchanged after a refused call. Under the sanitizer build (.ci/run,
docs/invariants.md) a regression shows as an AddressSanitizer report, not a wrong value.
"""

import gc

import numpy as np
import pytest
from hostile_code import observe

from tokcy import RequestState
from tokcy.connector import SchedulerOutputManager
from tokcy.executor import HostBuffers, prepare_inputs


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
