"""Small random Llama / Mistral / Qwen2 checkpoints for the model tests, and hand-built step inputs.

``random_model(name)`` builds one of ``ARCHITECTURES`` from its ``transformers`` config in
float64 and gives it random weights of useful scale (the library's own initialisation is
so small that every logit is nearly equal and greedy output is one token repeated).

``step_inputs`` writes out, sequence by sequence and position by position, the attention
metadata a step of the engine hands the model (the contract of ``forward(inputs,
kv_cache)``), from plain Python lists: the model tests use it as an independent source of
inputs, apart from tokcy's executor.
"""

from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the model tests compare with transformers")

DTYPE = torch.float64
_COMMON = dict(vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=1024, bos_token_id=None, eos_token_id=None)

#: name -> (config class, options): every case has grouped-query attention (4 heads, 2 KV heads).
ARCHITECTURES = {
    # Llama-3 RoPE scaling; head_dim 8 puts one frequency in each band (kept, smoothed, divided)
    "llama3": ("LlamaConfig", dict(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 64})),
    # a window shorter than every prompt of the tests
    "mistral": ("MistralConfig", dict(sliding_window=11)),
    # q/k/v biases, tied embeddings
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
}


def config_for(name, **overrides):
    class_name, options = ARCHITECTURES[name]
    return getattr(transformers, class_name)(**{**_COMMON, **options, **overrides})


def randomize(model, seed):
    """Weights of unit-scale activations: norms near 1, projections ~ 1/sqrt(fan in), small biases.

    With tied embeddings the input embedding is also the LM head, so a large embedding makes
    every token predict itself: there it is small and the layers' outputs are larger.
    """
    tied = model.config.tie_word_embeddings
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=DTYPE)
            if name.endswith("norm.weight"):
                parameter.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                parameter.copy_(0.2 * noise)
            elif name.endswith("embed_tokens.weight"):
                parameter.copy_(noise * (0.1 if tied else 1.0))
            else:
                residual_out = name.endswith(("o_proj.weight", "down_proj.weight"))
                gain = 3.0 if name == "lm_head.weight" or (tied and residual_out) else 1.0
                parameter.copy_(noise * parameter.shape[1] ** -0.5 * gain)
    return model


def random_model(name, seed=0, **overrides):
    config = config_for(name, **overrides)
    model = transformers.AutoModelForCausalLM.from_config(config).to(DTYPE).eval()
    return randomize(model, seed)


class ListKVCache:
    """Per layer (slots, kv_heads, head_dim) storage, NaN where nothing was written."""

    def __init__(self, num_slots, block_size, num_layers, num_kv_heads, head_dim, dtype=DTYPE):
        self.block_size = block_size
        shape = (num_slots, num_kv_heads, head_dim)
        self._layers = [(torch.full(shape, float("nan"), dtype=dtype), torch.full(shape, float("nan"), dtype=dtype))
                        for _ in range(num_layers)]

    def layer(self, index):
        return self._layers[index]


def step_inputs(sequences, block_size):
    """The inputs of one step: ``sequences`` is a list of (tokens, num_cached, block ids), each
    feeding ``tokens`` at positions ``num_cached ..``; ``block ids`` uses -1 for released blocks.
    Every sequence's last row is gathered."""
    input_ids, positions, slots, gather, cu, kv_lens = [], [], [], [], [0], []
    width = max(len(blocks) for _, _, blocks in sequences)
    table = []
    for tokens, cached, blocks in sequences:
        for offset, token in enumerate(tokens):
            position = cached + offset
            input_ids.append(token)
            positions.append(position)
            slots.append(blocks[position // block_size] * block_size + position % block_size)
        cu.append(cu[-1] + len(tokens))
        gather.append(cu[-1] - 1)
        kv_lens.append(cached + len(tokens))
        table.append(list(blocks) + [0] * (width - len(blocks)))

    def tensor(values, dtype=torch.int32):
        return torch.tensor(values, dtype=dtype)

    return SimpleNamespace(
        input_ids=tensor(input_ids), position_ids=tensor(positions), gather_ids=tensor(gather),
        cu_seqlens=tensor(cu), kv_lens=tensor(kv_lens), slot_mapping=tensor(slots, torch.int64),
        block_table=tensor(table), max_query_len=max(len(t) for t, _, _ in sequences), max_kv_len=max(kv_lens),
    )
