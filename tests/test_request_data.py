"""RequestData: the rows of a SchedulerOutput as plain values, built for the whole report at once.

A worked example written by hand, a differential test of every field against the columns
(sliced independently with numpy), and a property test of the row slicer over the shapes
it has fast paths for (all rows the same length, mostly empty rows, anything else).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokcy import RequestState
from tokcy.connector import RequestData, SchedulerOutput, SchedulerOutputManager
from tokcy.connector.output import COLUMNS, _row_slices


def test_worked_example(backend):
    manager = SchedulerOutputManager()
    a = backend.Request(1, [10, 11, 12], num_layer_groups=2)
    b = backend.Request(2, [20])
    a.block_tables[0].extend([5, 6])
    a.block_tables[1].extend([7])
    b.block_tables[0].append(8)
    output = manager.build_scheduler_output([a, b], [])
    for request in (a, b):
        request.move_to_next_context_chunk()
        request.state = RequestState.GENERATION_IN_PROGRESS
    first_a, first_b = output.requests
    assert isinstance(first_a, RequestData)
    assert (first_a.request_id, first_a.is_new) == (1, True)
    assert (first_a.new_tokens, first_a.new_block_ids) == ([10, 11, 12], [5, 6])
    assert (first_a.computed_position, first_a.num_scheduled_tokens, first_a.num_replaced_tokens) == (0, 3, 0)
    assert first_a.new_block_ids_by_group == [[5, 6], [7]] and first_a.num_layer_groups == 2
    assert (first_b.new_tokens, first_b.new_block_ids_by_group, first_b.num_layer_groups) == ([20], [[8]], 1)
    a.add_new_token(13)
    a.block_tables[1].append(9)
    b.add_new_token(21)
    output = manager.build_scheduler_output([], [b, a])
    assert output.new_requests == [] and [data.request_id for data in output.cached_requests] == [2, 1]
    second_b, second_a = output.cached_requests
    assert second_b.as_dict() == {
        "request_id": 2, "is_new": False, "new_tokens": [21], "new_block_ids_by_group": [[]],
        "computed_position": 1, "num_scheduled_tokens": 1, "num_replaced_tokens": 0,
        "num_replaced_blocks_by_group": [0], "num_released_blocks_by_group": [0],
    }
    assert (second_a.new_tokens, second_a.new_block_ids, second_a.new_block_ids_by_group) == ([13], [], [[], [9]])
    assert second_a.num_replaced_blocks_by_group == [0, 0] and second_a.computed_position == 3
    # each row's lists are its own; the objects are built once per output
    assert second_a.new_tokens is not second_b.new_tokens
    assert output.request_data(1) is second_a and output.requests == [second_b, second_a]
    assert second_a != second_b and second_a == output.requests[1]
    assert repr(second_b).startswith("RequestData(request_id=2, is_new=False, new_tokens=[21]")


def _expected_rows(output):
    """Every field of every row, sliced from the columns with numpy (independent of RequestData)."""
    rows = []
    for row in range(len(output.request_ids)):
        segments = range(output.group_offsets[row], output.group_offsets[row + 1])
        blocks = [output.block_ids[output.block_offsets[s] : output.block_offsets[s + 1]].tolist() for s in segments]
        rows.append({
            "request_id": int(output.request_ids[row]),
            "is_new": bool(output.is_new[row]),
            "new_tokens": output.tokens[output.token_offsets[row] : output.token_offsets[row + 1]].tolist(),
            "new_block_ids_by_group": blocks,
            "computed_position": int(output.computed_positions[row]),
            "num_scheduled_tokens": int(output.num_scheduled_tokens[row]),
            "num_replaced_tokens": int(output.num_replaced_tokens[row]),
            "num_replaced_blocks_by_group": [int(output.num_replaced_blocks[s]) for s in segments],
            "num_released_blocks_by_group": [int(output.num_released_blocks[s]) for s in segments],
        })
    return rows


def test_every_field_matches_the_columns(backend):
    """Random decode steps over requests of one and of three layer groups, with rewinds."""
    rng = np.random.default_rng(5)
    for groups in (1, 3):
        manager = SchedulerOutputManager()
        requests = [backend.Request(i, rng.integers(0, 1000, 1 + i % 5).tolist(), num_layer_groups=groups)
                    for i in range(9)]
        manager.build_scheduler_output(requests, [])
        for request in requests:
            request.move_to_next_context_chunk()
            request.state = RequestState.GENERATION_IN_PROGRESS
        for step in range(12):
            for request in requests:
                for _ in range(int(rng.integers(0, 3))):
                    request.add_new_token(int(rng.integers(0, 1000)))
                if rng.random() < 0.2 and request.get_num_tokens(0) > request.prompt_len:
                    request.truncate(request.get_num_tokens(0) - 1)
                for table in request.block_tables:
                    if rng.random() < 0.3:
                        table.append(int(rng.integers(0, 500)))
            scheduled = [requests[i] for i in rng.permutation(len(requests))[: int(rng.integers(0, 10))]]
            output = manager.build_scheduler_output([], scheduled)
            expected = _expected_rows(output)
            got = output.requests
            assert [data.as_dict() for data in got] == expected, (groups, step)
            assert [data.new_block_ids for data in got] == [row["new_block_ids_by_group"][0] for row in expected]
            assert [data.as_dict() for data in output.new_requests] == [row for row in expected if row["is_new"]]
            assert [data.as_dict() for data in output.cached_requests] == [row for row in expected if not row["is_new"]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=40), st.sampled_from(["any", "uniform", "sparse"]), st.integers(0, 5))
def test_row_slices_equal_plain_slicing(lengths, shape, start):
    if shape == "uniform" and lengths:
        lengths = [lengths[0]] * len(lengths)
    elif shape == "sparse":
        lengths = [length if index % 7 == 0 else 0 for index, length in enumerate(lengths)]
    offsets = np.array([start] + list(np.cumsum(lengths) + start), dtype=np.int64)
    flat = np.arange(start + sum(lengths), dtype=np.int32) * 3
    rows = _row_slices(flat, offsets)
    assert rows == [flat[offsets[r] : offsets[r + 1]].tolist() for r in range(len(lengths))]
    assert all(type(row) is list for row in rows) and len({id(row) for row in rows}) == len(rows)


def test_an_output_and_its_rows_are_freed_without_the_cycle_collector(backend):
    import gc
    import weakref

    manager = SchedulerOutputManager()
    output = manager.build_scheduler_output([backend.Request(1, [1, 2, 3])], [])
    assert output.requests[0].new_tokens == [1, 2, 3]
    alive = weakref.ref(output)
    gc.disable()
    try:
        del output
        assert alive() is None  # freed by reference counting alone
    finally:
        gc.enable()


def _hand_made(**changes):
    columns = {
        "request_ids": [3, 4], "is_new": [True, False], "computed_positions": [0, 7], "num_scheduled_tokens": [2, 1],
        "num_replaced_tokens": [0, 0], "token_offsets": [0, 2, 3], "tokens": [10, 11, 12], "group_offsets": [0, 1, 1],
        "block_offsets": [0, 1], "block_ids": [5], "num_replaced_blocks": [0], "num_released_blocks": [0],
    }
    columns.update(changes)
    dtypes = {"is_new": np.bool_, "tokens": np.int32, "block_ids": np.int32}
    return SchedulerOutput(0, *(np.array(columns[name], dtype=dtypes.get(name, np.int64)) for name in COLUMNS))


def test_rows_of_a_hand_made_output_one_without_layer_groups(backend):
    first, second = _hand_made().requests
    assert (first.request_id, first.is_new, first.new_tokens, first.new_block_ids) == (3, True, [10, 11], [5])
    assert (first.new_block_ids_by_group, first.num_layer_groups, first.computed_position) == ([[5]], 1, 0)
    assert (second.request_id, second.is_new, second.new_tokens, second.new_block_ids) == (4, False, [12], [])
    assert (second.new_block_ids_by_group, second.num_layer_groups, second.computed_position) == ([], 0, 7)
    assert (second.num_scheduled_tokens, second.num_replaced_blocks_by_group) == (1, [])


@pytest.mark.parametrize("changes, message", [
    ({"is_new": [True]}, "per-row columns differ in length"),
    ({"token_offsets": [0, 2]}, "per-row columns differ in length"),
    ({"token_offsets": [0, 4, 3]}, "offsets of row 0 lie outside"),
    ({"token_offsets": [0, 2, 4]}, "offsets of row 1 lie outside"),
    ({"group_offsets": [0, 2, 2]}, "offsets of row 0 lie outside"),
    ({"block_offsets": [0, 2]}, "offsets of row 0 lie outside"),
    ({"group_offsets": [0, 1, 0]}, "offsets of row 1 lie outside"),
])
def test_a_hand_made_output_with_inconsistent_columns_is_refused(backend, changes, message):
    output = _hand_made(**changes)
    with pytest.raises(ValueError, match=message):
        output.requests  # noqa: B018 - the read is the test
    if hasattr(backend, "request_rows"):  # the compiled builder checks again, on its own
        with pytest.raises(ValueError, match=message):
            backend.request_rows(RequestData, output, None)
