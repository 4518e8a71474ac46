"""What code that holds an InputPreparer's tensors, or hands it tensors, can do to it (CPU
tensors here, both backends): no storage the preparer writes can be resized under it; its
tensors by name cannot be replaced; the previous step's tokens cannot be a view of what
the step overwrites, and the caller's tensor changed during the call does not change the
rows it fills; a failed step leaves ``last_copy_bytes`` as it was."""

import pytest

from tokcy import RequestState

torch = pytest.importorskip("torch")
from tokcy.executor import InputPreparer  # noqa: E402 (needs torch, which may be absent)


def decoding(module, request_id, tokens, blocks, slot):
    request = module.Request(request_id, tokens)
    request.state = RequestState.GENERATION_IN_PROGRESS
    request.block_tables[0].extend(blocks)
    request.seq_slot = slot
    return request


def test_no_storage_the_preparer_writes_can_be_resized(backend):
    """torch lets anyone holding a tensor resize its storage (``untyped_storage().resize_``)
    unless numpy's memory backs it: the preparer's copy, scatter and gathers would then
    write past the memory left. Every such storage a caller can reach refuses, and the
    next step is still right."""
    preparer = InputPreparer(16, 4, block_size=4, max_blocks_per_seq=4, max_slots=4)
    request = decoding(backend, 1, [10, 11, 12, 13, 14], [7, 8], slot=2)
    inputs = preparer.prepare([], [request])
    group = inputs.groups[0]
    reachable = {"block_table": preparer.block_table, "input_ids": inputs.input_ids,
                 "the packed inputs": inputs.input_ids._base, "dense table": group.block_table,
                 "dense tables": group.block_table._base, "kv_indices": group.kv_indices,
                 "kv_indices of every group": group.kv_indices._base, "slot_mapping": group.slot_mapping}
    for name, tensor in reachable.items():
        with pytest.raises(RuntimeError, match="not resizable"):
            tensor.untyped_storage().resize_(8)
        assert tensor.untyped_storage().nbytes() > 8, name
    request.add_new_token(15)
    request.block_tables[0].append(9)
    inputs = preparer.prepare([], [request])
    # 6 tokens of block 4: blocks 7 and 8 hold them (9 is for the next), position 5 in slot 8 * 4 + 1
    assert inputs.input_ids.tolist() == [15] and inputs.groups[0].block_table.tolist() == [[7, 8, 0, 0]]
    assert inputs.groups[0].kv_indices.tolist() == [7, 8] and inputs.groups[0].slot_mapping.tolist() == [33]
    assert preparer.block_table[0, 2].tolist() == [7, 8, 9, 0]


def test_the_tensors_by_name_cannot_be_replaced(backend):
    preparer = InputPreparer(16, 4)
    with pytest.raises(TypeError):
        preparer.tensors["input_ids"] = torch.zeros(16, dtype=torch.int32)
    request = backend.Request(1, [5, 6, 7])
    assert preparer.prepare([request], []).input_ids.tolist() == [5, 6, 7]


def test_previous_tokens_that_are_the_preparers_own_inputs_are_refused(backend):
    """The step's copy overwrites the preparer's inputs before the device-token rows read
    the previous tokens: a view of those inputs would give the rows this step's ids."""
    preparer = InputPreparer(16, 4)
    first = preparer.prepare([backend.Request(8, [60, 61, 62, 63])], [])
    plain = decoding(backend, 3, [1, 2], [], slot=0)
    copied = preparer.last_copy_bytes
    with pytest.raises(ValueError, match="a view of this InputPreparer's own inputs"):
        preparer.prepare([], [], device_token_requests=[plain], previous_new_tokens=first.input_ids)
    assert preparer.last_copy_bytes == copied
    inputs = preparer.prepare([], [], device_token_requests=[plain], previous_new_tokens=first.input_ids.clone())
    assert inputs.input_ids.tolist() == [60]


@pytest.mark.parametrize("change", ["resize_", "set_"])
def test_previous_tokens_changed_by_code_the_call_runs_feed_the_rows_as_they_were(backend, change):
    """The previous tokens' length bounds the slots pass 1 accepts; code the call runs
    later (here a generator of generation requests) shrinks the caller's tensor or points
    it at other memory. The rows read the tokens as they were when the call took them
    (torch's index check raised after the host pass before)."""
    preparer = InputPreparer(16, 4)
    previous = torch.tensor([50, 51, 52, 53], dtype=torch.int32)
    plain = decoding(backend, 3, [1, 2], [], slot=3)

    def generation():
        if change == "resize_":
            previous.resize_(1)
        else:
            previous.set_(torch.tensor([9], dtype=torch.int32))
        yield from ()

    inputs = preparer.prepare([], generation(), device_token_requests=[plain], previous_new_tokens=previous)
    assert previous.shape == (1,)
    assert inputs.input_ids.tolist() == [53] and inputs.device_token_slots.tolist() == [3]


def test_previous_tokens_whose_storage_shrinks_during_the_call_are_refused(backend):
    """Code the call runs shrinks the storage the caller's tensor (and the call's alias of
    it) lies in: the gather would read past it (torch checks indices against the shape
    only). Refused, the ring where it was."""
    preparer = InputPreparer(16, 4)
    previous = torch.arange(1_000_000, dtype=torch.int32)
    plain = decoding(backend, 3, [1, 2], [], slot=999_999)

    def generation():
        previous.untyped_storage().resize_(4)
        yield from ()

    with pytest.raises(RuntimeError, match="the memory of previous_new_tokens was resized by code that ran during"):
        preparer.prepare([], generation(), device_token_requests=[plain], previous_new_tokens=previous)
    assert preparer.last_copy_bytes == 0
    inputs = preparer.prepare([], [], device_token_requests=[plain], previous_new_tokens=torch.arange(
        1_000_000, dtype=torch.int32))
    assert inputs.input_ids.tolist() == [999_999]


def test_previous_tokens_that_share_memory_with_the_inputs_anywhere_are_refused(backend):
    """The preparer's inputs reached through another tensor over the same memory, starting
    further in (numpy's view of a field, made a tensor again): refused as well."""
    preparer = InputPreparer(16, 4)
    first = preparer.prepare([backend.Request(8, [60, 61, 62, 63])], [])
    plain = decoding(backend, 3, [1, 2], [], slot=0)
    inside = torch.from_numpy(first.input_ids.numpy()[1:])
    with pytest.raises(ValueError, match="a view of this InputPreparer's own inputs"):
        preparer.prepare([], [], device_token_requests=[plain], previous_new_tokens=inside)


def test_previous_tokens_without_a_column_are_named(backend):
    preparer = InputPreparer(16, 4)
    plain = decoding(backend, 3, [1, 2], [], slot=0)
    with pytest.raises(ValueError, match=r"previous_new_tokens has no column \(its shape is \(n, 0\)\)"):
        preparer.prepare([], [], device_token_requests=[plain],
                         previous_new_tokens=torch.zeros((4, 0), dtype=torch.int32))



@pytest.mark.parametrize("group", ["context_requests", "generation_requests", "device_token_requests"])
def test_a_group_that_is_not_iterable_is_named(backend, group):
    """A single Request where a list of them goes, in each group of InputPreparer.prepare:
    the TypeError prepare_inputs gives, and the step neither copies nor moves its ring."""
    preparer = InputPreparer(16, 4)
    request = decoding(backend, 3, [1, 2], [], slot=0)
    groups = {"context_requests": [], "generation_requests": [], group: request}
    before = preparer.last_copy_bytes
    with pytest.raises(TypeError) as caught:
        preparer.prepare(**groups, previous_new_tokens=torch.zeros(4, dtype=torch.int32))
    assert str(caught.value) == f"{group} must be a list (or another iterable) of Requests, not a Request"
    assert preparer.last_copy_bytes == before
    step = preparer.prepare([], [request])  # the preparer serves the next step
    assert step.input_ids.tolist() == [2]
