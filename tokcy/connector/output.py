"""``SchedulerOutput`` (columnar arrays, one row per scheduled request) and ``RequestData`` (its rows, built lazily)."""

import abc
from operator import attrgetter

import numpy as np

from tokcy import _backend, _request_data
from tokcy._request_data import COLUMNS, _GivenColumns


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
    references them any more; it makes each column array on its first read.) The
    attributes are read-only: a column cannot be replaced (its values can be written, and
    a manager's report's rows then read the new values, checked).

    ``new_requests`` and ``cached_requests`` are lists of ``RequestData`` built on first
    access; ``num_context_requests`` rows come first.
    """

    # each column is a read-only property reading the same name of _source (made below the
    # class): a manager's report (its backend's ReportColumns, which makes each column on
    # its first read) or the columns given to __init__ (a _GivenColumns); no __getattr__
    __slots__ = ("_num_context_requests", "_source", "_rows", "__weakref__")

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
        self._num_context_requests = num_context_requests
        self._rows = None
        self._source = _GivenColumns(
            request_ids, is_new, computed_positions, num_scheduled_tokens, num_replaced_tokens, token_offsets, tokens,
            group_offsets, block_offsets, block_ids, num_replaced_blocks, num_released_blocks,
        )

    def __reduce__(self):
        return type(self), (self.num_context_requests, *(getattr(self, name) for name in COLUMNS))

    def __len__(self):
        return len(self.request_ids)

    def request_data(self, row):
        """``RequestData`` for one row."""
        rows = self._made_rows()[0]  # its length is the batch's: the columns need not be made
        if not 0 <= row < len(rows):
            raise IndexError(f"row {row} is out of range for {len(rows)} scheduled requests")
        return rows[row]

    def _made_rows(self):
        """(every row, the new rows, the cached rows): RequestData made on the first use."""
        rows = self._rows
        if rows is None:
            rows = self._rows = _backend.module.request_rows(self)
        return rows

    @property
    def requests(self):
        """``RequestData`` for every row, in row order (a new list)."""
        return list(self._made_rows()[0])

    @property
    def new_requests(self):
        """``RequestData`` of the rows reported as new (first report, or after reset / pause; a new list)."""
        return list(self._made_rows()[1])

    @property
    def cached_requests(self):
        """``RequestData`` of the rows reported as deltas (a new list)."""
        return list(self._made_rows()[2])

    @property
    def num_new_tokens(self):
        """Tokens carried by this report, all rows together."""
        return len(self.tokens)

    @property
    def num_new_blocks(self):
        """Block ids carried by this report, all rows and groups together."""
        return len(self.block_ids)

    def __repr__(self):
        is_new = self.is_new
        new = int(np.count_nonzero(is_new))  # (a column made by hand may be a list)
        return (
            f"{type(self).__name__}(new={new}, cached={len(is_new) - new}, "
            f"tokens={len(self.tokens)}, blocks={len(self.block_ids)})"
        )


_FROM_REPORT = object()  # a manager's report's _num_context_requests: its ReportColumns knows


def _num_context_requests(output):
    """The rows of context requests (they come first)."""
    count = output._num_context_requests
    return output._source.num_context if count is _FROM_REPORT else count


SchedulerOutput.num_context_requests = property(_num_context_requests)
for _name in COLUMNS:  # read-only: a C getter, no setter
    setattr(SchedulerOutput, _name, property(attrgetter(f"_source.{_name}")))
_new_object = object.__new__


def new_output():
    """A ``SchedulerOutput`` for a manager's report: ``_source`` is to be set to the
    backend's ``ReportState.build`` result (a ``ReportColumns``, whose attributes are the
    columns and ``num_context`` the context rows), which sets nothing else."""
    output = _new_object(SchedulerOutput)
    output._num_context_requests = _FROM_REPORT
    output._rows = None
    return output


class RequestData(abc.ABC):
    """One row of a ``SchedulerOutput``, as plain Python values.

    Fields (read-only attributes): ``request_id``, ``is_new``, ``new_tokens``,
    ``new_block_ids`` (group 0), ``computed_position``, ``num_scheduled_tokens``,
    ``num_replaced_tokens``; per layer group: ``new_block_ids_by_group``,
    ``num_replaced_blocks_by_group``, ``num_released_blocks_by_group``; and
    ``num_layer_groups``. ``as_dict()`` gives them all. Every list a field gives is a new
    one, the caller's to keep or change.

    A row is made lazily: a ``SchedulerOutput`` makes the ``RequestData`` of all its rows
    at once, when the first one is asked for, and each is only a reference to the report's
    columns and a row number; a field reads the columns when it is read. So the rows of a
    report cost one small object each, and a consumer pays for the fields it reads. A
    row keeps its report's arrays alive; it reads a manager's report as it is when read
    (every offset checked), and copies of the columns of an output made by hand. Rows
    compare equal when all their fields do (a row of either backend), are read-only and
    not hashable, and pickle as their fields.

    Each backend makes its own row class; ``isinstance(row, RequestData)`` is true for
    both, and this class documents the fields.
    """

    __slots__ = ()

    @classmethod
    def __subclasshook__(cls, other):
        return True if cls is RequestData and _request_data.is_row_type(other) else NotImplemented

    request_id = property(doc="The request's id.")
    is_new = property(doc="True for the request's first report (or its first after reset / pause).")
    new_tokens = property(doc="Beam-0 tokens not reported yet (all of them for a new request).")
    new_block_ids = property(doc="``new_block_ids_by_group[0]`` (empty when the request has no layer group).")
    computed_position = property(doc="Tokens whose KV is computed before this iteration.")
    num_scheduled_tokens = property(doc="Tokens this iteration feeds for the request.")
    num_replaced_tokens = property(doc="Already-reported tokens at the tail that ``new_tokens`` replaces (usually 0).")
    num_layer_groups = property(doc="The request's layer groups (segments of the report).")
    new_block_ids_by_group = property(doc="Per layer group, the block ids not reported yet (lists).")
    num_replaced_blocks_by_group = property(
        doc="Per group, already-reported block ids at the tail that the new ones replace."
    )
    num_released_blocks_by_group = property(
        doc="Per group, how many leading blocks a sliding window has released so far (they read -1)."
    )

    @abc.abstractmethod
    def as_dict(self):
        """Every field (except ``new_block_ids`` and ``num_layer_groups``, which follow
        from ``new_block_ids_by_group``), as plain Python values."""
        raise NotImplementedError
