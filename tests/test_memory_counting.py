"""Complexity by counting, never by timing.

What the public API lets us count: a view is zero-copy, so the array that owns its memory
is the beam's storage. Its size is the capacity (so: spare capacity <= 25 %, about 4 bytes
per token), and how many distinct storages the views of a growing beam reveal is how many
times the tokens were moved (so: appends are amortised O(1), even while views are held).
"""

import math

import numpy as np
import pytest


def storage_of(view):
    """The object behind ``view`` that shows all of the buffer's storage: the object owning
    the memory, or, where that exports no buffer (the compiled core's source of views,
    which keeps the storage and shows it to numpy only), the array made over all of it.

    Follows ``.base`` of arrays and ``.obj`` of memoryviews (a read-only wrapper may sit
    between the view and the storage) down to the owner.
    """
    owner, whole = view, None
    while True:
        if isinstance(owner, np.ndarray) and owner.base is not None:
            whole, owner = owner, owner.base
        elif isinstance(owner, memoryview) and owner.obj is not None:
            owner = owner.obj
        else:
            break
    if isinstance(owner, np.ndarray):
        return owner
    try:
        memoryview(owner)
    except TypeError:
        assert isinstance(whole, np.ndarray), type(owner).__name__
        return whole
    return owner


def capacity_bytes(view):
    owner = storage_of(view)
    return owner.nbytes if isinstance(owner, np.ndarray) else memoryview(owner).nbytes


@pytest.mark.parametrize("n", [100, 1000, 8192, 50_000])
def test_capacity_after_appends_is_at_most_125_percent(backend, n):
    r = backend.Request(1, [0])
    for token in range(1, n):
        r.add_new_token(token)
    view = r.get_tokens_view()
    assert len(view) == n
    assert capacity_bytes(view) <= 1.25 * 4 * n + 4 * 64


def test_capacity_after_add_new_tokens_on_beams(backend):
    r = backend.Request(1, list(range(10)), beam_width=3)
    for step in range(5000):
        r.add_new_tokens([step, step + 1, step + 2])
    for beam in range(3):
        assert capacity_bytes(r.get_tokens_view(beam)) <= 1.25 * 4 * 5010 + 4 * 64


def test_bytes_per_token_at_8192(backend):
    requests = [backend.Request(i, [1, 2, 3]) for i in range(16)]
    for r in requests:
        for token in range(8192 - 3):
            r.add_new_token(token)
    total = sum(capacity_bytes(r.get_tokens_view()) for r in requests)
    assert total / (16 * 8192) <= 5.0


def test_views_are_zero_copy(backend):
    r = backend.Request(1, list(range(5000)))
    whole = r.get_tokens_view()
    tail = r.get_tokens_view(0, 4936, 5000)
    assert np.shares_memory(whole, tail)
    assert storage_of(whole) is storage_of(tail)
    table = backend.BlockTable(range(100))
    assert np.shares_memory(table.view(), table.view())


def test_appends_move_the_tokens_a_logarithmic_number_of_times_even_with_views(backend):
    """A view of the prefix never forces a copy on append (copy-on-write only for writes a
    view can see): the distinct storages seen by n views are about log_1.25(n)."""
    n = 20_000
    r = backend.Request(1, [7])
    views = []
    for token in range(n):
        r.add_new_token(token)
        views.append(r.get_tokens_view())  # a view of everything so far, kept alive
    storages = {id(storage_of(v)) for v in views}
    assert len(storages) <= math.log(n) / math.log(1.25) + 4
    assert views[-1].tolist()[-3:] == [n - 3, n - 2, n - 1]
    assert views[10].tolist() == [7] + list(range(11))


def test_truncate_under_a_view_copies_once_then_appends_in_place(backend):
    r = backend.Request(1, list(range(1000)))
    for token in range(100):
        r.add_new_token(token)
    before = r.get_tokens_view()
    r.truncate(1050)
    after = []
    for token in range(40):
        r.add_new_token(token)
        after.append(r.get_tokens_view(0, 1050 + token, 1051 + token))
    # the rewrite of positions the view shows moved the tokens once, not on every append
    assert len({id(storage_of(v)) for v in after}) <= 2
    assert before.tolist()[1050:1060] == list(range(50, 60))
    assert r.get_tokens_range(0, 1050, 1053) == [0, 1, 2]


def test_block_table_capacity(backend):
    t = backend.BlockTable()
    for block in range(10_000):
        t.append(block)
    assert capacity_bytes(t.view()) <= 1.25 * 4 * 10_000 + 4 * 64
