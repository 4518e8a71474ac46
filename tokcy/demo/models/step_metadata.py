"""ADAPTER (temporary): the attention metadata of a step, computed in Python from the block tables.

The models read ``slot_mapping``, ``block_table``, ``kv_lens``, ``max_query_len`` and
``max_kv_len`` from the step's prepared inputs. Until the executor builds them in its own
pass, ``with_attention_metadata`` computes them here with numpy from each scheduled
sequence's block ids (a per-sequence Python loop: exactly the host work the executor's
pass removes).
"""

from types import SimpleNamespace

import numpy as np
import torch


def with_attention_metadata(inputs, block_tables, block_size):
    """``inputs`` (a ``DeviceInputs``) plus the attention metadata; ``block_tables[s]`` is sequence
    s's block ids (released blocks -1), ``None`` for a padding sequence."""
    host = inputs.host
    cu = np.asarray(host.cu_seqlens, dtype=np.int64)
    positions = np.asarray(host.position_ids, dtype=np.int64)
    kv_lens = np.asarray(host.num_cached_tokens, dtype=np.int64) + np.asarray(host.seq_lens, dtype=np.int64)
    width = max([len(table) for table in block_tables if table is not None] + [1])
    dense = np.zeros((len(cu) - 1, width), dtype=np.int64)
    live = np.zeros(len(cu) - 1, dtype=bool)
    for s, table in enumerate(block_tables[: len(cu) - 1]):
        if table is not None:
            dense[s, : len(table)] = table
            live[s] = True
    row_sequence = np.repeat(np.arange(len(cu) - 1), np.diff(cu))
    blocks = dense[row_sequence, positions // block_size]
    slot_mapping = np.where(live[row_sequence], blocks * block_size + positions % block_size, -1)
    device = inputs.input_ids.device

    def tensor(array, dtype):
        return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=dtype)

    return SimpleNamespace(
        input_ids=inputs.input_ids, position_ids=inputs.position_ids, gather_ids=inputs.gather_ids,
        cu_seqlens=tensor(cu, torch.int32), num_sequences=host.num_sequences,
        slot_mapping=tensor(slot_mapping, torch.int64), block_table=tensor(dense, torch.int32),
        kv_lens=tensor(kv_lens, torch.int32), max_query_len=int(np.diff(cu).max()), max_kv_len=int(kv_lens.max()),
    )
