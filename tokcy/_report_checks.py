"""Errors of the KV-connector report (``tokcy.connector``), shared by both backends.

``tokcy/_core_report.pxi`` and ``tokcy/_pure/report.py`` call these only on their slow
paths, so a bad batch raises the same exception with the same message whichever backend
is live, and the two cannot drift. Each function raises, but request_group, which reads a group.
"""

CONTEXT = "context_requests"
GENERATION = "generation_requests"
DEVICE_TOKEN = "device_token_requests"
GROUPS = (CONTEXT, GENERATION, DEVICE_TOKEN)


def _qualified(cls):
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def request_group(group, name, container=tuple):
    """``container(group)``, for a group of requests given as an iterable other than a list
    or tuple; a TypeError naming the argument when it is not iterable at all (a single
    Request passed where a list of them goes, say), the same on both backends."""
    try:
        items = iter(group)
    except TypeError:
        if hasattr(type(group), "__iter__"):  # its own __iter__ raised: the caller's error, as raised
            raise
        raise TypeError(f"{name} must be a list (or another iterable) of Requests, not a "
                        f"{type(group).__name__}") from None
    return container(items)


def not_a_request(group, index, obj, expected):
    """``obj`` is not a ``Request`` of the live backend (``expected``)."""
    given = type(obj)
    message = f"{group}[{index}] must be a Request, not {_qualified(given)}"
    if given.__qualname__ == expected.__qualname__:  # e.g. the other backend's Request
        message += f" (the live backend takes {_qualified(expected)})"
    raise TypeError(message)


def finished(request_id):
    raise ValueError(f"request {request_id} is finished (GENERATION_COMPLETE) and cannot be scheduled")


def duplicate(request_id):
    raise ValueError(f"request {request_id} is scheduled more than once in this call")


def group_count(request_id, num_groups, reported_groups):
    raise ValueError(
        f"request {request_id} has {num_groups} layer groups but its earlier reports had {reported_groups}"
    )


def matched_past_position(request_id, matched, position):
    raise ValueError(
        f"request {request_id}: {matched} connector-matched tokens exceed its context position {position} "
        f"(recorded tokens wait for the request's next report, even across a pause(): "
        f"record_matched_tokens({request_id}, 0) drops them)"
    )


def negative_matched(num_tokens):
    raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")


def outside_buffer(request_id, begin, end, size):
    raise ValueError(f"request {request_id}: the report's copy [{begin}, {end}) lies outside its {size} entries")


def busy():
    raise RuntimeError("this SchedulerOutputManager is building a report in another thread")
