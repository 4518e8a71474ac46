"""Helpers shared by the tests of Python code run in the middle of a call and of memory
safety: two ways to run such code (a collection's callbacks, a weak reference's callback as
a buffer's old storage goes), a batch of decoding requests, and every public observable of a
request.
"""

import gc
import weakref
from contextlib import contextmanager

from tokcy import RequestState


@contextmanager
def at_next_collection(action, slack=1):
    """Run ``action`` once, from a gc callback, at the next collection: it starts once
    ``slack`` more tracked objects are allocated than freed. Yields a dict: set its
    "calling" to True just before the call under test (a store that allocates nothing);
    "ran" then says where the action ran: None (no collection), "inside" or "outside"."""
    state = {"calling": False, "ran": None}

    def callback(phase, info):
        if phase == "start" and state["ran"] is None:
            state["ran"] = "inside" if state["calling"] else "outside"
            action()

    threshold = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(max(gc.get_count()[0] + slack, 1))
    try:
        yield state
    finally:
        state["calling"] = False
        gc.set_threshold(*threshold)
        gc.callbacks.remove(callback)


def when_storage_retires(view, action):
    """Run ``action`` once, from a weak reference's callback, when the array ``view`` was
    sliced from (its base, which the buffer keeps) is dropped: the buffer drops it inside
    the next write that moves it to new storage, once the caller has dropped ``view`` (a
    write copies first while a view may exist). This is how Python code runs inside a
    write that makes storage: the compiled core allocates nothing there that could start
    a collection. Returns a dict: "ran"."""
    state = {"ran": False}

    def callback(_):
        state["ran"] = True
        action()

    state["guard"] = weakref.ref(view.base, callback)
    return state


def decode_requests(backend, count):
    requests = []
    for index in range(count):
        request = backend.Request(index, [10 + index, 20 + index, 30 + index])
        request.state = RequestState.GENERATION_IN_PROGRESS
        request.block_tables[0].extend([index])
        requests.append(request)
    return requests


def observe(request):
    """Every public observable of a request (tokens, fields, block tables)."""
    return (
        request.request_id,
        request.beam_width,
        request.get_tokens(),
        request.prompt_len,
        request.orig_prompt_len,
        request.max_new_tokens,
        int(request.state),
        request.seq_slot,
        request.context_current_position,
        request.context_chunk_size,
        request.draft_tokens,
        [(table.tolist(), table.num_released) for table in request.block_tables],
    )


class RefusesIteration:
    """A batch whose ``__iter__`` raises TypeError itself (not a batch that is not iterable)."""

    def __iter__(self):
        raise TypeError("this batch is not ready")


class IndexRuns:
    """An integer argument (a batch size, ``max_draft_len``) whose conversion
    (``__index__``) first runs ``action``: caller code in the middle of a call."""

    def __init__(self, value, action):
        self.value, self.action = value, action

    def __index__(self):
        self.action()
        return self.value
