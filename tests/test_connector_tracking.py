"""The manager's per-request state: created on a first report or record_matched_tokens,
dropped on request_finished, never more than the live requests (this also drives the
compiled backend's hash table through growth and backward-shift deletion)."""

import random

from tokcy import RequestState
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


def test_block_counts_survive_the_slot_table_growing_and_freed_slots_being_reused(backend):
    """Each request's reported block count per layer group stays its own while the table
    of tracked requests grows under it (more than two groups keep their counts outside a
    compiled slot) and while finished requests' places are handed to new ones."""
    manager = SchedulerOutputManager()
    many = backend.Request(1, [5, 6], num_layer_groups=3)
    two = backend.Request(2, [8], num_layer_groups=2)
    for group, table in enumerate(many.block_tables):
        table.extend([10 * group, 10 * group + 1])
    two.block_tables[0].append(40)
    two.block_tables[1].extend([50, 51, 52])
    manager.build_scheduler_output([many, two], [])
    for request in (many, two):
        request.move_to_next_context_chunk()
        request.state = RequestState.GENERATION_IN_PROGRESS
    for first in range(100, 1100, 100):  # 1,000 more tracked requests, then 500 of them finished
        joining = [backend.Request(request_id, [request_id]) for request_id in range(first, first + 100)]
        manager.build_scheduler_output(joining, [])
    for request_id in range(100, 1100, 2):
        manager.request_finished(request_id)
    reused = [backend.Request(request_id, [3], num_layer_groups=1 + request_id % 4) for request_id in range(5000, 5400)]
    for request in reused:
        for table in request.block_tables:
            table.append(request.request_id)
    manager.build_scheduler_output(reused, [])
    assert manager.num_tracked_requests == 2 + 500 + 400
    many.block_tables[1].append(12)
    many.block_tables[2][1] = 99
    two.block_tables[1].truncate(1)
    many.add_new_token(7)
    output = manager.build_scheduler_output([], [many, two, reused[3]])
    assert [row.as_dict() for row in output.requests] == [
        {"request_id": 1, "is_new": False, "computed_position": 2, "num_scheduled_tokens": 1,
         "new_tokens": [7], "num_replaced_tokens": 0,
         "new_block_ids_by_group": [[], [12], [99]], "num_replaced_blocks_by_group": [0, 0, 1],
         "num_released_blocks_by_group": [0, 0, 0]},
        {"request_id": 2, "is_new": False, "computed_position": 0, "num_scheduled_tokens": 1,
         "new_tokens": [], "num_replaced_tokens": 0,
         "new_block_ids_by_group": [[], []], "num_replaced_blocks_by_group": [0, 2],
         "num_released_blocks_by_group": [0, 0]},
        {"request_id": 5003, "is_new": False, "computed_position": 0, "num_scheduled_tokens": 1,
         "new_tokens": [], "num_replaced_tokens": 0,
         "new_block_ids_by_group": [[], [], [], []], "num_replaced_blocks_by_group": [0, 0, 0, 0],
         "num_released_blocks_by_group": [0, 0, 0, 0]},
    ]
