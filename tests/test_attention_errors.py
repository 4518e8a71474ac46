"""Bad input to the attention metadata: a clear error naming the request (and group),
the same on both backends, raised before anything is written or consumed."""

import pickle

import numpy as np
import pytest
import torch

from tokcy import RequestState
from tokcy.executor import HostBuffers, InputPreparer, prepare_inputs

GENERATING = RequestState.GENERATION_IN_PROGRESS


def request(module, request_id, num_tokens, blocks, *, slot=None, beam_width=1, groups=1):
    item = module.Request(request_id, list(range(num_tokens)), beam_width=beam_width, num_layer_groups=groups)
    item.state = GENERATING
    for table in item.block_tables:
        table.extend(blocks)
    item.seq_slot = slot
    return item


def snapshot(holder, requests):
    arrays = [array.copy() for array in holder.arrays]
    meta = holder.metadata
    arrays += [array.copy() for array in (meta.kv_lens, meta.cu_kv_seqlens) + meta.slot_mapping + meta.block_table]
    return arrays, [pickle.dumps(item) for item in requests]


CASES = [
    # (description, requests builder, block sizes, expected message)
    ("table too short", lambda m: [request(m, 7, 9, [1, 2])], (4,),
     "request 7 group 0: its rows need 3 blocks, but its block table holds only 2 (position 8 has none)"),
    ("released block written", lambda m: [request(m, 8, 9, [1, 2, 3])], (4,), None),
    ("more blocks than max_blocks_per_seq", lambda m: [request(m, 9, 5, [1, 2, 3, 4, 5])], (4,),
     "request 9 group 0: its block table holds 5 blocks, above max_blocks_per_seq 4"),
    ("beams", lambda m: [request(m, 10, 5, [1, 2], beam_width=2)], (4,),
     "request 10 has beam_width 2, but attention metadata (a block size) needs beam_width 1"),
    ("group count", lambda m: [request(m, 11, 5, [1, 2])], (4, 4),
     "request 11 has 1 layer groups but block_sizes gives 2"),
    ("second group short", lambda m: [request(m, 12, 5, [1, 2], groups=2)], (4, 2),
     "request 12 group 1: its rows need 3 blocks, but its block table holds only 2 (position 4 has none)"),
]


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_bad_tables_raise_before_writing(backend, case):
    name, build, block_sizes, message = case
    requests = [request(backend, 1, 6, [5, 6, 7], groups=len(block_sizes))] + build(backend)
    if name == "released block written":
        requests[-1].block_tables[0].release_front(3)
        message = "request 8 group 0: position 8 is in block 2, which the sliding window released"
    holder = HostBuffers(16, 4, max_blocks_per_seq=4, num_layer_groups=2)
    before = snapshot(holder, requests)
    with pytest.raises(ValueError) as error:
        prepare_inputs([], requests, block_sizes=block_sizes, out=holder)
    assert message in str(error.value)
    after = snapshot(holder, requests)
    assert all(np.array_equal(x, y) for x, y in zip(before[0], after[0])) and before[1] == after[1]


def test_block_table_ids_must_fit_int32(backend):
    table = backend.Request(1, [1]).block_tables[0]
    with pytest.raises(OverflowError):
        table.append(2**31)
    assert table.tolist() == []


@pytest.mark.parametrize("sizes", [(0,), (-4,), ()])
def test_bad_block_sizes(backend, sizes):
    with pytest.raises(ValueError, match="block sizes must be >= 1"):
        prepare_inputs([], [request(backend, 1, 3, [1])], block_sizes=sizes)


def test_holders_and_preparers_refuse_more_layer_groups_than_the_metadata_holds(backend):
    """17 layer groups (the metadata holds 16) are refused when the arrays would be made,
    not at the first call: a HostBuffers, a MetadataBuffers and an InputPreparer; 16 are
    made, and a call with 17 block sizes still says the same."""
    from tokcy.executor._metadata import MetadataBuffers

    message = "^between 1 and 16 layer groups, got 17$"
    with pytest.raises(ValueError, match=message):
        HostBuffers(4, 4, max_blocks_per_seq=1, num_layer_groups=17)
    with pytest.raises(ValueError, match=message):
        MetadataBuffers(4, 4, 1, 17)
    with pytest.raises(ValueError, match=message):
        InputPreparer(4, 4, block_sizes=(16,) * 17, max_blocks_per_seq=1)
    with pytest.raises(ValueError, match="^between 1 and 16 layer groups, got 0$"):
        MetadataBuffers(4, 4, 1, 0)
    holder = HostBuffers(4, 4, max_blocks_per_seq=1, num_layer_groups=16)
    assert holder.metadata.num_layer_groups == 16
    assert InputPreparer(4, 4, block_sizes=(16,) * 16, max_blocks_per_seq=1).block_sizes == (16,) * 16
    with pytest.raises(ValueError, match=message):
        prepare_inputs([], [], block_sizes=(16,) * 17)


def test_block_size_without_metadata_outputs(backend):
    with pytest.raises(ValueError, match=r"HostBuffers\(\.\.\., max_blocks_per_seq=\.\.\.\)"):
        prepare_inputs([], [request(backend, 1, 3, [1])], block_size=4, out=HostBuffers(8, 2))


@pytest.mark.parametrize("problem", ["no slot", "slot out of range", "same slot twice"])
def test_device_table_slots(backend, problem):
    preparer = InputPreparer(16, 4, block_size=4, max_blocks_per_seq=4, max_slots=4)
    first = request(backend, 1, 5, [1, 2], slot=0)
    slot = {"no slot": None, "slot out of range": 4, "same slot twice": 0}[problem]
    second = request(backend, 2, 5, [3, 4], slot=slot)
    message = {
        "no slot": "request 2 has no seq_slot; the device block table is indexed by it",
        "slot out of range": "request 2 has seq_slot 4, outside the device block table's max_slots 4",
        "same slot twice": "seq_slot 0 is used by both request 1 and request 2",
    }[problem]
    table = preparer.block_table.clone()
    with pytest.raises(ValueError) as error:
        preparer.prepare([], [first, second])
    assert str(error.value) == message
    assert torch.equal(preparer.block_table, table)
    # nothing was consumed: the next good call sends request 1's table whole
    preparer.prepare([], [first])
    assert preparer.block_table[0, 0].tolist() == [1, 2, 0, 0]


def test_preparer_needs_max_blocks_per_seq(backend):
    with pytest.raises(ValueError, match="max_blocks_per_seq"):
        InputPreparer(8, 2, block_size=4)


@pytest.mark.parametrize(("tables", "error", "message"), [
    ("sparse", ValueError, "device_tables: unknown table 'sparse' (known: 'dense', 'csr')"),
    (["dense", "CSR"], ValueError, "device_tables: unknown table 'CSR' (known: 'dense', 'csr')"),
    (3, TypeError, "device_tables must be 'dense', 'csr' or a sequence of them, not int"),
    ([b"csr"], TypeError, "device_tables must name tables as strings, got b'csr'"),
])
def test_preparer_names_a_bad_device_tables(backend, tables, error, message):
    with pytest.raises(error) as caught:
        InputPreparer(8, 2, block_size=4, max_blocks_per_seq=4, device_tables=tables)
    assert str(caught.value) == message


def test_preparer_device_tables_need_a_block_size_and_read_in_order(backend):
    with pytest.raises(ValueError, match="device_tables needs a block size"):
        InputPreparer(8, 2, device_tables="csr")
    assert InputPreparer(8, 2).device_tables is None
    made = {tables: InputPreparer(8, 2, block_size=4, max_blocks_per_seq=4, device_tables=tables).device_tables
            for tables in (None, "csr", ("csr", "dense", "csr"), ())}
    assert made == {None: ("dense", "csr"), "csr": ("csr",), ("csr", "dense", "csr"): ("dense", "csr"), (): ()}


def test_a_device_slot_past_previous_new_tokens_changes_nothing(backend):
    """A device-token request whose seq_slot is past previous_new_tokens is refused in the
    host pass (naming the request): no request's change marks consumed, nothing staged,
    so with one staging buffer the previous step's host inputs still read as they were,
    and the next call sends the change it did not consume."""
    preparer = InputPreparer(16, 4, block_size=4, max_blocks_per_seq=4, max_slots=8, num_staging_buffers=1)
    decode = request(backend, 1, 5, [1, 2], slot=0)
    waiting = request(backend, 2, 3, [3], slot=6)
    previous = preparer.prepare([], [decode])
    decode.block_tables[0].append(9)
    states = [pickle.dumps(item) for item in (decode, waiting)]
    staged = [buffer.clone() for buffer in preparer._staging]
    with pytest.raises(ValueError, match="^request 2 in device_token_requests: seq_slot 6 is out of range for "
                                         "previous_new_tokens of 4 slots$"):
        preparer.prepare([], [decode], device_token_requests=[waiting],
                         previous_new_tokens=torch.zeros(4, dtype=torch.int32))
    assert [pickle.dumps(item) for item in (decode, waiting)] == states
    assert all(torch.equal(before, after) for before, after in zip(staged, preparer._staging))
    host = previous.host
    assert (host.input_ids.tolist(), host.kv_lens.tolist(), host.slot_mapping.tolist()) == ([4], [5], [8])
    assert preparer.block_table[0, 0].tolist() == [1, 2, 0, 0]  # the device table was not touched
    preparer.prepare([], [decode])
    assert preparer.block_table[0, 0].tolist() == [1, 2, 9, 0]


def test_a_failure_after_the_host_pass_resends_whole_rows(backend):
    """The host pass consumed the tables' changes (a truncation: two entries to zero), then
    the device-side step failed: the next call sends the scheduled rows whole, zeros to
    the row's end included (the row may still hold the longer table). The failed call is
    refused as a whole: ``last_copy_bytes`` still reports the last step prepared."""
    preparer = InputPreparer(16, 4, block_size=4, max_blocks_per_seq=4, max_slots=4)
    decode = request(backend, 1, 3, [7, 8, 9], slot=2)
    preparer.prepare([], [decode])
    assert preparer.block_table[0, 2].tolist() == [7, 8, 9, 0]
    decode.block_tables[0].truncate(1)
    table = preparer.device_table
    real_apply = table.apply

    def failing_apply(*args):
        raise RuntimeError("the device step failed")

    table.apply = failing_apply
    copied = preparer.last_copy_bytes  # three entries sent; the failed step copied two
    with pytest.raises(RuntimeError, match="the device step failed"):
        preparer.prepare([], [decode])
    table.apply = real_apply
    assert preparer.last_copy_bytes == copied
    for _ in range(2):
        preparer.prepare([], [decode])
        assert preparer.block_table[0, 2].tolist() == [7, 0, 0, 0]


def test_a_plan_taken_over_by_another_writer_is_refused(backend):
    holder = HostBuffers(16, 4, max_blocks_per_seq=4)
    first, second = backend.InputWriter(), backend.InputWriter()
    for writer in (first, second):
        writer.bind(*holder.arrays)
        writer.set_metadata(holder.metadata.bound(backend))
    requests = [request(backend, 1, 5, [1, 2])]
    first.plan([], requests, [], [], 0, None, 0, (4,))
    second.plan([], requests, [], [], 0, None, 0, (4,))
    with pytest.raises(RuntimeError, match="planned by another writer"):
        first.write()
    assert second.write()[3] == 1


@pytest.mark.parametrize("width, error, message", [
    (4.0, TypeError, "max_blocks_per_seq must be an integer, not float"),
    ("4", TypeError, "max_blocks_per_seq must be an integer, not str"),
    (0, ValueError, "max_blocks_per_seq must be >= 1, got 0"),
])
def test_bind_names_a_bad_max_blocks_per_seq_and_keeps_its_arrays(backend, width, error, message):
    """AttentionMetadata.bind converts max_blocks_per_seq as both backends do (a float was
    taken by the pure twin); a refused call leaves the metadata bound as it was, so a
    decode step still writes its rows (block 4, 4 columns: slot 4 * 7 + 1 = 29)."""
    metadata = backend.AttentionMetadata()
    arrays = (np.zeros(2, np.int32), np.zeros(3, np.int32), (np.zeros(2, np.int64),), (np.zeros(3, np.int32),),
              (np.zeros(2, np.int32),))
    metadata.bind(4, *arrays)
    with pytest.raises(error, match=f"^{message}$"):
        metadata.bind(width, *arrays)
    holder = HostBuffers(2, 2)
    writer = backend.InputWriter()
    writer.bind(*holder.arrays)
    writer.set_metadata(metadata)
    writer.prepare([], [request(backend, 1, 6, [3, 7])], (), (), 0, None, 0, (4,))
    assert arrays[2][0][:1].tolist() == [29]
