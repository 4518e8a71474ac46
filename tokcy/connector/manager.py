"""``SchedulerOutputManager``: the connector-facing object an engine keeps for its lifetime."""

from tokcy import _backend
from tokcy.connector.output import SchedulerOutput


class SchedulerOutputManager:
    """Reports each iteration's scheduled requests to a KV-cache connector as deltas.

    Per-request state is O(1) (plus one count per layer group), kept from a request's
    first report (or ``record_matched_tokens``) until ``request_finished``. A request that
    is not scheduled in an iteration keeps its state untouched; whatever changed in the
    meantime is in its next report.

    One manager per request: the reports reset the low-water marks that the request's
    token buffer and block tables keep, so two managers reporting the same ``Request``
    would each miss what the other consumed. Requests are identified by ``request_id``.
    """

    __slots__ = ("_state",)

    def __init__(self):
        self._state = _backend.module.ReportState()

    def build_scheduler_output(self, context_requests, generation_requests):
        """Report one iteration; returns a ``SchedulerOutput``.

        ``context_requests`` are reported with the context cursor as computed position and
        the chunk size as scheduled tokens; ``generation_requests`` with n - 1 and
        1 + draft tokens. Rows keep that order (context first). Raises TypeError for an
        item that is not a ``Request`` of the live backend, and ValueError naming the
        request for a finished request, a request id given twice, or a layer-group count
        that differs from the request's earlier reports; the whole batch is checked first,
        so a failed call changes neither the manager nor any request.
        """
        num_context = len(context_requests)
        return SchedulerOutput(num_context, *self._state.build(context_requests, generation_requests))

    def record_matched_tokens(self, request_id, num_tokens):
        """Record ``num_tokens`` tokens the connector itself supplied for ``request_id``.

        They are subtracted from the computed position of that request's next report only.
        A later call before that report replaces the number (it does not add). Works for a
        request not reported yet (its state is created); ``num_tokens`` must be >= 0.
        """
        self._state.record_matched_tokens(request_id, num_tokens)

    def reset_request(self, request_id):
        """Make the request's next report a new one, with all its tokens and blocks.

        An unknown id is ignored (idempotent). The group count seen so far is kept.
        """
        self._state.reset_request(request_id)

    def request_finished(self, request_id):
        """Drop all state of ``request_id``; an unknown id is ignored (idempotent)."""
        self._state.request_finished(request_id)

    @property
    def num_tracked_requests(self):
        """How many request ids the manager holds state for."""
        return self._state.num_tracked_requests

    def tracked_request_ids(self):
        """The request ids the manager holds state for, sorted."""
        return self._state.tracked_request_ids()

    def __repr__(self):
        return f"{type(self).__name__}(num_tracked_requests={self.num_tracked_requests})"
