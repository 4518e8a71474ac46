"""Paged attention over tokcy's attention metadata, batched: no Python loop over sequences.

One ``AttentionPlan`` per forward turns the step's metadata into index tensors that every
layer reuses:

- ``slot_mapping`` (one int64 per token row, -1 for padding rows): where each new row's
  key and value are written, one indexed write per layer;
- ``block_table`` (sequences x max_blocks_per_seq, -1 where a sliding window released a
  block) with ``kv_lens``: the cache slot of every key position ``0 .. kv_len - 1`` of every
  sequence, gathered into a (sequences, max_kv_len) layout; when every layer has the same
  sliding window w, only the w + max_query_len - 1 positions from each sequence's first
  query position - w + 1 on, so that a step's attention costs the same at any context length;
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

        query_positions = torch.full((num_sequences, self.max_query_len), -1, dtype=torch.long, device=device)
        query_positions[self.row_sequence, self.row_offset] = positions

        # Key positions gathered per sequence: all of 0 .. max_kv_len - 1, or, when every layer
        # has the same window w, only the span the step's queries can see, from its first
        # query's position - w + 1 on (w + max_query_len - 1 positions, flat in context length).
        max_kv_len = int(inputs.max_kv_len)
        windows = set(sliding_windows)
        window = next(iter(windows)) if len(windows) == 1 else None
        if window is None or window + self.max_query_len - 1 >= max_kv_len:
            key_positions = torch.arange(max_kv_len, device=device)[None, :]
        else:
            first = query_positions[:, 0].clamp(min=0)
            span = torch.arange(window + self.max_query_len - 1, device=device)
            key_positions = (first - window + 1).clamp(min=0)[:, None] + span[None, :]
        table = inputs.block_table.to(device).long()
        width = table.shape[1]
        block_index = (key_positions // block_size).expand(num_sequences, -1)
        blocks = table.gather(1, block_index.clamp(max=width - 1))
        blocks = torch.where(block_index < width, blocks, -1)  # past the table: missing
        kv_lens = inputs.kv_lens.to(device).long()
        key_valid = (key_positions < kv_lens[:, None]) & (blocks >= 0)
        self.key_valid = key_valid
        self.key_slots = torch.where(key_valid, blocks * block_size + key_positions % block_size, 0)

        key_positions = key_positions[:, None, :]
        causal = (key_positions <= query_positions[:, :, None]) & key_valid[:, None, :]
        self.masks = {}  # window (None: full attention) -> (sequences, 1, max_query_len, keys)
        for window in windows:
            mask = causal
            if window is not None:
                mask = mask & (key_positions > query_positions[:, :, None] - window)
            self.masks[window] = mask[:, None]

    def attend(self, q, k, v, keys, values, window):
        """Write this step's ``k``/``v`` (rows, kv_heads, dim) into ``keys``/``values`` (slots,
        kv_heads, dim), then attend: returns (rows, heads, dim) for the queries ``q``."""
        keys[self.write_slots] = k[self.write_rows]
        values[self.write_slots] = v[self.write_rows]
        invalid = ~self.key_valid[:, :, None, None]
        gathered_keys = keys[self.key_slots].masked_fill(invalid, 0)  # (sequences, keys, kv_heads, dim)
        gathered_values = values[self.key_slots].masked_fill(invalid, 0)
        queries = q.new_zeros((self.num_sequences, self.max_query_len) + q.shape[1:])
        queries[self.row_sequence, self.row_offset] = q
        out = scaled_dot_product_attention(
            queries.transpose(1, 2), gathered_keys.transpose(1, 2), gathered_values.transpose(1, 2),
            attn_mask=self.masks[window], scale=q.shape[-1] ** -0.5, enable_gqa=q.shape[1] != k.shape[1],
        )
        return out.transpose(1, 2)[self.row_sequence, self.row_offset]
