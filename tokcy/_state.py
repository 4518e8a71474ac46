"""The request lifecycle states, shared by both backends."""

import enum


class RequestState(enum.IntEnum):
    """Where a request is in its life; the engine moves it forward.

    ``pause()`` sends a request back to ``CONTEXT_INIT`` so that its tokens are
    recomputed as a prompt.
    """

    CONTEXT_INIT = 0
    GENERATION_IN_PROGRESS = 1
    GENERATION_COMPLETE = 2
