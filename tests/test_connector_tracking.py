"""The manager's per-request state: created on a first report or record_matched_tokens,
dropped on request_finished, never more than the live requests (this also drives the
compiled backend's hash table through growth and backward-shift deletion)."""

import random

from tokcy.connector import SchedulerOutputManager


def test_tracked_ids_follow_joins_and_finishes(backend):
    rng = random.Random(4)
    manager = SchedulerOutputManager()
    live = {}
    for step in range(4000):
        if live and rng.random() < 0.45:
            request_id = rng.choice(list(live))
            del live[request_id]
            manager.request_finished(request_id)
        else:
            # clustered ids (consecutive, and multiples of a power of two) and random ones
            request_id = rng.choice([step, step * 1024, rng.randrange(-(2**62), 2**62)])
            if request_id in live:
                continue
            if rng.random() < 0.5:
                manager.record_matched_tokens(request_id, 1)
            else:
                manager.build_scheduler_output([backend.Request(request_id, [1, 2, 3])], [])
            live[request_id] = True
        if step % 97 == 0:
            assert manager.tracked_request_ids() == sorted(live)
    assert manager.tracked_request_ids() == sorted(live)
    assert manager.num_tracked_requests == len(live)
    for request_id in list(live):
        manager.request_finished(request_id)
    assert manager.num_tracked_requests == 0 and manager.tracked_request_ids() == []


def test_reports_stay_correct_across_many_requests(backend):
    """Many tracked requests at once: each one's state is its own."""
    manager = SchedulerOutputManager()
    requests = [backend.Request(request_id * 4096, [request_id] * 3) for request_id in range(600)]
    output = manager.build_scheduler_output(requests, [])
    assert output.is_new.all() and output.tokens.tolist() == [r for r in range(600) for _ in range(3)]
    for request in requests[::3]:
        request.add_new_token(7)
    output = manager.build_scheduler_output([], requests[1:])
    assert not output.is_new.any()
    assert output.token_offsets[-1] == len(range(3, 600, 3))
    assert manager.build_scheduler_output([requests[0]], []).requests[0].new_tokens == [7]
