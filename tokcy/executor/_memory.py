"""Zeroed arrays for the holders' outputs (``HostBuffers``, ``MetadataBuffers``).

With the compiled core they lie in memory it owns (``tokcy._core.zeroed_array``): numpy
frees no memory an array does not own, so neither ``resize`` nor ``__setstate__`` of an
output array can free what a writer bound to it writes, and the array's base (an object
with no method, no memoryview anyone could release) keeps that memory, as does a writer
for as long as it is bound (``tokcy._invariants.bound_memory``). Without it they lie in a
bytearray's memory, which no numpy array owns either: the twin's check before each write
(that no numpy array owning bound memory was given other memory) then has nothing to
read for them, and a bound bytearray cannot be resized.
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
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(bytearray(count * dtype.itemsize), dtype).reshape(shape)
    return _zeroed_array(int(np.prod(shape, dtype=np.int64)), dtype).reshape(shape)
