"""The reference: same weights, one request at a time, full recompute every step, no cache, greedy.

Nothing here knows about tokcy: the sequence is a Python list, every step runs the whole
sequence through the model with a dense causal mask and appends the argmax of the last
row. The engine is right when it produces exactly these tokens.
"""

import torch

from tokcy.demo.model import attend


def full_forward(model, tokens):
    """Logits of the last position of ``tokens`` (a list of ids), computed from scratch."""
    ids = torch.tensor(tokens, dtype=torch.long, device=model.device)
    positions = torch.arange(len(tokens), device=model.device)
    x = model.embedding[ids]
    for layer in model.layers:
        q, k, v = model.qkv(layer, x, positions)
        x = model.finish_layer(layer, x, attend(q, k, v, positions, positions))
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
