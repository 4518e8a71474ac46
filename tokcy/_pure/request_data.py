"""``RequestData`` rows of a ``SchedulerOutput`` (pure twin of ``_core_request_data.pxi``).

A row is its report's ``RowColumns`` and its row number: making a whole report's rows is
one small object per row, and a field is read from the columns only when it is asked
for (every list a new one). The rows of a manager's report read its arrays as they are
when a field is read, checking every offset they follow against the column it indexes;
the rows of an output made by hand read copies, checked when the rows are made. The
compiled rows do the same.
"""

import weakref
from itertools import compress

import numpy as np

from tokcy import _invariants, _request_data
from tokcy._request_data import COLUMNS, MADE_BY_REPORT, OUTSIDE, READ_ONLY, _GivenColumns, column_copy


class RowColumns:
    """The columns of one report that its rows read: a manager's report's own arrays, or
    private copies (``_request_data.column_copy``) of the columns of an output made by hand.
    A weak reference to the array under each of a manager's columns keeps numpy from
    resizing it (even with refcheck=False) while a row can read it."""

    __reduce__ = _invariants.refuse_pickling  # as the compiled twin (rows pickle as their fields)

    __slots__ = (*COLUMNS, "_resize_guards")

    def __init__(self, output, made_by_hand):
        take = column_copy if made_by_hand else _as_is  # (one assignment each: stubtest reads them)
        self.request_ids = take(output.request_ids, np.int64, "request_ids")
        self.is_new = take(output.is_new, np.bool_, "is_new")
        self.computed_positions = take(output.computed_positions, np.int64, "computed_positions")
        self.num_scheduled_tokens = take(output.num_scheduled_tokens, np.int64, "num_scheduled_tokens")
        self.num_replaced_tokens = take(output.num_replaced_tokens, np.int64, "num_replaced_tokens")
        self.token_offsets = take(output.token_offsets, np.int64, "token_offsets")
        self.tokens = take(output.tokens, np.int32, "tokens")
        self.group_offsets = take(output.group_offsets, np.int64, "group_offsets")
        self.block_offsets = take(output.block_offsets, np.int64, "block_offsets")
        self.block_ids = take(output.block_ids, np.int32, "block_ids")
        self.num_replaced_blocks = take(output.num_replaced_blocks, np.int64, "num_replaced_blocks")
        self.num_released_blocks = take(output.num_released_blocks, np.int64, "num_released_blocks")
        self._resize_guards = () if made_by_hand else tuple(
            weakref.ref(_root(getattr(self, name))) for name in COLUMNS
        )


def _as_is(column, dtype, name):
    return column


def _root(array):
    """The array that owns ``array``'s memory (the end of its chain of bases)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


class RequestData:
    """One row of a ``SchedulerOutput`` (the fields are documented on
    ``tokcy.connector.RequestData``); made by the report, never by hand."""

    __slots__ = ("_columns", "_row")
    _is_request_data = True

    def __init__(self, *args, **kwargs):
        raise TypeError(MADE_BY_REPORT)

    def __getattr__(self, name):  # reached for an unset slot only: a row made through __new__
        if name in RequestData.__slots__:
            raise TypeError(MADE_BY_REPORT)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name, value):
        raise AttributeError(READ_ONLY.format(name))

    def __delattr__(self, name):
        raise AttributeError(READ_ONLY.format(name))

    @property
    def request_id(self):
        return self._columns.request_ids.item(self._row)

    @property
    def is_new(self):
        return self._columns.is_new.item(self._row)

    @property
    def new_tokens(self):
        return _slice(self._columns.tokens, self._columns.token_offsets, self._row, self._row)

    @property
    def computed_position(self):
        return self._columns.computed_positions.item(self._row)

    @property
    def num_scheduled_tokens(self):
        return self._columns.num_scheduled_tokens.item(self._row)

    @property
    def num_replaced_tokens(self):
        return self._columns.num_replaced_tokens.item(self._row)

    def _segments(self, column=None):
        """Row's segments (a range), checked against ``block_offsets`` (and ``column``)."""
        offsets, row = self._columns.group_offsets, self._row
        first, end = offsets.item(row), offsets.item(row + 1)
        if not 0 <= first <= end < len(self._columns.block_offsets) or (column is not None and end > len(column)):
            raise ValueError(OUTSIDE.format(row))
        return range(first, end)

    @property
    def num_layer_groups(self):
        return len(self._segments())

    @property
    def new_block_ids(self):
        segments = self._segments()
        if not segments:
            return []
        return _slice(self._columns.block_ids, self._columns.block_offsets, segments[0], self._row)

    @property
    def new_block_ids_by_group(self):
        columns = self._columns
        return [_slice(columns.block_ids, columns.block_offsets, segment, self._row) for segment in self._segments()]

    @property
    def num_replaced_blocks_by_group(self):
        column = self._columns.num_replaced_blocks
        return column[self._segments(column)].tolist()

    @property
    def num_released_blocks_by_group(self):
        column = self._columns.num_released_blocks
        return column[self._segments(column)].tolist()

    as_dict = _request_data.as_dict
    __eq__ = _request_data.equal
    __ne__ = _request_data.not_equal
    __hash__ = None  # type: ignore[assignment]
    __repr__ = _request_data.describe
    __reduce__ = _request_data.reduce


def _slice(values, offsets, index, row):
    """``values[offsets[index]:offsets[index + 1]]`` as a new list; ValueError naming
    ``row`` unless both offsets lie inside ``values``. The offsets are read now: a row
    reads its report's columns as they are when it is read."""
    begin, end = offsets.item(index), offsets.item(index + 1)
    if not 0 <= begin <= end <= len(values):
        raise ValueError(OUTSIDE.format(row))
    return values[begin:end].tolist()


def request_rows(output):
    """The ``RequestData`` of every row of ``output``, and of its new rows and its cached
    rows apart (three new tuples). The columns of an output made by hand are copied and
    checked first: each row's offsets must lie inside them (ValueError naming the first
    row that does not); a manager's rows check each offset when they read it."""
    made_by_hand = type(output._source) is _GivenColumns
    columns = RowColumns(output, made_by_hand)
    if made_by_hand:
        _check_layout(columns)
    count = len(columns.request_ids)
    rows = _whole_tuple([_made_row(columns, row) for row in range(count)], count)
    is_new = columns.is_new.tolist()
    num_new = sum(is_new)
    return (rows, _whole_tuple(list(compress(rows, is_new)), num_new),
            _whole_tuple([data for data, new in zip(rows, is_new) if not new], count - num_new))


def _whole_tuple(items, count):
    """The list ``items`` as a tuple, which no one can change, refused unless it still
    holds its ``count`` rows: a collection's callback (any allocation may start one) can
    find the list (gc.get_objects) and empty it. (Through an iterator: ``tuple(items)``
    would copy the list's items after an allocation that may run that callback.)"""
    made = tuple(iter(items))
    if len(made) != count:
        raise RuntimeError("the rows of a report were changed by code that ran while they were made")
    return made


def _made_row(columns, row):
    data = _new_row(RequestData)
    _set_columns(data, columns)  # the slots' own setters: a row refuses setattr
    _set_row(data, row)
    return data


_new_row = object.__new__
_set_columns = RequestData.__dict__["_columns"].__set__
_set_row = RequestData.__dict__["_row"].__set__


def _check_layout(columns):
    """ValueError unless the per-row columns have one length and every row's offsets lie
    inside the columns: its tokens, its segments, each segment's block ids and counts."""
    count = len(columns.request_ids)
    per_row = (columns.is_new, columns.computed_positions, columns.num_scheduled_tokens, columns.num_replaced_tokens)
    if any(len(column) != count for column in per_row) or not (
        len(columns.token_offsets) == len(columns.group_offsets) == count + 1
    ):
        raise ValueError("the SchedulerOutput's per-row columns differ in length")
    tokens, groups, blocks = columns.token_offsets, columns.group_offsets, columns.block_offsets
    starts, ends = groups[:-1], groups[1:]
    in_segments = (starts >= 0) & (starts <= ends) & (ends < len(blocks))
    in_segments &= (ends <= len(columns.num_replaced_blocks)) & (ends <= len(columns.num_released_blocks))
    bad = (tokens[:-1] < 0) | (tokens[:-1] > tokens[1:]) | (tokens[1:] > len(columns.tokens)) | ~in_segments
    # a row is bad if any of its segments' block spans is: count the bad spans up to each segment
    bad_span = (blocks[:-1] < 0) | (blocks[:-1] > blocks[1:]) | (blocks[1:] > len(columns.block_ids))
    bad_before = np.concatenate(([0], np.cumsum(bad_span)))
    rows = np.flatnonzero(in_segments)
    bad[rows] |= bad_before[ends[rows]] > bad_before[starts[rows]]
    if bad.any():
        raise ValueError(OUTSIDE.format(int(np.argmax(bad))))
