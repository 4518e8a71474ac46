"""Python code run in ``prepare_inputs`` or a report that changes what the call was given or shares.

A batch-size conversion that changes the list of requests or replaces a holder's field
(``HostBuffers``, ``MetadataBuffers``: read-only), a collection's callbacks that make a
holder's first writer and metadata, or build the connector manager's next report, while a
call is at it.

Each test asserts the defined result or a clean exception, the same on both backends; under
the sanitizer build (.ci/run) a regression shows as an AddressSanitizer report, not a wrong
value.
"""

import gc

import pytest
from hostile_code import IndexRuns, at_next_collection, decode_requests

from tokcy import RequestState
from tokcy.connector import SchedulerOutputManager
from tokcy.executor import HostBuffers, prepare_inputs
from tokcy.executor._metadata import MetadataBuffers


@pytest.mark.parametrize("given, change, request_ids, input_ids", [
    (1, lambda batch, requests: batch.extend(requests[1:]), [0, 1, 2, -1], [3, 4, 5, 0]),
    (3, lambda batch, requests: batch.clear(), [-1, -1, -1, -1], [0, 0, 0, 0]),
    (2, lambda batch, requests: batch.append(batch[0]), None, None),
], ids=["grown", "cleared", "duplicated"])
@pytest.mark.parametrize("holder", ["out", "no out, block size"])
def test_a_list_of_requests_is_read_after_the_conversions_that_can_change_it(backend, given, change, request_ids,
                                                                           input_ids, holder):
    """A batch-size conversion changes the list of requests the call was given (its first
    ``given`` of three): both backends read the list as that left it (request r's last
    token is 3 + r; the batch padded to 4), into a holder or into arrays the call makes
    (with a block size, which plans the batch twice)."""
    requests = decode_requests(backend, 3)
    for number, request in enumerate(requests):
        request.add_new_token(3 + number)
    batch = requests[:given]
    where = {"out": HostBuffers(16, 8)} if holder == "out" else {"block_size": 16}
    convert = IndexRuns(4, lambda: change(batch, requests))
    if request_ids is None:
        with pytest.raises(ValueError, match="request 0 is given twice in the batch"):
            prepare_inputs([], batch, cuda_graph_batch_sizes=[convert], **where)
        return
    prepared = prepare_inputs([], batch, cuda_graph_batch_sizes=[convert], **where)
    assert prepared.request_ids.tolist() == request_ids and prepared.input_ids.tolist() == input_ids


@pytest.mark.parametrize("holder_type", ["HostBuffers", "MetadataBuffers"])
def test_a_holders_fields_are_read_only(backend, holder_type):
    """Its writers are bound to its arrays when made: replacing one would leave them
    writing the old ones (a block-size conversion that tried it now fails before anything
    is written)."""
    out = HostBuffers(16, 8, max_blocks_per_seq=4)
    target = out if holder_type == "HostBuffers" else out.metadata
    names = (["arrays", "max_num_tokens", "max_batch_size", "max_draft_len", "max_beam_width", "metadata"]
             if holder_type == "HostBuffers" else
             ["max_blocks_per_seq", "num_layer_groups", "kv_lens", "cu_kv_seqlens", "slot_mapping", "block_table",
              "kv_indptr", "kv_indices", "kv_last_page_len"])
    for name in names:
        before = getattr(target, name)
        with pytest.raises(AttributeError, match=f"{holder_type}.{name} is read-only"):
            setattr(target, name, None)
        assert getattr(target, name) is before
    requests = decode_requests(backend, 2)
    prepare_inputs([], requests, out=out, block_size=16)
    out.input_ids[:] = -7

    class SwapsMetadata:
        def __index__(self):
            out.metadata = MetadataBuffers(16, 8, 4)
            return 16

    with pytest.raises(AttributeError, match="HostBuffers.metadata is read-only"):
        prepare_inputs([], requests, out=out, block_size=SwapsMetadata())
    assert out.input_ids.tolist() == [-7] * 16


def test_a_report_built_from_a_collection_inside_another_never_shares_its_arrays(backend):
    """Python code that runs as a report is finished (a collection's callback, or another
    thread given the GIL there) may build the manager's next report: it is refused while
    the first is being built, and once accepted writes arrays of its own. The first report
    shows its own rows, and the next one carries on from them (no token lost)."""
    manager = SchedulerOutputManager()
    first = backend.Request(1, [10, 11, 12])
    second = backend.Request(2, [20, 21, 22])
    for request in (first, second):
        request.state = RequestState.GENERATION_IN_PROGRESS
    manager.build_scheduler_output([], [first])  # the arena's arrays exist
    first.add_new_token(13)
    inner, refused = [], []

    def build_inner(phase, info):
        if phase == "start" and not inner:
            try:
                inner.append(manager.build_scheduler_output([], [second]))
            except RuntimeError:
                refused.append(True)

    threshold = gc.get_threshold()
    gc.callbacks.append(build_inner)
    gc.set_threshold(1)
    try:
        outer = manager.build_scheduler_output([], [first])
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(build_inner)
    assert refused or inner  # the callback ran
    assert (outer.request_ids.tolist(), outer.tokens.tolist()) == ([1], [13])
    if inner:
        assert (inner[0].request_ids.tolist(), inner[0].tokens.tolist()) == ([2], [20, 21, 22])
    first.add_new_token(14)
    later = manager.build_scheduler_output([], [first])
    assert (later.tokens.tolist(), later.num_replaced_tokens.tolist()) == ([14], [0])


def test_two_first_calls_on_a_holder_share_one_writer_and_one_metadata(backend):
    """HostBuffers.writer() and MetadataBuffers.bound() keep the first one made: a call
    that made its own meanwhile (another thread's first call, here a collection's
    callback) gets the kept one, so the busy guard covers both and the metadata written is
    the metadata read."""
    holder = HostBuffers(16, 4, max_blocks_per_seq=4)
    made = {}

    def first_use_inside():
        made["writer"] = holder.writer(backend)
        made["metadata"] = holder.metadata.bound(backend)

    with at_next_collection(first_use_inside) as state:
        state["calling"] = True
        writer = holder.writer(backend)
    metadata = holder.metadata.bound(backend)
    assert state["ran"] == "inside"  # (making the writer allocates what the collector tracks)
    assert made["writer"] is writer and made["metadata"] is metadata
    assert holder.writer(backend) is writer
    decode = backend.Request(1, list(range(9)))
    decode.state = RequestState.GENERATION_IN_PROGRESS
    decode.block_tables[0].extend([5, 6, 7])
    inputs = prepare_inputs([], [decode], block_size=4, out=holder)
    assert (inputs.max_kv_len, inputs.kv_indices.tolist(), inputs.slot_mapping.tolist()) == (9, [5, 6, 7], [28])
