"""Token-buffer baselines: reading through ``get_tokens()`` copies, and plain Python lists.

The TensorRT-LLM pull requests #16791 and #22092 start from the same pattern:
``request.get_tokens(0)`` marshals the whole token vector into a new Python list, and the
caller then reads only its length, a short slice or the last entry. These functions
reproduce those reads, so the accessor benchmark can time them beside tokcy's O(1) /
O(range) accessors on the same request.
"""

from __future__ import annotations

import numpy as np


# #16791 ("before", cuda_graph_runner first-draft branch): len(request.get_tokens(0)).
def num_tokens_by_copy(request) -> int:
    return len(request.get_tokens(0))


# #16791 ("before", _prepare_tp_inputs context loop): get_tokens(0)[begin:end].
def tokens_range_by_copy(request, begin: int, end: int) -> list:
    return request.get_tokens(0)[begin:end]


# The same copy, read for its last entry (what get_last_tokens(0) replaces).
def last_token_by_copy(request) -> int:
    return request.get_tokens(0)[-1]


class ListTokens:
    """A request's tokens kept as a Python list of ints: the store tokcy replaces.

    One Python int object per token (ids above 256 are not cached by CPython) plus an
    8-byte list slot: the memory benchmark's baseline, and the append baseline.
    """

    __slots__ = ("tokens",)

    def __init__(self, prompt):
        self.tokens = list(prompt.tolist() if isinstance(prompt, np.ndarray) else prompt)

    def add_new_token(self, token: int, beam: int = 0) -> int:  # plain list.append
        self.tokens.append(token)
        return len(self.tokens)

    def get_num_tokens(self, beam: int = 0) -> int:
        return len(self.tokens)

    def truncate(self, num_tokens: int) -> None:
        del self.tokens[num_tokens:]
