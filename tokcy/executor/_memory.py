"""Zeroed arrays for the holders' outputs (``HostBuffers``, ``MetadataBuffers``).

With the compiled core they lie in memory it owns (``tokcy._core.zeroed_array``): numpy
frees no memory an array does not own, so neither ``resize`` nor ``__setstate__`` of an
output array can free what a writer bound to it writes, and the array's base (an object
with no method, no memoryview anyone could release) keeps that memory, as does a writer
for as long as it is bound (``tokcy._invariants.bound_memory``). Without it, the pure twin
writes through the arrays themselves, and plain numpy arrays serve.
"""

import numpy as np

from tokcy import _backend

try:
    _zeroed_array = _backend.import_compiled().zeroed_array  # (a core built from another copy is refused)
except ImportError:  # no compiled core: the twin has no pointer to protect
    _zeroed_array = None


def zeros(shape, dtype):
    """A zero-filled C-contiguous array of ``shape`` (an int or a tuple) and ``dtype``."""
    dtype = np.dtype(dtype)
    if _zeroed_array is None:
        return np.zeros(shape, dtype)
    return _zeroed_array(int(np.prod(shape, dtype=np.int64)), dtype).reshape(shape)
