"""Every allocation of a call made to fail in turn: the call raises MemoryError (or
succeeds), and what it leaves behind is as if it had never run.

CPython's ``_testcapi.set_nomemory(n, n + 1)`` fails the n-th memory allocation from
then on (Python objects, numpy's small arrays); each test runs its call for n = 0, 1,
2, ... on a fresh world, until the call no longer meets a failure, and checks that a
failed call lost nothing and duplicated nothing: the next calls give exactly what a
world that never failed gives. The reference is the same world built again, run
without failures. (CPython 3.11 prints "deallocated bytearray object has exported
buffers" when the allocation of a new bytearray's bytes fails: its own cleanup reads a
field it has not set yet; nothing is exported.)
"""

import sys

import pytest

from tokcy import RequestState
from tokcy.connector import SchedulerOutputManager
from tokcy.connector.output import COLUMNS

_testcapi = pytest.importorskip("_testcapi", reason="CPython's _testcapi (set_nomemory) is not installed")

# CPython 3.12.1 and 3.13.0 themselves crash (segfault) under set_nomemory in plain Python
# code: a function that builds a list comprehension over a 3-tuple, run with each of its
# allocations failing in turn, is enough (seen here; no tokcy involved). The sweep means
# something only on an interpreter that survives it: 3.10 and 3.11 (.ci/run's).
pytestmark = pytest.mark.skipif(sys.version_info >= (3, 12),
                                reason="CPython 3.12 and 3.13 crash under set_nomemory in plain Python code")

# a call meets a failure at each of its first allocations; past its last one, this many
# failure points in a row that the call never meets end the sweep
CLEAN_RUN = 25
MAX_POINTS = 3000


def allocation_errors():
    """What a failed allocation raises: MemoryError, and SystemError from numpy and CPython
    code that reports it so, and torch's OutOfMemoryError."""
    errors = (MemoryError, SystemError)
    if "torch" in sys.modules:
        errors += (sys.modules["torch"].OutOfMemoryError,)
    return errors


def failing_at(n, call):
    """``call()`` with the n-th allocation from now failing: (result, None) or (None, error)."""
    errors = allocation_errors()
    try:
        _testcapi.set_nomemory(n, n + 1)
        try:
            result = call()
        finally:
            _testcapi.remove_mem_hooks()
    except errors as error:
        return None, error
    return result, None


def sweep(make_world, call, check):
    """For n = 0, 1, ...: a fresh world, ``call(world)`` failing at allocation n, then
    ``check(world, result, error)``; stops after CLEAN_RUN successes in a row. Returns how
    many failure points raised."""
    failed = clean = 0
    for n in range(MAX_POINTS):
        world = make_world()
        result, error = failing_at(n, lambda: call(world))
        check(world, result, error)
        if error is None:
            clean += 1
            if clean == CLEAN_RUN:
                return failed
        else:
            failed += 1
            clean = 0
    pytest.fail(f"the call still met failures after {MAX_POINTS} allocations")


# ------------------------------------------------------------------------- the connector
def columns(output):
    return {name: getattr(output, name).tolist() for name in COLUMNS}


def request_rows(output):
    return [output.request_data(row).as_dict() for row in range(len(output))]


def connector_world(backend):
    """A manager that reported three decoding requests, their first generated token
    included; then each gains tokens and blocks (one a whole block of them), one rewrites
    its reported token (a rejected draft: the report replaces it), and a new request
    arrives."""
    manager = SchedulerOutputManager()
    requests = []
    for number in range(3):
        request = backend.Request(number, list(range(10 * number, 10 * number + 5)))
        request.block_tables[0].extend([4 * number, 4 * number + 1])
        requests.append(request)
    manager.build_scheduler_output(requests, [])
    for number, request in enumerate(requests):
        request.move_to_next_context_chunk()
        request.state = RequestState.GENERATION_IN_PROGRESS
        request.add_new_token(90 + number)
    manager.build_scheduler_output([], requests)
    for number, request in enumerate(requests):
        for token in range(1 + 4 * (number == 1)):
            request.add_new_token(100 + 10 * number + token)
        request.block_tables[0].append(50 + number)
    requests[2].truncate(5)
    requests[2].add_new_tokens([77])
    fresh = backend.Request(7, [7, 8, 9])
    fresh.block_tables[0].append(70)
    return manager, requests, fresh


def generate_one_more(requests, fresh):
    fresh.move_to_next_context_chunk()
    fresh.state = RequestState.GENERATION_IN_PROGRESS
    for request in requests + [fresh]:
        request.add_new_token(200 + request.request_id)


def next_steps(manager, requests, fresh):
    """The reports of the step the sweep's call made (or failed to make), then of one more."""
    first = manager.build_scheduler_output([fresh], requests)
    generate_one_more(requests, fresh)
    second = manager.build_scheduler_output([], requests + [fresh])
    return [(columns(output), request_rows(output)) for output in (first, second)]


def test_a_report_that_fails_at_any_allocation_loses_and_duplicates_nothing(backend):
    expected = next_steps(*connector_world(backend))

    def call(world):
        manager, requests, fresh = world
        return manager.build_scheduler_output([fresh], requests)

    def check(world, output, error):
        manager, requests, fresh = world
        if error is None:  # the report it returned, then the next step's
            generate_one_more(requests, fresh)
            second = manager.build_scheduler_output([], requests + [fresh])
            assert [(columns(out), request_rows(out)) for out in (output, second)] == expected
        else:  # as if it never ran: the next call reports what it would have
            assert next_steps(manager, requests, fresh) == expected

    assert sweep(lambda: connector_world(backend), call, check) > 0


def test_reading_a_report_that_fails_at_any_allocation_leaves_it_whole(backend):
    def world():
        manager, requests, fresh = connector_world(backend)
        return manager.build_scheduler_output([fresh], requests)

    expected = (columns(world()), request_rows(world()))

    def check(output, result, error):
        assert (columns(output), request_rows(output)) == expected
        assert error is not None or result == expected

    assert sweep(world, lambda output: (columns(output), request_rows(output)), check) > 0


# ------------------------------------------------------------------------- the executor
def as_lists(value):
    return value.tolist() if hasattr(value, "tolist") else value


def inputs_seen(inputs):
    """Every field of a ``PreparedInputs`` / ``DeviceInputs``, as lists and ints."""
    from tokcy.executor._host import ARRAY_FIELDS, COUNT_FIELDS

    seen = {name: as_lists(getattr(inputs, name)) for name in ARRAY_FIELDS + COUNT_FIELDS}
    seen.update({name: as_lists(getattr(inputs, name)) for name in ("kv_lens", "cu_kv_seqlens", "max_kv_len")})
    seen["groups"] = [{name: as_lists(getattr(group, name)) for name in
                       ("slot_mapping", "block_table", "kv_indptr", "kv_indices", "kv_last_page_len")}
                      for group in inputs.groups]
    return seen


def with_blocks(request, blocks, slot):
    """``request`` with ``blocks`` in its first table (block size 4) and, with a second
    layer group, twice as many in the second (block size 2)."""
    request.block_tables[0].extend(blocks)
    if len(request.block_tables) == 2:
        request.block_tables[1].extend([100 + 2 * block + half for block in blocks for half in (0, 1)])
    request.seq_slot = slot
    return request


def decode_request(backend, request_id, num_tokens, blocks, slot, groups=1):
    request = backend.Request(request_id, list(range(100 * request_id, 100 * request_id + num_tokens)),
                              num_layer_groups=groups)
    request.state = RequestState.GENERATION_IN_PROGRESS
    return with_blocks(request, blocks, slot)


def executor_world(backend, make_prepare, groups=1):
    """Three decoding requests whose rows were sent once, then changed (a new token each, a
    new block, a truncated table), and a context request; ``make_prepare()`` gives the
    call (prepare_inputs into HostBuffers, or an InputPreparer's prepare)."""
    prepare = make_prepare()
    decode = [decode_request(backend, 0, 5, [0, 1], 0, groups), decode_request(backend, 1, 7, [4, 5, 6], 1, groups),
              decode_request(backend, 2, 6, [8, 9, 10, 11, 12, 13], 2, groups)]
    prepare([], decode)
    for request in decode:
        request.add_new_token(50 + request.request_id)
    decode[0].block_tables[0].append(2)
    for table in decode[2].block_tables:
        table.truncate(len(table) // 2)
    context = with_blocks(backend.Request(9, list(range(9)), num_layer_groups=groups), [20, 21, 22], 5)
    return prepare, [context], decode


def executor_steps(prepare, context, decode, first=None):
    """What the sweep's call gave (``first``: None to make that call now), then the next step's."""
    first = prepare(context, decode) if first is None else first
    shown = [inputs_seen(first)]
    for request in decode:
        request.add_new_token(60 + request.request_id)
    shown.append(inputs_seen(prepare([], decode)))
    return shown


def executor_sweep(backend, make_prepare, extra=lambda prepare: None, groups=1):
    clean = executor_world(backend, make_prepare, groups)
    expected = executor_steps(*clean)
    expected_extra = extra(clean[0])

    def call(world):
        prepare, context, decode = world
        return prepare(context, decode)

    def check(world, result, error):
        if error is None:
            assert executor_steps(*world, first=result) == expected
        else:  # nothing changed: the same call now gives what it would have
            assert executor_steps(*world) == expected
        assert extra(world[0]) == expected_extra

    return sweep(lambda: executor_world(backend, make_prepare, groups), call, check)


@pytest.mark.parametrize("block_sizes", [(4,), (4, 2)])
def test_prepare_inputs_failing_at_any_allocation_changes_nothing(backend, block_sizes):
    from tokcy.executor import HostBuffers, prepare_inputs

    def make_prepare():
        out = HostBuffers(32, 8, max_blocks_per_seq=16, num_layer_groups=len(block_sizes))
        return lambda context, generation: prepare_inputs(context, generation, block_sizes=block_sizes, out=out)

    assert executor_sweep(backend, make_prepare, groups=len(block_sizes)) > 0


def test_a_preparer_failing_at_any_allocation_changes_nothing(backend):
    """The preparer's device table (kept by the changes each step sends) ends as in a world
    that never failed: a failed call lost no change and the next one sent them."""
    pytest.importorskip("torch")
    from tokcy.executor import InputPreparer

    def make_prepare():
        return InputPreparer(32, 8, block_size=4, max_blocks_per_seq=8, max_slots=8, num_staging_buffers=1).prepare

    assert executor_sweep(backend, make_prepare, lambda prepare: prepare.__self__.block_table.tolist()) > 0


def test_a_two_group_preparer_with_device_tokens_failing_at_any_allocation_changes_nothing(backend):
    """Two layer groups, and the third decoding request's newest token still on the device
    (its row gathered from the previous step's tokens)."""
    torch = pytest.importorskip("torch")
    from tokcy.executor import InputPreparer

    previous = torch.arange(900, 908, dtype=torch.int32)

    def make_prepare():
        preparer = InputPreparer(32, 8, block_sizes=(4, 2), max_blocks_per_seq=16, max_slots=8, num_staging_buffers=1)

        def prepare(context, generation):
            return preparer.prepare(context, generation[:2], device_token_requests=generation[2:],
                                    previous_new_tokens=previous)

        prepare.block_table = preparer.block_table
        return prepare

    assert executor_sweep(backend, make_prepare, lambda prepare: prepare.block_table.tolist(), groups=2) > 0


# ------------------------------------------------------------------------- requests
def generating_request(backend):
    """A request two tokens into generation, with drafts, a chunk and a block table."""
    request = backend.Request(2, [20, 21, 22, 23, 24], max_new_tokens=50)
    request.state = RequestState.GENERATION_IN_PROGRESS
    request.add_new_token(25)
    request.add_new_token(26)
    request.draft_tokens = [7, 8]
    request.block_tables[0].extend([4, 5, 6])
    request.block_tables[0].release_front(1)
    request.seq_slot = 3
    return request


def context_request(backend):
    request = backend.Request(1, list(range(12)))
    request.context_chunk_size = 4
    return request


HELD_VIEWS = {}  # request id -> a view of one of its beams, held while a sweep's call runs


def beam_request(backend):
    """Three beams two tokens into generation, beam 1's tokens viewed (its next write is a
    copy-on-write), with a block table."""
    request = backend.Request(3, [30, 31, 32, 33, 34], beam_width=3)
    request.state = RequestState.GENERATION_IN_PROGRESS
    request.add_new_tokens([1, 2, 3])
    request.add_new_tokens([4, 5, 6])
    request.block_tables[0].extend([7, 8])
    HELD_VIEWS[request.request_id] = request.get_tokens_view(1)
    return request


REQUEST_CALLS = {
    "add_new_token": (generating_request, lambda request: request.add_new_token(27)),
    "add_new_tokens": (generating_request, lambda request: request.add_new_tokens([27])),
    "set_generated_tokens": (generating_request, lambda request: request.set_generated_tokens([[90, 91, 92]])),
    "set_generated_tokens, grown": (generating_request,
                                    lambda request: request.set_generated_tokens([list(range(300, 340))])),
    "truncate": (generating_request, lambda request: request.truncate(6)),
    "pause": (generating_request, lambda request: request.pause(100)),
    "__init__ again": (generating_request, lambda request: request.__init__(2, [5, 6, 7])),
    "state": (generating_request, lambda request: setattr(request, "state", RequestState.GENERATION_COMPLETE)),
    "draft_tokens": (generating_request, lambda request: setattr(request, "draft_tokens", [1, 2, 3])),
    "seq_slot": (generating_request, lambda request: setattr(request, "seq_slot", 5)),
    "move_to_next_context_chunk": (context_request, lambda request: request.move_to_next_context_chunk()),
    "context_chunk_size": (context_request, lambda request: setattr(request, "context_chunk_size", 2)),
    "block append": (generating_request, lambda request: request.block_tables[0].append(9)),
    "block extend, grown": (generating_request, lambda request: request.block_tables[0].extend(range(100, 140))),
    "block set": (generating_request, lambda request: request.block_tables[0].__setitem__(-1, 9)),
    "block truncate": (generating_request, lambda request: request.block_tables[0].truncate(2)),
    "block clear": (generating_request, lambda request: request.block_tables[0].clear()),
    "block release_front": (generating_request, lambda request: request.block_tables[0].release_front(2)),
    "add_new_tokens, 3 beams": (beam_request, lambda request: request.add_new_tokens([7, 8, 9])),
    "set_generated_tokens, 3 beams": (beam_request, lambda request: request.set_generated_tokens([[1], [2, 3], []])),
    "set_generated_tokens, 3 beams, grown": (beam_request, lambda request: request.set_generated_tokens(
        [list(range(100, 140)), list(range(200, 230)), [5]])),
    "pause, 3 beams": (beam_request, lambda request: request.pause(100)),
}


@pytest.mark.parametrize("name", list(REQUEST_CALLS))
def test_a_request_call_failing_at_any_allocation_changes_nothing(backend, name):
    """Every field of the request (its change marks included) is as before a failed call,
    and as after a call that met no failure in a world without failures."""
    make, call = REQUEST_CALLS[name]
    before = make(backend)._state_dict()
    after = make(backend)
    call(after)
    after = after._state_dict()
    assert after != before

    def check(request, result, error):
        assert request._state_dict() == (before if error is not None else after)

    sweep(lambda: make(backend), call, check)


@pytest.mark.parametrize("holder", ["HostBuffers", "InputPreparer"])
def test_a_first_call_failing_at_any_allocation_leaves_a_usable_holder(backend, holder):
    """The first call into a new holder makes its writers (and a preparer its device
    table's rows and views): failing anywhere there, it leaves the holder as new, and the
    next call gives what a first call gives."""
    from tokcy.executor import HostBuffers, InputPreparer, prepare_inputs

    if holder == "InputPreparer":
        pytest.importorskip("torch")

    def world():
        requests = [decode_request(backend, 0, 5, [0, 1], 0), decode_request(backend, 1, 7, [4, 5, 6], 1)]
        if holder == "HostBuffers":
            out = HostBuffers(32, 8, max_blocks_per_seq=16)
            return (lambda: prepare_inputs([], requests, block_size=4, out=out)), None
        preparer = InputPreparer(32, 8, block_size=4, max_blocks_per_seq=16, max_slots=8, num_staging_buffers=1)
        return (lambda: preparer.prepare([], requests)), preparer

    def seen(world, inputs):
        table = None if world[1] is None else world[1].block_table.tolist()
        return inputs_seen(inputs), table

    clean = world()
    expected = seen(clean, clean[0]())

    def check(world, result, error):
        assert seen(world, world[0]() if error is not None else result) == expected

    assert sweep(world, lambda world: world[0](), check) > 0
