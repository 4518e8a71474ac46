"""One request's reports, exact, step by step, and the connector's rules in docs/connector.md.

The worked scenario: a 64-token prompt reported whole, then decode steps of 1, 0 and 3 new
tokens and a truncation, each token copied into a report exactly once; then the rules one
at a time (shrink and rewrite, sliding-window releases, matched tokens, device-token rows,
pause and reset, finished requests, the columns).
"""

import numpy as np
import pytest

from tokcy import RequestState
from tokcy.connector import RequestData, SchedulerOutput, SchedulerOutputManager

PROMPT = list(range(1000, 1064))  # 64 tokens


def decode_request(backend, request_id=7, prompt=PROMPT, num_layer_groups=1):
    request = backend.Request(request_id, prompt, num_layer_groups=num_layer_groups)
    for table in request.block_tables:
        table.extend([10, 11])  # 64 tokens, 32 per block
    return request


def only(output):
    rows = output.requests
    assert len(rows) == 1
    return rows[0]


def test_one_request_s_reports_copy_each_token_once(backend):
    manager = SchedulerOutputManager()
    request = decode_request(backend)
    carried = 0

    # context iteration: the whole prompt, new request
    output = manager.build_scheduler_output([request], [])
    assert len(output.new_requests) == 1 and output.cached_requests == []
    data = output.new_requests[0]
    assert data.request_id == 7
    assert data.new_tokens == PROMPT
    assert data.new_block_ids == [10, 11]
    assert data.computed_position == 0
    assert data.num_scheduled_tokens == 64
    assert data.num_replaced_tokens == 0
    carried += len(data.new_tokens)
    request.move_to_next_context_chunk()
    request.state = RequestState.GENERATION_IN_PROGRESS

    # generation, one new token (and a new block: 65 tokens need three)
    request.add_new_token(2000)
    request.block_tables[0].append(12)
    output = manager.build_scheduler_output([], [request])
    assert output.new_requests == [] and len(output.cached_requests) == 1
    data = output.cached_requests[0]
    assert (data.new_tokens, data.computed_position, data.num_replaced_tokens) == ([2000], 64, 0)
    assert data.new_block_ids == [12]
    assert data.num_scheduled_tokens == 1
    carried += len(data.new_tokens)

    # generation, no new token
    data = only(manager.build_scheduler_output([], [request]))
    assert (data.new_tokens, data.computed_position, data.num_replaced_tokens) == ([], 64, 0)
    assert data.new_block_ids == []
    carried += len(data.new_tokens)

    # generation, three new tokens
    for token in (2001, 2002, 2003):
        request.add_new_token(token)
    data = only(manager.build_scheduler_output([], [request]))
    assert (data.new_tokens, data.computed_position, data.num_replaced_tokens) == ([2001, 2002, 2003], 67, 0)
    carried += len(data.new_tokens)

    # the token list dropped two tokens (68 -> 66)
    request.truncate(66)
    data = only(manager.build_scheduler_output([], [request]))
    assert (data.new_tokens, data.computed_position, data.num_replaced_tokens) == ([], 65, 2)
    carried += len(data.new_tokens)

    # 64 prompt tokens + 1 + 0 + 3 + 0 were really written: each copied once
    assert carried == 68
    assert request.get_num_tokens(0) == 66


def test_shrink_then_regrowth_between_reports_is_reported(backend):
    """A token rewritten at an already-reported position (shrink, then regrowth past the
    reported length): a report that only sent the tokens past the last reported length would
    miss it."""
    manager = SchedulerOutputManager()
    request = decode_request(backend)
    request.state = RequestState.GENERATION_IN_PROGRESS
    for token in (1, 2, 3):
        request.add_new_token(token)
    manager.build_scheduler_output([], [request])  # reports 67 tokens
    request.truncate(65)  # drafts 2, 3 rejected ...
    for token in (4, 5, 6):  # ... and regrowth past the reported length
        request.add_new_token(token)
    data = only(manager.build_scheduler_output([], [request]))
    assert data.num_replaced_tokens == 2
    assert data.new_tokens == [4, 5, 6]
    assert data.computed_position == 67
    # the same for blocks: block 11 freed and re-allocated as 21, then 22 added
    request.block_tables[0].truncate(1)
    request.block_tables[0].extend([21, 22])
    data = only(manager.build_scheduler_output([], [request]))
    assert data.new_block_ids == [21, 22]
    assert data.num_replaced_blocks_by_group == [1]
    assert data.new_tokens == [] and data.num_replaced_tokens == 0
    # a block re-written in place at a reported ordinal
    request.block_tables[0][1] = 31
    data = only(manager.build_scheduler_output([], [request]))
    assert (data.new_block_ids, data.num_replaced_blocks_by_group) == ([31, 22], [2])


def test_sliding_window_release_is_a_count_not_a_resend(backend):
    manager = SchedulerOutputManager()
    request = decode_request(backend, num_layer_groups=2)
    request.block_tables[1].extend([12, 13])
    manager.build_scheduler_output([request], [])
    request.block_tables[1].release_front(3)
    request.block_tables[1].append(14)
    data = only(manager.build_scheduler_output([request], []))
    assert data.new_block_ids_by_group == [[], [14]]
    assert data.num_replaced_blocks_by_group == [0, 0]
    assert data.num_released_blocks_by_group == [0, 3]
    # the count is absolute: it is repeated, and carries nothing, on later reports
    data = only(manager.build_scheduler_output([request], []))
    assert data.new_block_ids_by_group == [[], []]
    assert data.num_released_blocks_by_group == [0, 3]
    assert request.block_tables[1].tolist() == [-1, -1, -1, 13, 14]


def test_context_chunks_and_matched_tokens(backend):
    manager = SchedulerOutputManager()
    request = decode_request(backend)
    request.context_chunk_size = 16
    manager.record_matched_tokens(7, 8)  # before the first report: state is created
    assert manager.tracked_request_ids() == [7]
    request.context_current_position = 8  # the connector supplied the first 8 tokens
    data = only(manager.build_scheduler_output([request], []))
    assert (data.computed_position, data.num_scheduled_tokens, data.is_new) == (0, 16, True)
    request.move_to_next_context_chunk()
    data = only(manager.build_scheduler_output([request], []))  # subtracted on the next report only
    assert (data.computed_position, data.num_scheduled_tokens, data.is_new) == (24, 16, False)
    assert data.new_tokens == []


def test_matched_tokens_apply_to_a_later_cached_context_row(backend):
    """Matched tokens are not tied to the first report: any next report that is a context row."""
    manager = SchedulerOutputManager()
    request = decode_request(backend)
    request.context_chunk_size = 16
    manager.build_scheduler_output([request], [])
    request.move_to_next_context_chunk()  # cursor 16
    manager.record_matched_tokens(7, 5)
    manager.record_matched_tokens(7, 3)  # replaces, does not add
    manager.build_scheduler_output([], [])  # not scheduled: still pending
    data = only(manager.build_scheduler_output([request], []))
    assert (data.is_new, data.computed_position, data.num_scheduled_tokens) == (False, 13, 16)
    data = only(manager.build_scheduler_output([request], []))  # used once
    assert data.computed_position == 16
    manager.record_matched_tokens(7, 16)  # exactly the cursor: position 0
    assert only(manager.build_scheduler_output([request], [])).computed_position == 0
    manager.record_matched_tokens(7, 0)
    assert only(manager.build_scheduler_output([request], [])).computed_position == 16


def test_matched_tokens_are_discarded_by_a_generation_or_device_row(backend):
    manager = SchedulerOutputManager()
    request = decode_request(backend)
    manager.build_scheduler_output([request], [])
    request.move_to_next_context_chunk()
    request.state = RequestState.GENERATION_IN_PROGRESS
    request.add_new_token(9)
    request.draft_tokens = [1, 2]
    manager.record_matched_tokens(7, 3)
    data = only(manager.build_scheduler_output([], [request]))
    assert (data.computed_position, data.num_scheduled_tokens) == (64, 3)  # not 61: discarded
    request.draft_tokens = []
    data = only(manager.build_scheduler_output([], [request]))
    assert data.computed_position == 64
    manager.record_matched_tokens(7, 50)
    data = only(manager.build_scheduler_output([], [], [request]))
    assert (data.computed_position, data.num_scheduled_tokens) == (65, 1)
    # discarded, not kept for a later context row: after a pause the cursor is 0 again
    request.pause(100)
    data = only(manager.build_scheduler_output([request], []))
    assert (data.is_new, data.computed_position) == (True, 0)


def test_matched_tokens_beyond_the_cursor(backend):
    manager = SchedulerOutputManager()
    request = decode_request(backend)
    request.context_chunk_size = 16
    other = decode_request(backend, 8)
    manager.record_matched_tokens(7, 1)  # cursor 0: one matched token is too many
    with pytest.raises(ValueError, match="request 7: 1 connector-matched tokens exceed its context position 0"):
        manager.build_scheduler_output([other, request], [])
    assert manager.tracked_request_ids() == [7]  # request 8 was not added
    request.context_current_position = 1  # now it fits, and is still pending
    data = only(manager.build_scheduler_output([request], []))
    assert (data.is_new, data.computed_position, data.new_tokens) == (True, 0, PROMPT)
    with pytest.raises(ValueError, match="num_tokens must be >= 0, got -2"):
        manager.record_matched_tokens(7, -2)
    with pytest.raises(ValueError, match="num_tokens must be >= 0"):
        manager.record_matched_tokens(99, -1)
    assert manager.tracked_request_ids() == [7]


def test_device_token_requests(backend):
    """Overlap scheduling: the newest token is on the device, fed at position n = host tokens."""
    manager = SchedulerOutputManager()
    context = decode_request(backend, 1, prompt=[1, 2, 3, 4])
    context.context_chunk_size = 2
    generation = decode_request(backend, 2, prompt=[5, 6])
    generation.state = RequestState.GENERATION_IN_PROGRESS
    generation.draft_tokens = [8]
    device = decode_request(backend, 3, prompt=[7, 7, 7])
    device.state = RequestState.GENERATION_IN_PROGRESS
    device.draft_tokens = [1, 2]  # not counted: a device-token row computes one token
    output = manager.build_scheduler_output([context], [generation], [device])
    assert output.request_ids.tolist() == [1, 2, 3] and output.num_context_requests == 1
    assert output.is_new.tolist() == [True, True, True]
    assert output.computed_positions.tolist() == [0, 1, 3]
    assert output.num_scheduled_tokens.tolist() == [2, 2, 1]
    assert output.tokens.tolist() == [1, 2, 3, 4, 5, 6, 7, 7, 7]
    assert output.token_offsets.tolist() == [0, 4, 6, 9]
    assert output.group_offsets.tolist() == [0, 1, 2, 3]

    # the device's token (n = 3 -> 4) reaches the host; the next token is on the device again
    device.add_new_token(70)
    data = only(manager.build_scheduler_output([], [], (device,)))
    assert data.as_dict() == {
        "request_id": 3,
        "is_new": False,
        "new_tokens": [70],
        "new_block_ids_by_group": [[]],
        "computed_position": 4,
        "num_scheduled_tokens": 1,
        "num_replaced_tokens": 0,
        "num_replaced_blocks_by_group": [0],
        "num_released_blocks_by_group": [0],
    }
    # nothing reached the host in between: same position, no new tokens
    data = only(manager.build_scheduler_output([], [], [device]))
    assert (data.new_tokens, data.computed_position, data.num_scheduled_tokens) == ([], 4, 1)
    # two tokens arrive and a block is added; the request goes back to a generation row
    device.add_new_token(71)
    device.add_new_token(72)
    device.block_tables[0].append(12)
    device.draft_tokens = []
    data = only(manager.build_scheduler_output([], [device]))
    assert (data.new_tokens, data.new_block_ids, data.computed_position, data.num_scheduled_tokens) == (
        [71, 72], [12], 5, 1
    )
    # a device row after a rewrite of the tail: the delta replaces, the position is n
    device.truncate(5)
    device.add_new_token(80)
    data = only(manager.build_scheduler_output([], [], [device]))
    assert (data.new_tokens, data.num_replaced_tokens, data.computed_position) == ([80], 1, 6)
    assert device.get_tokens(0) == [7, 7, 7, 70, 71, 80]
    # all three groups are checked for duplicates and bad items, with the group named
    with pytest.raises(ValueError, match="request 3 is scheduled more than once"):
        manager.build_scheduler_output([], [device], [device])
    with pytest.raises(TypeError, match=r"device_token_requests\[1\] must be a Request, not int"):
        manager.build_scheduler_output([], [], [device, 5])


def test_pause_and_reset_make_the_next_report_new(backend):
    manager = SchedulerOutputManager()
    request = decode_request(backend)
    request.state = RequestState.GENERATION_IN_PROGRESS
    request.add_new_token(5)
    manager.build_scheduler_output([], [request])
    manager.reset_request(7)
    data = only(manager.build_scheduler_output([], [request]))
    assert data.is_new and data.new_tokens == PROMPT + [5] and data.new_block_ids == [10, 11]
    assert not only(manager.build_scheduler_output([], [request])).is_new
    request.pause(100)  # prompt is now 65 tokens, blocks dropped
    request.block_tables[0].extend([40, 41, 42])
    data = only(manager.build_scheduler_output([request], []))
    assert data.is_new and data.new_tokens == PROMPT + [5] and data.new_block_ids == [40, 41, 42]
    assert data.computed_position == 0 and data.num_scheduled_tokens == 65
    assert not only(manager.build_scheduler_output([request], [])).is_new


def test_unscheduled_requests_keep_their_state(backend):
    manager = SchedulerOutputManager()
    first, second = decode_request(backend, 1), decode_request(backend, 2)
    manager.build_scheduler_output([first, second], [])
    second.truncate(64)
    second.block_tables[0].truncate(1)
    second.block_tables[0].append(99)
    for _ in range(3):
        manager.build_scheduler_output([first], [])
    data = only(manager.build_scheduler_output([second], []))
    assert (data.is_new, data.new_block_ids, data.num_replaced_blocks_by_group) == (False, [99], [1])


def test_finished_requests_drop_their_state(backend):
    manager = SchedulerOutputManager()
    requests = [decode_request(backend, request_id) for request_id in range(50)]
    manager.build_scheduler_output(requests, [])
    assert manager.num_tracked_requests == 50
    for request in requests[:45]:
        manager.request_finished(request.request_id)
    manager.request_finished(12345)  # unknown: ignored
    manager.request_finished(3)  # twice: ignored
    manager.reset_request(12345)  # unknown: ignored, not tracked
    assert manager.tracked_request_ids() == list(range(45, 50))
    assert manager.num_tracked_requests == 5
    # an id coming back after it finished is a new request
    data = only(manager.build_scheduler_output([decode_request(backend, 3)], []))
    assert data.is_new


def test_columnar_arrays(backend):
    manager = SchedulerOutputManager()
    context = decode_request(backend, 1, prompt=[1, 2, 3], num_layer_groups=2)
    generation = decode_request(backend, 2, prompt=[4, 5], num_layer_groups=1)
    generation.state = RequestState.GENERATION_IN_PROGRESS
    output = manager.build_scheduler_output([context], [generation])
    assert isinstance(output, SchedulerOutput) and len(output) == 2
    assert output.num_context_requests == 1
    assert output.request_ids.tolist() == [1, 2] and output.request_ids.dtype == np.int64
    assert output.is_new.tolist() == [True, True] and output.is_new.dtype == np.bool_
    assert output.computed_positions.tolist() == [0, 1]
    assert output.num_scheduled_tokens.tolist() == [3, 1]
    assert output.num_replaced_tokens.tolist() == [0, 0]
    assert output.tokens.dtype == np.int32 and output.tokens.tolist() == [1, 2, 3, 4, 5]
    assert output.token_offsets.tolist() == [0, 3, 5]
    assert output.group_offsets.tolist() == [0, 2, 3]
    assert output.block_offsets.tolist() == [0, 2, 4, 6]
    assert output.block_ids.dtype == np.int32 and output.block_ids.tolist() == [10, 11, 10, 11, 10, 11]
    assert output.num_replaced_blocks.tolist() == [0, 0, 0]
    assert output.num_released_blocks.tolist() == [0, 0, 0]
    data = output.request_data(0)
    assert isinstance(data, RequestData)
    assert data.new_block_ids_by_group == [[10, 11], [10, 11]]
    assert data.num_layer_groups == 2
    assert output.new_requests[0] is output.new_requests[0] is data  # built once, each list a new one
    with pytest.raises(IndexError):
        output.request_data(2)
    empty = manager.build_scheduler_output([], [])
    assert len(empty) == 0 and empty.token_offsets.tolist() == [0] and empty.block_offsets.tolist() == [0]
    assert empty.new_requests == [] and empty.cached_requests == []


def test_accepts_tuples_and_subclasses(backend):
    class MyRequest(backend.Request):
        pass

    manager = SchedulerOutputManager()
    request = MyRequest(3, [1, 2])
    data = only(manager.build_scheduler_output((request,), ()))
    assert data.new_tokens == [1, 2]


def test_matched_tokens_recorded_before_a_pause_stay_until_dropped(backend):
    """A prefix hit recorded, then the request preempted before its report: the manager
    knows it by id only, so the count stays; the error says how to drop it, and dropping it
    (recording 0) lets the report through as a plain first report."""
    manager = SchedulerOutputManager()
    request = decode_request(backend)
    request.context_current_position = 32  # the connector loaded the first 32 tokens
    manager.record_matched_tokens(7, 32)
    request.pause(len(PROMPT))
    request.block_tables[0].extend([12])
    with pytest.raises(ValueError) as caught:
        manager.build_scheduler_output([request], [])
    assert str(caught.value) == (
        "request 7: 32 connector-matched tokens exceed its context position 0 (recorded tokens wait for the "
        "request's next report, even across a pause(): record_matched_tokens(7, 0) drops them)")
    manager.record_matched_tokens(7, 0)
    data = only(manager.build_scheduler_output([request], []))
    assert (data.is_new, data.computed_position, data.new_tokens, data.new_block_ids) == (True, 0, PROMPT, [12])
