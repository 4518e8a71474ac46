"""asv: attention metadata of a decode step (the ``attention`` scenario of ``python -m tokcy bench``).

Host work per step of tokcy's ``InputPreparer.prepare`` with a block size (the device-side
scatter and gather stubbed out and timed apart, as in the CLI scenario), against the
small-engine pattern (a) and the vLLM pattern (b), for 256 decode requests of L tokens;
and the bytes each sends host-to-device per step. ``FloorAttention`` is tokcy's step as
plain C, timed in C (``tokcy.bench._floor``), as a ``track_`` figure in seconds per step.
"""

from tokcy.bench import attention, floor
from tokcy.bench.timing import Plan

from ._common import BACKENDS, NeedsFloor, torch_on_bench_threads, use_backend

FLOOR_PLAN = Plan(rounds=5, per_round=9)

# The world of the last parameter combination, built once: asv may call setup before
# every sample, and building 256 requests of 131,072 tokens takes longer than timing.
_WORLD = {}


def _steps(seq_len, block_size, groups, backend):
    key = (seq_len, block_size, groups, backend)
    if key not in _WORLD:
        _WORLD.clear()
        world = attention.World(use_backend(backend), seq_len, block_size, groups)
        _WORLD[key] = (attention.tokcy_preparer(world), attention.small_engine(world), attention.vllm(world))
    return _WORLD[key]


class AttentionMetadata:
    params = ([2_048, 32_768, 131_072], [16, 256], [1, 2], BACKENDS)
    param_names = ["seq_len", "block_size", "groups", "backend"]
    timeout = 600

    def setup(self, seq_len, block_size, groups, backend):
        torch_on_bench_threads()
        use_backend(backend)
        tokcy, small, vllm = _steps(seq_len, block_size, groups, backend)
        self.tokcy_step, self.tokcy_bytes, self.device_side = tokcy
        self.small_step, self.small_bytes = small
        self.vllm_step, self.vllm_bytes = vllm

    def time_tokcy(self, *_):
        self.tokcy_step()

    def time_tokcy_device_side_on_cpu(self, *_):
        self.device_side()

    def time_small_engine(self, *_):
        self.small_step()

    def time_vllm(self, *_):
        self.vllm_step()

    def track_bytes_per_step_tokcy(self, *_):
        return self.tokcy_bytes

    def track_bytes_per_step_small_engine(self, *_):
        return self.small_bytes

    def track_bytes_per_step_vllm(self, *_):
        return self.vllm_bytes


class FloorAttention(NeedsFloor):
    """The floor of AttentionMetadata.time_tokcy: the same step as plain C, seconds per step timed in C."""

    params = ([2_048, 32_768, 131_072], [16, 256], [1, 2])
    param_names = ["seq_len", "block_size", "groups"]

    def track_floor(self, seq_len, block_size, groups):
        return floor.attention(FLOOR_PLAN, attention.BATCH, seq_len, block_size, groups,
                               attention.touch_every(block_size)).median

    track_floor.unit = "seconds"
