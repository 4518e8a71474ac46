"""Bad input: a ValueError / TypeError naming the request, and nothing changed anywhere.

Each failing call is made on one of two identical worlds; the next valid report must then
be the same on both (so neither the manager nor the requests' change marks were touched),
and both managers must track the same ids.
"""

import pytest
from hostile_code import RefusesIteration

from tokcy import RequestState
from tokcy.connector import SchedulerOutputManager


def make_world(backend):
    """A manager with two reported requests that then changed (pending deltas)."""
    manager = SchedulerOutputManager()
    context = backend.Request(1, list(range(20)), num_layer_groups=2)
    context.context_chunk_size = 8
    for table in context.block_tables:
        table.extend([1, 2])
    generation = backend.Request(2, list(range(30)))
    generation.state = RequestState.GENERATION_IN_PROGRESS
    generation.block_tables[0].extend([3, 4, 5])
    manager.build_scheduler_output([context], [generation])
    context.move_to_next_context_chunk()
    context.block_tables[1].truncate(1)
    context.block_tables[1].append(9)
    context.block_tables[0].release_front(1)
    generation.add_new_token(100)
    generation.truncate(30)
    generation.add_new_token(101)
    generation.block_tables[0][2] = 6
    manager.record_matched_tokens(1, 3)
    return manager, context, generation


def report(output):
    return [data.as_dict() for data in output.requests]


def bad_calls(backend, context, generation):
    """(exception, message fragment, context list, generation list) for each bad batch."""
    twin = backend.Request(2, list(range(30)))  # another object with a reported id
    finished = backend.Request(3, [1, 2, 3])
    finished.state = RequestState.GENERATION_COMPLETE
    regrouped = backend.Request(1, list(range(20)), num_layer_groups=3)
    fresh = backend.Request(4, [7, 7])
    return [
        (ValueError, "request 2 is scheduled more than once", [context], [generation, generation]),
        (ValueError, "request 2 is scheduled more than once", [generation], [generation]),
        (ValueError, "request 2 is scheduled more than once", [fresh, context], [generation, twin]),
        (ValueError, "request 4 is scheduled more than once", [fresh, context, fresh], []),
        (ValueError, "request 3 is finished", [fresh, context], [generation, finished]),
        (ValueError, "request 1 has 3 layer groups but its earlier reports had 2", [fresh], [generation, regrouped]),
        (TypeError, r"generation_requests\[1\] must be a Request, not str", [fresh, context], [generation, "x"]),
        (TypeError, r"context_requests\[0\] must be a Request, not NoneType", [None], []),
    ]


@pytest.mark.parametrize("case", range(8))
def test_bad_batch_changes_nothing(backend, case):
    manager, context, generation = make_world(backend)
    twin_manager, twin_context, twin_generation = make_world(backend)
    error, message, bad_context, bad_generation = bad_calls(backend, context, generation)[case]
    with pytest.raises(error, match=message):
        manager.build_scheduler_output(bad_context, bad_generation)
    assert manager.tracked_request_ids() == twin_manager.tracked_request_ids() == [1, 2]
    assert report(manager.build_scheduler_output([context], [generation])) == report(
        twin_manager.build_scheduler_output([twin_context], [twin_generation])
    )
    assert manager.tracked_request_ids() == [1, 2]


def test_finished_state_of_a_reported_request(backend):
    manager, context, generation = make_world(backend)
    generation.state = RequestState.GENERATION_COMPLETE
    with pytest.raises(ValueError, match="request 2 is finished"):
        manager.build_scheduler_output([context], [generation])
    generation.state = RequestState.GENERATION_IN_PROGRESS
    data = manager.build_scheduler_output([], [generation]).requests[0]
    assert data.new_tokens == [101] and data.num_replaced_tokens == 0
    assert data.new_block_ids == [6] and data.num_replaced_blocks_by_group == [1]


def test_group_count_is_checked_after_reset_too(backend):
    manager, context, generation = make_world(backend)
    manager.reset_request(1)
    with pytest.raises(ValueError, match="request 1 has 1 layer groups but its earlier reports had 2"):
        manager.build_scheduler_output([backend.Request(1, [1])], [])
    manager.request_finished(1)  # finishing forgets it: the id may come back with any layout
    assert manager.build_scheduler_output([backend.Request(1, [1])], []).requests[0].is_new


def test_record_matched_tokens_validation(backend):
    manager = SchedulerOutputManager()
    with pytest.raises(ValueError, match="num_tokens must be >= 0, got -1"):
        manager.record_matched_tokens(1, -1)
    with pytest.raises(TypeError):
        manager.record_matched_tokens(1, 2.0)
    with pytest.raises(TypeError):
        manager.record_matched_tokens("1", 2)
    with pytest.raises(TypeError):
        manager.reset_request(None)
    with pytest.raises(TypeError):
        manager.request_finished(1.5)
    assert manager.num_tracked_requests == 0


def test_requests_of_the_other_backend_are_refused(backend, both_backends):
    compiled, pure = both_backends
    other = pure if backend is compiled else compiled
    manager = SchedulerOutputManager()
    live = "tokcy._core.Request" if backend is compiled else "tokcy._pure.request.Request"
    given = "tokcy._pure.request.Request" if backend is compiled else "tokcy._core.Request"
    message = f"context_requests[0] must be a Request, not {given} (the live backend takes {live})"
    with pytest.raises(TypeError) as caught:
        manager.build_scheduler_output([other.Request(1, [1])], [])
    assert str(caught.value) == message
    assert manager.num_tracked_requests == 0


def uninitialised_requests(backend):
    class SkipsInit(backend.Request):
        def __init__(self, request_id):
            pass  # no super().__init__()

    return [backend.Request.__new__(backend.Request), SkipsInit(5)]


@pytest.mark.parametrize("case", range(2))
def test_request_whose_init_never_ran(backend, case):
    """Never a crash: both backends make a blank Request (id 0, one empty beam, no block
    tables) before __init__, so one whose __init__ never ran is reported as an empty new
    request, and the other rows are reported as if it were not there."""
    for groups_of in (lambda c, g, b: ([c, b], [g]), lambda c, g, b: ([c], [g], [b])):
        manager, context, generation = make_world(backend)
        twin_manager, twin_context, twin_generation = make_world(backend)
        bare = uninitialised_requests(backend)[case]
        output = manager.build_scheduler_output(*groups_of(context, generation, bare))
        rows = output.new_requests + output.cached_requests
        (row,) = [data for data in rows if data.request_id == 0]
        assert row in output.new_requests
        assert row.new_tokens == [] and row.num_replaced_tokens == 0
        assert row.new_block_ids_by_group == [] and row.computed_position == 0
        others = [data for data in rows if data.request_id != 0]
        twin = twin_manager.build_scheduler_output([twin_context], [twin_generation])
        assert [data.as_dict() for data in others] == report(twin)
        assert manager.tracked_request_ids() == [0, 1, 2]


def test_messages_are_identical_on_both_backends(both_backends, monkeypatch):
    from tokcy import _backend

    messages = []
    for module in both_backends:
        monkeypatch.setattr(_backend, "module", module)
        manager, context, generation = make_world(module)
        found = []
        for error, _, bad_context, bad_generation in bad_calls(module, context, generation):
            with pytest.raises(error) as caught:
                manager.build_scheduler_output(bad_context, bad_generation)
            found.append(str(caught.value))
        messages.append(found)
    assert messages[0] == messages[1]


def decode_world(backend, count=24):
    """A manager that has reported ``count`` requests (ids 1..count), each then one token
    further: the next report's rows are all fast-plan rows."""
    manager = SchedulerOutputManager()
    requests = []
    for request_id in range(1, count + 1):
        request = backend.Request(request_id, list(range(request_id, request_id + 5)))
        request.block_tables[0].extend([request_id])
        requests.append(request)
    manager.build_scheduler_output(requests, [])
    for request in requests:
        request.move_to_next_context_chunk()
        request.state = RequestState.GENERATION_IN_PROGRESS
        request.add_new_token(1000 + request.request_id)
    return manager, requests


@pytest.mark.parametrize("position", [1, 4, 8, 16, 23])
@pytest.mark.parametrize("kind", ["None", "str", "finished", "duplicate"])
def test_a_bad_item_among_many_fast_rows_changes_nothing(backend, kind, position):
    """A batch long enough that the fast plan looks rows ahead (it reads ahead only fields of
    objects of the exact types it checks): whatever lies at ``position``, the call raises
    for it and changes nothing, so the next valid report equals an untouched twin's."""
    manager, requests = decode_world(backend)
    twin_manager, twin_requests = decode_world(backend)
    batch = list(requests)
    if kind == "finished":
        batch[position].state = RequestState.GENERATION_COMPLETE
        error, message = ValueError, f"request {position + 1} is finished"
    elif kind == "duplicate":
        batch[position] = batch[0]
        error, message = ValueError, "request 1 is scheduled more than once"
    else:
        batch[position] = None if kind == "None" else "x"
        given = type(batch[position]).__name__
        error, message = TypeError, rf"generation_requests\[{position}\] must be a Request, not {given}"
    with pytest.raises(error, match=message):
        manager.build_scheduler_output([], batch)
    requests[position].state = RequestState.GENERATION_IN_PROGRESS
    output = manager.build_scheduler_output([], requests)
    assert report(output) == report(twin_manager.build_scheduler_output([], twin_requests))
    assert output.request_ids.tolist() == list(range(1, 25))
    assert output.tokens.tolist() == [1000 + request_id for request_id in range(1, 25)]


def test_a_blank_request_among_many_fast_rows_is_a_new_row(backend):
    """A blank Request (never initialised, no layer groups) read ahead of the fast rows is
    reported where it lies, as a new request with no tokens, between the decode rows."""
    manager, requests = decode_world(backend)
    blank = backend.Request.__new__(backend.Request)
    output = manager.build_scheduler_output([], requests[:10] + [blank] + requests[10:])
    assert output.request_ids.tolist() == list(range(1, 11)) + [0] + list(range(11, 25))
    assert output.is_new.tolist() == [False] * 10 + [True] + [False] * 14
    assert output.tokens.tolist() == [1000 + request_id for request_id in range(1, 25)]


def test_an_object_claiming_to_be_a_request_is_refused_by_its_real_type(backend):
    class Impostor:
        """Not a Request, though its ``__class__`` says so (which ``isinstance`` believes)."""

        @property
        def __class__(self):
            return backend.Request

    assert isinstance(Impostor(), backend.Request)
    with pytest.raises(TypeError, match=r"context_requests\[0\] must be a Request, not .*Impostor"):
        SchedulerOutputManager().build_scheduler_output([Impostor()], [])


def test_the_lists_are_read_after_a_later_group_is_iterated(backend):
    """A generation group given as a generator empties the context list the call was given
    while the call iterates it: both backends read the list after that (request 1 is not
    reported, and its tokens still are, in full, by the next report)."""
    first, second = backend.Request(1, [1, 2, 3]), backend.Request(2, [4, 5])
    second.state = RequestState.GENERATION_IN_PROGRESS
    context = [first]

    def generation():
        context.clear()
        yield second

    manager = SchedulerOutputManager()
    output = manager.build_scheduler_output(context, generation())
    assert output.request_ids.tolist() == [2] and output.num_context_requests == 0
    assert manager.build_scheduler_output([first], []).tokens.tolist() == [1, 2, 3]


@pytest.mark.parametrize("group", ["context_requests", "generation_requests", "device_token_requests"])
def test_a_group_that_is_not_iterable_is_named(backend, group):
    """A single Request where a list of them goes: a TypeError naming the argument, worded
    alike on both backends; the manager tracks nothing and the request's marks stay."""
    manager = SchedulerOutputManager()
    request = backend.Request(1, [5, 6, 7])
    request.state = RequestState.GENERATION_IN_PROGRESS
    groups = {"context_requests": [], "generation_requests": []}
    groups[group] = request
    with pytest.raises(TypeError) as caught:
        manager.build_scheduler_output(**groups)
    assert str(caught.value) == f"{group} must be a list (or another iterable) of Requests, not a Request"
    assert manager.num_tracked_requests == 0
    report = manager.build_scheduler_output([], [request])  # its first report: all of it, as if none ran
    assert report.new_requests[0].new_tokens == [5, 6, 7]


@pytest.mark.parametrize("group", ["context_requests", "generation_requests", "device_token_requests"])
def test_a_groups_own_type_error_from_iter_is_raised_as_it_is(backend, group):
    """An iterable whose ``__iter__`` raises TypeError: that error, as raised, on both
    backends; the manager tracks nothing."""
    manager = SchedulerOutputManager()
    groups = {"context_requests": [], "generation_requests": [], group: RefusesIteration()}
    with pytest.raises(TypeError, match="^this batch is not ready$"):
        manager.build_scheduler_output(**groups)
    assert manager.num_tracked_requests == 0
