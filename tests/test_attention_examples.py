"""Attention metadata from small batches worked out by hand (both backends)."""

import numpy as np
import pytest

from tokcy import RequestState
from tokcy.executor import HostBuffers, prepare_inputs

GENERATING = RequestState.GENERATION_IN_PROGRESS


def generating(module, request_id, tokens, blocks, *, drafts=(), slot=None, groups=None):
    request = module.Request(request_id, tokens[:-1] if len(tokens) > 1 else tokens,
                             num_layer_groups=1 if groups is None else len(groups))
    request.state = GENERATING
    if len(tokens) > 1:
        request.add_new_token(tokens[-1])
    for table, ids in zip(request.block_tables, [blocks] if groups is None else groups):
        table.extend(ids)
    request.draft_tokens = list(drafts)
    request.seq_slot = slot
    return request


def context(module, request_id, prompt_len, cursor, chunk, groups):
    request = module.Request(request_id, list(range(prompt_len)), num_layer_groups=len(groups))
    request.context_current_position = cursor
    request.context_chunk_size = chunk
    for table, ids in zip(request.block_tables, groups):
        table.extend(ids)
    return request


def arrays(result, group=None):
    source = result if group is None else result.groups[group]
    return {name: np.asarray(getattr(source, name)).tolist()
            for name in ("slot_mapping", "block_table", "kv_indptr", "kv_indices", "kv_last_page_len")}


@pytest.mark.parametrize("with_out", [False, True])
def test_every_row_kind_block_size_4(backend, with_out):
    # bs 4. A: context chunk [2, 7) of a 10-token prompt, straddling blocks 0 and 1.
    a = context(backend, 1, 10, 2, 5, [[7, 3, 9]])
    # B: n = 4 tokens, 2 drafts: positions 3, 4, 5, crossing from block 0 into block 1.
    b = generating(backend, 2, [5, 6, 7, 8], [4, 5], drafts=[1, 2])
    # C: first draft, n = 6, M = 2: positions 3, 4, 5.
    c = generating(backend, 3, [0, 1, 2, 3, 4, 5], [2, 8])
    # D: plain generation, n = 5: position 4, the first slot of block 1.
    d = generating(backend, 4, [1, 2, 3, 4, 5], [6, 1])
    # E: device token, n = 3: position 3.
    e = generating(backend, 5, [1, 2, 3], [11], slot=5)
    out = HostBuffers(64, 8, 2, max_blocks_per_seq=3) if with_out else None
    result = prepare_inputs([a], [b, d], first_draft_requests=[c], device_token_requests=[e], max_draft_len=2,
                            block_size=4, out=out, max_blocks_per_seq=None if with_out else 3)
    assert result.position_ids.tolist() == [2, 3, 4, 5, 6, 3, 4, 5, 3, 4, 5, 4, 3]
    assert arrays(result) == {
        "slot_mapping": [30, 31, 12, 13, 14, 19, 20, 21, 11, 32, 33, 4, 47],
        "block_table": [[7, 3, 0], [4, 5, 0], [2, 8, 0], [6, 1, 0], [11, 0, 0]],
        "kv_indptr": [0, 2, 4, 6, 8, 9],
        "kv_indices": [7, 3, 4, 5, 2, 8, 6, 1, 11],
        "kv_last_page_len": [3, 2, 2, 1, 4],
    }
    assert result.kv_lens.tolist() == [7, 6, 6, 5, 4]
    assert result.cu_kv_seqlens.tolist() == [0, 7, 13, 19, 24, 28]
    assert (result.max_query_len, result.max_kv_len) == (5, 7)
    assert result.slot_mapping.dtype == np.int64 and result.block_table.dtype == np.int32
    assert result.groups[0].block_size == 4


def test_padding_rows_write_nothing(backend):
    d = generating(backend, 4, [1, 2, 3, 4, 5], [6, 1])
    e = generating(backend, 5, [1, 2, 3], [11], slot=0)
    result = prepare_inputs([], [d], device_token_requests=[e], block_size=4, cuda_graph_batch_sizes=[4],
                            max_blocks_per_seq=2)
    assert arrays(result) == {
        "slot_mapping": [4, 47, -1, -1],
        "block_table": [[6, 1], [11, 0], [0, 0], [0, 0]],
        "kv_indptr": [0, 2, 3, 3, 3],
        "kv_indices": [6, 1, 11],
        "kv_last_page_len": [1, 4, 0, 0],
    }
    assert result.kv_lens.tolist() == [5, 4, 0, 0]
    assert result.cu_kv_seqlens.tolist() == [0, 5, 9, 9, 9]
    assert (result.max_query_len, result.max_kv_len) == (1, 5)


def test_two_groups_and_a_sliding_window_release(backend):
    # group 0: block size 2, group 1: block size 4. The context request fills [0, 6).
    a = context(backend, 1, 6, 0, 6, [[5, 6, 7], [30, 31]])
    # n = 10: position 9. Group 0 released its first 3 blocks (positions 0-5).
    b = generating(backend, 2, list(range(10)), None, groups=[[0, 1, 2, 3, 4], [20, 21, 22]])
    b.block_tables[0].release_front(3)
    out = HostBuffers(32, 4, max_blocks_per_seq=6, num_layer_groups=2)
    result = prepare_inputs([a], [b], block_sizes=(2, 4), out=out)
    assert arrays(result, 0) == {
        "slot_mapping": [10, 11, 12, 13, 14, 15, 9],
        "block_table": [[5, 6, 7, 0, 0, 0], [-1, -1, -1, 3, 4, 0]],
        "kv_indptr": [0, 3, 5],
        "kv_indices": [5, 6, 7, 3, 4],
        "kv_last_page_len": [2, 2],
    }
    assert arrays(result, 1) == {
        "slot_mapping": [120, 121, 122, 123, 124, 125, 89],
        "block_table": [[30, 31, 0, 0, 0, 0], [20, 21, 22, 0, 0, 0]],
        "kv_indptr": [0, 2, 5],
        "kv_indices": [30, 31, 20, 21, 22],
        "kv_last_page_len": [2, 2],
    }
    assert arrays(result) == arrays(result, 0)
    assert result.kv_lens.tolist() == [6, 10] and result.cu_kv_seqlens.tolist() == [0, 6, 16]
    assert (result.max_query_len, result.max_kv_len) == (6, 10)
    assert [group.block_size for group in result.groups] == [2, 4]


def test_without_a_block_size_nothing_is_written(backend):
    d = generating(backend, 4, [1, 2, 3, 4, 5], [6, 1])
    out = HostBuffers(8, 2, max_blocks_per_seq=2)
    out.metadata.kv_lens[:] = 77
    result = prepare_inputs([], [d], out=out)
    assert result.slot_mapping is None and result.groups is None and result.block_table is None
    assert out.metadata.kv_lens.tolist() == [77, 77]
    assert "groups" not in result.asdict()
