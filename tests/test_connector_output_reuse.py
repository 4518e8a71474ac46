"""The report's output arrays: reused by the compiled backend only once nobody holds them.

Worked examples written by hand (a held report, a held column, a view, a buffer export
never change while later reports run), allocation counts through the state's
``num_output_allocations`` counter (steady decode allocates nothing once warm; a held
column costs exactly its own array; a huge report does not pin its memory), arrays
tampered with through a column's ``base`` never reused, the request's slot hint when
slots are reused for other ids or the request is reported by another manager, and the
public constructor and pickling of ``SchedulerOutput``.
"""

import pickle
import sys

import numpy as np
import pytest

from tokcy import RequestState
from tokcy.connector import SchedulerOutput, SchedulerOutputManager
from tokcy.connector.output import COLUMNS


def is_compiled(backend):
    return backend.__name__ == "tokcy._core"


@pytest.fixture
def array_reads(backend):
    """The ways the compiled arena checks its arrays (by their fields, or through numpy's
    buffer export) to run a test under, each in turn; the twin has one way (None)."""
    if not is_compiled(backend):
        yield [None]
        return
    before = backend._array_reads()
    yield ["fields", "export"]
    backend._array_reads(before)


def use(backend, mode):
    if mode is not None:
        backend._array_reads(mode)
        assert backend._array_reads() == mode


def columns(output):
    return {name: getattr(output, name).tolist() for name in COLUMNS}


def decoding(backend, count, prompt_len=3):
    """``count`` requests past their context report, and their manager."""
    manager = SchedulerOutputManager()
    requests = []
    for number in range(count):
        request = backend.Request(number, list(range(100 * number, 100 * number + prompt_len)))
        request.block_tables[0].append(number)
        requests.append(request)
    manager.build_scheduler_output(requests, [])
    for request in requests:
        request.move_to_next_context_chunk()
        request.state = RequestState.GENERATION_IN_PROGRESS
    return manager, requests


def step(manager, requests, token):
    for request in requests:
        request.add_new_token(token)
    return manager.build_scheduler_output([], requests)


def test_held_reports_columns_views_and_exports_never_change(backend):
    manager, (a, b) = decoding(backend, 2)
    a.block_tables[0].append(50)
    held = step(manager, [a, b], 7)
    expected = {
        "request_ids": [0, 1], "is_new": [False, False], "computed_positions": [3, 3],
        "num_scheduled_tokens": [1, 1], "num_replaced_tokens": [0, 0], "token_offsets": [0, 1, 2],
        "tokens": [7, 7], "group_offsets": [0, 1, 2], "block_offsets": [0, 1, 1], "block_ids": [50],
        "num_replaced_blocks": [0, 0], "num_released_blocks": [0, 0],
    }
    assert columns(held) == expected
    tokens_only = step(manager, [a, b], 8).tokens  # the rest of that report is dropped
    view = step(manager, [a, b], 9).block_offsets[1:]
    export = memoryview(step(manager, [a, b], 10).request_ids)
    for token in range(11, 40):
        step(manager, [a, b], token)
    assert columns(held) == expected
    assert tokens_only.tolist() == [8, 8] and view.tolist() == [0, 0] and export.tolist() == [0, 1]
    assert step(manager, [b, a], 40).tokens.tolist() == [40, 40]


def test_steady_decode_allocates_nothing_once_warm(backend, array_reads):
    for mode in array_reads:
        use(backend, mode)
        manager, requests = decoding(backend, 4)
        step(manager, requests, 1)  # the first decode report: sized for decode from now on
        before = manager._state.num_output_allocations
        for token in range(2, 22):
            output = step(manager, requests, token)
            assert output.tokens.tolist() == [token] * 4
            del output
        # the twin makes each read report's three arrays (int64, bool, and int32 from its list of ints)
        assert manager._state.num_output_allocations - before == (0 if is_compiled(backend) else 3 * 20)


def test_a_held_column_costs_the_next_report_its_own_array_only(backend):
    manager, requests = decoding(backend, 4)
    step(manager, requests, 1)
    held_tokens = step(manager, requests, 2).tokens
    before = manager._state.num_output_allocations
    assert step(manager, requests, 3).tokens.tolist() == [3] * 4
    assert manager._state.num_output_allocations - before == (1 if is_compiled(backend) else 3)
    assert held_tokens.tolist() == [2] * 4


def test_a_huge_report_does_not_pin_its_arrays(backend):
    manager, requests = decoding(backend, 1, prompt_len=100_000)
    before = manager._state.num_output_allocations
    step(manager, requests, 1)  # the 100,000-token context report's int32 array is far too large
    # compiled: that array replaced; the twin: an unread decode report is Python ints only
    assert manager._state.num_output_allocations - before == (1 if is_compiled(backend) else 0)
    before = manager._state.num_output_allocations
    for token in range(2, 6):
        step(manager, requests, token)
    assert manager._state.num_output_allocations - before == 0


def test_allocations_of_a_huge_report_and_its_reads(backend):
    """Worked example, counted per backend: the compiled arena makes three arrays for its
    first report and reuses them once nobody holds them; the twin makes one int32 array
    for a report that copies slices (the 100,000 tokens and the 2 blocks, together) and
    the rest only when the columns are read."""
    manager = SchedulerOutputManager()
    request = backend.Request(1, list(range(100_000)))
    request.block_tables[0].extend([5, 6])
    output = manager.build_scheduler_output([request], [])  # never read
    assert manager._state.num_output_allocations == (3 if is_compiled(backend) else 1)
    assert output.tokens.size == 100_000 and output.block_ids.tolist() == [5, 6]
    assert manager._state.num_output_allocations == (3 if is_compiled(backend) else 1 + 2)  # int64, bool
    del output
    request.move_to_next_context_chunk()
    request.state = RequestState.GENERATION_IN_PROGRESS
    request.add_new_token(7)
    before = manager._state.num_output_allocations
    output = manager.build_scheduler_output([], [request])  # a decode row: one token
    assert manager._state.num_output_allocations - before == (1 if is_compiled(backend) else 0)
    assert output.tokens.tolist() == [7]
    assert manager._state.num_output_allocations - before == (1 if is_compiled(backend) else 3)


TAMPERINGS = {
    "read-only": lambda array: setattr(array.flags, "writeable", False),
    "other dtype": lambda array: setattr(array, "dtype", np.uint32),
    "two-dimensional": lambda array: setattr(array, "shape", (1, array.size)),
}


def report_after_changing_its_arrays(backend, change):
    """A third decode report of three requests, made after ``change`` was applied to the
    second report's int32 array (reached through a column's ``base``; nothing else holds
    it then): (that report, the manager, its allocation count before the report, the
    requests). The twin allocates when a column is read: count after the reads."""
    manager, requests = decoding(backend, 3)
    step(manager, requests, 1)
    output = step(manager, requests, 2)
    owner = output.tokens.base
    del output
    if owner is not None:
        change(owner)
        del owner
    before = manager._state.num_output_allocations
    return step(manager, requests, 3), manager, before, requests


# numpy 2.5 deprecates setting an array's dtype or shape in place: still a change a caller can make
@pytest.mark.filterwarnings("ignore:Setting the (dtype|shape) on a NumPy array has been deprecated:DeprecationWarning")
@pytest.mark.parametrize("tampering", sorted(TAMPERINGS))
def test_an_array_changed_through_a_columns_base_is_never_reused(backend, tampering, array_reads):
    for mode in array_reads:
        use(backend, mode)
        output, manager, before, _ = report_after_changing_its_arrays(backend, TAMPERINGS[tampering])
        assert output.tokens.tolist() == [3, 3, 3] and output.tokens.flags.writeable
        assert output.tokens.dtype == np.int32 and output.tokens.ndim == 1
        assert manager._state.num_output_allocations - before == (1 if is_compiled(backend) else 3)


@pytest.mark.parametrize("size", [2, 1_000], ids=["shrunk", "grown"])
def test_an_array_the_manager_may_write_again_cannot_be_resized(backend, array_reads, size):
    """A column's base kept once its report is dropped is an array the manager may write
    the next report into (from another thread too, while a large copy runs without the
    GIL). numpy refuses to resize it even with refcheck=False, since the manager keeps a
    weak reference to it: a resize would free the memory under that copy. The twin writes
    each report into new arrays and keeps none: an old one is its holder's to resize."""
    def resize(array):
        if is_compiled(backend):
            with pytest.raises(ValueError, match="cannot resize"):
                array.resize(size, refcheck=False)
        else:
            array.resize(size, refcheck=False)

    for mode in array_reads:
        use(backend, mode)
        output, manager, before, requests = report_after_changing_its_arrays(backend, resize)
        assert output.tokens.tolist() == [3, 3, 3]
        assert manager._state.num_output_allocations - before == (0 if is_compiled(backend) else 3)
        assert columns(step(manager, requests, 4))["tokens"] == [4, 4, 4]


def test_a_failed_call_leaves_held_and_later_reports_right(backend):
    manager, (a, b) = decoding(backend, 2)
    held = step(manager, [a, b], 5)
    expected = columns(held)
    a.add_new_token(6)
    with pytest.raises(ValueError, match="scheduled more than once"):
        manager.build_scheduler_output([], [a, b, a])
    assert columns(held) == expected
    output = manager.build_scheduler_output([], [a])
    assert output.tokens.tolist() == [6] and output.computed_positions.tolist() == [4]


def test_slot_hint_after_slot_reuse_and_in_another_manager(backend):
    manager = SchedulerOutputManager()
    five = backend.Request(5, [1, 2])
    assert manager.build_scheduler_output([five], []).tokens.tolist() == [1, 2]
    manager.request_finished(5)
    nine = backend.Request(9, [3])
    manager.build_scheduler_output([nine], [])  # takes the slot 5 had
    five.add_new_token(4)
    again = manager.build_scheduler_output([], [five])  # its hint now names 9's slot
    assert (again.is_new.tolist(), again.tokens.tolist(), again.computed_positions.tolist()) == ([True], [1, 2, 4], [2])
    nine.add_new_token(6)
    assert manager.build_scheduler_output([], [nine]).tokens.tolist() == [6]
    other = SchedulerOutputManager()  # the same request objects, slots of another state
    other.build_scheduler_output([backend.Request(7, [8])], [])
    first = other.build_scheduler_output([], [nine])
    assert (first.is_new.tolist(), first.tokens.tolist()) == ([True], [3, 6])
    assert manager.tracked_request_ids() == [5, 9] and other.tracked_request_ids() == [7, 9]


def test_scheduler_output_constructor_and_pickle(backend):
    manager, (a,) = decoding(backend, 1)
    output = step(manager, [a], 4)
    restored = pickle.loads(pickle.dumps(output))
    assert type(restored) is SchedulerOutput and columns(restored) == columns(output)
    assert restored.num_context_requests == 0 and restored.cached_requests == output.cached_requests
    made = SchedulerOutput(0, *(getattr(output, name).copy() for name in COLUMNS))
    assert columns(made) == columns(output) and len(made) == 1
    with pytest.raises(AttributeError, match="no attribute 'no_such_column'"):
        made.no_such_column  # noqa: B018 - the read is the test


def test_each_column_is_made_on_its_own_first_read_and_kept(backend):
    # compiled: a column is a slice made on its first read, so reading block_ids adds one
    # view of the int32 array under tokens; the twin makes all twelve on the first read
    manager, requests = decoding(backend, 3)
    output = step(manager, requests, 9)
    tokens = output.tokens
    assert output.tokens is tokens and tokens.tolist() == [9, 9, 9]
    base = tokens.base
    references = sys.getrefcount(base)
    block_ids = output.block_ids
    assert sys.getrefcount(base) == references + (1 if is_compiled(backend) else 0)
    assert block_ids.base is base and output.block_ids is block_ids
    assert all(made is getattr(output, name) for made, name in zip(output._source.arrays(), COLUMNS))
    with pytest.raises(AttributeError, match="no attribute 'no_such_column'"):
        output.no_such_column  # noqa: B018 - the read is the test


def test_an_output_made_by_hand_gives_back_the_columns_given(backend):
    manager, (a,) = decoding(backend, 1)
    given = {name: getattr(step(manager, [a], 4), name).copy() for name in COLUMNS}
    made = SchedulerOutput(0, *given.values())
    assert all(getattr(made, name) is column for name, column in given.items())
    with pytest.raises(AttributeError):
        made.tokens = given["tokens"]
    assert made.tokens is given["tokens"]


def test_the_repr_of_an_output_made_by_hand_counts_its_rows_from_lists_or_arrays(backend):
    """The columns of an output made by hand are what was given, lists included: its repr
    counts them without numpy methods (it raised AttributeError on a list)."""
    lists = ([7, 8, 9], [True, False, True], [0, 4, 0], [2, 1, 1], [0, 0, 0], [0, 2, 3, 4], [5, 6, 7, 8],
             [0, 1, 2, 3], [0, 1, 1, 2], [11, 12], [0, 0, 0], [0, 0, 0])
    expected = "SchedulerOutput(new=2, cached=1, tokens=4, blocks=2)"
    assert repr(SchedulerOutput(2, *lists)) == expected
    assert repr(SchedulerOutput(2, *(np.asarray(column) for column in lists))) == expected
    assert repr(SchedulerOutput(0, *([] for _ in lists))) == "SchedulerOutput(new=0, cached=0, tokens=0, blocks=0)"


def test_an_array_changed_while_its_report_is_written_is_not_handed_on(backend, monkeypatch, array_reads):
    """A kept array revived from a weak reference and given other memory (``__setstate__``)
    by code that runs while a report is written (here the allocation of the array that
    report outgrew): the copy still writes the arena's memory, and the report shows that
    memory (the compiled report makes its own view of it, on first read), never the
    array's new contents; the next report replaces the array."""
    import weakref

    for mode in array_reads:
        use(backend, mode)
        manager, requests = decoding(backend, 3)
        seen = step(manager, requests, 7)
        kept = weakref.ref(seen.request_ids.base) if seen.request_ids.base is not None else None
        del seen
        for request in requests:  # as many rows (the int64 array fits), far more tokens (the int32 one does not)
            for token in range(200):
                request.add_new_token(1000 + token)
        changed = []

        def hostile(make):
            def allocate(*args, **kwargs):
                array = kept() if kept is not None else None
                if array is not None and not changed:
                    array.__setstate__((1, (4,), np.dtype(np.int64), False, np.full(4, -5, np.int64).tobytes()))
                    changed.append(array)
                del array
                return make(*args, **kwargs)
            return allocate

        with monkeypatch.context() as patch:
            patch.setattr(np, "asarray", hostile(np.asarray))
            patch.setattr(np, "empty", hostile(np.empty))
            output = manager.build_scheduler_output([], requests)
        assert len(changed) == (1 if is_compiled(backend) else 0)
        changed.clear()
        row = output.request_data(2)  # first: its rows read the arrays before any column is made
        assert (row.request_id, row.computed_position, row.new_tokens) == (2, 203, list(range(1000, 1200)))
        got = columns(output)
        assert got["request_ids"] == [0, 1, 2] and got["computed_positions"] == [203, 203, 203]
        assert got["token_offsets"] == [0, 200, 400, 600]
        assert got["tokens"] == list(range(1000, 1200)) * 3
        assert columns(step(manager, requests, 8))["tokens"] == [8, 8, 8]


def test_num_context_requests_of_a_report_and_of_an_output_made_by_hand(backend):
    """A manager's report knows its context rows; an output made by hand says what it was
    given, whatever that is (None included)."""
    manager, (a, b) = decoding(backend, 2)
    fresh = backend.Request(9, [1, 2, 3])
    report = manager.build_scheduler_output([fresh], [a, b])
    assert report.num_context_requests == 1
    assert pickle.loads(pickle.dumps(report)).num_context_requests == 1
    given = [getattr(report, name) for name in COLUMNS]
    assert SchedulerOutput(None, *given).num_context_requests is None
    assert SchedulerOutput(3, *given).num_context_requests == 3


def test_columns_made_by_hand_hold_no_report(backend):
    """A backend's ReportColumns is made by a report: one made from Python holds none, and
    says so instead of showing memory it does not have."""
    with pytest.raises(TypeError) as raised:  # (the twin's needs its parts: it cannot be made empty)
        backend.ReportColumns().arrays()
    if is_compiled(backend):
        assert str(raised.value) == ("this ReportColumns holds no report: a SchedulerOutputManager's report "
                                     "makes them")




@pytest.mark.backend_free("the compiled core's own memory: the twin's columns are numpy's arrays, which such a "
                          "__setstate__ frees under their views (docs/invariants.md)")
def test_rows_made_after_a_column_base_got_memory_of_its_own_read_the_report(monkeypatch):
    """``__setstate__`` on the array behind a report's columns gives it memory of its own
    (numpy copies the pickled bytes), and a second one frees that memory whatever exports
    of it exist. Rows made between the two read the report as it was written, from the
    memory the report holds (they read the array's memory, freed by then)."""
    from tests.conftest import compiled_backend
    from tokcy import _backend

    backend = compiled_backend()
    monkeypatch.setattr(_backend, "module", backend)  # the manager's backend, whichever is live
    manager = SchedulerOutputManager()
    output = manager.build_scheduler_output([backend.Request(index, list(range(50))) for index in range(200)], [])
    root = output.request_ids.base
    count = root.shape[0]
    root.__setstate__((1, (count,), np.dtype(np.int64), False, np.arange(count, dtype=np.int64).tobytes()))
    rows = output.requests
    root.__setstate__((1, (4 * count,), np.dtype(np.int64), False, np.full(4 * count, 7, np.int64).tobytes()))
    assert [(row.request_id, row.new_tokens) for row in rows] == [(index, list(range(50))) for index in range(200)]
