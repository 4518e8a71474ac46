"""Deterministic demo workloads: prompts made of repeated motifs with a little noise.

Repetition is what prompt lookup feeds on; the noise keeps drafts from being always right.
"""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Workload:
    prompts: tuple
    max_new_tokens: tuple

    def __len__(self):
        return len(self.prompts)

    @property
    def num_prompt_tokens(self):
        return sum(len(prompt) for prompt in self.prompts)


def make_workload(num_requests, *, prompt_len=(16, 512), new_tokens=(32, 64), vocab_size=96, noise=0.1, seed=0):
    """``num_requests`` prompts with lengths in ``prompt_len`` and budgets in ``new_tokens`` (inclusive)."""
    rng = np.random.default_rng(seed)
    prompts, budgets = [], []
    for _ in range(num_requests):
        length = int(rng.integers(prompt_len[0], prompt_len[1] + 1))
        motif = rng.integers(0, vocab_size, size=int(rng.integers(3, 12))).tolist()
        prompt = (motif * (length // len(motif) + 1))[:length]
        for position in rng.integers(0, length, size=int(length * noise)).tolist():
            prompt[position] = int(rng.integers(0, vocab_size))
        prompts.append(tuple(prompt))
        budgets.append(int(rng.integers(new_tokens[0], new_tokens[1] + 1)))
    return Workload(tuple(prompts), tuple(budgets))
