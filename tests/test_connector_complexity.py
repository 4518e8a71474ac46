"""Complexity by counting, not timing: what the reports carry over a decode run does not
depend on how long the prompt was."""

import pytest

from tokcy import RequestState
from tokcy.connector import SchedulerOutputManager

BLOCK = 32


def carried_over_decode(backend, prompt_len, steps=200, num_requests=4, window=None):
    manager = SchedulerOutputManager()
    requests = []
    next_block = 0
    for request_id in range(num_requests):
        request = backend.Request(request_id, [request_id] * prompt_len)
        request.block_tables[0].extend(range(next_block, next_block + prompt_len // BLOCK))
        next_block += prompt_len // BLOCK
        requests.append(request)
    manager.build_scheduler_output(requests, [])  # the prompt, once
    for request in requests:
        request.move_to_next_context_chunk()
        request.state = RequestState.GENERATION_IN_PROGRESS
    tokens = blocks = 0
    for step in range(steps):
        for request in requests:
            request.add_new_token(step)
            table = request.block_tables[0]
            if request.get_num_tokens(0) > len(table) * BLOCK:
                table.append(next_block)
                next_block += 1
            if window is not None:
                table.release_front(max(table.num_released, len(table) - window))
        output = manager.build_scheduler_output([], requests)
        assert len(output.cached_requests) == num_requests
        tokens += len(output.tokens)
        blocks += len(output.block_ids)
    return tokens, blocks


@pytest.mark.parametrize("window", [None, 4])
def test_decode_reports_are_flat_in_prompt_length(backend, window):
    short = carried_over_decode(backend, 64, window=window)
    long = carried_over_decode(backend, 16384, window=window)
    assert short == long
    tokens, blocks = short
    assert tokens == 4 * 200  # one token per request per step
    assert blocks == 4 * (200 // BLOCK + (1 if 200 % BLOCK else 0))  # one block per 32 tokens
