"""``SchedulerOutput`` (columnar arrays, one row per scheduled request) and ``RequestData`` (its rows, built lazily)."""

from itertools import compress, pairwise, repeat
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np

from tokcy import _backend

COLUMNS = (
    "request_ids", "is_new", "computed_positions", "num_scheduled_tokens", "num_replaced_tokens", "token_offsets",
    "tokens", "group_offsets", "block_offsets", "block_ids", "num_replaced_blocks", "num_released_blocks",
)
"""``SchedulerOutput``'s columns, in the order of its constructor's arguments."""


class SchedulerOutput:
    """One iteration's report, columnar. Rows: context requests, then generation requests,
    then device-token requests, in the order given. Every column is a public numpy array:

    * per row: ``request_ids`` (int64), ``is_new`` (bool), ``computed_positions``,
      ``num_scheduled_tokens``, ``num_replaced_tokens`` (int64);
    * tokens: ``tokens`` (int32, flat); row r's new tokens are
      ``tokens[token_offsets[r]:token_offsets[r + 1]]``;
    * blocks: one *segment* per (row, layer group). Row r's segments are
      ``group_offsets[r] .. group_offsets[r + 1] - 1``; segment s's new block ids are
      ``block_ids[block_offsets[s]:block_offsets[s + 1]]`` (int32, flat), and
      ``num_replaced_blocks[s]`` / ``num_released_blocks[s]`` (int64) go with it.

    The arrays are this report's own: nothing writes to them after the call, for as long
    as anyone holds the output, a column or a view of one. (The compiled backend writes a
    report into arrays it keeps, reusing them for a later report only once nothing
    references them any more; it makes the column arrays on their first read.)

    ``new_requests`` and ``cached_requests`` are lists of ``RequestData`` built on first
    access; ``num_context_requests`` rows come first.
    """

    __slots__ = ("num_context_requests", *COLUMNS, "_source", "_all_rows", "_new_requests", "_cached_requests",
                 "__weakref__")

    def __init__(
        self,
        num_context_requests,
        request_ids,
        is_new,
        computed_positions,
        num_scheduled_tokens,
        num_replaced_tokens,
        token_offsets,
        tokens,
        group_offsets,
        block_offsets,
        block_ids,
        num_replaced_blocks,
        num_released_blocks,
    ):
        self.num_context_requests = num_context_requests
        self._source = (
            request_ids, is_new, computed_positions, num_scheduled_tokens, num_replaced_tokens, token_offsets, tokens,
            group_offsets, block_offsets, block_ids, num_replaced_blocks, num_released_blocks,
        )

    def __getattr__(self, name):
        # reached only for a slot not set yet: a column (all are set from the backend's
        # report on the first read of any) or a list of RequestData (made on first use)
        if name in _COLUMN_SLOTS:
            source = self._source
            for column, array in zip(_COLUMN_SLOTS.values(), source if type(source) is tuple else source.arrays()):
                column.__set__(self, array)
            return _COLUMN_SLOTS[name].__get__(self)
        if name == "_all_rows":
            self._all_rows = rows = _build_rows(self)
            return rows
        if name == "_new_requests":
            self._new_requests = rows = list(compress(self._all_rows, self.is_new.tolist()))
            return rows
        if name == "_cached_requests":
            self._cached_requests = rows = list(compress(self._all_rows, (~self.is_new).tolist()))
            return rows
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __reduce__(self):
        return type(self), (self.num_context_requests, *(getattr(self, name) for name in COLUMNS))

    def __len__(self):
        return len(self.request_ids)

    def request_data(self, row):
        """``RequestData`` for one row."""
        if not 0 <= row < len(self.request_ids):
            raise IndexError(f"row {row} is out of range for {len(self.request_ids)} scheduled requests")
        return self._all_rows[row]

    @property
    def requests(self):
        """``RequestData`` for every row, in row order (a new list)."""
        return list(self._all_rows)

    @property
    def new_requests(self):
        """``RequestData`` of the rows reported as new (first report, or after reset / pause)."""
        return self._new_requests

    @property
    def cached_requests(self):
        """``RequestData`` of the rows reported as deltas."""
        return self._cached_requests

    @property
    def num_new_tokens(self):
        """Tokens carried by this report, all rows together."""
        return len(self.tokens)

    @property
    def num_new_blocks(self):
        """Block ids carried by this report, all rows and groups together."""
        return len(self.block_ids)

    def __repr__(self):
        return (
            f"{type(self).__name__}(new={int(self.is_new.sum())}, cached={int((~self.is_new).sum())}, "
            f"tokens={len(self.tokens)}, blocks={len(self.block_ids)})"
        )


_COLUMN_SLOTS = {name: SchedulerOutput.__dict__[name] for name in COLUMNS}  # name -> its slot descriptor
_new_object = object.__new__


def from_report(report):
    """The ``SchedulerOutput`` of a backend's ``ReportState.build`` result: (number of
    context rows, the columns: a tuple of arrays, or an object whose ``arrays()`` makes them)."""
    output = _new_object(SchedulerOutput)
    output.num_context_requests, output._source = report
    return output


class _Columns:
    """The per-segment columns of one output as Python lists, made on first use: only the
    fields with one entry per layer group read them. Holds the arrays, not the output, so
    that an output and its rows form no reference cycle."""

    __slots__ = ("_arrays", "_lists")

    def __init__(self, output):
        self._arrays = (output.group_offsets, output.block_offsets, output.block_ids, output.num_replaced_blocks,
                        output.num_released_blocks)
        self._lists = None

    def lists(self):
        """(group_offsets, block_offsets, block_ids, num_replaced_blocks, num_released_blocks)."""
        if self._lists is None:
            self._lists = tuple(column.tolist() for column in self._arrays)
            self._arrays = None  # the lists are all it needs from now on
        return self._lists


class RequestData(tuple):
    """One row of a ``SchedulerOutput``, as plain Python values.

    Fields (read-only attributes): ``request_id``, ``is_new``, ``new_tokens``,
    ``new_block_ids`` (group 0), ``computed_position``, ``num_scheduled_tokens``,
    ``num_replaced_tokens``; per layer group (a new list on every read):
    ``new_block_ids_by_group``, ``num_replaced_blocks_by_group``,
    ``num_released_blocks_by_group``; and ``num_layer_groups``. ``as_dict()`` gives them all.

    A ``SchedulerOutput`` builds the ``RequestData`` of all its rows at once, when the first
    one is asked for: each column becomes a Python list once and a row's lists are slices
    of those, so the objects cost O(batch + tokens + blocks) together. ``new_tokens`` and
    ``new_block_ids`` are lists of this row's own (the same list on every read: copy it
    before changing it). A ``RequestData`` is a tuple underneath, because a tuple is the
    cheapest object Python builds per row; read it through its fields, not by index.
    """

    __slots__ = ()

    if TYPE_CHECKING:  # the fields' types, for type checkers
        request_id: int
        is_new: bool
        new_tokens: list[int]
        new_block_ids: list[int]
        computed_position: int
        num_scheduled_tokens: int
        num_replaced_tokens: int
        _row: int
        _columns: _Columns

    else:  # read-only fields: each a C-level itemgetter, the cheapest attribute Python has
        request_id = property(itemgetter(0), doc="The request's id.")
        is_new = property(itemgetter(1), doc="True for the request's first report (or its first after reset / pause).")
        new_tokens = property(itemgetter(2), doc="Beam-0 tokens not reported yet (all of them for a new request).")
        new_block_ids = property(itemgetter(3), doc="``new_block_ids_by_group[0]``.")
        computed_position = property(itemgetter(4), doc="Tokens whose KV is computed before this iteration.")
        num_scheduled_tokens = property(itemgetter(5), doc="Tokens this iteration feeds for the request.")
        num_replaced_tokens = property(
            itemgetter(6), doc="Already-reported tokens at the tail that ``new_tokens`` replaces (usually 0)."
        )
        _row = property(itemgetter(7))
        _columns = property(itemgetter(8))

    def _segments(self):
        offsets = self._columns.lists()[0]
        return range(offsets[self._row], offsets[self._row + 1])

    @property
    def num_layer_groups(self):
        return len(self._segments())

    @property
    def new_block_ids_by_group(self):
        """Per layer group, the block ids not reported yet (lists)."""
        _, offsets, block_ids, _, _ = self._columns.lists()
        return [block_ids[offsets[segment] : offsets[segment + 1]] for segment in self._segments()]

    @property
    def num_replaced_blocks_by_group(self):
        """Per group, already-reported block ids at the tail that the new ones replace."""
        column = self._columns.lists()[3]
        return [column[segment] for segment in self._segments()]

    @property
    def num_released_blocks_by_group(self):
        """Per group, how many leading blocks a sliding window has released so far (they read -1)."""
        column = self._columns.lists()[4]
        return [column[segment] for segment in self._segments()]

    def as_dict(self):
        """Every field, as plain Python values (``new_tokens`` copied)."""
        return {
            "request_id": self.request_id,
            "is_new": self.is_new,
            "new_tokens": list(self.new_tokens),
            "new_block_ids_by_group": self.new_block_ids_by_group,
            "computed_position": self.computed_position,
            "num_scheduled_tokens": self.num_scheduled_tokens,
            "num_replaced_tokens": self.num_replaced_tokens,
            "num_replaced_blocks_by_group": self.num_replaced_blocks_by_group,
            "num_released_blocks_by_group": self.num_released_blocks_by_group,
        }

    def __eq__(self, other):
        if isinstance(other, RequestData):
            return self.as_dict() == other.as_dict()
        return NotImplemented

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self):
        fields = ", ".join(f"{key}={value!r}" for key, value in self.as_dict().items())
        return f"RequestData({fields})"


def _row_slices(flat, offsets):
    """``[flat[offsets[r]:offsets[r + 1]].tolist() for every row r]`` (``flat``, ``offsets``:
    numpy arrays), each a list of its own, with numpy building the lists in one call for the
    common shapes: every row the same length (decode: one token each, or none), or only a
    few rows non-empty (decode blocks: a new block every block-size steps)."""
    count = len(offsets) - 1
    total = int(offsets[-1] - offsets[0]) if count > 0 else 0
    if count <= 0:
        return []
    if total % count == 0 and offsets[-1] - offsets[-2] == total // count:
        width = total // count
        if width == 0 or np.array_equal(offsets, np.arange(0, total + 1, width) + offsets[0]):
            return flat[offsets[0] : offsets[-1]].reshape(count, width).tolist()
    lengths = np.diff(offsets)
    nonempty = np.flatnonzero(lengths)
    if 4 * len(nonempty) < count:
        rows = np.empty((count, 0), dtype=flat.dtype).tolist()
        for row, begin, end in zip(nonempty.tolist(), offsets[nonempty].tolist(), offsets[nonempty + 1].tolist()):
            rows[row] = flat[begin:end].tolist()
        return rows
    values, bounds = flat.tolist(), offsets.tolist()
    return [values[begin:end] for begin, end in zip(bounds, bounds[1:])]


def _build_rows(output):
    """The ``RequestData`` of every row of ``output``: built by the compiled backend in one
    C pass when it is live, else through lists here (the same tuples either way)."""
    if type(output._source) is tuple:  # columns given to the constructor: check them first
        _check_layout(output)
    build = getattr(_backend.module, "request_rows", _request_rows)
    return build(RequestData, output, _Columns(output))


def _check_layout(output):
    """ValueError unless every row's offsets lie inside the columns (what a manager's
    report always satisfies), with the compiled builder's messages."""
    count = len(output.request_ids)
    per_row = (output.is_new, output.computed_positions, output.num_scheduled_tokens, output.num_replaced_tokens)
    if any(len(column) != count for column in per_row) or not (
        len(output.token_offsets) == len(output.group_offsets) == count + 1
    ):
        raise ValueError("the SchedulerOutput's per-row columns differ in length")
    tokens, groups, blocks = (np.asarray(column, dtype=np.int64) for column in
                              (output.token_offsets, output.group_offsets, output.block_offsets))
    bad = (tokens[:-1] < 0) | (tokens[:-1] > tokens[1:]) | (tokens[1:] > len(output.tokens))
    bad |= (groups[:-1] < 0) | (groups[:-1] > groups[1:]) | (groups[1:] >= len(blocks))
    if not bad.any():
        first = groups[:-1][groups[:-1] < groups[1:]]
        bad_first = (blocks[first] < 0) | (blocks[first] > blocks[first + 1]) | (blocks[first + 1] > len(output.block_ids))
        bad[np.flatnonzero(groups[:-1] < groups[1:])[bad_first]] = True
    if bad.any():
        raise ValueError(f"the SchedulerOutput's offsets of row {int(np.argmax(bad))} lie outside its columns")


def _request_rows(cls, output, columns):
    """The pure-Python builder of ``_build_rows``: every column read once, as lists."""
    count = len(output.request_ids)
    token_offsets = output.token_offsets
    new_tokens = _row_slices(output.tokens, token_offsets)
    if len(output.block_offsets) - 1 == count and np.array_equal(output.group_offsets, np.arange(count + 1)):
        new_block_ids = _row_slices(output.block_ids, output.block_offsets)  # one layer group per row
    else:  # group 0 of each row that has one
        block_offsets, block_ids = output.block_offsets.tolist(), output.block_ids.tolist()
        bounds = output.group_offsets.tolist()
        new_block_ids = [
            block_ids[block_offsets[first] : block_offsets[first + 1]] if first < last else []
            for first, last in pairwise(bounds)
        ]
    return list(map(tuple.__new__, repeat(cls), zip(
        output.request_ids.tolist(), output.is_new.tolist(), new_tokens, new_block_ids,
        output.computed_positions.tolist(), output.num_scheduled_tokens.tolist(), output.num_replaced_tokens.tolist(),
        range(count), repeat(columns),
    )))
