"""Integers beyond what a field holds: the exception names the field, on both backends, and
the call changes nothing.

A request id, a count or a slot is an int64 (OverflowError past it), a token or block id
an int32. An int too long for Python to turn into text (over 4,300 digits) is described by
its size in bits, never printed: printing it would raise an error of its own that names
nothing. HUGE = 10**5000 has floor(5000 * log2(10)) + 1 = 16,610 bits.
"""

import pickle

import numpy as np
import pytest
from list_model import observe

from tokcy import RequestState
from tokcy.connector import SchedulerOutputManager
from tokcy.executor import HostBuffers, prepare_inputs

HUGE = 10**5000
HUGE_TEXT = r"\(an integer of 16,610 bits\)"
INT64_MAX = 2**63 - 1


def decoding(backend):
    request = backend.Request(3, [5, 6, 7], max_new_tokens=4)
    request.state = RequestState.GENERATION_IN_PROGRESS
    request.seq_slot = 1
    request.block_tables[0].extend([8])
    return request


@pytest.mark.parametrize(
    "arguments, keywords, message",
    [
        ((INT64_MAX + 1, [1]), {}, "request_id 9223372036854775808 does not fit in int64"),
        ((-INT64_MAX - 2, [1]), {}, "request_id -9223372036854775809 does not fit in int64"),
        ((HUGE, [1]), {}, f"request_id {HUGE_TEXT} does not fit in int64"),
        ((1, [1]), {"max_new_tokens": INT64_MAX + 1}, "max_new_tokens 9223372036854775808 does not fit in int64"),
        ((1, [1]), {"beam_width": -HUGE}, r"beam_width \(a negative integer of 16,610 bits\) does not fit in int64"),
        ((1, [1]), {"num_layer_groups": HUGE}, f"num_layer_groups {HUGE_TEXT} does not fit in int64"),
        ((1, [4, HUGE]), {}, rf"prompt\[1\]: token id {HUGE_TEXT} does not fit in int32"),
    ],
    ids=["id-past-max", "id-past-min", "id-huge", "max_new_tokens", "beam_width", "groups", "prompt"],
)
def test_constructor_names_the_field(backend, arguments, keywords, message):
    with pytest.raises(OverflowError, match=message):
        backend.Request(*arguments, **keywords)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: setattr(r, "seq_slot", HUGE), f"seq_slot {HUGE_TEXT} does not fit in int64"),
        (lambda r: setattr(r, "seq_slot", -INT64_MAX - 2), "seq_slot -9223372036854775809 does not fit in int64"),
        (lambda r: r.add_new_token(HUGE), f"token: token id {HUGE_TEXT} does not fit in int32"),
        (lambda r: r.block_tables[0].append(-HUGE),
         r"block_id: block id \(a negative integer of 16,610 bits\) does not fit in int32"),
        (lambda r: r.block_tables[0].extend([9, HUGE]), rf"block_ids\[1\]: block id {HUGE_TEXT} does not fit in int32"),
    ],
    ids=["seq_slot-huge", "seq_slot-past-min", "token", "block-id", "block-ids"],
)
def test_setters_name_the_field_and_change_nothing(backend, change, message):
    request = decoding(backend)
    before = observe(request)
    with pytest.raises(OverflowError, match=message):
        change(request)
    assert observe(request) == before


def test_a_restored_state_names_the_field(backend):
    request = decoding(backend)
    state = request.__reduce__()[1][1]
    with pytest.raises(OverflowError, match="request_id 9223372036854775808 does not fit in int64"):
        backend.Request._from_state(dict(state, request_id=INT64_MAX + 1))
    with pytest.raises(OverflowError, match=f"max_new_tokens {HUGE_TEXT} does not fit in int64"):
        backend.Request._from_state(dict(state, max_new_tokens=HUGE))
    assert pickle.loads(pickle.dumps(request)).max_new_tokens == 4  # the state itself is fine


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: m.record_matched_tokens(INT64_MAX + 1, 2), "request_id 9223372036854775808 does not fit in int64"),
        (lambda m: m.record_matched_tokens(3, HUGE), f"num_tokens {HUGE_TEXT} does not fit in int64"),
        (lambda m: m.reset_request(HUGE), f"request_id {HUGE_TEXT} does not fit in int64"),
        (lambda m: m.request_finished(-INT64_MAX - 2), "request_id -9223372036854775809 does not fit in int64"),
    ],
    ids=["matched-id", "matched-count", "reset", "finished"],
)
def test_connector_calls_name_the_argument_and_change_nothing(backend, call, message):
    manager = SchedulerOutputManager()
    request = decoding(backend)
    request.state = RequestState.CONTEXT_INIT
    manager.build_scheduler_output([request], [])
    before = (manager.tracked_request_ids(), observe(request))
    with pytest.raises(OverflowError, match=message):
        call(manager)
    assert (manager.tracked_request_ids(), observe(request)) == before


@pytest.mark.parametrize(
    "keywords, error, message",
    [
        ({"block_size": HUGE}, ValueError,
         (r"block_sizes must be a tuple of integers in \[1, 2147483647\], one per layer group, "
          "got a tuple holding an integer too long to print")),
        ({"block_size": INT64_MAX + 1}, ValueError, r"got \(9223372036854775808,\)"),
        ({"cuda_graph_batch_sizes": [4, HUGE]}, OverflowError,
         f"cuda_graph_batch_sizes entry {HUGE_TEXT} does not fit in int64"),
        ({"cuda_graph_batch_sizes": [4.0]}, TypeError, "cuda_graph_batch_sizes entry must be an integer, not float"),
    ],
    ids=["block-size-huge", "block-size-past-int64", "batch-size-huge", "batch-size-float"],
)
def test_prepare_inputs_names_the_argument_and_changes_nothing(backend, keywords, error, message):
    request = decoding(backend)
    holder = HostBuffers(8, 8, max_blocks_per_seq=4)
    prepare_inputs([], [request], out=holder, block_size=4)
    meta = holder.metadata
    outputs = holder.arrays + (meta.kv_lens, meta.cu_kv_seqlens) + meta.slot_mapping + meta.block_table
    arrays = [array.copy() for array in outputs]
    before = observe(request)
    with pytest.raises(error, match=message):
        prepare_inputs([], [request], out=holder, **keywords)
    assert observe(request) == before
    assert all(np.array_equal(old, new) for old, new in zip(arrays, outputs))
