"""Threads: the compiled report copies without the GIL, so it must own what it reads.

* A large report (one that copies without the GIL) runs while another thread appends to
  (reallocates) a request, or replaces its buffers: never a crash, each report is a
  consistent snapshot, and the mirror built from the reports equals the request afterwards.
* While a report is being built, a second build / record_matched_tokens / reset_request /
  request_finished on the same manager raises RuntimeError and changes nothing.
"""

import sys
import threading
import time

import numpy as np
import pytest

from tokcy import RequestState
from tokcy.connector import SchedulerOutputManager

LARGE = 1 << 24  # 16M tokens (64 MiB, above malloc's mmap threshold: freeing it unmaps it)
BUSY = "this SchedulerOutputManager is building a report in another thread"


def large_request(backend, request_id=1, size=LARGE):
    prompt = np.arange(size, dtype=np.int32) % 50000
    request = backend.Request(request_id, prompt)
    request.block_tables[0].extend(range(size // 4096))
    request.state = RequestState.GENERATION_IN_PROGRESS
    return request, prompt


@pytest.fixture
def fast_switching():
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(interval)


def test_report_while_another_thread_appends(backend):
    """The report copies a 2 * LARGE request first, then ``target``; meanwhile another thread
    appends to ``target``, and its first append reallocates (and frees) the storage the
    report is about to read. Before the report owned its buffers this was a segfault."""
    manager = SchedulerOutputManager()
    first, first_prompt = large_request(backend, 1, 2 * LARGE)
    for round_ in range(3):
        target, prompt = large_request(backend, 2 + round_)  # capacity == size: appends reallocate
        appended = []
        go, stop = threading.Event(), threading.Event()

        def append():
            go.wait()
            while not stop.is_set() and len(appended) < 2000:  # bounded
                token = len(appended) % 50000
                target.add_new_token(token)
                appended.append(token)
                if len(appended) % 64 == 0:
                    target.block_tables[0].append(len(appended))

        manager.reset_request(1)  # the whole of ``first`` is copied again
        thread = threading.Thread(target=append)
        thread.start()
        go.set()
        try:
            output = manager.build_scheduler_output([], [first, target])
        finally:
            stop.set()
            thread.join()
        assert output.is_new.tolist() == [True, True]
        assert np.array_equal(output.tokens[: 2 * LARGE], first_prompt)
        # whatever the interleaving, the report is a consistent snapshot: the tokens as they
        # were when the report read the request; the rest is in the next report
        tokens = output.tokens[output.token_offsets[1] :]
        assert np.array_equal(tokens[:LARGE], prompt)
        assert tokens[LARGE:].tolist() == appended[: len(tokens) - LARGE]
        assert output.computed_positions.tolist() == [2 * LARGE - 1, len(tokens) - 1]
        blocks = output.block_ids[output.block_offsets[1] :]
        assert np.array_equal(blocks[: LARGE // 4096], np.arange(LARGE // 4096))
        output = manager.build_scheduler_output([], [target])
        assert output.num_replaced_tokens[0] == 0
        assert output.tokens.tolist() == appended[len(tokens) - LARGE :]
        assert output.num_replaced_blocks[0] == 0
        assert np.array_equal(np.concatenate([blocks, output.block_ids]), target.block_tables[0].view())
        assert target.get_num_tokens(0) == LARGE + len(appended)
        assert np.array_equal(target.get_tokens_view(0, 0, LARGE), prompt)
        manager.request_finished(target.request_id)


def test_report_while_another_thread_replaces_the_buffers(backend):
    """Re-running ``__init__`` drops the request's token buffer and block tables (and their
    storage) while the report may be copying them: they are owned, so the report is one
    snapshot or the other, and the mirror catches up on the next report."""
    manager = SchedulerOutputManager()
    first, _ = large_request(backend, 1, 2 * LARGE)
    for round_ in range(2):
        target, prompt = large_request(backend, 2)
        go = threading.Event()

        def reinit():
            go.wait()
            target.__init__(2, [5, 6, 7])

        manager.reset_request(1)
        thread = threading.Thread(target=reinit)
        thread.start()
        go.set()
        try:
            output = manager.build_scheduler_output([], [first, target])
        finally:
            thread.join()
        tokens = output.tokens[output.token_offsets[1] :]
        blocks = output.block_ids[output.block_offsets[1] :]
        old = len(tokens) == LARGE
        if old:
            assert np.array_equal(tokens, prompt) and np.array_equal(blocks, np.arange(LARGE // 4096))
        else:  # __init__ ran first
            assert tokens.tolist() == [5, 6, 7] and blocks.tolist() == []
        assert output.computed_positions[1] == len(tokens) - 1
        data = manager.build_scheduler_output([], [target]).requests[0]
        assert data.num_replaced_tokens == (LARGE if old else 0)
        assert data.new_tokens == ([5, 6, 7] if old else [])
        assert data.num_replaced_blocks_by_group == [len(blocks)] and data.new_block_ids == []
        manager.request_finished(2)


def test_reentrant_calls_raise_while_a_report_is_built(backend):
    """Deterministic: the device-token group is a generator, consumed inside build()."""
    manager = SchedulerOutputManager()
    first, second = backend.Request(1, [1, 2, 3]), backend.Request(2, [4, 5])
    first.context_chunk_size = 1
    manager.build_scheduler_output([first], [])
    first.context_current_position = 2
    manager.record_matched_tokens(1, 2)
    first.add_new_token(9)
    seen = []

    def device_requests():
        for call in (
            lambda: manager.build_scheduler_output([second], []),
            lambda: manager.build_scheduler_output([], []),
            lambda: manager.record_matched_tokens(1, 1),
            lambda: manager.record_matched_tokens(3, 1),
            lambda: manager.reset_request(1),
            lambda: manager.request_finished(1),
        ):
            with pytest.raises(RuntimeError, match=BUSY):
                call()
            seen.append(call)
        yield second

    output = manager.build_scheduler_output([first], [], device_requests())
    assert len(seen) == 6
    assert output.request_ids.tolist() == [1, 2]
    assert output.is_new.tolist() == [False, True]  # reset_request did not happen
    assert output.computed_positions.tolist() == [0, 2]  # the matched count stayed 2
    assert output.tokens.tolist() == [9, 4, 5]
    assert manager.tracked_request_ids() == [1, 2]  # nothing finished, nothing added


def test_concurrent_builds_on_one_manager(backend, fast_switching):
    """Two threads report disjoint requests through one manager: a call that overlaps
    another raises RuntimeError (busy) and changes nothing; every call that succeeds is
    exact, so the mirrors built from the successful reports equal the requests."""
    manager = SchedulerOutputManager()
    big, _ = large_request(backend, 1, LARGE // 4)
    small = backend.Request(2, [1, 2, 3])
    small.state = RequestState.GENERATION_IN_PROGRESS
    mirrors = {}
    refused, succeeded = [0, 0], [0, 0]
    errors = []

    def done():
        return min(succeeded) >= 3 and sum(refused) >= 1

    def run(request, index, deadline):
        try:
            while time.monotonic() < deadline and not done():
                time.sleep(0)  # let the other thread in
                request.add_new_token(7)
                try:
                    if index == 0:
                        manager.reset_request(1)  # every successful report copies all 16M tokens
                    output = manager.build_scheduler_output([], [request])
                except RuntimeError as error:
                    assert str(error) == BUSY
                    refused[index] += 1
                    continue
                succeeded[index] += 1
                tokens = output.tokens.tolist() if index else output.tokens
                if output.is_new[0]:
                    mirrors[index] = tokens
                else:
                    kept = len(mirrors[index]) - output.num_replaced_tokens[0]
                    mirrors[index] = list(mirrors[index][:kept]) + list(tokens)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    deadline = time.monotonic() + 30  # bounded; done() is typically reached in well under a second
    threads = [threading.Thread(target=run, args=(request, index, deadline))
               for index, request in enumerate([big, small])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert done(), (refused, succeeded)  # the calls did overlap, and both got through
    assert mirrors[1] == small.get_tokens(0)[: len(mirrors[1])]
    assert len(mirrors[0]) > LARGE // 4 and np.array_equal(mirrors[0], big.get_tokens_view(0, 0, len(mirrors[0])))
