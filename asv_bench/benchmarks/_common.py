"""Helpers shared by the benchmark modules (not benchmarks themselves)."""

import numpy as np

BACKENDS = ["cython", "python"]
VOCAB = 128_000


def backend_module(name):
    """``tokcy._core`` or ``tokcy._pure``; NotImplementedError (asv: skipped) if not built."""
    if name == "cython":
        from tokcy import _backend

        try:
            return _backend.import_compiled()  # (a core built from another copy is refused)
        except ImportError as error:
            raise NotImplementedError(f"tokcy._core is not built: {error}")
    from tokcy import _pure

    return _pure


def use_backend(name):
    """Make ``name`` the live backend for tokcy's public functions (as the test fixture does)."""
    import tokcy
    from tokcy import _backend

    module = backend_module(name)
    _backend.module, _backend.BACKEND = module, name
    tokcy.Request, tokcy.BlockTable = module.Request, module.BlockTable
    return module


def torch_on_bench_threads():
    """torch on the intra-op threads ``python -m tokcy bench`` runs it on
    (``tokcy.bench.machine.TORCH_THREADS``: an engine's host path runs small tensor ops);
    NotImplementedError (asv: skipped) without torch. asv runs each benchmark in a process
    of its own, so nothing is restored."""
    try:
        import torch
    except ImportError as error:
        raise NotImplementedError(f"this benchmark needs torch: {error}")
    from tokcy.bench import machine

    torch.set_num_threads(machine.TORCH_THREADS)


def tokens(n, rng_seed=0):
    return np.random.default_rng(rng_seed).integers(0, VOCAB, n, dtype=np.int32)


class NeedsFloor:
    """Mixin: skip (NotImplementedError) when the bench's floor extension is not built."""

    timeout = 300

    def setup(self, *params):
        from tokcy.bench import floor

        if not floor.available():
            raise NotImplementedError(floor.describe())
