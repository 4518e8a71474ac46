"""``SchedulerOutput`` (columnar arrays, one row per scheduled request) and ``RequestData`` (a lazy row view)."""


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

    ``new_requests`` and ``cached_requests`` are lists of ``RequestData`` built on first
    access; ``num_context_requests`` rows come first.
    """

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
        self.request_ids = request_ids
        self.is_new = is_new
        self.computed_positions = computed_positions
        self.num_scheduled_tokens = num_scheduled_tokens
        self.num_replaced_tokens = num_replaced_tokens
        self.token_offsets = token_offsets
        self.tokens = tokens
        self.group_offsets = group_offsets
        self.block_offsets = block_offsets
        self.block_ids = block_ids
        self.num_replaced_blocks = num_replaced_blocks
        self.num_released_blocks = num_released_blocks
        self._new_requests = None
        self._cached_requests = None
        self._columns = None

    _COLUMNS = (
        "request_ids",
        "is_new",
        "computed_positions",
        "num_scheduled_tokens",
        "num_replaced_tokens",
        "token_offsets",
        "tokens",
        "group_offsets",
        "block_offsets",
        "block_ids",
        "num_replaced_blocks",
        "num_released_blocks",
    )

    def _python_columns(self):
        """Every column as a Python list, made once, for ``RequestData``."""
        if self._columns is None:
            self._columns = {name: getattr(self, name).tolist() for name in self._COLUMNS}
        return self._columns

    def __len__(self):
        return len(self.request_ids)

    def request_data(self, row):
        """``RequestData`` for one row."""
        if not 0 <= row < len(self.request_ids):
            raise IndexError(f"row {row} is out of range for {len(self.request_ids)} scheduled requests")
        return RequestData(self, row)

    @property
    def requests(self):
        """``RequestData`` for every row, in row order (a new list)."""
        return [RequestData(self, row) for row in range(len(self.request_ids))]

    @property
    def new_requests(self):
        """``RequestData`` of the rows reported as new (first report, or after reset / pause)."""
        if self._new_requests is None:
            is_new = self._python_columns()["is_new"]
            self._new_requests = [RequestData(self, row) for row in range(len(is_new)) if is_new[row]]
        return self._new_requests

    @property
    def cached_requests(self):
        """``RequestData`` of the rows reported as deltas."""
        if self._cached_requests is None:
            is_new = self._python_columns()["is_new"]
            self._cached_requests = [RequestData(self, row) for row in range(len(is_new)) if not is_new[row]]
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


class RequestData:
    """One row of a ``SchedulerOutput``; every field is read from the arrays on access.

    The first ``RequestData`` of an output converts its columns to Python lists once
    (O(batch + tokens + blocks)); each field is then a list index or slice.
    """

    __slots__ = ("_output", "_row", "_columns")

    def __init__(self, output, row):
        self._output = output
        self._row = row
        self._columns = output._python_columns()

    @property
    def request_id(self):
        return self._columns["request_ids"][self._row]

    @property
    def is_new(self):
        """True when this is the request's first report (or its first after reset / pause)."""
        return self._columns["is_new"][self._row]

    @property
    def new_tokens(self):
        """Beam-0 tokens not reported yet (all of them for a new request), as a new list."""
        columns = self._columns
        offsets = columns["token_offsets"]
        return columns["tokens"][offsets[self._row] : offsets[self._row + 1]]

    @property
    def computed_position(self):
        return self._columns["computed_positions"][self._row]

    @property
    def num_scheduled_tokens(self):
        return self._columns["num_scheduled_tokens"][self._row]

    @property
    def num_replaced_tokens(self):
        """Already-reported tokens at the tail that ``new_tokens`` replaces (0 in the common case)."""
        return self._columns["num_replaced_tokens"][self._row]

    def _segments(self):
        offsets = self._columns["group_offsets"]
        return range(offsets[self._row], offsets[self._row + 1])

    @property
    def num_layer_groups(self):
        return len(self._segments())

    def _blocks(self, segment):
        columns = self._columns
        offsets = columns["block_offsets"]
        return columns["block_ids"][offsets[segment] : offsets[segment + 1]]

    @property
    def new_block_ids_by_group(self):
        """Per layer group, the block ids not reported yet (lists)."""
        return [self._blocks(segment) for segment in self._segments()]

    @property
    def new_block_ids(self):
        """``new_block_ids_by_group[0]``."""
        return self._blocks(self._columns["group_offsets"][self._row])

    @property
    def num_replaced_blocks_by_group(self):
        """Per group, already-reported block ids at the tail that the new ones replace."""
        column = self._columns["num_replaced_blocks"]
        return [column[segment] for segment in self._segments()]

    @property
    def num_released_blocks_by_group(self):
        """Per group, how many leading blocks a sliding window has released so far (they read -1)."""
        column = self._columns["num_released_blocks"]
        return [column[segment] for segment in self._segments()]

    def as_dict(self):
        """Every field, as plain Python values."""
        return {
            "request_id": self.request_id,
            "is_new": self.is_new,
            "new_tokens": self.new_tokens,
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

    __hash__ = None

    def __repr__(self):
        fields = ", ".join(f"{key}={value!r}" for key, value in self.as_dict().items())
        return f"RequestData({fields})"
