"""What code that a call runs can reach while the call still reads it: a collection's
callbacks find containers through ``gc.get_referrers`` and ``gc.get_objects``, and a weak
reference's callback runs when a buffer's old storage goes. Whatever such code changes, a
read stays inside memory that is there (no crash, which the sanitizer build of the suite
would report), and a call whose inputs changed under it is refused or gives what was there.
"""

import gc
import sys
from contextlib import contextmanager

import pytest
from hostile_code import when_storage_retires

from tokcy import RequestState
from tokcy.connector import SchedulerOutputManager
from tokcy.connector.output import COLUMNS


def test_clearing_the_lists_that_refer_to_a_column_leaves_every_column_as_it_was(backend):
    """A report keeps each column it made. ``gc.get_referrers(column)`` hands out what
    holds it: were that a list, clearing it made the next read go past its end (the
    compiled core reads it unchecked)."""
    requests = [backend.Request(index, [1, 2, 3 + index]) for index in range(4)]
    output = SchedulerOutputManager().build_scheduler_output(requests, [])
    expected = {name: getattr(output, name).tolist() for name in COLUMNS}
    for name in COLUMNS:
        for holder in gc.get_referrers(getattr(output, name)):
            if type(holder) is list:
                holder.clear()
    assert {name: getattr(output, name).tolist() for name in COLUMNS} == expected
    assert [row.request_id for row in output.requests] == [0, 1, 2, 3]


def drain_list_free_list(keep):
    """Take every list CPython 3.11 keeps for reuse, so that making the next one allocates
    (and so may start a collection)."""
    keep.append([[] for _ in range(200)])


@contextmanager
def at_every_collection(change):
    """While inside, a collection may start at every allocation of a tracked object, and
    each calls ``change()`` as it starts (what a memory profiler's callback could do); the
    free list of lists is drained after each, so that the next list made allocates."""
    keep = []

    def callback(phase, info):
        if phase == "start":
            change()
        else:
            drain_list_free_list(keep)

    threshold = gc.get_threshold()
    gc.callbacks.append(callback)
    drain_list_free_list(keep)
    gc.set_threshold(1)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(callback)


def test_a_collection_that_empties_what_holds_the_rows_of_a_report_loses_none(backend):
    """The rows of a report are made as one container, then the new rows and the cached
    rows are picked from it into containers of their own: making those may start a
    collection, whose callback looks for the first container (gc.get_objects) and empties
    any list of rows it finds. The compiled core's rows are tuples, which nothing can
    empty (it read a list unchecked); the twin's are made in lists first, and a list
    emptied is refused (RuntimeError), never rows lost (as they were)."""
    requests = [backend.Request(index, [1, 2, 3]) for index in range(64)]
    output = SchedulerOutputManager().build_scheduler_output(requests, [])
    emptied = []

    def empty_the_lists_of_rows():
        found = gc.get_objects()
        for item in found:
            if type(item) is list and len(item) == 64 and type(item[0]).__name__ == "RequestData":
                emptied.append(len(item))
                item.clear()
        del found

    made = None
    with at_every_collection(empty_the_lists_of_rows):  # (what the call returns is tuples: not emptied)
        try:
            made = backend.request_rows(output)  # what output.requests and the others are picked from
        except RuntimeError as error:
            assert backend.__name__ == "tokcy._pure" and emptied, error
            assert str(error) == "the rows of a report were changed by code that ran while they were made"
    if made is None:  # refused: made again, with no callback
        made = backend.request_rows(output)
    rows, new_rows, cached_rows = made
    assert [row.request_id for row in rows] == [row.request_id for row in new_rows] == list(range(64))
    assert cached_rows == ()
    if backend.__name__ == "tokcy._core":
        assert emptied == []  # its rows are held in tuples: nothing the callback can empty


def test_pause_refuses_when_a_collection_replaces_the_ids_it_listed(backend):
    """pause lists each table's ids, then checks that the lists still show the tables
    before it empties them. A collection started while it lists the second table can find
    the first list (gc.get_objects) and put a tuple of the same ids in its place: the check
    reads the lists as they are now, by the same rules on both backends, and refuses what
    is no longer a list of ints (the compiled core read that item as a list; the twin
    returned the tuple)."""
    outcomes = set()
    for slack in range(8):
        request = backend.Request(1, [1, 2, 3], num_layer_groups=2)
        for table in request.block_tables:
            table.extend([777001, 777002])
        replaced, starts, calling = [], [0], [True]

        def replace_the_first_list():
            starts[0] += 1
            if starts[0] <= slack or not calling[0]:  # (not what pause returned, once it has)
                return
            found = gc.get_objects()
            for item in found:
                if (type(item) is list and len(item) == 1 and type(item[0]) is list
                        and item[0] == [777001, 777002] and item is not replaced):
                    item[0] = (777001, 777002)
                    replaced.append(1)
            del found

        held = refused = None
        with at_every_collection(replace_the_first_list):
            try:
                held = request.pause(100)
                calling[0] = False
            except RuntimeError as error:
                calling[0] = False
                refused = str(error)
        if refused is not None:
            assert "during pause: nothing was changed" in refused
            assert [table.tolist() for table in request.block_tables] == [[777001, 777002]] * 2
            assert request.prompt_len == 3 and request.state.name == "CONTEXT_INIT"
            outcomes.add("refused")
            continue
        # not refused: no collection replaced a list while pause listed and checked them
        assert held == [[777001, 777002]] * 2 and [type(ids) for ids in held] == [list, list]
        assert [len(table) for table in request.block_tables] == [0, 0]
        outcomes.add("untouched")
    if sys.version_info < (3, 12):  # a collection starts inside the listing (a list it makes allocates)
        assert "refused" in outcomes, outcomes


@pytest.mark.parametrize("call", ["add_new_token", "add_new_tokens"])
def test_a_single_beam_append_refuses_a_request_reinitialised_while_it_grows(backend, call):
    """An append that grows the buffer drops its old storage, whose last reader (a view's
    base) can have a weak reference whose callback re-initialises the request: the token
    would go into a beam the request no longer has. Refused, the request as the callback
    left it (as the several-beam append is)."""
    request = backend.Request(1, list(range(16)))  # full: the next append grows
    view = request.get_tokens_view()
    state = when_storage_retires(view, lambda: request.__init__(1, [7, 7, 7]))
    del view
    with pytest.raises(RuntimeError, match=f"re-initialised by code that ran during {call}: nothing was changed"):
        if call == "add_new_token":
            request.add_new_token(99)
        else:
            request.add_new_tokens([99])
    assert state["ran"]
    assert request.get_tokens() == [[7, 7, 7]]
    assert request.add_new_token(8) == 4 and request.get_tokens(0) == [7, 7, 7, 8]


def test_a_single_beam_append_whose_growth_runs_harmless_code_appends(backend):
    """The same growth whose callback changes nothing: the token is appended."""
    request = backend.Request(1, list(range(16)))
    view = request.get_tokens_view()
    state = when_storage_retires(view, lambda: None)
    del view
    assert request.add_new_tokens([99]) == 17 and state["ran"]
    assert request.get_tokens(0) == list(range(16)) + [99]


@pytest.mark.parametrize("copy_with", ["pickle", "copy", "deepcopy"])
def test_a_request_copied_while_a_collection_reinitialises_it_is_one_of_its_states(backend, copy_with):
    """A request's state is read field after field, allocating lists between them: a
    collection started there whose callback re-initialises the request made a copy that
    mixed the two (the old tokens with the new prompt length, or a ValueError when the new
    prompt was longer). The state is read with the collector paused: the copy is the
    request before the callback or after it, never a mix."""
    import copy
    import pickle

    copies = {"pickle": lambda item: pickle.loads(pickle.dumps(item)), "copy": copy.copy, "deepcopy": copy.deepcopy}
    before = ([list(range(41))], 40, RequestState.GENERATION_IN_PROGRESS, [[1, 2, 3]] * 2)
    after = ([[9, 9, 9]] * 2, 3, RequestState.CONTEXT_INIT, [[], []])
    for slack in range(12):
        request = backend.Request(1, list(range(40)), num_layer_groups=2)
        request.state = RequestState.GENERATION_IN_PROGRESS
        request.add_new_token(40)
        for table in request.block_tables:
            table.extend([1, 2, 3])
        starts = [0]

        def reinitialise():
            starts[0] += 1
            if starts[0] == slack + 1:
                request.__init__(1, [9, 9, 9], beam_width=2, num_layer_groups=2)

        with at_every_collection(reinitialise):
            copied = copies[copy_with](request)
        state = (copied.get_tokens(), copied.prompt_len, copied.state, [table.tolist() for table in copied.block_tables])
        assert state in (before, after), (slack, state)
