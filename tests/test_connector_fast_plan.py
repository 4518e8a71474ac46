"""The compiled report's fast plan (the common generation / device-token row) against its
general plan, and both against the pure twin.

The compiled ``ReportState`` plans runs of common rows (an exact Request, reported before
and not paused since, its slot hint valid, its layer-group count unchanged) in a fast
loop and every other row in the general one; ``_fast_plan = False`` sends every row to
the general plan. The same random programs must give the same reports, the same errors
and the same request and manager state afterwards with the fast plan on, with it off,
and on the pure twin; ``_num_fast_rows`` counts the rows the fast loop planned, so the
comparison is known to exercise it.
"""

import random

import pytest

import connector_world
from connector_world import run_case
from tokcy import RequestState, _backend
from tokcy.connector import SchedulerOutputManager


def test_random_runs_report_alike_with_and_without_the_fast_plan(both_backends, monkeypatch):
    compiled, pure = both_backends
    fast_rows = {}

    def manager_factory(fast):
        def make():
            manager = SchedulerOutputManager()
            if manager._state.__class__ is compiled.ReportState:
                manager._state._fast_plan = fast
                fast_rows.setdefault(fast, []).append(manager._state)
            return manager
        return make

    for seed in range(300):
        transcripts = []
        for module, fast in ((compiled, True), (compiled, False), (pure, None)):
            monkeypatch.setattr(_backend, "module", module)
            monkeypatch.setattr(connector_world, "SchedulerOutputManager", manager_factory(fast))
            transcripts.append(run_case(seed, module))
        assert transcripts[0] == transcripts[1] == transcripts[2], f"seed {seed}"
    assert sum(state._num_fast_rows for state in fast_rows[True]) > 1000  # the fast loop ran, often
    assert sum(state._num_fast_rows for state in fast_rows[False]) == 0


# ---------------------------------------------------------------- batches with errors
def make_pool(module, rng_seed):
    """Requests of ``module`` past their first report (1-3 layer groups), and the manager."""
    rng = random.Random(rng_seed)
    state = module.ReportState()
    subclass = type("SubRequest", (module.Request,), {})  # never the fast plan's exact type
    pool = []
    for number in range(8):
        kind = subclass if number == 0 else module.Request
        request = kind(number, list(range(rng.randint(1, 40))), num_layer_groups=rng.randint(1, 3))
        for table in request.block_tables:
            table.extend(range(100 * number, 100 * number + rng.randint(0, 5)))
        pool.append(request)
    state.build(pool, [])
    for request in pool:
        request.move_to_next_context_chunk()
        request.state = RequestState.GENERATION_IN_PROGRESS
    return state, pool


def mutate(module, state, pool, rng):
    """One random change between reports (the same rng draws on every backend)."""
    request = pool[rng.randrange(len(pool))]
    choice = rng.randrange(10)
    if choice < 4:
        request.add_new_token(rng.randrange(1000))
    elif choice == 4:
        request.truncate(max(request.prompt_len, request.get_num_tokens(0) - rng.randint(0, 3)))
    elif choice == 5:
        table = request.block_tables[rng.randrange(len(request.block_tables))]
        table.append(rng.randrange(1000))
        if len(table) > 2 and rng.random() < 0.5:
            table[1] = rng.randrange(1000)
        elif rng.random() < 0.2:  # refilled whole: new ids, none released
            table.__init__([rng.randrange(1000) for _ in range(rng.randint(0, 4))])
    elif choice == 6:
        state.record_matched_tokens(request.request_id, rng.randint(0, 3))
    elif choice == 7:
        state.reset_request(request.request_id)
    elif choice == 8:
        request.draft_tokens = [rng.randrange(1000) for _ in range(rng.randint(0, 2))]
    else:
        request.state = rng.choice([RequestState.GENERATION_IN_PROGRESS, RequestState.GENERATION_COMPLETE])


def batch(module, pool, rng):
    """A random generation / device-token split of the pool, now and then with an item
    the general plan refuses (a duplicate, a non-Request) or only it plans (a subclass,
    a never-seen id, a request with another group count)."""
    chosen = rng.sample(pool, rng.randint(0, len(pool)))
    odd = rng.randrange(8)
    if odd == 0 and chosen:
        chosen.insert(rng.randint(0, len(chosen)), chosen[0])  # scheduled twice
    elif odd == 1:
        chosen.insert(rng.randint(0, len(chosen)), "not a request")
    elif odd == 2:
        chosen.insert(rng.randint(0, len(chosen)), module.Request(1000 + rng.randrange(3), [1, 2]))
    elif odd == 3:
        chosen.insert(rng.randint(0, len(chosen)), module.Request(rng.randrange(8), [1], num_layer_groups=4))
    cut = rng.randint(0, len(chosen))
    return chosen[:cut], chosen[cut:]


def outcome(state, generation, device):
    try:
        columns = state.build([], generation, device)
    except (TypeError, ValueError) as error:
        return type(error).__name__, str(error)
    return [column.tolist() for column in columns.arrays()]


def snapshot(state, pool):
    return state.tracked_request_ids(), [request._state_dict() for request in pool]


@pytest.mark.parametrize("chunk", range(4))
def test_random_batches_with_errors_agree_with_and_without_the_fast_plan(both_backends, monkeypatch, chunk):
    compiled, pure = both_backends
    fast_rows = 0
    for seed in range(chunk * 50, (chunk + 1) * 50):
        runs = []
        for module, fast in ((compiled, True), (compiled, False), (pure, None)):
            monkeypatch.setattr(_backend, "module", module)
            state, pool = make_pool(module, seed)
            if fast is not None:
                state._fast_plan = fast
            rng = random.Random(seed)
            events = []
            for _ in range(12):
                for _ in range(rng.randint(0, 3)):
                    mutate(module, state, pool, rng)
                generation, device = batch(module, pool, rng)
                events.append(outcome(state, generation, device))
                events.append(snapshot(state, pool))  # a failed call changed nothing
            runs.append(events)
            if fast:
                fast_rows += state._num_fast_rows
        assert runs[0] == runs[1] == runs[2], f"seed {seed}"
    assert fast_rows > 500


def test_a_failed_call_gives_back_the_fast_rows_marks_and_slots(backend):
    """Worked example: two common rows, then a duplicate; nothing changes, and the next
    report carries exactly the pending deltas."""
    manager = SchedulerOutputManager()
    a, b = backend.Request(1, [1, 2, 3]), backend.Request(2, [4, 5])
    for request in (a, b):
        request.state = RequestState.GENERATION_IN_PROGRESS
    a.block_tables[0].extend([10, 11])
    manager.build_scheduler_output([], [a, b])
    a.add_new_token(6)
    b.add_new_token(7)
    b.block_tables[0].append(20)
    manager.record_matched_tokens(1, 2)  # discarded by a's next (generation) report
    before = (a._state_dict(), b._state_dict())
    with pytest.raises(ValueError, match="request 1 is scheduled more than once"):
        manager.build_scheduler_output([], [a, b, a])
    assert (a._state_dict(), b._state_dict()) == before
    output = manager.build_scheduler_output([], [a], [b])
    assert output.tokens.tolist() == [6, 7] and output.computed_positions.tolist() == [3, 3]
    assert output.num_replaced_tokens.tolist() == [0, 0] and output.block_ids.tolist() == [20]
    assert output.block_offsets.tolist() == [0, 0, 1] and output.num_scheduled_tokens.tolist() == [1, 1]


def test_a_table_refilled_through_init_is_reported_whole(backend):
    """Worked example: a request's table refilled through ``__init__`` between reports (new
    ids, none released) is reported as every block replaced, on the compiled backend by
    the fast plan, which reads the request's first table without the table object."""
    manager = SchedulerOutputManager()
    request = backend.Request(1, [1, 2, 3])
    request.state = RequestState.GENERATION_IN_PROGRESS
    table = request.block_tables[0]
    table.extend([10, 11, 12])
    table.release_front(1)
    manager.build_scheduler_output([], [request])
    table.__init__([30, 31])
    request.add_new_token(4)
    fast_rows = getattr(manager._state, "_num_fast_rows", 0)
    output = manager.build_scheduler_output([], [request])
    assert output.tokens.tolist() == [4] and output.num_replaced_tokens.tolist() == [0]
    assert output.block_ids.tolist() == [30, 31] and output.block_offsets.tolist() == [0, 2]
    assert output.num_replaced_blocks.tolist() == [3] and output.num_released_blocks.tolist() == [0]
    if backend.__name__ == "tokcy._core":
        assert manager._state._num_fast_rows == fast_rows + 1
    (data,) = manager.build_scheduler_output([], [request]).cached_requests  # nothing new since
    assert (data.new_tokens, data.new_block_ids, data.num_replaced_blocks_by_group) == ([], [], [0])
