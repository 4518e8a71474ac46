"""The reference: same weights, one request at a time, full recompute every step, no cache, greedy.

Nothing here knows about tokcy: the sequence is a Python list, every step runs the whole
sequence through the model (dense causal attention, torch's own
``scaled_dot_product_attention`` rather than the engine's kernel) and appends the argmax
of the last row. The engine is right when it produces exactly these tokens.

The last layer computes its attention for the last position only: nothing else of it
reaches the logits, and it halves the quadratic work of every step.
"""

import torch
from torch.nn.functional import scaled_dot_product_attention


def _attention(q, k, v, *, causal):
    # (tokens, heads, dim) -> (heads, tokens, dim) and back
    out = scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=causal)
    return out.transpose(0, 1)


def full_forward(model, tokens):
    """Logits of the last position of ``tokens`` (a list of ids), computed from scratch."""
    ids = torch.tensor(tokens, dtype=torch.long, device=model.device)
    positions = torch.arange(len(tokens), device=model.device)
    x = model.embedding[ids]
    last = len(model.layers) - 1
    for index, layer in enumerate(model.layers):
        q, k, v = model.qkv(layer, x, positions)
        if index == last:  # only the last row matters from here on
            x = model.finish_layer(layer, x[-1:], _attention(q[-1:], k, v, causal=False))
        else:
            x = model.finish_layer(layer, x, _attention(q, k, v, causal=True))
    return model.logits(x[-1:])[0]


def generate(model, prompt, max_new_tokens):
    """Greedy continuation of ``prompt``: a list of ``max_new_tokens`` token ids."""
    tokens = [int(t) for t in prompt]
    out = []
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            token = int(full_forward(model, tokens).argmax())
            tokens.append(token)
            out.append(token)
    return out
