"""asv: the device feed (the ``device_feed`` scenario of ``python -m tokcy bench``).

One whole engine step of ``InputPreparer.prepare`` for 256 decode requests, with a block
size (tokens and attention metadata, the device block table's scatter and gather), with a
block size gathering the CSR table alone (``device_tables="csr"``) and without, beside ``prepare_inputs`` on the host alone; on the CPU here (the torch calls do
the device-side work inside the call), on the first CUDA device where torch sees one.
``track_torch_calls_*``: the torch calls one step makes, each paid on the host (on a GPU
one or more kernel launches, or a view): a count, the same on every machine.
"""

from tokcy.bench import attention, device_feed

from ._common import BACKENDS, torch_on_bench_threads, use_backend

_STEPS = {}  # (seq_len, backend) -> the steps of the last world built (256 requests take a while)


def _steps(seq_len, backend):
    key = (seq_len, backend)
    if key not in _STEPS:
        try:
            import torch  # noqa: F401
        except ImportError as error:
            raise NotImplementedError(f"the device feed needs torch: {error}")
        _STEPS.clear()
        world = attention.World(use_backend(backend), seq_len, device_feed.BLOCK_SIZE, 1,
                                batch=device_feed.GOAL_BATCH)
        _STEPS[key] = device_feed.steps(world, device_feed.feed_device())
    return _STEPS[key]


class DeviceFeed:
    params = ([2_048, 32_768], BACKENDS)
    param_names = ["seq_len", "backend"]
    timeout = 300

    def setup(self, seq_len, backend):
        torch_on_bench_threads()
        use_backend(backend)
        self.steps, self.drain = _steps(seq_len, backend)

    def _step(self, name):
        if self.drain is not None:  # CUDA: the figure is the host's time to issue the step
            self.drain()
        self.steps[name]()

    def time_tokcy(self, *_):
        self._step("tokcy")

    def time_tokcy_csr(self, *_):
        self._step("tokcy csr")

    def time_tokcy_tokens(self, *_):
        self._step("tokcy tokens")

    def time_prepare_inputs(self, *_):
        self._step("prepare_inputs")

    def track_torch_calls_tokcy(self, *_):
        return device_feed.torch_calls(self.steps["tokcy"])

    def track_torch_calls_tokcy_csr(self, *_):
        return device_feed.torch_calls(self.steps["tokcy csr"])

    def track_torch_calls_tokcy_tokens(self, *_):
        return device_feed.torch_calls(self.steps["tokcy tokens"])

    track_torch_calls_tokcy.unit = "calls"
    track_torch_calls_tokcy_tokens.unit = "calls"
