"""Scenario ``connector_batch``: how the scheduler output grows with the batch, beside the floor.

B requests of 2,048 tokens in steady decode (one new token per request per iteration, a
new block every 32), as in ``tokcy.bench.connector``, without ``before`` (its cost grows
with the tokens held, which that scenario shows). Goals: tokcy within 3x of the floor at
B = 256, 1,024 and 4,096, a fixed cost per call under 2 us, the RequestData of a report
within 3x of the columns alone at B = 256, and the pure twin no slower than ``after``.
"""

from __future__ import annotations

from tokcy.bench import goals
from tokcy.bench.connector import QUOTED_TITLE, request_data_goal, run_row
from tokcy.bench.scenario import GOAL_BATCH_SIZES, BatchSweep

TOKENS = 2_048


class ConnectorBatch(BatchSweep):
    name = "connector_batch"
    title = f"Connector: scheduler output for B requests of {TOKENS:,} tokens in steady decode, per iteration"
    fixed = {"tokens": TOKENS}
    implementations = ("tokcy", "tokcy+columns", "tokcy+RequestData", "tokcy+fields", "after", "floor")
    needs = ("tokcy.connector", "tokcy._baselines.connector")
    legend = (
        "tokcy: build_scheduler_output (columnar); tokcy+columns: then its twelve columns read; "
        "tokcy+RequestData: then every RequestData made; tokcy+fields: and "
        "each row's new_tokens and new_block_ids read; after: TensorRT-LLM pull request #22092's loop; floor: the "
        "same columns as plain C; tokcy/floor: the median over rounds of tokcy's round over the floor's, "
        "timed right after it; below 1.0x (B = 4,096): both wait on memory there, and the floor, a plain loop "
        "with no prefetch, waits longer (docs/benchmarks.md, the floor)",
    )
    quoted_title = QUOTED_TITLE
    plot_xlabel = f"batch size B (requests of {TOKENS:,} tokens)"

    def run(self, config, backend, plan):
        return run_row(config, backend, plan, [name for name in self.implementations if name != "floor"])

    def goals(self, rows, backend):
        if backend == "python":
            return [goals.twin_not_slower(rows)]
        return (goals.within_floor(rows, "requests", GOAL_BATCH_SIZES) + [goals.fixed_cost(rows, "requests")]
                + [request_data_goal(rows)])


SCENARIO = ConnectorBatch()
