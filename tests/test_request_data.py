"""RequestData: the rows of a SchedulerOutput as plain values, made lazily.

A worked example written by hand; a differential test of every field against the columns
(sliced independently with numpy) over manager reports and over random hand-made
outputs, with an independent per-row check of their layouts; reads after the columns
changed in place; rows that outlive their report; pickling; and the bytes a report's
rows cost (they must not grow with its tokens).
"""

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokcy import RequestState
from tokcy.connector import RequestData, SchedulerOutput, SchedulerOutputManager
from tokcy import _backend
from tokcy._request_data import FIELDS
from tokcy.connector.output import COLUMNS


@contextlib.contextmanager
def _live(module):
    """``module`` made the live backend for a block (for tests that run both in turn)."""
    previous = _backend.module
    _backend.module = module
    try:
        yield
    finally:
        _backend.module = previous


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
    # every read gives a new list, the caller's own; the objects are made once per output
    tokens = second_a.new_tokens
    tokens.append(99)
    assert second_a.new_tokens == [13] and second_a.new_tokens is not second_a.new_tokens
    assert output.request_data(1) is second_a and output.requests == [second_b, second_a]
    for name in ("requests", "new_requests", "cached_requests"):  # the lists are the caller's too
        before = getattr(output, name)
        getattr(output, name).clear()
        getattr(output, name).append(second_a)
        assert getattr(output, name) == before and getattr(output, name) is not getattr(output, name)
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
    with pytest.raises(ValueError, match=message):  # the backend's builder, called directly
        backend.request_rows(output)


def _first_bad_row(columns):
    """The first row whose offsets leave the columns (None if none), a plain loop over
    the rule: its tokens, its segments, each segment's block span and counts in range."""
    token_offsets, group_offsets, block_offsets = columns["token_offsets"], columns["group_offsets"], columns["block_offsets"]
    for row in range(len(columns["request_ids"])):
        first, end = group_offsets[row], group_offsets[row + 1]
        if not 0 <= token_offsets[row] <= token_offsets[row + 1] <= len(columns["tokens"]):
            return row
        if not 0 <= first <= end < len(block_offsets):
            return row
        if end > len(columns["num_replaced_blocks"]) or end > len(columns["num_released_blocks"]):
            return row
        for segment in range(first, end):
            if not 0 <= block_offsets[segment] <= block_offsets[segment + 1] <= len(columns["block_ids"]):
                return row
    return None


@st.composite
def hand_made_columns(draw):
    """Columns of a hand-made report: a valid layout, then (sometimes) one offset moved."""
    count = draw(st.integers(0, 6))
    token_lengths = draw(st.lists(st.integers(0, 3), min_size=count, max_size=count))
    groups = draw(st.lists(st.integers(0, 2), min_size=count, max_size=count))
    block_lengths = draw(st.lists(st.integers(0, 2), min_size=sum(groups), max_size=sum(groups)))
    columns = {
        "request_ids": draw(st.lists(st.integers(0, 10**12), min_size=count, max_size=count)),
        "is_new": draw(st.lists(st.booleans(), min_size=count, max_size=count)),
        "computed_positions": draw(st.lists(st.integers(0, 10**6), min_size=count, max_size=count)),
        "num_scheduled_tokens": token_lengths,
        "num_replaced_tokens": draw(st.lists(st.integers(0, 2), min_size=count, max_size=count)),
        "token_offsets": np.cumsum([0] + token_lengths).tolist(),
        "tokens": draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=sum(token_lengths),
                                max_size=sum(token_lengths))),
        "group_offsets": np.cumsum([0] + groups).tolist(),
        "block_offsets": np.cumsum([0] + block_lengths).tolist(),
        "block_ids": draw(st.lists(st.integers(-1, 10**6), min_size=sum(block_lengths), max_size=sum(block_lengths))),
        "num_replaced_blocks": draw(st.lists(st.integers(0, 2), min_size=sum(groups), max_size=sum(groups))),
        "num_released_blocks": draw(st.lists(st.integers(0, 2), min_size=sum(groups), max_size=sum(groups))),
    }
    if draw(st.booleans()):  # move one offset anywhere, often outside
        name = draw(st.sampled_from(["token_offsets", "group_offsets", "block_offsets"]))
        index = draw(st.integers(0, len(columns[name]) - 1))
        columns[name][index] = draw(st.integers(-2, 12))
    if draw(st.integers(0, 9)) == 0:  # a count column one short
        columns[draw(st.sampled_from(["num_replaced_blocks", "num_released_blocks"]))][-1:] = []
    return columns


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(columns=hand_made_columns())  # the backend fixture holds no state across examples
def test_hand_made_outputs_against_the_columns(backend, columns):
    output = _hand_made(**columns)
    bad = _first_bad_row(columns)
    if bad is not None:
        with pytest.raises(ValueError, match=f"offsets of row {bad} lie outside"):
            output.requests  # noqa: B018 - the read is the test
        return
    rows = output.requests
    expected = _expected_rows(output)
    assert [data.as_dict() for data in rows] == expected
    assert [data.new_block_ids for data in rows] == [(row["new_block_ids_by_group"] or [[]])[0] for row in expected]
    assert [data.num_layer_groups for data in rows] == [len(row["new_block_ids_by_group"]) for row in expected]
    assert output.new_requests == [data for data in rows if data.is_new]
    assert output.cached_requests == [data for data in rows if not data.is_new]


def _manager_report(backend, groups=1):
    """A manager's report of 4 rows (2 context, 2 generation), two blocks per layer group."""
    manager = SchedulerOutputManager()
    requests = [backend.Request(i, list(range(10 * i, 10 * i + 1 + i % 3)), num_layer_groups=groups)
                for i in range(4)]
    for request in requests:
        for table in request.block_tables:
            table.extend([request.request_id, 50 + request.request_id])
    return manager.build_scheduler_output(requests[:2], requests[2:])


def _outcome(read):
    try:
        return "value", read()
    except Exception as error:  # noqa: BLE001 - the outcome is what is compared
        return type(error).__name__, str(error)


ALL_FIELDS = (*FIELDS, "new_block_ids", "num_layer_groups")
WRITABLE = ("token_offsets", "group_offsets", "block_offsets", "tokens", "block_ids", "num_replaced_blocks",
            "num_released_blocks", "request_ids", "is_new", "computed_positions")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.integers(1, 2), before=st.booleans(),  # both_backends holds no state across examples
       writes=st.lists(st.tuples(st.sampled_from(WRITABLE), st.integers(0, 30), st.integers(-3, 40)),
                       min_size=1, max_size=4))
def test_writes_into_a_manager_report_read_alike_on_both_backends(both_backends, groups, before, writes):
    """A caller writes into a manager's report in place, before or after its rows are made:
    every field of every row gives the same value, or the same error, on both backends (the
    compiled rows follow raw pointers: a bad offset must be refused, never read)."""
    outcomes = []
    for backend in both_backends:
        with _live(backend):
            output = _manager_report(backend, groups)

            def write():
                for name, index, value in writes:
                    column = getattr(output, name)
                    column[index % len(column)] = value

            if before:
                write()
            rows = output.requests
            if not before:
                write()
            outcomes.append([[_outcome(lambda: getattr(data, name)) for name in ALL_FIELDS] for data in rows])
    assert outcomes[0] == outcomes[1]


def test_a_field_reads_a_manager_report_as_it_is_and_checks_it_again(backend):
    output = _manager_report(backend)
    first, second = output.requests[:2]
    assert (second.new_tokens, first.new_block_ids) == ([10, 11], [0, 50])
    output.tokens[1] = 77  # written in place: the row reads the new value
    assert second.new_tokens == [77, 11]
    output.token_offsets[2] = 99  # past the tokens: every read that follows it is refused
    with pytest.raises(ValueError, match="offsets of row 1 lie outside"):
        second.new_tokens  # noqa: B018
    assert first.new_tokens == [0]
    output.block_offsets[1] = -3
    for field in ("new_block_ids", "new_block_ids_by_group"):
        with pytest.raises(ValueError, match="offsets of row 0 lie outside"):
            getattr(first, field)
    output.group_offsets[1] = 9
    for field in ("num_layer_groups", "new_block_ids", "num_replaced_blocks_by_group", "num_released_blocks_by_group"):
        with pytest.raises(ValueError, match="offsets of row 0 lie outside"):
            getattr(first, field)
    assert (first.request_id, first.computed_position, second.is_new) == (0, 0, True)


def test_rows_of_a_hand_made_output_read_copies_taken_when_they_were_made(backend):
    output = _hand_made()
    first, second = output.requests
    output.tokens[2] = 77
    output.token_offsets[2] = 9
    assert (first.new_tokens, second.new_tokens) == ([10, 11], [12])


@pytest.mark.parametrize("variant", ["lists", "strided", "read_only", "big_endian", "int32_offsets", "uint8_is_new",
                                     "int16_tokens"])
def test_hand_made_columns_of_any_layout_read_as_plain_arrays(backend, variant):
    plain = _hand_made().requests
    columns = {name: getattr(_hand_made(), name) for name in COLUMNS}
    if variant == "lists":
        columns = {name: column.tolist() for name, column in columns.items()}
    elif variant == "strided":
        columns = {name: np.repeat(column, 2)[::2] for name, column in columns.items()}
    elif variant == "read_only":
        for column in columns.values():
            column.flags.writeable = False
    elif variant == "big_endian":
        columns = {name: column.astype(column.dtype.newbyteorder(">")) for name, column in columns.items()}
    elif variant == "int32_offsets":
        for name in ("token_offsets", "group_offsets", "block_offsets"):
            columns[name] = columns[name].astype(np.int32)
    elif variant == "uint8_is_new":
        columns["is_new"] = columns["is_new"].astype(np.uint8)
    elif variant == "int16_tokens":
        columns["tokens"] = columns["tokens"].astype(np.int16)
    rows = SchedulerOutput(0, *(columns[name] for name in COLUMNS)).requests
    assert [data.as_dict() for data in rows] == [data.as_dict() for data in plain]
    assert [type(data.is_new) for data in rows] == [bool, bool]


def _raw(**changes):
    """A hand-made output whose changed columns are passed as given (no conversion here)."""
    columns = {name: getattr(_hand_made(), name) for name in COLUMNS}
    columns.update(changes)
    return SchedulerOutput(0, *(columns[name] for name in COLUMNS))


@pytest.mark.parametrize("name, column, error, message", [
    ("tokens", np.array([10, 11, 2**31]), ValueError, "tokens column holds 2147483648, outside \\[-2147483648, "),
    ("block_ids", np.array([-(2**31) - 1]), ValueError, "block_ids column holds -2147483649, outside"),
    ("tokens", [10.0, 11.5, 12.0], TypeError, "tokens column must hold integers, not float64"),
    ("is_new", np.array([2, 0], dtype=np.uint8), ValueError, "is_new column holds 2, outside \\[0, 1\\]"),
    ("request_ids", np.array([3, 2**63], dtype=np.uint64), ValueError, "request_ids column holds 9223372036854775808"),
    ("token_offsets", ["0", "2", "3"], TypeError, "token_offsets column must hold integers, not <U1"),
    ("computed_positions", [0, 2**70], TypeError, "computed_positions column must hold integers, not object"),
])
def test_a_hand_made_column_that_numpy_would_round_or_wrap_is_refused(backend, name, column, error, message):
    """np.array(column, dtype) would truncate 11.5 to 11 and wrap 2**31 to -2**31: the
    rows refuse such a column, name it, and leave the output as it was (a second read
    raises the same error; the column is still the caller's object)."""
    output = _raw(**{name: column})
    for _ in range(2):
        with pytest.raises(error, match=message):
            output.requests  # noqa: B018 - the read is the test
        with pytest.raises(error, match=message):
            output.request_data(0)
    assert getattr(output, name) is column


def test_empty_hand_made_columns_given_as_plain_lists_are_taken(backend):
    """numpy reads [] as float64; an empty column holds no value to refuse."""
    output = _raw(request_ids=[], is_new=[], computed_positions=[], num_scheduled_tokens=[], num_replaced_tokens=[],
                  token_offsets=[0], tokens=[], group_offsets=[0], block_offsets=[0], block_ids=[],
                  num_replaced_blocks=[], num_released_blocks=[])
    assert output.requests == [] and len(output) == 0


def test_a_two_dimensional_column_is_refused(backend):
    with pytest.raises(ValueError, match="columns are one-dimensional"):
        _hand_made(tokens=[[10, 11, 12]]).requests  # noqa: B018


def test_rows_outlive_their_report_and_the_next_report_leaves_them_unchanged(backend):
    manager = SchedulerOutputManager()
    requests = [backend.Request(i, [i, i + 1]) for i in range(3)]
    for request in requests:
        request.block_tables[0].append(10 + request.request_id)
    manager.build_scheduler_output(requests, [])
    for request in requests:
        request.move_to_next_context_chunk()
        request.state = RequestState.GENERATION_IN_PROGRESS
        request.add_new_token(100 + request.request_id)
    kept = manager.build_scheduler_output([], requests).cached_requests[1]  # the report itself is dropped
    for step in range(3):
        for request in requests:
            request.add_new_token(200 + step)
        manager.build_scheduler_output([], requests)
    assert (kept.request_id, kept.new_tokens, kept.computed_position) == (1, [101], 2)


def test_rows_pickle_as_their_fields(backend):
    import pickle

    for data in _hand_made().requests + _manager_report(backend, groups=2).requests:
        copy = pickle.loads(pickle.dumps(data))
        assert isinstance(copy, RequestData) and copy == data and copy.as_dict() == data.as_dict()
        assert copy.new_block_ids == data.new_block_ids and copy.num_layer_groups == data.num_layer_groups


def test_a_row_pickled_on_one_backend_loads_on_the_other(both_backends):
    import pickle

    compiled, pure = both_backends
    for made, loaded in ((compiled, pure), (pure, compiled)):
        with _live(made):
            data = _manager_report(made).requests[2]
            text = pickle.dumps(data)
        with _live(loaded):
            copy = pickle.loads(text)
        assert type(copy) is loaded.RequestData and copy == data and copy.new_tokens == [20, 21, 22]


def test_rows_of_both_backends_compare_by_their_fields(both_backends):
    compiled, pure = both_backends
    first, second = _hand_made().requests
    assert type(first) in (compiled.RequestData, pure.RequestData)
    twin_rows, _, _ = pure.request_rows(_hand_made())
    compiled_rows, _, _ = compiled.request_rows(_hand_made())
    assert twin_rows == compiled_rows and twin_rows != compiled_rows[::-1]
    assert [repr(data) for data in twin_rows] == [repr(data) for data in compiled_rows]
    assert all(isinstance(data, RequestData) for data in twin_rows + compiled_rows)
    assert (twin_rows[0] == "not a row") is False and twin_rows[0] != 3


def test_a_row_is_made_by_its_report_only_and_is_read_only(backend):
    for args in ((), (1,), ([1, 2],)):
        with pytest.raises(TypeError, match="^a RequestData is made by its SchedulerOutput, not by hand$"):
            backend.RequestData(*args)
    by_hand = backend.RequestData.__new__(backend.RequestData)
    for field in ALL_FIELDS:
        with pytest.raises(TypeError, match="^a RequestData is made by its SchedulerOutput, not by hand$"):
            getattr(by_hand, field)
    with pytest.raises(TypeError):
        RequestData()  # the documented type is abstract
    data = _hand_made().requests[0]
    with pytest.raises(TypeError):
        hash(data)
    for name in ("request_id", "_row", "_columns", "anything"):
        with pytest.raises(AttributeError, match=f"^a RequestData is read-only: '{name}' cannot be set or deleted$"):
            setattr(data, name, 1)
        with pytest.raises(AttributeError, match=f"^a RequestData is read-only: '{name}' cannot be set or deleted$"):
            delattr(data, name)
    assert data.request_id == 3


def test_a_report_is_read_only(backend):
    output = _manager_report(backend)
    rows = output.requests
    for name in ("tokens", "is_new", "token_offsets", "num_context_requests"):
        with pytest.raises(AttributeError, match="has no setter"):  # Python's own message
            setattr(output, name, np.zeros(3, dtype=np.int32))
    assert output.requests == rows and rows[2].new_tokens == [20, 21, 22]


def test_a_manager_report_cannot_be_resized_under_its_rows(backend):
    output = _manager_report(backend)
    data = output.requests[3]
    root = output.tokens.base if output.tokens.base is not None else output.tokens
    with pytest.raises(ValueError, match="cannot resize"):
        root.resize(10**6, refcheck=False)  # even without numpy's reference check
    assert data.new_tokens == [30]
    del data, output
    if backend.__name__ == "tokcy._core":  # a view of the manager's memory, which numpy frees never
        with pytest.raises(ValueError, match="cannot resize"):
            root.resize(10**6, refcheck=False)
    else:  # the rows are gone: nothing guards it any more
        root.resize(10**6, refcheck=False)


def test_a_collection_while_the_rows_are_made_sees_no_half_filled_list(backend):
    """A garbage-collector callback (what a memory profiler runs) reads every list and tuple
    of the batch's length while collections run at every allocation: none has an empty slot."""
    import gc

    count = 777
    output = _hand_made(
        request_ids=np.arange(count), is_new=np.arange(count) % 2 == 0, computed_positions=np.zeros(count),
        num_scheduled_tokens=np.zeros(count), num_replaced_tokens=np.zeros(count), token_offsets=np.zeros(count + 1),
        tokens=np.zeros(0), group_offsets=np.zeros(count + 1), block_offsets=np.zeros(1), block_ids=np.zeros(0),
        num_replaced_blocks=np.zeros(0), num_released_blocks=np.zeros(0))
    seen = []

    snapshots = []  # kept: a list freed here would refill the free list, and lists taken from it skip the collector

    def read_lists(phase, info):
        if phase == "start":
            snapshots.append(gc.get_objects(generation=0))  # where new lists are
            seen.extend(type(item[0]).__name__ for item in snapshots[-1]
                        if type(item) in (list, tuple) and len(item) in (count, count // 2, count // 2 + 1))

    threshold, enabled = gc.get_threshold(), gc.isenabled()
    spare = [[] for _ in range(200)]  # the list free list emptied: each list made is a fresh allocation
    gc.callbacks.append(read_lists)
    gc.set_threshold(1)
    gc.enable()
    kept = []  # each call's lists kept, so that the collector's count grows and it runs inside every call
    try:
        for _ in range(20):  # until a collection has run inside a call (rarely not within the first 5)
            for _ in range(5):
                kept.append(backend.request_rows(output))
            if "RequestData" in seen:
                break
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(read_lists)
        if not enabled:
            gc.disable()
    rows, new_rows, cached_rows = kept[-1]
    assert len(spare) == 200 and (len(rows), len(new_rows), len(cached_rows)) == (count, 389, 388)
    assert "RequestData" in seen  # the callback did read the rows' lists


def test_a_cycle_through_a_column_is_collected(backend):
    """A column of a subclass with attributes can lead back to its report: the rows read a
    copy, so the collector can still free the whole cycle."""
    import gc
    import weakref

    class Tagged(np.ndarray):
        pass

    tokens = np.array([10, 11, 12], dtype=np.int32).view(Tagged)
    output = _hand_made(tokens=tokens)
    rows = output.requests
    tokens.owner = output  # output -> its source -> tokens -> output
    alive = weakref.ref(output)
    del output, rows, tokens
    gc.collect()
    assert alive() is None


def test_the_rows_of_a_report_cost_bytes_per_row_not_per_token(backend):
    """A report of one row with 100,000 new tokens: its rows take a few hundred bytes
    (a list per token field would take megabytes); reading the field pays for it."""
    import tracemalloc

    manager = SchedulerOutputManager()
    output = manager.build_scheduler_output([backend.Request(1, np.arange(100_000, dtype=np.int32))], [])
    output.request_ids  # noqa: B018 - the columns first, so only the rows are measured
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        (data,) = output.new_requests
        rows_bytes = tracemalloc.get_traced_memory()[0] - before
        tokens = data.new_tokens
        field_bytes = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(tokens) == 100_000
    assert rows_bytes < 4_096, rows_bytes
    assert field_bytes > 100_000 * 8, field_bytes  # the list's pointers alone
