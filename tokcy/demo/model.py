"""A tiny decoder-only transformer that consumes tokcy's prepared inputs and a paged KV cache.

Token embedding, ``num_layers`` x (RMSNorm, rotary multi-head attention, RMSNorm, gated
MLP), final RMSNorm and LM head. Weights come from a fixed seed; everything is float64 so
that the engine (batched, paged, chunked) and the reference (one request, full recompute)
pick the same greedy token.

The model contract (what ``tokcy.demo.engine.Engine`` needs of a model)
-----------------------------------------------------------------------

``model.forward(inputs, kv_cache)`` returns the logits ``(len(inputs.gather_ids), vocab)``
of the gathered rows, after writing every token row's new K/V into ``kv_cache``.

* ``inputs`` is what ``tokcy.executor.InputPreparer.prepare`` returns (a ``DeviceInputs``
  of a preparer made with a block size): device tensors ``input_ids``, ``position_ids``,
  ``gather_ids`` (one entry per token row / gathered row), per sequence ``cu_seqlens``,
  ``seq_lens``, ``num_cached_tokens``, ``kv_lens`` (cached + this step's tokens) and
  ``cu_kv_seqlens``; the ints ``max_query_len``, ``max_kv_len``; ``slot_mapping`` (int64
  per token row: the cache slot its K/V goes to, -1 for a padding row, which writes
  nothing); ``block_table`` (sequences x max_blocks_per_seq, int32: block ``j`` of the
  sequence holds its positions ``j * block_size ...``; zero past its blocks); the paged
  CSR ``kv_indptr``, ``kv_indices``, ``kv_last_page_len``; and ``groups[g]`` with the
  same per-group arrays when layers use different block tables (group 0 is the top level).
  Padding sequences have ``kv_lens`` 0 and no blocks; their rows are never gathered.
* ``kv_cache`` is a ``tokcy.demo.kv_cache.PagedKVCache``: ``kv_cache.layer(i)`` gives
  that layer's ``(keys, values)``, each ``(num_slots, num_kv_heads, head_dim)``, flat by
  slot (slot = block * block_size + offset), and ``kv_cache.block_size``.
* The engine reads ``model.config.num_layers``, ``model.config.num_kv_heads`` (may differ
  from the number of query heads), ``model.config.head_dim``, ``model.device`` and
  ``model.dtype`` to build the cache.

How this model does it: one indexed write per layer puts the rows' K/V at
``slot_mapping``; the keys and values of every sequence are read back through
``block_table`` as one (sequences, max_kv_len) gather, and each row attends, causally by
absolute position, to its own sequence's first ``kv_lens`` positions. No per-sequence
Python loop and no Python arithmetic on slots.
"""

from dataclasses import dataclass

import torch

DTYPE = torch.float64


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 96
    d_model: int = 32
    num_layers: int = 2
    num_heads: int = 2
    mlp_hidden: int = 64
    rope_theta: float = 10000.0
    seed: int = 1234
    norm_eps: float = 1e-6

    @property
    def head_dim(self):
        return self.d_model // self.num_heads

    @property
    def num_kv_heads(self):
        return self.num_heads


# ---------------------------------------------------------------- shared math (also used by the reference)
def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotary(x, positions, inv_freq):
    """Rotate (tokens, heads, head_dim) by the angles of ``positions`` (NeoX half split)."""
    angles = positions.to(DTYPE)[:, None] * inv_freq[None, :]  # (tokens, head_dim/2)
    cos = angles.cos()[:, None, :]
    sin = angles.sin()[:, None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def mlp(x, layer):
    return (torch.nn.functional.silu(x @ layer["w_gate"]) * (x @ layer["w_up"])) @ layer["w_down"]


class TinyTransformer:
    """Weights plus two entry points: ``forward`` (paged, batched) and the pieces the reference reuses."""

    def __init__(self, config=ModelConfig(), device="cpu"):
        self.config = config
        self.device = torch.device(device)
        self.dtype = DTYPE
        generator = torch.Generator().manual_seed(config.seed)
        d, h, v = config.d_model, config.mlp_hidden, config.vocab_size

        def init(*shape, scale):
            return (torch.randn(*shape, generator=generator, dtype=DTYPE) * scale).to(self.device)

        self.embedding = init(v, d, scale=1.0)
        self.layers = []
        for _ in range(config.num_layers):
            self.layers.append(
                {
                    "attn_norm": 1.0 + init(d, scale=0.1),
                    "w_q": init(d, d, scale=d**-0.5),
                    "w_k": init(d, d, scale=d**-0.5),
                    "w_v": init(d, d, scale=d**-0.5),
                    "w_o": init(d, d, scale=d**-0.5),
                    "mlp_norm": 1.0 + init(d, scale=0.1),
                    "w_gate": init(d, h, scale=d**-0.5),
                    "w_up": init(d, h, scale=d**-0.5),
                    "w_down": init(h, d, scale=h**-0.5),
                }
            )
        self.final_norm = 1.0 + init(d, scale=0.1)
        self.lm_head = init(d, v, scale=d**-0.5 * 4.0)
        hd = config.head_dim
        self.inv_freq = (
            1.0 / config.rope_theta ** (torch.arange(0, hd, 2, dtype=DTYPE) / hd)
        ).to(self.device)

    # pieces shared with the reference ----------------------------------------------
    def qkv(self, layer, x, positions):
        cfg = self.config
        h = rms_norm(x, layer["attn_norm"], cfg.norm_eps)
        shape = (x.shape[0], cfg.num_heads, cfg.head_dim)
        q = rotary((h @ layer["w_q"]).view(shape), positions, self.inv_freq)
        k = rotary((h @ layer["w_k"]).view(shape), positions, self.inv_freq)
        v = (h @ layer["w_v"]).view(shape)
        return q, k, v

    def finish_layer(self, layer, x, attention):
        x = x + attention.reshape(x.shape[0], -1) @ layer["w_o"]
        return x + mlp(rms_norm(x, layer["mlp_norm"], self.config.norm_eps), layer)

    def logits(self, hidden):
        return rms_norm(hidden, self.final_norm, self.config.norm_eps) @ self.lm_head

    # the engine's forward ----------------------------------------------------------
    def forward(self, inputs, kv_cache):
        """Logits (len(inputs.gather_ids), vocab) for the gathered rows; new K/V written to
        ``kv_cache`` (see the model contract in the module docstring)."""
        slots = inputs.slot_mapping
        written = torch.nonzero(slots >= 0).squeeze(1)  # padding rows write nothing
        written_slots = slots.index_select(0, written)
        layout = BatchLayout(inputs, kv_cache.block_size)
        x = self.embedding[inputs.input_ids.long()]
        for index, layer in enumerate(self.layers):
            q, k, v = self.qkv(layer, x, inputs.position_ids.long())
            keys, values = kv_cache.layer(index)
            keys.index_copy_(0, written_slots, k.index_select(0, written))  # one indexed write each
            values.index_copy_(0, written_slots, v.index_select(0, written))
            x = self.finish_layer(layer, x, layout.attend(q, keys, values))
        return self.logits(x[inputs.gather_ids.long()])


class BatchLayout:
    """Where every sequence's queries and keys are, computed once per forward on the device.

    Queries are laid out (sequences, max_query_len) by their row; keys (sequences,
    max_kv_len) by position, their cache slots read through the block table. A query of
    sequence s at offset i sits at position kv_len - seq_len + i and sees the keys at
    positions <= its own and < kv_len.
    """

    def __init__(self, inputs, block_size):
        device = inputs.block_table.device
        num_rows = len(inputs.position_ids)
        seq_lens, kv_lens = inputs.seq_lens.long(), inputs.kv_lens.long()
        max_query_len, max_kv_len = max(int(inputs.max_query_len), 1), max(int(inputs.max_kv_len), 1)
        positions = torch.arange(max_kv_len, device=device)
        blocks = inputs.block_table.long().index_select(1, positions // block_size)
        self.key_slots = blocks * block_size + positions % block_size
        self.key_valid = positions[None, :] < kv_lens[:, None]
        sequences = torch.arange(len(seq_lens), device=device)
        self.row_sequence = torch.repeat_interleave(sequences, seq_lens, output_size=num_rows)
        self.row_offset = torch.arange(num_rows, device=device) - inputs.cu_seqlens.long()[self.row_sequence]
        query_positions = (kv_lens - seq_lens)[:, None] + torch.arange(max_query_len, device=device)[None, :]
        self.visible = self.key_valid[:, None, :] & (positions[None, None, :] <= query_positions[:, :, None])
        self.query_shape = (len(seq_lens), max_query_len)

    def attend(self, q, keys, values):
        """Each row's attention over its sequence's keys, gathered by slot. Keys past a
        sequence's KV read slot 0's block: masked, and their values zeroed so that a
        NaN-poisoned block cannot leak through 0 * NaN; a query that sees nothing
        (padding) gets zeros."""
        k = keys[self.key_slots]  # (sequences, max_kv_len, heads, dim)
        v = torch.where(self.key_valid[..., None, None], values[self.key_slots], 0.0)
        queries = q.new_zeros(self.query_shape + q.shape[1:])
        queries[self.row_sequence, self.row_offset] = q
        scores = torch.einsum("sqhd,skhd->shqk", queries, k) * q.shape[-1] ** -0.5
        scores = scores.masked_fill(~self.visible[:, None], float("-inf"))
        probs = torch.nan_to_num(scores.softmax(-1), nan=0.0)
        return torch.einsum("shqk,skhd->sqhd", probs, v)[self.row_sequence, self.row_offset]
