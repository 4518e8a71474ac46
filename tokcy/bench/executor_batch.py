"""Scenario ``executor_batch``: how ``prepare_inputs`` grows with the batch, beside the floor.

B generation requests of L = 2,048 tokens, no drafts, no context chunk (a decode step:
one row per request). Implementations as in ``tokcy.bench.executor``, without ``before``
(its cost grows with L, which that scenario shows). The goals of a decode step: tokcy
within 3x of the floor at B = 256, 1,024 and 4,096, a fixed cost per call under 2 us,
and the pure twin no slower than the per-request Python loop.
"""

from __future__ import annotations

from tokcy.bench import goals
from tokcy.bench.executor import run_row
from tokcy.bench.scenario import GOAL_BATCH_SIZES, BatchSweep

SEQ_LEN = 2_048


class ExecutorBatch(BatchSweep):
    name = "executor_batch"
    title = f"Executor: prepare_inputs for B generation requests of {SEQ_LEN:,} tokens (decode step), per iteration"
    implementations = ("tokcy", "after", "numpy", "floor")
    needs = ("tokcy.executor", "tokcy._baselines.executor")
    legend = (
        "tokcy: prepare_inputs into preallocated HostBuffers; after: the per-request Python loop of TensorRT-LLM "
        "pull request #16791; numpy: vLLM-style gather; floor: the same rows as plain C, timed in C; "
        "tokcy/floor: the median over rounds of tokcy's round over the floor's, timed right after it; "
        "below 1.0x (B = 4,096): both wait on memory there, and the floor, a plain loop with no prefetch, waits "
        "longer (docs/benchmarks.md, the floor)",
    )
    plot_xlabel = f"batch size B (requests of {SEQ_LEN:,} tokens)"

    def run(self, config, backend, plan):
        return run_row(config, backend, plan, ("after", "numpy"), config["requests"], SEQ_LEN, 0, 0)

    def goals(self, rows, backend):
        if backend == "python":
            return [goals.twin_not_slower(rows)]
        return goals.within_floor(rows, "requests", GOAL_BATCH_SIZES) + [goals.fixed_cost(rows, "requests")]


SCENARIO = ExecutorBatch()
