"""Exact small worked examples for ``BlockTable`` (docs/request.md): one per layer group
of a request, its accessors, sliding-window releases, views, pickling and repr.

Every expected value is written out by hand; nothing is computed by the code under test.
Each test runs once per backend (fixture ``backend``).
"""

import pickle

import numpy as np
import pytest


# ------------------------------------------------------------------- block tables
@pytest.mark.parametrize("groups", [1, 2, 5])
def test_block_tables_sized_by_num_layer_groups(backend, groups):
    r = backend.Request(1, [1], num_layer_groups=groups)
    assert len(r.block_tables) == groups
    assert all(isinstance(t, backend.BlockTable) for t in r.block_tables)
    assert all(t.tolist() == [] for t in r.block_tables)
    r.block_tables[0].append(4)
    assert r.block_tables[0].tolist() == [4]
    assert all(t.tolist() == [] for t in r.block_tables[1:])
    # the tuple holds the same tables every time
    assert r.block_tables[0] is r.block_tables[0]


def test_block_table_basics(backend):
    t = backend.BlockTable()
    assert len(t) == 0
    assert t.tolist() == []
    assert t.num_released == 0
    assert t.append(5) == 1
    assert t.append(np.int32(6)) == 2
    assert t.extend([7, 8]) == 4
    assert t.extend(np.array([9], dtype=np.int64)) == 5
    assert t.extend([]) == 5
    assert len(t) == 5
    assert t.tolist() == [5, 6, 7, 8, 9]
    assert list(t) == [5, 6, 7, 8, 9]
    assert t[0] == 5 and t[4] == 9
    assert t[-1] == 9 and t[-5] == 5
    assert type(t[0]) is int
    assert t == [5, 6, 7, 8, 9]
    assert t == backend.BlockTable([5, 6, 7, 8, 9])
    assert t != backend.BlockTable([5, 6, 7, 8])


def test_block_table_constructor(backend):
    t = backend.BlockTable([3, 4])
    assert t.tolist() == [3, 4]
    assert backend.BlockTable(np.array([0, 1, 2], dtype=np.uint16)).tolist() == [0, 1, 2]


def test_block_table_setitem(backend):
    t = backend.BlockTable([1, 2, 3])
    t[1] = 20
    t[-1] = 30
    t[0] = 0
    assert t.tolist() == [0, 20, 30]


def test_block_table_truncate(backend):
    t = backend.BlockTable([1, 2, 3, 4])
    t.truncate(4)
    assert t.tolist() == [1, 2, 3, 4]
    t.truncate(2)
    assert t.tolist() == [1, 2]
    assert len(t) == 2
    t.append(7)
    assert t.tolist() == [1, 2, 7]
    t.truncate(0)
    assert t.tolist() == []


def test_block_table_release_front(backend):
    t = backend.BlockTable([1, 2, 3, 4, 5])
    t.release_front(0)
    assert t.tolist() == [1, 2, 3, 4, 5]
    t.release_front(2)
    assert t.tolist() == [-1, -1, 3, 4, 5]
    assert t.num_released == 2
    assert t[0] == -1 and t[-4] == -1
    t.release_front(2)  # same count: nothing changes
    assert t.tolist() == [-1, -1, 3, 4, 5]
    t.release_front(4)
    assert t.tolist() == [-1, -1, -1, -1, 5]
    assert t.num_released == 4
    t[4] = 50
    t.append(6)
    assert t.tolist() == [-1, -1, -1, -1, 50, 6]
    t.release_front(6)
    assert t.tolist() == [-1] * 6
    assert t.num_released == 6


def test_block_table_truncate_clamps_num_released(backend):
    t = backend.BlockTable([1, 2, 3, 4, 5])
    t.release_front(3)
    t.truncate(2)
    assert t.tolist() == [-1, -1]
    assert t.num_released == 2
    t.append(8)
    t[2] = 9
    assert t.tolist() == [-1, -1, 9]
    t.release_front(2)
    t.truncate(0)
    assert t.num_released == 0
    t.extend([1, 2])
    t[0] = 4
    assert t.tolist() == [4, 2]
    t.release_front(1)
    assert t.tolist() == [-1, 2]


def test_block_table_view_is_a_read_only_snapshot(backend):
    t = backend.BlockTable([1, 2, 3])
    v = t.view()
    assert isinstance(v, np.ndarray)
    assert v.dtype == np.int32
    assert v.tolist() == [1, 2, 3]
    assert not v.flags.writeable
    with pytest.raises(ValueError):
        v[0] = 9
    t[0] = 10
    t.release_front(2)
    t.truncate(1)
    t.extend([7, 8, 9])
    assert v.tolist() == [1, 2, 3]
    assert t.tolist() == [-1, 7, 8, 9]
    assert t.view().tolist() == [-1, 7, 8, 9]


def test_block_table_pickle(backend):
    t = backend.BlockTable([1, 2, 3])
    t.release_front(1)
    u = pickle.loads(pickle.dumps(t))
    assert type(u) is backend.BlockTable
    assert u.tolist() == [-1, 2, 3]
    assert u.num_released == 1
    with pytest.raises(ValueError):
        u[0] = 5
    with pytest.raises(ValueError):
        u.release_front(0)


def test_block_table_repr(backend):
    assert repr(backend.BlockTable([1, 2])) == "BlockTable([1, 2], num_released=0)"


def test_setting_an_entry_converts_its_index_once(backend):
    """An index whose conversion gives 0 the first time and 1 after: the entry set is 0 and
    the index is converted once (as a C-typed argument is), on both backends."""
    calls = []

    class Index:
        def __index__(self):
            calls.append(1)
            return 0 if len(calls) == 1 else 1

    table = backend.BlockTable([10, 11, 12])
    table[Index()] = 99
    assert table.tolist() == [99, 11, 12] and len(calls) == 1
