"""Zeroed arrays for the holders' outputs (``HostBuffers``, ``MetadataBuffers``).

With the compiled core they lie in memory it owns (``tokcy._core.zeroed_memory``): numpy
frees no memory an array does not own, so neither ``resize`` nor ``__setstate__`` of an
output array can free what a writer bound to it writes, and the writer keeps that memory
for as long as it is bound (``tokcy._invariants.resize_guards``). Without it, the pure twin
writes through the arrays themselves, and plain numpy arrays serve.
"""

import numpy as np

try:
    from tokcy._core import zeroed_memory
except ImportError:  # no compiled core: the twin has no pointer to protect
    zeroed_memory = None


def zeros(shape, dtype):
    """A zero-filled C-contiguous array of ``shape`` (an int or a tuple) and ``dtype``."""
    dtype = np.dtype(dtype)
    if zeroed_memory is None:
        return np.zeros(shape, dtype)
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(zeroed_memory(count * dtype.itemsize), dtype=dtype).reshape(shape)
