"""``SchedulerOutputManager``: the connector-facing object an engine keeps for its lifetime."""

from tokcy import _backend
from tokcy.connector.output import new_output


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

    def __reduce__(self):
        raise TypeError("a SchedulerOutputManager cannot be pickled or copied: what it has reported lives in the "
                        "requests' change marks too, so a copy and the original would each miss what the other "
                        "reports; keep one manager for the requests")

    def build_scheduler_output(self, context_requests, generation_requests, device_token_requests=()):
        """Report one iteration; returns a ``SchedulerOutput``. Rows: context, generation,
        then device-token requests, each group in the order given (n = beam-0 tokens):

        * ``context_requests``: computed position = the context cursor p, less the tokens
          recorded by ``record_matched_tokens`` since the last report; scheduled = the chunk.
        * ``generation_requests``: n - 1 (the newest host token is fed again) and 1 + drafts.
        * ``device_token_requests`` (overlap scheduling): the newest token is still on the
          device and the executor feeds it at position n, so KV of tokens 0..n-1 is computed:
          n and 1. The new tokens are the host's delta, as for every row.

        Raises TypeError for an item that is not a ``Request`` of the live backend, and ValueError naming the request for a finished
        request, a request id given twice, a layer-group count that differs from the
        request's earlier reports, or matched tokens beyond a context row's cursor; the
        whole batch is checked first, so a failed call changes neither the manager nor any
        request. RuntimeError if a report of this manager is being built in another thread.

        Threads: a large report (256 Ki tokens and blocks or more) copies with the GIL
        released, a small one keeps it (releasing would cost more than the copy); every
        buffer the copy reads is owned for the call, so another thread mutating or dropping a scheduled request cannot
        corrupt memory, but what it changes during the call is its own race (the report
        shows each request as it was when the call read it).
        """
        # made first: once build() commits, nothing may fail (a report is never lost)
        output = new_output()
        output._source = self._state.build(context_requests, generation_requests, device_token_requests)
        return output

    def record_matched_tokens(self, request_id, num_tokens):
        """Record ``num_tokens`` tokens the connector itself supplied for ``request_id``.

        They apply to the request's next report only: if it is a context row, its computed
        position is the cursor minus ``num_tokens`` (ValueError naming the request, nothing
        changed, if that would be negative); any other row discards them. A later call
        before that report replaces the number (it does not add). Works for a request not
        reported yet (its state is created); ``num_tokens`` < 0 is a ValueError.
        """
        self._state.record_matched_tokens(request_id, num_tokens)

    def reset_request(self, request_id):
        """Make the request's next report a new one, with all its tokens and blocks.

        An unknown id is ignored (idempotent). The group count seen so far and pending
        matched tokens are kept.
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
