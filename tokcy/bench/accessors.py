"""Scenario ``accessors``: the token buffer's reads and append, against ``get_tokens()`` copies.

One request of n tokens (beam 0). tokcy's O(1) / O(range) accessors are timed beside the
"before" pattern that TensorRT-LLM pull requests #16791 and #22092 removed, which copies the
whole token list with ``get_tokens(0)`` and reads its length, its last 64 tokens or its
last token; append is timed against ``list.append`` on a plain Python list (the bound
method itself, no wrapper). tokcy's lines stay flat in n; the copies grow with n. The
ratio column is copy / tokcy: how much more the copy pattern costs per read, not a
speed-up of any engine step (both absolute times are printed beside it).
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from tokcy._baselines import tokens as baselines
from tokcy.bench.scenario import Row, Scenario
from tokcy.bench.timing import measure

VOCAB = 128_000
RANGE = 64

OPERATIONS = {
    # label: (tokcy call, baseline call)
    "get_num_tokens": ("get_num_tokens(0)", "len(get_tokens(0))"),
    "get_tokens_range": (f"get_tokens_range(0, n-{RANGE}, n)", f"get_tokens(0)[n-{RANGE}:n]"),
    "get_last_tokens": ("get_last_tokens(0)", "get_tokens(0)[-1]"),
    "append": ("add_new_token(t, 0)", "list.append(t)"),
}

LENGTHS = {
    "smoke": (128, 512),
    "quick": (2_048, 131_072),
    "default": (2_048, 8_192, 32_768, 131_072),
    "full": (2_048, 4_096, 8_192, 16_384, 32_768, 65_536, 131_072),
}


def make_tokens(n: int, rng_seed: int = 0) -> np.ndarray:
    return np.random.default_rng(rng_seed).integers(0, VOCAB, n, dtype=np.int32)


def make_request(backend, n: int, rng_seed: int = 0):
    """A request whose beam 0 holds n tokens: a 64-token prompt, the rest appended."""
    tokens = make_tokens(n, rng_seed)
    prompt = min(n, 64)
    request = backend.Request(rng_seed, tokens[:prompt])
    for token in tokens[prompt:].tolist():
        request.add_new_token(token, 0)
    return request, tokens


def steps(backend, operation: str, n: int):
    """(tokcy step, baseline step, before-hook or None): checked equal before any timing."""
    request, tokens = make_request(backend, n)
    mine: Callable[[], object]
    theirs: Callable[[], object]
    if operation == "get_num_tokens":
        mine, theirs = functools.partial(request.get_num_tokens, 0), functools.partial(baselines.num_tokens_by_copy, request)
        before = None
    elif operation == "get_tokens_range":
        mine = functools.partial(request.get_tokens_range, 0, n - RANGE, n)
        theirs = functools.partial(baselines.tokens_range_by_copy, request, n - RANGE, n)
        before = None
    elif operation == "get_last_tokens":
        mine, theirs = functools.partial(request.get_last_tokens, 0), functools.partial(baselines.last_token_by_copy, request)
        before = None
    elif operation == "append":
        listed = baselines.ListTokens(tokens)
        token = int(tokens[-1])
        mine, theirs = functools.partial(request.add_new_token, token, 0), functools.partial(listed.tokens.append, token)
        theirs()
        if mine() != n + 1 or listed.get_num_tokens() != n + 1:
            raise AssertionError(f"append at n={n}: the lengths differ")
        request.truncate(n)
        listed.truncate(n)

        def before(request=request, listed=listed):
            request.truncate(n)
            listed.truncate(n)

        return mine, theirs, before
    else:
        raise ValueError(f"unknown operation {operation!r}")
    expected = mine()
    got = theirs()
    if list(np.atleast_1d(expected)) != list(np.atleast_1d(got)):
        raise AssertionError(f"{operation} at n={n}: baseline gave {got!r}, tokcy {expected!r}")
    return mine, theirs, before


class Accessors(Scenario):
    name = "accessors"
    title = "Token buffer accessors: one request of n tokens, time per call"
    columns = (("operation", "operation"), ("n", "tokens (n)"))
    implementations = ("tokcy", "baseline")
    ratio_label = "copy/tokcy"
    legend = tuple(f"{label}: tokcy {calls[0]}  vs  baseline {calls[1]}" for label, calls in OPERATIONS.items()) + (
        "copy/tokcy: the baseline's time over tokcy's for one read (for append: list.append's over tokcy's); "
        "it compares one accessor call, not an engine step",
    )
    plot_x = "n"
    plot_xlabel = "sequence length n (tokens)"
    plot_ylabel = "host time per call (s)"

    def configs(self, level):
        return [{"operation": op, "n": n} for op in OPERATIONS for n in LENGTHS[level]]

    def describe(self, config):
        return f"{config['operation']} n={config['n']:,}"

    def run(self, config, backend, plan):
        mine, theirs, before = steps(backend, config["operation"], config["n"])
        timings = {"tokcy": measure(mine, plan, before=before), "baseline": measure(theirs, plan, before=before)}
        return Row(
            config=dict(config),
            values={name: timing.median for name, timing in timings.items()},
            timings={name: timing.as_dict() for name, timing in timings.items()},
        )

    def plot_series(self, rows):
        series = []
        for op in ("get_tokens_range", "get_num_tokens"):
            for impl, call in zip(self.implementations, OPERATIONS[op]):
                points = sorted((r.config["n"], r.values[impl]) for r in rows if r.config["operation"] == op)
                if points:
                    series.append((f"{call} ({'tokcy' if impl == 'tokcy' else 'copy'})", [p[0] for p in points], [p[1] for p in points]))
        return series


SCENARIO = Accessors()
