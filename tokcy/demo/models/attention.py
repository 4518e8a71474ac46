"""Paged attention over tokcy's attention metadata, batched: no Python loop over sequences.

One ``AttentionPlan`` per forward turns the step's metadata into index tensors that every
layer reuses:

- ``slot_mapping`` (one int64 per token row, -1 for padding rows): where each new row's
  key and value are written, one indexed write per layer;
- ``block_table`` (sequences x max_blocks_per_seq, -1 where a sliding window released a
  block) with ``kv_lens``: the cache slot of every key position ``0 .. kv_len - 1`` of every
  sequence, gathered into a (sequences, max_kv_len) layout;
- ``cu_seqlens``, ``position_ids``, ``max_query_len``: where each token row sits in a
  (sequences, max_query_len) layout of queries, and its absolute position.

The mask is transformers' own convention: a query at position q sees key positions k with
``k <= q`` and, in a layer with a sliding window w, ``k > q - w`` (w positions, itself
included). Keys at positions past ``kv_len``, or in released blocks, are masked and zeroed
(an unwritten slot may hold anything, NaN included, and 0 x NaN would leak into the sum).
"""

import torch
from torch.nn.functional import scaled_dot_product_attention


class AttentionPlan:
    """The index tensors of one step, built once and shared by all layers."""

    def __init__(self, inputs, block_size, sliding_windows):
        positions = inputs.position_ids.long()
        device = positions.device
        num_rows = positions.shape[0]
        cu_seqlens = inputs.cu_seqlens.to(device).long()
        num_sequences = cu_seqlens.shape[0] - 1
        rows = torch.arange(num_rows, device=device)
        self.row_sequence = torch.searchsorted(cu_seqlens[1:], rows, right=True)
        self.row_offset = rows - cu_seqlens[self.row_sequence]
        self.num_sequences = num_sequences
        self.max_query_len = int(inputs.max_query_len)

        slot_mapping = inputs.slot_mapping.to(device).long()
        written = slot_mapping >= 0
        self.write_rows = written.nonzero().squeeze(1)
        self.write_slots = slot_mapping[self.write_rows]

        max_kv_len = int(inputs.max_kv_len)
        table = inputs.block_table.to(device).long()
        key_positions = torch.arange(max_kv_len, device=device)
        block_index = key_positions // block_size
        width = table.shape[1]
        if width:
            blocks = table[:, block_index.clamp(max=width - 1)]
        else:
            blocks = table.new_full((num_sequences, max_kv_len), -1)
        blocks = torch.where(block_index[None, :] < width, blocks, -1)  # past the table: missing
        kv_lens = inputs.kv_lens.to(device).long()
        key_valid = (key_positions[None, :] < kv_lens[:, None]) & (blocks >= 0)
        self.key_valid = key_valid
        self.key_slots = torch.where(key_valid, blocks * block_size + key_positions % block_size, 0)

        query_positions = torch.full((num_sequences, self.max_query_len), -1, dtype=torch.long, device=device)
        query_positions[self.row_sequence, self.row_offset] = positions
        causal = (key_positions[None, None, :] <= query_positions[:, :, None]) & key_valid[:, None, :]
        self.masks = {}  # window (None: full attention) -> (sequences, 1, max_query_len, max_kv_len)
        for window in set(sliding_windows):
            mask = causal
            if window is not None:
                mask = mask & (key_positions[None, None, :] > query_positions[:, :, None] - window)
            self.masks[window] = mask[:, None]

    def attend(self, q, k, v, keys, values, window):
        """Write this step's ``k``/``v`` (rows, kv_heads, dim) into ``keys``/``values`` (slots,
        kv_heads, dim), then attend: returns (rows, heads, dim) for the queries ``q``."""
        keys[self.write_slots] = k[self.write_rows]
        values[self.write_slots] = v[self.write_rows]
        invalid = ~self.key_valid[:, :, None, None]
        gathered_keys = keys[self.key_slots].masked_fill(invalid, 0)  # (sequences, max_kv_len, kv_heads, dim)
        gathered_values = values[self.key_slots].masked_fill(invalid, 0)
        queries = q.new_zeros((self.num_sequences, self.max_query_len) + q.shape[1:])
        queries[self.row_sequence, self.row_offset] = q
        out = scaled_dot_product_attention(
            queries.transpose(1, 2), gathered_keys.transpose(1, 2), gathered_values.transpose(1, 2),
            attn_mask=self.masks[window], scale=q.shape[-1] ** -0.5, enable_gqa=q.shape[1] != k.shape[1],
        )
        return out.transpose(1, 2)[self.row_sequence, self.row_offset]
