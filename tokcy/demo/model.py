"""A tiny decoder-only transformer that consumes tokcy's flat inputs and a paged KV cache.

Token embedding, ``num_layers`` x (RMSNorm, rotary multi-head attention, RMSNorm, gated
MLP), final RMSNorm and LM head. Weights come from a fixed seed; everything is float64 so
that the engine (batched, paged, chunked) and the reference (one request, full recompute)
pick the same greedy token.

``forward`` reads exactly what ``tokcy.executor`` produces: ``input_ids`` and
``position_ids`` (one per token row), ``cu_seqlens`` / ``num_cached_tokens`` (one per
sequence), ``gather_ids`` (rows whose logits are wanted), plus one block-id array per
sequence (``None`` for a padding sequence). Attention is a plain per-sequence loop: the
new keys and values are written into the cache slots the block table gives for positions
``cached .. cached + len - 1``, then the sequence attends to every position ``0 .. cached
+ len - 1`` read back through the block table, causally within the chunk. Padding
sequences are computed (attending to themselves only, writing nothing) and their rows
are never gathered.
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


def attend(q, k, v, query_positions, key_positions):
    """q (Lq, H, D), k/v (Lk, H, D): causal softmax attention by absolute position."""
    scale = q.shape[-1] ** -0.5
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    mask = key_positions[None, :] > query_positions[:, None]  # (Lq, Lk): key in the future
    scores = scores.masked_fill(mask[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


class TinyTransformer:
    """Weights plus two entry points: ``forward`` (paged, batched) and the pieces the reference reuses."""

    def __init__(self, config=ModelConfig(), device="cpu"):
        self.config = config
        self.device = torch.device(device)
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
    def forward(self, input_ids, position_ids, cu_seqlens, num_cached_tokens, gather_ids, kv_cache, block_tables):
        """Logits (len(gather_ids), vocab) for the gathered rows; new K/V written to ``kv_cache``.

        ``block_tables[s]`` is sequence s's block ids (array-like) or ``None`` for padding.
        Index arguments may be numpy arrays or torch tensors.
        """
        device = self.device
        input_ids = torch.as_tensor(input_ids, device=device).long()
        position_ids = torch.as_tensor(position_ids, device=device).long()
        gather_ids = torch.as_tensor(gather_ids, device=device).long()
        cu = [int(v) for v in torch.as_tensor(cu_seqlens).tolist()]
        cached = [int(v) for v in torch.as_tensor(num_cached_tokens).tolist()]
        num_sequences = len(cu) - 1
        if len(block_tables) < num_sequences:
            raise ValueError(f"{len(block_tables)} block tables for {num_sequences} sequences")

        # per sequence, once for all layers: the slots of its new rows and of all its positions
        plans = []
        for s in range(num_sequences):
            start, end = cu[s], cu[s + 1]
            table = block_tables[s]
            if table is None:  # padding: attends to itself, writes nothing
                plans.append((start, end, None, None, None))
                continue
            length = end - start
            total = cached[s] + length
            all_positions = torch.arange(total, device=device)
            slots = kv_cache.slots(table, all_positions)
            plans.append((start, end, slots[cached[s]:], slots, all_positions))

        x = self.embedding[input_ids]
        for index, layer in enumerate(self.layers):
            q, k, v = self.qkv(layer, x, position_ids)
            keys, values = kv_cache.layer(index)
            out = torch.empty_like(q)
            for start, end, new_slots, slots, all_positions in plans:
                rows = slice(start, end)
                if slots is None:
                    out[rows] = attend(q[rows], k[rows], v[rows], position_ids[rows], position_ids[rows])
                    continue
                keys[new_slots] = k[rows]
                values[new_slots] = v[rows]
                query_positions = all_positions[len(all_positions) - (end - start):]
                out[rows] = attend(q[rows], keys[slots], values[slots], query_positions, all_positions)
            x = self.finish_layer(layer, x, out)
        return self.logits(x[gather_ids])
