"""Hot loop 2, the KV-connector report, in plain Python/numpy: the readable reference.

``ReportState`` is the per-request state behind ``tokcy.connector.SchedulerOutputManager``
and its batch loop; ``tokcy/_core_report.pxi`` is the same algorithm in C (same results,
same errors). The rules (DESIGN.md, "Hot loop 2"):

* A request's first report, or its first after ``reset_request`` or after ``pause()``
  (its pause count changed), is *new*: all beam-0 tokens and all blocks of every group.
* Later reports are *cached* deltas. Each buffer (beam-0 tokens, each block table)
  remembers ``dirty_from``, the lowest position written or dropped since the last report;
  the delta starts at ``begin = min(reported, dirty_from)`` and replaces
  ``reported - begin`` already-reported entries. After the report ``dirty_from`` is reset
  to the buffer's size. A consumer's mirror drops the replaced entries, appends the new
  ones and sets the first ``num_released`` block ids of each group to -1 (sliding-window
  releases travel as that absolute count, never by re-sending the table).
* computed position: the context cursor for a context request, n - 1 for a generation
  request (n = beam-0 tokens), minus the tokens recorded by ``record_matched_tokens``
  (on the request's next report only). Scheduled tokens: the chunk size in context,
  1 + draft tokens in generation. Which list a request comes in decides which.
* ``build`` validates the whole batch before it changes anything: a non-Request
  (TypeError), a finished request, a request id twice in one call, or a group count that
  differs from the request's earlier reports (ValueError naming the request) leave the
  manager and every request as they were.
"""

import numpy as np

from tokcy._pure.request import Request
from tokcy._state import RequestState
from tokcy._tokens import as_index

__all__ = ["ReportState"]


class _Slot:
    """What one request has reported so far (O(1) per request, plus one count per group)."""

    __slots__ = ("num_tokens", "num_pauses", "matched", "num_blocks", "reported")

    def __init__(self):
        self.num_tokens = 0  # beam-0 tokens reported so far (the mirror's length)
        self.num_pauses = 0  # the request's pause count at its last report
        self.matched = 0  # connector-supplied tokens to subtract on the next report
        self.num_blocks = []  # blocks reported so far, per group; [] before any report
        self.reported = False  # False: the next report is a new request


class ReportState:
    """Per-request report state of one ``SchedulerOutputManager`` and its batch loop."""

    __slots__ = ("_slots",)

    def __init__(self):
        self._slots = {}  # request id -> _Slot

    def build(self, context_requests, generation_requests):
        """Report one iteration; returns the columnar arrays (see tokcy.connector.SchedulerOutput)."""
        context = list(context_requests)
        generation = list(generation_requests)
        num_context = len(context)
        fresh = {}  # slots for never-seen ids: added to the manager only once all is valid
        seen = set()
        rows = []
        # pass 1: validate the whole batch and plan the copies; nothing is changed
        for row, request in enumerate(context + generation):
            if not isinstance(request, Request):
                name = "context_requests" if row < num_context else "generation_requests"
                position = row if row < num_context else row - num_context
                raise TypeError(f"{name}[{position}] must be a Request, not {type(request).__name__}")
            request_id = request._request_id
            if request._state == RequestState.GENERATION_COMPLETE:
                raise ValueError(f"request {request_id} is finished (GENERATION_COMPLETE) and cannot be scheduled")
            slot = self._slots.get(request_id)
            if slot is None:
                slot = fresh.get(request_id)
                if slot is None:
                    slot = fresh[request_id] = _Slot()
            if request_id in seen:
                raise ValueError(f"request {request_id} is scheduled more than once in this call")
            seen.add(request_id)
            tables = request._block_tables
            if slot.num_blocks and len(slot.num_blocks) != len(tables):
                raise ValueError(
                    f"request {request_id} has {len(tables)} layer groups but its earlier reports "
                    f"had {len(slot.num_blocks)}"
                )
            is_new = not slot.reported or slot.num_pauses != request._num_pauses
            beam = request._beams[0]
            size = beam.size
            begin = 0 if is_new else min(slot.num_tokens, beam.dirty_from, size)
            if row < num_context:
                position = request._context_position - slot.matched
                scheduled = request._chunk_size
            else:
                position = size - 1 - slot.matched
                scheduled = 1 + len(request._draft_tokens)
            segments = []
            for group, table in enumerate(tables):
                buffer = table._buffer
                reported = 0 if is_new else slot.num_blocks[group]
                block_begin = 0 if is_new else min(reported, buffer.dirty_from, buffer.size)
                segments.append((buffer, block_begin, reported - block_begin, table._num_released))
            replaced = 0 if is_new else slot.num_tokens - begin
            rows.append((request, slot, is_new, beam, begin, replaced, position, scheduled, segments))

        # pass 2: copy the deltas, then commit
        self._slots.update(fresh)
        batch = len(rows)
        request_ids = np.empty(batch, dtype=np.int64)
        is_new = np.empty(batch, dtype=np.bool_)
        positions = np.empty(batch, dtype=np.int64)
        scheduled = np.empty(batch, dtype=np.int64)
        replaced_tokens = np.empty(batch, dtype=np.int64)
        token_offsets = np.zeros(batch + 1, dtype=np.int64)
        group_offsets = np.zeros(batch + 1, dtype=np.int64)
        token_pieces, block_pieces, block_counts, replaced_blocks, released_blocks = [], [], [0], [], []
        for row, (request, slot, new, beam, begin, replaced, position, count, segments) in enumerate(rows):
            request_ids[row] = request._request_id
            is_new[row] = new
            positions[row] = position
            scheduled[row] = count
            replaced_tokens[row] = replaced
            token_pieces.append(beam.storage[begin : beam.size])
            token_offsets[row + 1] = token_offsets[row] + beam.size - begin
            group_offsets[row + 1] = group_offsets[row] + len(segments)
            beam.dirty_from = beam.size
            slot.num_tokens = beam.size
            slot.num_pauses = request._num_pauses
            slot.matched = 0
            slot.reported = True
            slot.num_blocks = []
            for buffer, block_begin, block_replaced, released in segments:
                block_pieces.append(buffer.storage[block_begin : buffer.size])
                block_counts.append(buffer.size - block_begin)
                replaced_blocks.append(block_replaced)
                released_blocks.append(released)
                buffer.dirty_from = buffer.size
                slot.num_blocks.append(buffer.size)
        return (
            request_ids,
            is_new,
            positions,
            scheduled,
            replaced_tokens,
            token_offsets,
            _concatenate(token_pieces),
            group_offsets,
            np.cumsum(np.array(block_counts, dtype=np.int64)),
            _concatenate(block_pieces),
            np.array(replaced_blocks, dtype=np.int64),
            np.array(released_blocks, dtype=np.int64),
        )

    def record_matched_tokens(self, request_id, num_tokens):
        request_id = as_index(request_id, "request_id")
        num_tokens = as_index(num_tokens, "num_tokens")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        slot = self._slots.get(request_id)
        if slot is None:
            slot = self._slots[request_id] = _Slot()
        slot.matched = num_tokens

    def reset_request(self, request_id):
        slot = self._slots.get(as_index(request_id, "request_id"))
        if slot is not None:
            slot.reported = False

    def request_finished(self, request_id):
        self._slots.pop(as_index(request_id, "request_id"), None)

    @property
    def num_tracked_requests(self):
        return len(self._slots)

    def tracked_request_ids(self):
        return sorted(self._slots)


def _concatenate(pieces):
    return np.concatenate(pieces).astype(np.int32, copy=False) if pieces else np.empty(0, dtype=np.int32)
