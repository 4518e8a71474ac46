"""Errors of input preparation (``tokcy.executor``), shared by both backends.

The compiled core calls these only on its slow path, so a bad batch raises the same
exception with the same message whichever backend is live. Each function raises.
"""

import numpy as np

from tokcy import _report_checks
from tokcy._report_checks import request_group  # noqa: F401 - the executor's groups are read alike
from tokcy._state import RequestState
from tokcy._tokens import INT32_MAX, as_integer, shown_repr

MAX_METADATA_GROUPS = 16  # layer groups one AttentionMetadata writes (the compiled core sizes its arrays by it)

#: The arrays ``InputWriter.bind`` takes, in its order (``tokcy.executor.ARRAY_FIELDS``).
BIND_ARRAYS = ("input_ids", "position_ids", "gather_ids", "seq_lens", "num_cached_tokens", "prompt_lens",
               "cu_seqlens", "request_ids", "draft_tokens", "draft_lens", "device_token_slots")

CONTEXT = "context_requests"
GENERATION = "generation_requests"
FIRST_DRAFT = "first_draft_requests"
DEVICE_TOKEN = "device_token_requests"
GROUP_NAMES = (CONTEXT, GENERATION, FIRST_DRAFT, DEVICE_TOKEN)  # prepare_inputs' argument order


def _state_name(code):
    try:
        return RequestState(code).name
    except ValueError:
        return str(code)


def not_a_request(group, index, obj, expected):
    """``obj`` is not a ``Request`` of the writer's backend (``expected``): the connector's
    message, which also names the class a Request of the other backend should have been."""
    _report_checks.not_a_request(group, index, obj, expected)


def duplicate(request_id):
    raise ValueError(f"request {request_id} is given twice in the batch")


def wrong_state(group, request_id, state_code, expected_code):
    raise ValueError(
        f"request {request_id} in {group} must be in state {_state_name(expected_code)}, "
        f"but it is {_state_name(state_code)}"
    )


def empty_chunk(request_id, position, prompt_len):
    message = f"context request {request_id} has an empty chunk (context_chunk_size is 0)"
    if position >= prompt_len:  # the usual cause: its last chunk ran, and its state was left as it was
        message += (f": its prompt is all computed (context_current_position {position} = prompt_len "
                    f"{prompt_len}), so it belongs in generation_requests, in state GENERATION_IN_PROGRESS")
    raise ValueError(message)


def chunk_past_prompt(request_id, position, chunk, prompt_len):
    raise ValueError(
        f"context request {request_id}: chunk [{position}, {position + chunk}) runs past its prompt of {prompt_len} tokens"
    )


def needs_single_beam(group, request_id, beam_width):
    raise ValueError(f"request {request_id} in {group} has beam_width {beam_width}, but those rows need beam_width 1")


def too_many_beams(request_id, beam_width, max_beam_width):
    raise ValueError(f"request {request_id} has beam_width {beam_width}, above max_beam_width {max_beam_width}")


def too_many_drafts(request_id, num_drafts, max_draft_len):
    raise ValueError(f"request {request_id} has {num_drafts} draft tokens, above max_draft_len {max_draft_len}")


def device_with_drafts(request_id, num_drafts):
    raise ValueError(
        f"request {request_id} in {DEVICE_TOKEN} carries {num_drafts} draft tokens; device-token rows take none"
    )


def missing_slot(request_id):
    raise ValueError(f"request {request_id} in {DEVICE_TOKEN} has no seq_slot")


def device_slots_arg(device_slots):
    """``InputWriter.plan``/``prepare``'s ``device_slots`` as an int, -1 for None."""
    if device_slots is None:
        return -1
    slots = as_integer(device_slots, "device_slots")
    if slots < 0:
        raise ValueError(f"device_slots must be >= 0 or None, got {slots}")
    return slots


def slot_beyond_device_tokens(request_id, slot, device_slots):
    raise ValueError(f"request {request_id} in {DEVICE_TOKEN}: seq_slot {slot} is out of range for "
                     f"previous_new_tokens of {device_slots} slots")


def no_tokens(group, request_id, beam):
    raise ValueError(f"request {request_id} in {group} has no tokens in beam {beam}")


def owned_batch_sizes(sizes):
    """``cuda_graph_batch_sizes`` copied into a tuple of ints before anything is planned,
    so no caller code (``__iter__``, ``__index__``) runs between the checks and the copy."""
    return None if sizes is None else tuple([as_integer(size, "cuda_graph_batch_sizes entry") for size in tuple(sizes)])


def bad_batch_size(value):
    if value > INT32_MAX:
        raise ValueError(f"cuda_graph_batch_sizes entries must be <= {INT32_MAX}, got {value}")
    raise ValueError(f"cuda_graph_batch_sizes entries must be >= 1, got {value}")


def outside_buffer(request_id, begin, count, size):
    raise ValueError(
        f"request {request_id}: tokens [{begin}, {begin + count}) lie outside the {size} tokens of its buffer"
    )


def no_padding_size(num_sequences, sizes):
    raise ValueError(
        f"no CUDA-graph batch size is >= the {num_sequences} sequences of the batch (sizes: {list(sizes)})"
    )


def over_capacity(what, needed, capacity):
    raise ValueError(f"the batch needs {needed} {what} but the output has room for {capacity}")


def negative_limit(name, value):
    raise ValueError(f"{name} must be >= 0, got {value}")


def busy():
    raise RuntimeError("this InputWriter is in use by another call (another thread's, or one re-entered from "
                       "code this call runs)")


def metadata_busy():
    raise RuntimeError("these attention-metadata outputs are in use by another call (a writer that shares them)")


def not_planned():
    raise RuntimeError("InputWriter.write() needs a successful plan() first")


def not_bound():
    raise RuntimeError("InputWriter.write() needs output arrays: call bind() first")


# ---------------------------------------------------------------- attention metadata
MAX_BLOCK_SIZE = 2**31 - 1


def bad_block_sizes(value):
    raise ValueError(
        f"block_sizes must be a tuple of integers in [1, {MAX_BLOCK_SIZE}], one per layer group, "
        f"got {shown_repr(value)}"
    )


def too_many_groups(num_groups, capacity):
    raise ValueError(f"block_sizes gives {num_groups} layer groups but the outputs have room for {capacity}")


def metadata_not_bound():
    raise ValueError("a block size needs attention-metadata outputs: HostBuffers(..., max_blocks_per_seq=...)")


def beams_with_block_size(request_id, beam_width):
    raise ValueError(
        f"request {request_id} has beam_width {beam_width}, but attention metadata (a block size) needs "
        f"beam_width 1: one block table per request cannot describe each beam's KV"
    )


def group_count(request_id, num_tables, num_groups):
    raise ValueError(f"request {request_id} has {num_tables} layer groups but block_sizes gives {num_groups}")


def too_many_blocks(request_id, group, num_blocks, max_blocks):
    raise ValueError(
        f"request {request_id} group {group}: its block table holds {num_blocks} blocks, "
        f"above max_blocks_per_seq {max_blocks}"
    )


def missing_block(request_id, group, position, block, num_blocks):
    """``position``: the first of the sequence's positions without a block; ``block``: the
    last block its rows need."""
    raise ValueError(
        f"request {request_id} group {group}: its rows need {block + 1} block{'s' if block else ''}, but its block "
        f"table holds only {num_blocks} (position {position} has none)"
    )


def released_block(request_id, group, position, block):
    raise ValueError(
        f"request {request_id} group {group}: position {position} is in block {block}, "
        f"which the sliding window released"
    )


def no_table_slot(request_id):
    raise ValueError(f"request {request_id} has no seq_slot; the device block table is indexed by it")


def table_slot_out_of_range(request_id, slot, max_slots):
    raise ValueError(
        f"request {request_id} has seq_slot {slot}, outside the device block table's max_slots {max_slots}"
    )


def duplicate_table_slot(slot, first_request_id, second_request_id):
    raise ValueError(f"seq_slot {slot} is used by both request {first_request_id} and request {second_request_id}")


def kv_too_long(total):
    raise ValueError(f"the batch's KV lengths add up to {total}, above the int32 range of cu_kv_seqlens")


def device_table_needs_prepare():
    raise RuntimeError("with a device block table, use InputWriter.prepare() (plan and write in one call)")


def metadata_replanned():
    raise RuntimeError("the attention metadata was re-bound or planned by another writer since plan(): plan again")


def memory_moved(name):
    """A bound array, or a numpy array its memory comes from, no longer has the memory it
    had when bound (``_invariants.bound_memory``): raised before anything is written."""
    raise RuntimeError(f"out array {name} (or the array its memory comes from) was given new memory by "
                       f"__setstate__ while bound: nothing was written; bind the arrays again")


def named_arrays(**arrays):
    """The arrays a metadata bind takes (``name=array``, or ``name=`` a tuple of arrays, one
    per layer group, or None for none) in one tuple, in the order given, and their names
    (``slot_mapping[1]``) in another."""
    flat, names = [], []
    for name, value in arrays.items():
        if type(value) is tuple:
            flat += value
            names += [f"{name}[{group}]" for group in range(len(value))]
        elif value is not None:
            flat.append(value)
            names.append(name)
    return tuple(flat), tuple(names)


def plain_array(array):
    """``array`` (an ndarray, of a subclass maybe) as a plain ndarray over the same memory:
    what it says of itself (len, shape, dtype, flags, ctypes) is then numpy's, which a
    subclass's properties cannot change, and so is the buffer it exports (from Python 3.12
    a subclass's ``__buffer__`` may export other, temporary memory: a pointer kept into
    that would dangle once the export is released)."""
    return np.ndarray.view(array, np.ndarray)


def check_bind_arrays(arrays):
    """``InputWriter.bind``'s arrays: numpy, 1-D, C-contiguous, writable; int32, and int64
    for the eighth (request_ids). Returns their plain views (``plain_array``): what is
    written through, as their buffers are numpy's own, whatever a subclass exports."""
    views = []
    for position, array in enumerate(arrays):
        dtype = np.int64 if position == 7 else np.int32
        if not isinstance(array, np.ndarray):
            raise TypeError(f"bind() argument {position + 1} must be a numpy array, not {type(array).__name__}")
        array = plain_array(array)
        if (array.dtype != dtype or array.ndim != 1 or not array.flags.c_contiguous or not array.flags.writeable
                or not array.flags.aligned):
            raise ValueError(f"bind() argument {position + 1} must be a writable, aligned, contiguous 1-D "
                             f"{np.dtype(dtype)} array")
        views.append(array)
    return tuple(views)


def check_writable_array(name, array, dtype, ndim=1):
    """An attention-metadata array: an ``ndim``-D, C-contiguous, writable, aligned numpy array
    of ``dtype`` (the compiled core writes its entries through typed C pointers)."""
    plain = plain_array(array) if isinstance(array, np.ndarray) else None
    if plain is None or not (plain.dtype == dtype and plain.ndim == ndim and plain.flags.c_contiguous
                             and plain.flags.writeable and plain.flags.aligned):
        raise ValueError(f"{name} must be a {ndim}-D, C-contiguous, writable, aligned {np.dtype(dtype).name} "
                         f"numpy array")


def check_layer_groups(count):
    """``count`` layer groups, if the attention metadata can hold them (ValueError if not):
    checked where metadata arrays are made, and again where they are bound."""
    if count < 1 or count > MAX_METADATA_GROUPS:
        raise ValueError(f"between 1 and {MAX_METADATA_GROUPS} layer groups, got {count}")
    return count


def check_metadata_arrays(max_blocks_per_seq, kv_lens, cu_kv_seqlens, slot_mapping, kv_indptr, kv_last_page_len,
                          block_table, kv_indices):
    """``AttentionMetadata.bind``'s arguments, checked in one order for both backends:
    the group counts, then every array (numpy only: nothing else is written through a
    pointer), so that a bad argument raises the same error whichever backend is live.
    Returns ``max_blocks_per_seq`` as an int (TypeError, naming it, if it is no integer)."""
    count = check_layer_groups(len(slot_mapping))
    max_blocks_per_seq = as_integer(max_blocks_per_seq, "max_blocks_per_seq")
    if max_blocks_per_seq < 1:
        raise ValueError(f"max_blocks_per_seq must be >= 1, got {max_blocks_per_seq}")
    if len(kv_indptr) != count or len(kv_last_page_len) != count:
        raise ValueError("one kv_indptr and kv_last_page_len per layer group")
    if (block_table is None) != (kv_indices is None):
        raise ValueError("block_table and kv_indices are both given or both None")
    if block_table is not None and (len(block_table) != count or len(kv_indices) != count):
        raise ValueError("one block_table and kv_indices per layer group")
    check_writable_array("kv_lens", kv_lens, np.int32)
    check_writable_array("cu_kv_seqlens", cu_kv_seqlens, np.int32)
    for group in range(count):
        check_writable_array("slot_mapping", slot_mapping[group], np.int64)
        check_writable_array("kv_indptr", kv_indptr[group], np.int32)
        check_writable_array("kv_last_page_len", kv_last_page_len[group], np.int32)
        if block_table is not None:
            check_writable_array("block_table", block_table[group], np.int32, ndim=2)
            columns = plain_array(block_table[group]).shape[1]
            if columns != max_blocks_per_seq:
                dense_columns(group, max_blocks_per_seq, columns)
            check_writable_array("kv_indices", kv_indices[group], np.int32)
    return max_blocks_per_seq


def dense_columns(group, max_blocks_per_seq, columns):
    raise ValueError(f"block_table[{group}] must have {max_blocks_per_seq} columns, got {columns}")


def misaligned_delta_area():
    raise ValueError("delta_area must be 8-byte aligned (the changed entries' indices are int64)")


def check_device_table_arrays(table_slots, delta_area, gathers):
    """``AttentionMetadata.bind_device_table``'s arrays (``gathers``: the blocks, live
    counts and run starts, a tuple of arrays per group each), in one order for both backends."""
    check_writable_array("table_slots", table_slots, np.int32)
    check_writable_array("delta_area", delta_area, np.int32)
    area = plain_array(delta_area)
    if len(area) and area.ctypes.data % 8:  # (an empty area is never written)
        misaligned_delta_area()
    for name, arrays, dtype in zip(("gather_blocks", "gather_live", "gather_base"), gathers,
                                   (np.int32, np.int64, np.int64)):
        for array in arrays:
            check_writable_array(name, array, dtype)
