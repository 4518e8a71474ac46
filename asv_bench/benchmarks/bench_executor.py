"""Hot loop 1, input preparation: tokcy against the patterns it replaces.

Batch (issue 3): one context chunk of 8,192 tokens + 255 generation requests at sequence
length L, with 0 or 3 draft tokens each. Baselines (tokcy/_baselines/executor.py):
``before`` (whole token list per request, seed 000's old code), ``after`` (seed 000's
fixed per-request Python loop), ``numpy`` (vLLM-style vectorised gather from a persistent
[requests, max_len] token array). Every implementation's arrays are checked equal to
tokcy's once, in setup.
"""

from tokcy import _backend
from tokcy._baselines import executor as baselines
from tokcy.bench.executor import check_same
from tokcy.executor import HostBuffers, prepare_inputs

from ._common import backend_module

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
