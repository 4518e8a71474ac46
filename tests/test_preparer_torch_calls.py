"""InputPreparer.prepare: the torch calls of a steady decode step, counted.

Each torch call is a device op (or a view) paid on the host every step, so the count is
what a regression in the device feed would change; the counts below are the whole list,
written out, for a decode batch whose views were made by earlier steps of the same sizes.
"""

import numpy as np
import pytest

from tokcy import RequestState
from tokcy.executor import InputPreparer

torch = pytest.importorskip("torch")
from tokcy.bench.device_feed import torch_call_recorder  # noqa: E402


def decode_batch(module, batch, seq_len=40, block_size=16, num_groups=1):
    requests = []
    width = -(-(seq_len + 1) // block_size)
    for index in range(batch):
        request = module.Request(index, np.arange(seq_len, dtype=np.int32), num_layer_groups=num_groups)
        request.state = RequestState.GENERATION_IN_PROGRESS
        request.seq_slot = index
        for group, table in enumerate(request.block_tables):
            table.extend(np.arange(width, dtype=np.int32) + (group * batch + index) * width)
        requests.append(request)
    return requests, width


def counted(preparer, requests, **kwargs):
    preparer.prepare([], requests, **kwargs)  # the views of these sizes are made and kept
    with torch_call_recorder() as calls:
        inputs = preparer.prepare([], requests, **kwargs)
    return inputs, sorted(calls.names)


@pytest.mark.parametrize("batch", [1, 16, 200])
def test_tokens_only_no_torch_call_on_cpu(backend, batch):
    """On a CPU device the packed copy is a memory copy between the two buffers (a torch
    copy_ of the same bytes costs three times as much on the host): no torch call."""
    requests, _ = decode_batch(backend, batch)
    preparer = InputPreparer(batch, batch)
    inputs, names = counted(preparer, requests)
    assert names == []
    with torch_call_recorder() as calls:  # a view read by the model is kept: read again, no call
        inputs.input_ids, inputs.input_ids, inputs.position_ids
    assert len(calls.names) == 2
    np.testing.assert_array_equal(inputs.input_ids.numpy(), np.full(batch, 39, np.int32))


def test_the_torch_copy_a_gpu_takes_is_one_call_with_the_same_inputs(backend):
    """The path a CUDA device takes (torch copy_), forced on CPU: one call, same tensors."""
    requests, width = decode_batch(backend, 16)
    twins, _ = decode_batch(backend, 16)  # a device table's marks are per request: one set each
    by_numpy = InputPreparer(16, 16, block_size=16, max_blocks_per_seq=width)
    by_torch = InputPreparer(16, 16, block_size=16, max_blocks_per_seq=width)
    by_torch._host_copy = False
    by_numpy.prepare([], twins)
    expected = by_numpy.prepare([], twins)
    by_torch.prepare([], requests)  # every table sent whole (a copy of another length)
    inputs, names = counted(by_torch, requests)
    assert names == sorted(STEP + PER_GROUP + ["copy_"])
    for name in ("input_ids", "position_ids", "seq_lens", "cu_seqlens", "kv_lens", "slot_mapping", "block_table",
                 "kv_indptr", "kv_indices"):
        assert torch.equal(getattr(inputs, name), getattr(expected, name)), name


def test_device_tokens_add_one_gather_and_one_copy(backend):
    requests, _ = decode_batch(backend, 8)
    preparer = InputPreparer(8, 8)
    previous = torch.arange(100, 108, dtype=torch.int32)
    inputs, names = counted(preparer, [], device_token_requests=requests, previous_new_tokens=previous)
    # attribute reads checking previous_new_tokens: its dtype, ndim, both devices, the length
    # of the alias the rows read (previous[:]), and its storage (not the preparer's own);
    # right before the gather, that the alias still lies inside its storage (its offset,
    # stride, length, item size and storage: host-side reads, no device op); then the ids'
    # slice of input_ids, the gather and the copy
    assert names == (["__get__"] * 7 + ["__getitem__"] * 2
                     + ["copy_", "element_size", "index_select", "storage_offset", "stride"]
                     + ["untyped_storage"] * 2)
    np.testing.assert_array_equal(inputs.input_ids.numpy(), np.arange(100, 108, dtype=np.int32))


STEP = ["__get__"]  # the dense table's batch size, from the table slots' shape (the packed copy is numpy's on CPU)
# one group, no block changed: gather the rows by slot and mask past the blocks (dense
# table), then the CSR indices: each sequence's run start repeated over its live blocks,
# plus the output index, gathered from the table; the blocks, live blocks and run starts
# come from the host, in the copy
PER_GROUP = ["index_select", "ge", "masked_fill_", "repeat_interleave", "add_", "index_select"]


# a model reads one layout: the dense table alone is the masked gather by slot; the CSR
# alone gathers its entries from the table itself (the run starts index the slots' rows)
DENSE_ONLY = ["index_select", "ge", "masked_fill_"]
CSR_ONLY = ["repeat_interleave", "add_", "index_select"]


@pytest.mark.parametrize(("tables", "step", "per_group"), [("dense", STEP, DENSE_ONLY), ("csr", [], CSR_ONLY),
                                                           ((), [], [])])
def test_a_preparer_gathers_only_the_tables_it_is_asked_for(backend, tables, step, per_group):
    """``device_tables`` names what each step gathers, per group; the table it leaves out
    reads None and the other equals what a preparer gathering both returns."""
    requests, width = decode_batch(backend, 16, num_groups=2)
    twins, _ = decode_batch(backend, 16, num_groups=2)
    both = InputPreparer(16, 16, block_sizes=(16, 16), max_blocks_per_seq=width)
    preparer = InputPreparer(16, 16, block_sizes=(16, 16), max_blocks_per_seq=width, device_tables=tables)
    both.prepare([], twins)
    expected = both.prepare([], twins)
    preparer.prepare([], requests)
    inputs, names = counted(preparer, requests)
    assert names == sorted(step + per_group * 2)
    for actual, reference in zip(inputs.groups, expected.groups):
        if "dense" in tables:
            assert torch.equal(actual.block_table, reference.block_table)
        else:
            assert actual.block_table is None
        if "csr" in tables:
            assert torch.equal(actual.kv_indices, reference.kv_indices)
        else:
            assert actual.kv_indices is None
        assert torch.equal(actual.kv_indptr, reference.kv_indptr)
    assert inputs.block_table is inputs.groups[0].block_table


@pytest.mark.parametrize("batch", [4, 64])
def test_block_table_calls_do_not_grow_with_the_batch(backend, batch):
    requests, width = decode_batch(backend, batch)
    preparer = InputPreparer(batch, batch, block_size=16, max_blocks_per_seq=width)
    preparer.prepare([], requests)  # every table sent whole
    _, names = counted(preparer, requests)
    assert names == sorted(STEP + PER_GROUP)
    requests[0].block_tables[0][-1] = 5  # a step with one changed entry: its copy's and its scatter's views made
    preparer.prepare([], requests)
    requests[1].block_tables[0][-1] = 7  # one changed entry again: sent and scattered, through the same views
    with torch_call_recorder() as calls:
        inputs = preparer.prepare([], requests)
    assert sorted(calls.names) == sorted(STEP + ["__setitem__"] + PER_GROUP)
    assert inputs.block_table[0, width - 1].item() == 5 and inputs.block_table[1, width - 1].item() == 7


def test_two_groups_cost_two_groups_of_calls(backend):
    """Each group's per-sequence figures come from the host: a second group of the same
    block size repeats the same six calls, and nothing else."""
    requests, width = decode_batch(backend, 8, num_groups=2)
    preparer = InputPreparer(8, 8, block_sizes=(16, 16), max_blocks_per_seq=width)
    preparer.prepare([], requests)
    _, names = counted(preparer, requests)
    assert names == sorted(STEP + PER_GROUP + PER_GROUP)


def device_ops(preparer, requests):
    """The aten ops (nested ones included) one prepare() runs, from torch's own profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        preparer.prepare([], requests)
    return [event.name for event in prof.events()]


@pytest.mark.parametrize("num_requests", [3, 4])  # odd and even token counts: the changed entries' padding word
def test_a_steady_step_converts_no_dtype(backend, num_requests):
    """Every array the device side reads arrives in the dtype its op takes (the scatter's
    indices and repeat_interleave's counts as int64): a conversion would be one more
    allocation and kernel launch per step on a GPU, hidden inside index_put_ or cumsum."""
    requests, width = decode_batch(backend, num_requests)
    preparer = InputPreparer(num_requests, num_requests, block_size=16, max_blocks_per_seq=width)
    preparer.prepare([], requests)  # every table sent whole
    requests[0].block_tables[0][-1] = 5
    preparer.prepare([], requests)  # one changed entry: this copy length's views made
    requests[1].block_tables[0][-1] = 7
    ops = device_ops(preparer, requests)
    assert "aten::index_put_" in ops and "aten::repeat_interleave" in ops  # the scatter and the CSR gather ran
    assert [name for name in ops if name in ("aten::_to_copy", "aten::copy_", "aten::empty_strided")] == []
    assert preparer.block_table[0, 1, width - 1].item() == 7
