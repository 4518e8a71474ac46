"""The KV-connector report in plain Python/numpy: the readable reference.

``ReportState`` is the per-request state behind ``tokcy.connector.SchedulerOutputManager``
and its batch loop; ``tokcy/_core_report.pxi`` is the same algorithm in C (same results,
same errors). The rules (docs/connector.md):

* A request's first report, or its first after ``reset_request`` or after ``pause()``
  (its pause count changed), is *new*: all beam-0 tokens and all blocks of every group.
* Later reports are *cached* deltas. Each buffer (beam-0 tokens, each block table)
  remembers ``dirty_from``, the lowest position written or dropped since the last report;
  the delta starts at ``begin = min(reported, dirty_from)`` and replaces
  ``reported - begin`` already-reported entries. The report consumes ``dirty_from`` (sets
  it to the buffer's size) when it reads it, in pass 1, and puts it back if the call
  fails: a change made while the rest of the report runs (another thread) lowers it
  again and shows in the next report. The device block table reads the same buffers
  through its own mark (docs/change-tracking.md). A consumer's mirror drops the replaced entries, appends the new
  ones and sets the first ``num_released`` block ids of each group to -1 (sliding-window
  releases travel as that absolute count, never by re-sending the table).
* Three groups, and the group decides the row's numbers (n = beam-0 tokens):
  context rows: computed position = the context cursor p, less the tokens recorded by
  ``record_matched_tokens`` since the request's last report; scheduled = the chunk size.
  Generation rows: n - 1 (the newest host token is fed again) and 1 + draft tokens.
  Device-token rows (overlap scheduling: the newest token is still on the device and the
  executor feeds it at position n): n and 1. Matched tokens apply to the request's next
  report only, and only if it is a context row; any other row discards them.
* ``build`` validates the whole batch before it changes anything: a non-Request or a
  Request whose ``__init__`` never ran (TypeError), a finished request, a request id twice
  in one call, a group count that differs from the request's earlier reports, or more
  matched tokens than the context cursor (ValueError naming the request) leave the
  manager and every request as they were. Messages: ``tokcy/_report_checks.py``.
* Threads: sizes, low-water marks and storage arrays are read once, in pass 1; pass 2
  uses only those (the compiled twin runs it without the GIL, owning every buffer and
  storage array it reads or writes). A request mutated by another thread during a report
  is the caller's race (the report shows it as at plan time); it never corrupts memory.
  While a ``build`` runs, ``build``, ``record_matched_tokens``, ``reset_request`` and
  ``request_finished`` on the same state raise RuntimeError.
"""

from itertools import chain

import numpy as np

from tokcy import _invariants
from tokcy import _report_checks as checks
from tokcy._pure.request import Request
from tokcy._state import RequestState
from tokcy._tokens import as_integer

__all__ = ["ReportColumns", "ReportState"]

_FINISHED = RequestState.GENERATION_COMPLETE


def _lowest(a, b, c):
    """min(a, b, c) for ints, without the builtin's call overhead (this runs per buffer)."""
    low = a if a < b else b  # noqa: FURB136 - min() is a call, this runs per buffer
    return low if low < c else c  # noqa: FURB136


class _Slot:
    """What one request has reported so far (O(1) per request, plus one count per group)."""

    __slots__ = ("num_tokens", "num_pauses", "matched", "num_blocks", "reported")

    def __init__(self):
        self.num_tokens = 0  # beam-0 tokens reported so far (the mirror's length)
        self.num_pauses = 0  # the request's pause count at its last report
        self.matched = 0  # connector-supplied tokens to subtract on the next report
        self.num_blocks = None  # blocks reported so far, per group; None before any report
        self.reported = False  # False: the next report is a new request


class ReportState:
    """Per-request report state of one ``SchedulerOutputManager`` and its batch loop."""

    __slots__ = ("_busy", "_num_allocations", "_slots")
    __reduce__ = _invariants.refuse_pickling  # as the compiled twin (the requests' marks are part of its state)

    def __new__(cls):
        # set up here, not in __init__: __init__ called again (on a state found through the
        # collector) changes nothing, as on the compiled twin, which clears no state mid-build
        self = super().__new__(cls)
        self._slots = {}  # request id -> _Slot
        self._busy = False  # a build() is running (the compiled twin releases the GIL in it)
        self._num_allocations = [0]  # numpy arrays made for reports so far, shared with their ReportColumns
        return self

    def build(self, context_requests, generation_requests, device_token_requests=()):
        """Report one iteration; returns the report's columns: a ``ReportColumns``, whose
        ``arrays()`` are ``tokcy.connector.SchedulerOutput``'s (``num_context``: its
        context rows). Everything the report allocates is made before its commit, and the
        commit allocates nothing: a failed call (MemoryError included) changes nothing, and a
        report once committed is returned."""
        if self._busy:
            checks.busy()
        self._busy = True
        try:
            # the compiled core's order: a group that is not a list is made one first (in
            # argument order: that may run caller code), then the lists given are read
            groups = [group if type(group) is list else list(group) if type(group) is tuple
                      else checks.request_group(group, name, list)
                      for group, name in zip((context_requests, generation_requests, device_token_requests),
                                             checks.GROUPS)]
            groups = tuple(list(group) for group in groups)  # no caller code runs from here on
            fresh = {}  # slots for never-seen ids: added to the manager only once all is valid
            consumed = []  # (buffer, its dirty_from before): put back if the call fails
            try:
                report = self._plan(groups, fresh, consumed)
                columns = self._columns(len(groups[0]), report)
                commits = iter(report[0])  # (the commit's loop would make it: made here)
                self._slots.update(fresh)  # (a dict may grow: it may fail)
            except BaseException:
                for request_id in fresh:
                    self._slots.pop(request_id, None)
                for buffer, dirty_from in consumed:
                    buffer.dirty_from = min(buffer.dirty_from, dirty_from)
                raise
            # pass 2: commit the slots, allocating nothing (it sets slots of objects that exist)
            for slot, size, num_pauses, block_ends in commits:
                slot.num_tokens = size
                slot.num_pauses = num_pauses
                slot.matched = 0  # used by a context row, discarded by any other
                slot.reported = True
                slot.num_blocks = block_ends
            return columns
        finally:
            self._busy = False

    def _plan(self, groups, fresh, consumed):
        # pass 1: validate the whole batch and plan the copies; nothing is changed but the
        # connector's marks, consumed as read (put back by build() if this fails). Each
        # buffer's storage array and size are taken here, once: a request mutated by another
        # thread during the report is reported as it was at plan time (the caller's race).
        # The per-row columns are gathered as lists here too (they are only returned if
        # the whole batch is valid), and each row's commit for pass 2.
        slots = self._slots
        seen = set()
        request_ids, is_new_flags, positions, scheduled_tokens, replaced_tokens = [], [], [], [], []
        token_offsets, group_offsets, block_offsets = [0], [0], [0]
        replaced_blocks, released_blocks, token_pieces, block_pieces = [], [], [], []
        commits = []  # (slot, tokens, pause count, blocks per group) per row
        num_tokens = num_segments = num_blocks = 0
        sliced = False  # a piece is a slice of a storage (not one entry)
        for kind in (0, 1, 2):
            if not groups[kind]:  # most calls leave one or two groups empty
                continue
            for index, request in enumerate(groups[kind]):
                if not issubclass(type(request), Request):  # its real type (not __class__), as the compiled core
                    checks.not_a_request(checks.GROUPS[kind], index, request, Request)
                beam = request._beams[0]
                request_id = request._request_id
                if request._state == _FINISHED:
                    checks.finished(request_id)
                slot = slots.get(request_id)
                if slot is None:
                    slot = fresh.get(request_id)
                    if slot is None:
                        slot = fresh[request_id] = _Slot()
                if request_id in seen:
                    checks.duplicate(request_id)
                seen.add(request_id)
                tables = request._block_tables
                if slot.num_blocks is not None and len(slot.num_blocks) != len(tables):
                    checks.group_count(request_id, len(tables), len(slot.num_blocks))
                if kind == 0 and slot.matched > request._context_position:
                    checks.matched_past_position(request_id, slot.matched, request._context_position)
                is_new = not slot.reported or slot.num_pauses != request._num_pauses
                size = beam.size
                begin = 0 if is_new else _lowest(slot.num_tokens, beam.dirty_from, size)
                if kind == 0:  # context: the cursor, less connector-matched tokens
                    position = request._context_position - slot.matched
                    scheduled = request._chunk_size
                elif kind == 1:  # generation: the newest host token is re-fed
                    position = size - 1
                    scheduled = 1 + len(request._draft_tokens)
                else:  # device token: the newest token, at position n, is still on the device
                    position = size
                    scheduled = 1
                if not 0 <= begin <= size:  # the loop-boundary check (numpy would wrap a negative begin)
                    checks.outside_buffer(request_id, begin, size, size)
                segments = []
                block_ends = []  # the row's commit: blocks per group
                for group, table in enumerate(tables):
                    buffer = table._buffer
                    end = buffer.size
                    reported = 0 if is_new else slot.num_blocks[group]
                    block_begin = 0 if is_new else _lowest(reported, buffer.dirty_from, end)
                    if not 0 <= block_begin <= end:
                        checks.outside_buffer(request_id, block_begin, end, end)
                    segments.append((buffer, block_begin, end, reported - block_begin, table._num_released))
                    block_ends.append(end)
                # the row is valid: its columns, its copies (taken now: a snapshot), its commit
                request_ids.append(request_id)
                is_new_flags.append(is_new)
                positions.append(position)
                scheduled_tokens.append(scheduled)
                replaced_tokens.append(0 if is_new else slot.num_tokens - begin)
                sliced |= _take(token_pieces, beam.storage, begin, size)
                num_tokens += size - begin
                token_offsets.append(num_tokens)
                num_segments += len(segments)
                group_offsets.append(num_segments)
                for buffer, block_begin, end, block_replaced, released in segments:
                    sliced |= _take(block_pieces, buffer.storage, block_begin, end)
                    num_blocks += end - block_begin
                    block_offsets.append(num_blocks)
                    replaced_blocks.append(block_replaced)
                    released_blocks.append(released)
                commits.append((slot, size, request._num_pauses, block_ends))
                # consume the marks as read (the row is planned: nothing below can fail)
                consumed.append((beam, beam.dirty_from))
                beam.dirty_from = size
                for buffer, _, end, _, _ in segments:
                    consumed.append((buffer, buffer.dirty_from))
                    buffer.dirty_from = end
        # the int64 columns in ReportColumns' order, joined when first read
        wide = (request_ids, positions, scheduled_tokens, replaced_tokens, token_offsets, group_offsets,
                block_offsets, replaced_blocks, released_blocks)
        return commits, wide, token_pieces + block_pieces, sliced, is_new_flags, num_segments, num_tokens, num_blocks

    def _columns(self, num_context, report):
        # the columns become three arrays, one per dtype, in the compiled twin's layout
        # (ReportColumns), the int64 and bool ones when first read
        commits, wide, pieces, sliced, is_new_flags, num_segments, num_tokens, num_blocks = report
        narrow = _join(pieces, num_tokens + num_blocks, self._num_allocations) if sliced else pieces
        return ReportColumns((wide, narrow, is_new_flags, len(commits), num_segments, num_tokens, num_blocks,
                              self._num_allocations), num_context)

    def record_matched_tokens(self, request_id, num_tokens):
        request_id = as_integer(request_id, "request_id")
        num_tokens = as_integer(num_tokens, "num_tokens")
        if num_tokens < 0:
            checks.negative_matched(num_tokens)
        if self._busy:
            checks.busy()
        slot = self._slots.get(request_id)
        if slot is None:
            slot = self._slots[request_id] = _Slot()
        slot.matched = num_tokens

    def reset_request(self, request_id):
        request_id = as_integer(request_id, "request_id")
        if self._busy:
            checks.busy()
        slot = self._slots.get(request_id)
        if slot is not None:
            slot.reported = False

    def request_finished(self, request_id):
        request_id = as_integer(request_id, "request_id")
        if self._busy:
            checks.busy()
        self._slots.pop(request_id, None)

    @property
    def num_tracked_requests(self):
        return len(self._slots)

    @property
    def num_output_allocations(self):
        """Output arrays allocated so far: each report's int32 array when it copies slices
        (decode rows are Python ints until read), and its columns' arrays when they are
        first read (the twin reuses none; the compiled twin reuses its three while nobody
        references them)."""
        return self._num_allocations[0]

    def tracked_request_ids(self):
        return sorted(self._slots)


def _take(pieces, storage, begin, end):
    """Append ``storage[begin:end]`` to ``pieces``: one entry as a Python int (decode: cheaper
    than a slice), more as a slice of the storage. True if it appended a slice."""
    if end - begin == 1:
        pieces.append(storage.item(begin))
        return False
    if end > begin:
        pieces.append(storage[begin:end])
        return True
    return False


def _join(pieces, size, allocations):
    """``pieces`` (``size`` entries in all) in order, each an int (one entry) or an int32
    slice of a buffer's storage, copied now into one new int32 array (a snapshot: the
    storage may be written later; counted in ``allocations[0]``). A report whose pieces
    are all ints (decode) keeps them as a list instead, already a snapshot."""
    joined = np.empty(size, dtype=np.int32)
    allocations[0] += 1
    at = 0
    for piece in pieces:
        if type(piece) is int:
            joined[at] = piece
            at += 1
        else:
            joined[at : at + len(piece)] = piece
            at += len(piece)
    return joined


class ReportColumns:
    """One report's columns, each an attribute of ``SchedulerOutput``'s name, made (all
    twelve together) on the first read of any and kept. Made from ``parts``: ``(wide,
    narrow, flags, batch, num_segments, num_tokens, num_blocks, allocations)``. ``wide``:
    the nine int64 columns' lists (request ids, positions, scheduled and replaced tokens:
    one per row; token and group offsets: one per row and one; block offsets: one per
    segment and one; replaced and released blocks: one per segment), one after another in
    one array once read; ``narrow``: the tokens then the block ids (an int32 array, or a
    list of ints); ``flags``: ``is_new``. All are snapshots nothing else holds; the arrays
    are sliced into the columns in the layout the compiled twin keeps in arrays it reuses.
    ``allocations``: the manager's count of the arrays made for its reports, a one-item
    list that making the arrays adds to. ``num_context``: the report's context rows (they
    come first)."""

    __reduce__ = _invariants.refuse_pickling  # as the compiled twin (a SchedulerOutput pickles its columns)

    __slots__ = ("_parts", "_columns", "_num_context")

    def __init__(self, parts, num_context):
        self._parts = parts
        self._columns = None
        self._num_context = num_context

    @property
    def num_context(self):
        """The report's context rows (they come first)."""
        return self._num_context

    def arrays(self):
        """The twelve columns in ``SchedulerOutput``'s order (made once, on their first read)."""
        columns = self._columns
        if columns is None:
            columns = self._columns = self._made()
        return columns

    def _made(self):
        wide, narrow, flags, b, s, t, num_blocks, allocations = self._parts
        wide = np.fromiter(chain.from_iterable(wide), dtype=np.int64, count=6 * b + 3 * s + 3)
        flags = np.array(flags, dtype=np.bool_)
        allocations[0] += 2
        if type(narrow) is list:
            narrow = np.array(narrow, dtype=np.int32)
            allocations[0] += 1
        return (
            wide[0:b], flags, wide[b : 2 * b], wide[2 * b : 3 * b], wide[3 * b : 4 * b],
            wide[4 * b : 5 * b + 1], narrow[0:t], wide[5 * b + 1 : 6 * b + 2], wide[6 * b + 2 : 6 * b + 3 + s],
            narrow[t : t + num_blocks], wide[6 * b + 3 + s : 6 * b + 3 + 2 * s],
            wide[6 * b + 3 + 2 * s : 6 * b + 3 + 3 * s],
        )

    # each column by name (SchedulerOutput's read it), written out: stubtest reads only these
    @property
    def request_ids(self):
        return self.arrays()[0]

    @property
    def is_new(self):
        return self.arrays()[1]

    @property
    def computed_positions(self):
        return self.arrays()[2]

    @property
    def num_scheduled_tokens(self):
        return self.arrays()[3]

    @property
    def num_replaced_tokens(self):
        return self.arrays()[4]

    @property
    def token_offsets(self):
        return self.arrays()[5]

    @property
    def tokens(self):
        return self.arrays()[6]

    @property
    def group_offsets(self):
        return self.arrays()[7]

    @property
    def block_offsets(self):
        return self.arrays()[8]

    @property
    def block_ids(self):
        return self.arrays()[9]

    @property
    def num_replaced_blocks(self):
        return self.arrays()[10]

    @property
    def num_released_blocks(self):
        return self.arrays()[11]
