"""KV-connector scheduler output in steady decode (seed 003_4dcae7e0a3c46b11's benchmark).

Each iteration appends one token to every request, and a block to its (single) layer
group every 32 tokens; then the iteration is reported. The timed call is the report only:
``number = 1``, so asv calls ``setup`` (which advances the world by one decode step)
before every sample. Implementations:

* ``tokcy``: ``SchedulerOutputManager.build_scheduler_output`` (columnar output);
* ``tokcy+RequestData``: the same, then every ``RequestData`` materialised with its
  ``new_tokens`` and ``new_block_ids`` (what a per-request consumer pays);
* ``before`` / ``after``: the seed's two patterns, in ``tokcy._baselines.connector``.

The seed's own figures (engine, main -> PR, ms per iteration) for scale:
16x8192 2.05 -> 0.16, 16x32768 8.13 -> 0.36, 64x2048 2.35 -> 0.45, 64x8192 8.16 -> 0.67,
256x2048 9.88 -> 1.81, 256x4096 17.95 -> 2.13, 8x131072 16.14 -> 0.59.
"""

import numpy as np

from tokcy import RequestState, _backend
from tokcy._baselines.connector import AfterSchedulerOutputManager, BeforeSchedulerOutputManager
from tokcy.connector import SchedulerOutputManager

from ._common import backend_module

BLOCK = 32
# the seed's seven rows, then 8 requests at more lengths for the flatness check
SHAPES = ["16x8192", "16x32768", "64x2048", "64x8192", "256x2048", "256x4096", "8x131072", "8x2048", "8x8192", "8x32768"]
IMPLEMENTATIONS = ["tokcy", "tokcy+RequestData", "before", "after"]


def make_manager(implementation):
    if implementation == "before":
        return BeforeSchedulerOutputManager()
    if implementation == "after":
        return AfterSchedulerOutputManager()
    return SchedulerOutputManager()


class DecodeWorld:
    """``num_requests`` requests of ``num_tokens`` tokens, past their context report."""

    def __init__(self, module, num_requests, num_tokens, implementation):
        rng = np.random.default_rng(0)
        self.requests = []
        self.next_block = 0
        self.step_number = 0
        for request_id in range(num_requests):
            request = module.Request(request_id, rng.integers(0, 32000, num_tokens, dtype=np.int32))
            blocks = -(-num_tokens // BLOCK)
            request.block_tables[0].extend(np.arange(self.next_block, self.next_block + blocks, dtype=np.int32))
            self.next_block += blocks
            self.requests.append(request)
        self.implementation = implementation
        self.manager = make_manager(implementation)
        reference = AfterSchedulerOutputManager() if implementation.startswith("tokcy") else SchedulerOutputManager()
        # context report, then one decode step; the implementation is checked against the reference once
        for in_context in (True, False):
            if not in_context:
                self.advance()
            batch = (self.requests, []) if in_context else ([], self.requests)
            check_equal(self.report(self.manager, *batch), self.report(reference, *batch))
            if in_context:
                for request in self.requests:
                    request.move_to_next_context_chunk()
                    request.state = RequestState.GENERATION_IN_PROGRESS

    @staticmethod
    def report(manager, context, generation):
        output = manager.build_scheduler_output(context, generation)
        if isinstance(manager, SchedulerOutputManager):
            return output.new_requests + output.cached_requests
        return output[0] + output[1]

    def advance(self):
        """One decode step: a token per request, a block when the last one is full."""
        self.step_number += 1
        for request in self.requests:
            num_tokens = request.add_new_token(self.step_number % 32000)
            if num_tokens % BLOCK == 1:
                request.block_tables[0].append(self.next_block)
                self.next_block += 1

    def run(self):
        output = self.manager.build_scheduler_output([], self.requests)
        if self.implementation == "tokcy+RequestData":
            for data in output.cached_requests:
                data.new_tokens, data.new_block_ids
        return output


def check_equal(reported, reference):
    assert len(reported) == len(reference)
    for data, expected in zip(reported, reference):
        assert data.request_id == expected.request_id
        assert data.new_tokens == expected.new_tokens
        assert data.new_block_ids == expected.new_block_ids
        assert data.computed_position == expected.computed_position


_WORLDS = {}


def world_for(backend, num_requests, num_tokens, implementation):
    key = (backend, num_requests, num_tokens, implementation)
    if key not in _WORLDS:
        _WORLDS.clear()  # one world per process at a time
        _WORLDS[key] = DecodeWorld(backend_module(backend), num_requests, num_tokens, implementation)
    return _WORLDS[key]


class ConnectorSteadyDecode:
    # Numeric parameters, so that the dashboard can plot against tokens per request; the
    # combinations that are not rows of SHAPES are skipped (asv shows them as n/a).
    params = (["cython", "python"], [8, 16, 64, 256], [2048, 4096, 8192, 32768, 131072], IMPLEMENTATIONS)
    param_names = ["backend", "requests", "tokens", "implementation"]
    number = 1
    repeat = (20, 200, 10.0)
    warmup_time = 0
    timeout = 600

    def setup(self, backend, num_requests, num_tokens, implementation):
        if f"{num_requests}x{num_tokens}" not in SHAPES:
            raise NotImplementedError("not one of the seed's rows")
        _backend.module = backend_module(backend)
        self.world = world_for(backend, num_requests, num_tokens, implementation)
        self.world.advance()

    def time_report(self, backend, num_requests, num_tokens, implementation):
        self.world.run()
