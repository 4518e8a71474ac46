"""Hot loop 1, input preparation: tokcy against the patterns it replaces.

Batch (issue 3): one context chunk of 8,192 tokens + 255 generation requests at sequence
length L, with 0 or 3 draft tokens each. Baselines (tokcy/_baselines/executor.py):
``before`` (whole token list per request, seed 000's old code), ``after`` (seed 000's
fixed per-request Python loop), ``numpy`` (vLLM-style vectorised gather from a persistent
[requests, max_len] token array). Every implementation's arrays are checked equal to
tokcy's once, in setup.
"""

import numpy as np

from tokcy import _backend, _pure
from tokcy._baselines import executor as baselines
from tokcy.executor import HostBuffers, prepare_inputs


def _module(name):
    if name == "python":
        return _pure
    try:
        from tokcy import _core
    except ImportError:
        raise NotImplementedError("tokcy._core is not built")  # asv skips the combination
    return _core


class PrepareInputs:
    params = (["cython", "python"], [2048, 32768, 131072], [0, 3])
    param_names = ["backend", "seq_len", "num_drafts"]
    timeout = 300

    def setup(self, backend, seq_len, num_drafts):
        self.module = _module(backend)
        self.saved = _backend.module
        _backend.module = self.module
        self.context, self.generation = baselines.make_batch(self.module, seq_len, num_drafts)
        self.max_draft_len = num_drafts
        self.out = HostBuffers(baselines.CONTEXT_CHUNK + 2048, 512, max(num_drafts, 1))
        self.numpy_batch = baselines.NumpyInputBatch(self.context, self.generation)
        expected = prepare_inputs(self.context, self.generation, max_draft_len=num_drafts, out=self.out).asdict()
        for name, produced in (
            ("before", baselines.before(self.context, self.generation)),
            ("after", baselines.after(self.context, self.generation)),
            ("numpy", self.numpy_batch.prepare()),
        ):
            for field, array in produced.items():
                if not np.array_equal(array, expected[field]) or array.dtype != expected[field].dtype:
                    raise AssertionError(f"baseline {name} differs from tokcy in {field}")

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
