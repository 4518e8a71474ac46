"""Input preparation (``prepare_inputs``): tokcy against the patterns it replaces.

Batch: one context chunk of 8,192 tokens + 255 generation requests at sequence length L,
with 0 or 3 draft tokens each. Baselines (tokcy/_baselines/executor.py): ``before`` (whole
token list per request, TensorRT-LLM before pull request #16791), ``after`` (that pull
request's per-request Python loop), ``numpy`` (vLLM-style vectorised gather from a
persistent [requests, max_len] token array). Every implementation's arrays are checked
equal to tokcy's once, in setup. ``PrepareInputsBatch`` sweeps the batch size of a decode
step (B generation requests of 2,048 tokens); ``FloorPrepare*`` are the same rows as plain
C, timed in C (``tokcy.bench._floor``), as ``track_`` figures in seconds per call.
"""

from tokcy import _backend
from tokcy._baselines import executor as baselines
from tokcy.bench import floor
from tokcy.bench.executor import check_same, implementations
from tokcy.bench.timing import Plan
from tokcy.executor import HostBuffers, prepare_inputs

from ._common import BACKENDS, NeedsFloor, backend_module

FLOOR_PLAN = Plan(rounds=5, per_round=9)
BATCHES = [16, 64, 256, 1024, 4096]

# The batch of the last parameter combination, built and checked once: asv may call
# setup before every sample, and building 256 x 131,072 tokens takes longer than timing.
_BATCH = {}


def _checked_batch(backend, seq_len, num_drafts):
    key = (backend, seq_len, num_drafts)
    if key not in _BATCH:
        _BATCH.clear()
        module = backend_module(backend)
        saved, _backend.module = _backend.module, module
        try:
            context, generation = baselines.make_batch(module, seq_len, num_drafts)
            out = HostBuffers(baselines.CONTEXT_CHUNK + 2048, 512, max(num_drafts, 1))
            numpy_batch = baselines.NumpyInputBatch(context, generation)
            expected = prepare_inputs(context, generation, max_draft_len=num_drafts, out=out).asdict()
            check_same("before", baselines.before(context, generation), expected)
            check_same("after", baselines.after(context, generation), expected)
            check_same("numpy", numpy_batch.prepare(), expected)
        finally:
            _backend.module = saved
        _BATCH[key] = (module, context, generation, out, numpy_batch)
    return _BATCH[key]


class PrepareInputs:
    params = (["cython", "python"], [2048, 32768, 131072], [0, 3])
    param_names = ["backend", "seq_len", "num_drafts"]
    timeout = 300

    def setup(self, backend, seq_len, num_drafts):
        self.module, self.context, self.generation, self.out, self.numpy_batch = _checked_batch(
            backend, seq_len, num_drafts
        )
        self.saved = _backend.module
        _backend.module = self.module
        self.max_draft_len = num_drafts

    def teardown(self, backend, seq_len, num_drafts):
        _backend.module = self.saved

    def time_tokcy(self, backend, seq_len, num_drafts):
        prepare_inputs(self.context, self.generation, max_draft_len=self.max_draft_len, out=self.out)

    def time_tokcy_allocating(self, backend, seq_len, num_drafts):
        prepare_inputs(self.context, self.generation, max_draft_len=self.max_draft_len)

    def time_before(self, backend, seq_len, num_drafts):
        baselines.before(self.context, self.generation)

    def time_after(self, backend, seq_len, num_drafts):
        baselines.after(self.context, self.generation)

    def time_numpy(self, backend, seq_len, num_drafts):
        self.numpy_batch.prepare()


_SWEEP = {}


class PrepareInputsBatch:
    """A decode step: B generation requests of 2,048 tokens, one row each."""

    params = (BACKENDS, BATCHES, ["tokcy", "after", "numpy"])
    param_names = ["backend", "requests", "implementation"]
    timeout = 300

    def setup(self, backend, num_requests, implementation):
        key = (backend, num_requests)
        if key not in _SWEEP:
            _SWEEP.clear()
            module = backend_module(backend)
            saved, _backend.module = _backend.module, module
            try:
                _SWEEP[key] = (module, implementations(module, 2048, 0, 0, num_requests, ("after", "numpy")))
            finally:
                _backend.module = saved
        module, steps = _SWEEP[key]
        self.saved, _backend.module = _backend.module, module
        self.step = steps[implementation]

    def teardown(self, backend, num_requests, implementation):
        _backend.module = self.saved

    def time_prepare(self, backend, num_requests, implementation):
        self.step()


class FloorPrepare(NeedsFloor):
    """The floor of PrepareInputs: the same batch as plain C, seconds per call timed in C."""

    params = ([2048, 32768, 131072], [0, 3])
    param_names = ["seq_len", "num_drafts"]

    def track_floor(self, seq_len, num_drafts):
        return floor.prepare(FLOOR_PLAN, baselines.NUM_GENERATION, seq_len, num_drafts, baselines.CONTEXT_CHUNK).median

    track_floor.unit = "seconds"


class FloorPrepareBatch(NeedsFloor):
    """The floor of PrepareInputsBatch."""

    params = (BATCHES,)
    param_names = ["requests"]

    def track_floor(self, num_requests):
        return floor.prepare(FLOOR_PLAN, num_requests, 2048, 0, 0).median

    track_floor.unit = "seconds"
