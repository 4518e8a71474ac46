"""Scenario ``memory``: bytes per token held, tokcy against Python lists (tracemalloc).

``num_requests`` requests start from a 64-token prompt and grow by one append per request
per step (fresh Python ints, as a sampler's ``tolist()`` returns them) until each holds
``num_tokens`` tokens. The figure is what tracemalloc counts as still allocated afterwards
(every container, request object and token store; not the interpreter), divided by the
tokens held; the peak during growth is recorded too. Python lists pay an 8-byte slot and a
28-byte int object per token; tokcy stores int32 with at most 25 % spare capacity.
tracemalloc sees numpy's buffers, so both backends are measured the same way. Not timed.
"""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np

from tokcy._baselines.tokens import ListTokens
from tokcy.bench.scenario import Row, Scenario

VOCAB = 128_000
PROMPT = 64

SIZES = {
    "smoke": ((4, 512),),
    "quick": ((32, 8_192),),
    "default": ((256, 8_192),),
    "full": ((256, 8_192), (64, 32_768)),
}


def grown_tokens(num_requests: int, num_tokens: int, rng_seed: int = 0) -> np.ndarray:
    """Token ids, shape [num_tokens, num_requests]: row i is every request's token i."""
    return np.random.default_rng(rng_seed).integers(0, VOCAB, (num_tokens, num_requests), dtype=np.int32)


def grow(make, tokens: np.ndarray) -> list:
    """Requests made by ``make(i, prompt_list)`` and grown by appends through ``tokens``."""
    prompts = tokens[:PROMPT].T
    requests = [make(i, prompts[i].tolist()) for i in range(tokens.shape[1])]
    appends = [request.add_new_token for request in requests]
    for step in range(PROMPT, tokens.shape[0]):
        for append, token in zip(appends, tokens[step].tolist()):
            append(token, 0)
    return requests


def bytes_per_token(make, num_requests: int, num_tokens: int, rng_seed: int = 0) -> tuple:
    """(retained, peak) bytes per token that tracemalloc counts for the grown requests."""
    tokens = grown_tokens(num_requests, num_tokens, rng_seed)
    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.clear_traces()
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        requests = grow(make, tokens)
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    held = num_requests * num_tokens
    if sum(r.get_num_tokens(0) for r in requests) != held:
        raise AssertionError("the grown requests do not hold the expected number of tokens")
    del requests
    return (current - base) / held, (peak - base) / held


def makers(backend) -> dict:
    return {
        "tokcy": lambda i, prompt: backend.Request(i, prompt),
        "list": lambda i, prompt: ListTokens(prompt),
    }


class Memory(Scenario):
    name = "memory"
    title = "Memory: bytes per token held after growth by appends (tracemalloc)"
    unit = "B/token"
    ratio_label = "smaller"
    columns = (("requests", "requests"), ("tokens", "tokens each"))
    implementations = ("tokcy", "list")
    legend = (
        "tokcy: Request (int32 buffer per beam); list: a Python list of int per request",
        "retained bytes after growth / tokens held; peak during growth in the JSON output",
    )

    def configs(self, level):
        return [{"requests": r, "tokens": t} for r, t in SIZES[level]]

    def describe(self, config):
        return f"{config['requests']} x {config['tokens']:,} tokens"

    def run(self, config, backend, plan):
        values, extra = {}, {}
        for name, make in makers(backend).items():
            retained, peak = bytes_per_token(make, config["requests"], config["tokens"])
            values[name] = retained
            extra[name] = {"retained_bytes_per_token": retained, "peak_bytes_per_token": peak}
        return Row(config=dict(config), values=values, timings=extra, note="tracemalloc")


SCENARIO = Memory()
