"""The Llama family (Llama, Mistral, Qwen2) as a paged, batched forward over tokcy's inputs.

Per layer: RMSNorm, fused q/k/v projection (biases where the architecture has them),
rotary embedding, paged attention (grouped-query, per-layer sliding window), output
projection, RMSNorm, gated SiLU MLP; then the final RMSNorm and the LM head (the embedding
matrix when the embeddings are tied), for the gathered rows only.

Numerics follow transformers' implementation of the same architectures, so that greedy
decoding agrees token for token: RMSNorm normalises in float32 and casts back before the
weight multiplies; the rotary inverse frequencies (Llama-3 scaling included) are computed
in float32 by the same formula, and so are the angles, their cosines and sines, which are
then cast to the model's dtype. Everything else runs in the model's dtype.
"""

import math

import torch
from torch.nn.functional import linear, silu

from tokcy.demo.models.attention import AttentionPlan
from tokcy.demo.models.config import UnsupportedModelError
from tokcy.demo.models.weights import CheckpointError

#: Tensors a checkpoint may carry that the forward does not use (older checkpoints saved
#: the rotary buffer).
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def rope_inverse_frequencies(config):
    """Float32 inverse frequencies of the rotary embedding, as transformers computes them."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    # Llama 3.1: long wavelengths divided by the factor, short ones kept, smooth in between
    low_freq_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_freq_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rms_norm(x, weight, eps):
    normed = x.to(torch.float32)
    normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def rotate(x, cos, sin):
    """Rotary embedding of (rows, heads, dim) with (rows, 1, dim) cos/sin, halves split (NeoX layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _layer_names(config, index):
    prefix = f"model.layers.{index}."
    names = {
        "input_norm": prefix + "input_layernorm.weight",
        "post_norm": prefix + "post_attention_layernorm.weight",
    }
    for proj in ("q", "k", "v", "o"):
        names[f"{proj}_weight"] = prefix + f"self_attn.{proj}_proj.weight"
        if config.qkv_bias if proj != "o" else config.o_proj_bias:
            names[f"{proj}_bias"] = prefix + f"self_attn.{proj}_proj.bias"
    for proj in ("gate", "up", "down"):
        names[f"{proj}_weight"] = prefix + f"mlp.{proj}_proj.weight"
        if config.mlp_bias:
            names[f"{proj}_bias"] = prefix + f"mlp.{proj}_proj.bias"
    return names


def _expected_shapes(config):
    hidden, heads, kv_heads, dim = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
    inner = config.intermediate_size
    return {
        "input_norm": (hidden,), "post_norm": (hidden,),
        "q_weight": (heads * dim, hidden), "k_weight": (kv_heads * dim, hidden), "v_weight": (kv_heads * dim, hidden),
        "o_weight": (hidden, heads * dim),
        "q_bias": (heads * dim,), "k_bias": (kv_heads * dim,), "v_bias": (kv_heads * dim,), "o_bias": (hidden,),
        "gate_weight": (inner, hidden), "up_weight": (inner, hidden), "down_weight": (hidden, inner),
        "gate_bias": (inner,), "up_bias": (inner,), "down_bias": (hidden,),
    }


class _Layer:
    """One decoder layer's weights (biases None where the architecture has none) and its
    sliding window (None: full attention)."""

    __slots__ = ("input_norm", "post_norm", "qkv_weight", "qkv_bias", "o_weight", "o_bias", "gate_up_weight",
                 "gate_up_bias", "down_weight", "down_bias", "window")
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_weight: torch.Tensor
    o_bias: torch.Tensor | None
    gate_up_weight: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down_weight: torch.Tensor
    down_bias: torch.Tensor | None
    window: int | None


class LlamaFamilyModel:
    """A Llama / Mistral / Qwen2 causal LM for the demo engine (``tokcy.demo.load_model`` builds it).

    ``config`` is the checked ``ArchitectureConfig`` (``num_layers``, ``num_kv_heads`` and
    ``head_dim`` size the KV cache); ``device`` and ``dtype`` are the weights'.
    """

    def __init__(self, config, source, *, device, dtype):
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        names = source.names()
        used = set()

        def take(name, shape):
            if name not in names:
                raise CheckpointError(f"{config.model_type} checkpoint: tensor {name} is missing")
            tensor = source.get(name)
            if tuple(tensor.shape) != shape:
                raise CheckpointError(f"{config.model_type} checkpoint: {name} has shape {tuple(tensor.shape)}, "
                                      f"the config says {shape}")
            if not tensor.is_floating_point():
                raise CheckpointError(f"{config.model_type} checkpoint: {name} is {tensor.dtype}, not floating point")
            used.add(name)
            return tensor.to(device=self.device, dtype=dtype)

        vocab, hidden = config.vocab_size, config.hidden_size
        self.embedding = take("model.embed_tokens.weight", (vocab, hidden))
        shapes = _expected_shapes(config)
        self.layers = []
        for index in range(config.num_layers):
            t = {key: take(name, shapes[key]) for key, name in _layer_names(config, index).items()}
            layer = _Layer()
            layer.input_norm, layer.post_norm = t["input_norm"], t["post_norm"]
            layer.qkv_weight = torch.cat((t["q_weight"], t["k_weight"], t["v_weight"]))
            layer.qkv_bias = torch.cat((t["q_bias"], t["k_bias"], t["v_bias"])) if config.qkv_bias else None
            layer.o_weight, layer.o_bias = t["o_weight"], t.get("o_bias")
            layer.gate_up_weight = torch.cat((t["gate_weight"], t["up_weight"]))
            layer.gate_up_bias = torch.cat((t["gate_bias"], t["up_bias"])) if config.mlp_bias else None
            layer.down_weight, layer.down_bias = t["down_weight"], t.get("down_bias")
            layer.window = config.sliding_windows[index]
            self.layers.append(layer)
        self.final_norm = take("model.norm.weight", (hidden,))
        if config.tie_word_embeddings:
            self.lm_head = self.embedding
            used.add("lm_head.weight")  # a tied checkpoint may still carry the copy
        else:
            self.lm_head = take("lm_head.weight", (vocab, hidden))
        unexpected = sorted(name for name in names - used if not name.endswith(IGNORED_SUFFIXES))
        if unexpected:
            raise UnsupportedModelError(f"{config.model_type} checkpoint: tensor {unexpected[0]} is not part of "
                                        f"the architecture tokcy.demo.load_model implements")
        self.inv_freq = rope_inverse_frequencies(config).to(self.device)

    def __repr__(self):
        c = self.config
        return (f"LlamaFamilyModel({c.model_type}: {c.num_layers} layers, hidden {c.hidden_size}, "
                f"{c.num_heads} heads / {c.num_kv_heads} KV heads x {c.head_dim}, vocab {c.vocab_size}, "
                f"{self.dtype}, {self.device})")

    def _rotary(self, positions):
        angles = positions[:, None].float() * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(self.dtype)[:, None, :], angles.sin().to(self.dtype)[:, None, :]

    def forward(self, inputs, kv_cache):
        """Logits (len(gather_ids), vocab) of the gathered rows; this step's K/V written to ``kv_cache``.

        ``inputs`` is the step's prepared inputs (token rows, sequences and the attention
        metadata: ``slot_mapping``, ``block_table``, ``kv_lens``, ...); ``kv_cache.layer(i)``
        gives layer i's (keys, values) storage, each (slots, num_kv_heads, head_dim), with
        slot = block * ``kv_cache.block_size`` + offset.
        """
        config = self.config
        keys, _ = kv_cache.layer(0)
        if keys.dtype != self.dtype:  # (a device mismatch fails in torch at the first indexed write)
            raise ValueError(f"the KV cache holds {keys.dtype}, the model computes in {self.dtype}")
        plan = AttentionPlan(inputs, kv_cache.block_size, config.sliding_windows)
        positions = inputs.position_ids.long()
        cos, sin = self._rotary(positions)
        gather = inputs.gather_ids.long()
        rows = positions.shape[0]
        q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        eps = config.rms_norm_eps
        x = self.embedding[inputs.input_ids.long()]
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            q, k, v = linear(rms_norm(x, layer.input_norm, eps), layer.qkv_weight, layer.qkv_bias).split(
                (q_size, kv_size, kv_size), dim=-1)
            q = rotate(q.view(rows, config.num_heads, config.head_dim), cos, sin)
            k = rotate(k.view(rows, config.num_kv_heads, config.head_dim), cos, sin)
            v = v.view(rows, config.num_kv_heads, config.head_dim)
            keys, values = kv_cache.layer(index)
            attention = plan.attend(q, k, v, keys, values, layer.window).reshape(rows, q_size)
            if index == last:  # nothing but the gathered rows reaches the logits from here on
                x, attention = x[gather], attention[gather]
            x = x + linear(attention, layer.o_weight, layer.o_bias)
            gate, up = linear(rms_norm(x, layer.post_norm, eps), layer.gate_up_weight, layer.gate_up_bias).chunk(2, -1)
            x = x + linear(silu(gate) * up, layer.down_weight, layer.down_bias)
        return linear(rms_norm(x, self.final_norm, eps), self.lm_head)
