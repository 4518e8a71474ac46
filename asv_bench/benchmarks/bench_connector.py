"""KV-connector scheduler output in steady decode (seed 003_4dcae7e0a3c46b11's benchmark).

Each iteration appends one token to every request, and a block to its (single) layer
group every 32 tokens; then the iteration is reported. The timed call is the report only:
``number = 1``, so asv calls ``setup`` (which advances the world by one decode step)
before every sample. Implementations:

* ``tokcy``: ``SchedulerOutputManager.build_scheduler_output`` (columnar output);
* ``tokcy+RequestData``: the same, then every ``RequestData`` materialised with its
  ``new_tokens`` and ``new_block_ids`` (what a per-request consumer pays);
* ``before`` / ``after``: the seed's two patterns, in ``tokcy._baselines.connector``.

The world (requests, blocks, one decode step) is ``tokcy.bench.connector.DecodeWorld``, the
one ``python -m tokcy bench`` times.

The seed's own figures (engine, main -> PR, ms per iteration) for scale:
16x8192 2.05 -> 0.16, 16x32768 8.13 -> 0.36, 64x2048 2.35 -> 0.45, 64x8192 8.16 -> 0.67,
256x2048 9.88 -> 1.81, 256x4096 17.95 -> 2.13, 8x131072 16.14 -> 0.59.
"""

from tokcy import _backend
from tokcy.bench.connector import DecodeWorld

from ._common import backend_module

# the seed's seven rows, then 8 requests at more lengths for the flatness check
SHAPES = ["16x8192", "16x32768", "64x2048", "64x8192", "256x2048", "256x4096", "8x131072", "8x2048", "8x8192", "8x32768"]
IMPLEMENTATIONS = ["tokcy", "tokcy+RequestData", "before", "after"]

_WORLDS = {}


def world_for(backend, num_requests, num_tokens, implementation):
    """The steady-decode world of ``tokcy.bench.connector`` (one per process at a time), its
    context report and first decode report checked equal to a reference implementation's."""
    key = (backend, num_requests, num_tokens, implementation)
    if key not in _WORLDS:
        _WORLDS.clear()
        module = backend_module(backend)
        manager = "tokcy" if implementation.startswith("tokcy") else implementation
        world = DecodeWorld(module, num_requests, num_tokens, manager)
        reference = DecodeWorld(module, num_requests, num_tokens, "after" if manager == "tokcy" else "tokcy")
        if world.reports != reference.reports:
            raise AssertionError(f"{implementation} reports differ from {reference.implementation}'s")
        _WORLDS[key] = world
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
        output = self.world.report()
        if implementation == "tokcy+RequestData":
            for data in output.cached_requests:
                data.new_tokens, data.new_block_ids
