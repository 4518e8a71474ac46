"""The compiled fast plan writes its rows' per-row columns and tokens straight into the
reusable output arrays while it plans them; these worked examples, written by hand, pin
the cases around that: a report that outgrows those arrays afterwards (a later row in the
same call needs larger ones, so the rows written so far move into the new arrays), a
common row whose tokens do not fit them (planned as a job and written by pass 2), and a
failed call after such rows (nothing changes). Both backends must give the same reports.
"""

import pytest

from tokcy import RequestState
from tokcy.connector import SchedulerOutputManager
from tokcy.connector.output import COLUMNS


def columns(output):
    return {name: getattr(output, name).tolist() for name in COLUMNS}


def generating(request):
    request.state = RequestState.GENERATION_IN_PROGRESS
    return request


def two_decoding(backend):
    """Requests 1 (tokens 1 2 3, blocks 10 11) and 2 (tokens 4 5), reported once and
    then once more with one new token each (6 and 7): small output arrays, kept."""
    manager = SchedulerOutputManager()
    a = generating(backend.Request(1, [1, 2, 3]))
    b = generating(backend.Request(2, [4, 5]))
    a.block_tables[0].extend([10, 11])
    manager.build_scheduler_output([], [a, b])
    a.add_new_token(6)
    b.add_new_token(7)
    manager.build_scheduler_output([], [a, b])  # dropped at once: its arrays are kept
    return manager, a, b


def test_rows_written_before_a_row_that_outgrows_the_arrays(backend):
    manager, a, b = two_decoding(backend)
    a.add_new_token(8)
    b.add_new_token(9)
    d = generating(backend.Request(4, list(range(100, 200))))  # new: 100 tokens, after a and b
    d.block_tables[0].extend([40, 41, 42])
    before = manager._state.num_output_allocations
    output = manager.build_scheduler_output([], [a, b, d])
    assert columns(output) == {
        "request_ids": [1, 2, 4],
        "is_new": [False, False, True],
        "computed_positions": [4, 3, 99],
        "num_scheduled_tokens": [1, 1, 1],
        "num_replaced_tokens": [0, 0, 0],
        "token_offsets": [0, 1, 2, 102],
        "tokens": [8, 9] + list(range(100, 200)),
        "group_offsets": [0, 1, 2, 3],
        "block_offsets": [0, 0, 0, 3],
        "block_ids": [40, 41, 42],
        "num_replaced_blocks": [0, 0, 0],
        "num_released_blocks": [0, 0, 0],
    }
    # compiled: the int64 and int32 arrays were too small; the twin makes its three per report
    assert manager._state.num_output_allocations - before == {"tokcy._core": 2, "tokcy._pure": 3}[backend.__name__]
    # and the next report, into the new arrays, carries only the next deltas
    for request, token in ((a, 11), (b, 12), (d, 13)):
        request.add_new_token(token)
    assert manager.build_scheduler_output([], [a, b, d]).tokens.tolist() == [11, 12, 13]


def test_rows_written_before_the_arrays_are_shrunk(backend):
    """A huge report, then a small one: its rows go into the huge arrays first, and move
    when all three are replaced by small ones (a small report does not pin the memory)."""
    manager = SchedulerOutputManager()
    requests = [generating(backend.Request(number, [number])) for number in range(14_000)]
    manager.build_scheduler_output([], requests)
    a, b = requests[7], requests[3]
    a.add_new_token(70)
    b.add_new_token(30)
    before = manager._state.num_output_allocations
    output = manager.build_scheduler_output([], [a], [b])
    assert columns(output) == {
        "request_ids": [7, 3],
        "is_new": [False, False],
        "computed_positions": [1, 2],
        "num_scheduled_tokens": [1, 1],
        "num_replaced_tokens": [0, 0],
        "token_offsets": [0, 1, 2],
        "tokens": [70, 30],
        "group_offsets": [0, 1, 2],
        "block_offsets": [0, 0, 0],
        "block_ids": [],
        "num_replaced_blocks": [0, 0],
        "num_released_blocks": [0, 0],
    }
    assert manager._state.num_output_allocations - before == 3  # compiled: all three shrink; the twin: its three


def test_a_common_row_whose_tokens_do_not_fit_the_arrays(backend):
    manager, a, b = two_decoding(backend)
    b.add_new_token(9)
    a.set_generated_tokens([list(range(50, 250))])  # re-writes a's tokens from 3 on: 200 of them
    output = manager.build_scheduler_output([], [b, a])
    assert columns(output) == {
        "request_ids": [2, 1],
        "is_new": [False, False],
        "computed_positions": [3, 202],
        "num_scheduled_tokens": [1, 1],
        "num_replaced_tokens": [0, 1],
        "token_offsets": [0, 1, 201],
        "tokens": [9] + list(range(50, 250)),
        "group_offsets": [0, 1, 2],
        "block_offsets": [0, 0, 0],
        "block_ids": [],
        "num_replaced_blocks": [0, 0],
        "num_released_blocks": [0, 0],
    }
    a.add_new_token(7)
    assert manager.build_scheduler_output([], [a]).tokens.tolist() == [7]


def test_a_failed_call_after_rows_written_to_the_arrays_changes_nothing(backend):
    manager, a, b = two_decoding(backend)
    a.add_new_token(8)
    b.add_new_token(9)
    before = (a._state_dict(), b._state_dict(), manager._state.tracked_request_ids())
    with pytest.raises(ValueError, match="request 2 is scheduled more than once"):
        manager.build_scheduler_output([], [a, b, generating(backend.Request(5, [1] * 64)), b])
    assert (a._state_dict(), b._state_dict(), manager._state.tracked_request_ids()) == before
    output = manager.build_scheduler_output([], [b, a])
    assert output.request_ids.tolist() == [2, 1] and output.tokens.tolist() == [9, 8]
    assert output.computed_positions.tolist() == [3, 4] and output.token_offsets.tolist() == [0, 1, 2]


def test_code_run_by_the_allocation_cannot_reach_the_arrays_being_replaced(backend, monkeypatch):
    """The rows written straight into the kept arrays move into new ones when a later row
    outgrows them. Allocating those can run Python code (a collection, hence a gc
    callback; here numpy's ``empty``, ``frombuffer`` or ``asarray`` itself runs it): code that looks
    for the kept arrays in every tracked container and resizes them, which would free the
    memory the move copies from. It finds none, and the report is whole."""
    import gc
    import weakref

    import numpy as np

    manager, a, b = two_decoding(backend)
    seen = manager.build_scheduler_output([], [])  # the kept arrays: the bases of a report's columns
    # weak references: they leave the arrays' reference counts (what decides their reuse)
    # as they are, and an array freed since matches nothing (an id could be reused)
    kept = [weakref.ref(column.base) for column in (seen.request_ids, seen.tokens, seen.is_new)
            if column.base is not None]
    del seen
    a.add_new_token(8)
    b.add_new_token(9)
    d = generating(backend.Request(4, list(range(100, 200))))  # new, after a and b: outgrows the arrays
    calls, resized = [], []

    def hostile(make):
        def allocate(*args, **kwargs):
            calls.append(args)
            for container in gc.get_objects():
                if type(container) in (tuple, list):
                    for item in container:
                        if isinstance(item, np.ndarray) and any(item is ref() for ref in kept):
                            item.resize(0, refcheck=False)
                            resized.append(id(item))
            return make(*args, **kwargs)
        return allocate

    with monkeypatch.context() as patch:
        patch.setattr(np, "empty", hostile(np.empty))
        patch.setattr(np, "frombuffer", hostile(np.frombuffer))
        patch.setattr(np, "asarray", hostile(np.asarray))
        output = manager.build_scheduler_output([], [a, b, d])
    assert resized == []
    # compiled: views of the new int64 and int32 memory; the twin: its joined tokens and block ids
    assert len(calls) == {"tokcy._core": 2, "tokcy._pure": 1}[backend.__name__]
    assert columns(output)["tokens"] == [8, 9] + list(range(100, 200))
    assert columns(output)["token_offsets"] == [0, 1, 2, 102] and columns(output)["request_ids"] == [1, 2, 4]
