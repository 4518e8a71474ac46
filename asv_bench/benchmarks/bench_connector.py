"""KV-connector scheduler output in steady decode (the benchmark of TensorRT-LLM pull request #22092).

Each iteration appends one token to every request, and a block to its (single) layer
group every 32 tokens; then the iteration is reported. The timed call is the report only:
``number = 1``, so asv calls ``setup`` (which advances the world by one decode step)
before every sample. Implementations:

* ``tokcy``: ``SchedulerOutputManager.build_scheduler_output`` (columnar output);
* ``tokcy+columns``: the same, then its twelve columns read (the batch grid only);
* ``tokcy+RequestData``: the same, then every ``RequestData`` of the report made;
* ``tokcy+fields``: and each row's ``new_tokens`` and ``new_block_ids`` read (what a
  per-request consumer that reads two fields pays; the batch grid only);
* ``before`` / ``after``: the pull request's two patterns, in ``tokcy._baselines.connector``.

Three grids, each full (every cell runs): the pull request's seven (requests x tokens)
rows as one ``shape`` parameter, 8 requests at more sequence lengths (the flatness in
tokens), and the batch size at 2,048 tokens (without ``before``, which grows with the
tokens held). ``Floor*`` are the same reports as plain C, timed in C
(``tokcy.bench._floor``), as ``track_`` figures in seconds per call beside them.

The world (requests, blocks, one decode step) is ``tokcy.bench.connector.DecodeWorld``, the
one ``python -m tokcy bench`` times.
"""

from tokcy import _backend
from tokcy.bench import floor
from tokcy.bench.connector import BLOCK, CONSUMERS, DecodeWorld
from tokcy.bench.timing import Plan

from ._common import BACKENDS, NeedsFloor, backend_module

SHAPES = ["16x8192", "16x32768", "64x2048", "64x8192", "256x2048", "256x4096", "8x131072"]
LENGTHS = [2048, 8192, 32768, 131072]
BATCHES = [16, 64, 256, 1024, 4096]
IMPLEMENTATIONS = ["tokcy", "tokcy+RequestData", "before", "after"]
FLOOR_PLAN = Plan(rounds=5, per_round=9)

_WORLDS = {}
_REFERENCE_REPORTS = {}  # (backend, requests, tokens, implementation) -> its first two reports


def world_for(backend, num_requests, num_tokens, implementation):
    """The steady-decode world of ``tokcy.bench.connector`` (one per process at a time), its
    context report and first decode report checked equal to a reference implementation's
    (tokcy's against "after", every other against tokcy's; each reference built once)."""
    key = (backend, num_requests, num_tokens, implementation)
    if key not in _WORLDS:
        _WORLDS.clear()
        module = backend_module(backend)
        world = DecodeWorld(module, num_requests, num_tokens, implementation)
        other = "after" if implementation.startswith("tokcy") else "tokcy"
        reference_key = (backend, num_requests, num_tokens, other)
        if reference_key not in _REFERENCE_REPORTS:
            _REFERENCE_REPORTS[reference_key] = DecodeWorld(module, num_requests, num_tokens, other).reports
        if world.reports != _REFERENCE_REPORTS[reference_key]:
            raise AssertionError(f"{implementation} reports differ from {other}'s")
        _WORLDS[key] = world
    return _WORLDS[key]


class _SteadyDecode:
    number = 1
    repeat = (20, 200, 10.0)
    warmup_time = 0
    timeout = 600

    def _setup(self, backend, num_requests, num_tokens, implementation):
        _backend.module = backend_module(backend)
        self.world = world_for(backend, num_requests, num_tokens, implementation)
        self.world.advance()
        self.consume = CONSUMERS.get(implementation)

    def _report(self):
        output = self.world.report()
        if self.consume is not None:
            self.consume(output)


class ConnectorQuotedRows(_SteadyDecode):
    """The seven (requests x tokens) rows the pull request measured."""

    params = (BACKENDS, SHAPES, IMPLEMENTATIONS)
    param_names = ["backend", "shape", "implementation"]

    def setup(self, backend, shape, implementation):
        num_requests, num_tokens = map(int, shape.split("x"))
        self._setup(backend, num_requests, num_tokens, implementation)

    def time_report(self, backend, shape, implementation):
        self._report()


class ConnectorSequenceLength(_SteadyDecode):
    """8 requests; tokcy's line stays flat in tokens, before/after grow."""

    params = (BACKENDS, LENGTHS, IMPLEMENTATIONS)
    param_names = ["backend", "tokens", "implementation"]

    def setup(self, backend, num_tokens, implementation):
        self._setup(backend, 8, num_tokens, implementation)

    def time_report(self, backend, num_tokens, implementation):
        self._report()


class ConnectorBatch(_SteadyDecode):
    """B requests of 2,048 tokens: the cost per request, beside FloorReport.track_batch."""

    params = (BACKENDS, BATCHES, ["tokcy", "tokcy+columns", "tokcy+RequestData", "tokcy+fields", "after"])
    param_names = ["backend", "requests", "implementation"]

    def setup(self, backend, num_requests, implementation):
        self._setup(backend, num_requests, 2048, implementation)

    def time_report(self, backend, num_requests, implementation):
        self._report()


class FloorReport(NeedsFloor):
    """The floor of the report: seconds per call of the same columns in plain C, timed in C."""

    params = (BATCHES,)
    param_names = ["requests"]

    def track_batch(self, num_requests):
        return floor.report(FLOOR_PLAN, num_requests, 2048, BLOCK).median

    track_batch.unit = "seconds"


class FloorReportQuotedRows(NeedsFloor):
    params = (SHAPES,)
    param_names = ["shape"]

    def track_shape(self, shape):
        num_requests, num_tokens = map(int, shape.split("x"))
        return floor.report(FLOOR_PLAN, num_requests, num_tokens, BLOCK).median

    track_shape.unit = "seconds"
