"""Zeroed arrays for the holders' outputs (``HostBuffers``, ``MetadataBuffers``).

With the compiled core they lie in memory it owns (``tokcy._core.zeroed_array``): numpy
frees no memory an array does not own, so neither ``resize`` nor ``__setstate__`` of an
output array can free what a writer bound to it writes, and the array's base (an object
with no method, no memoryview anyone could release) keeps that memory, as does a writer
for as long as it is bound (``tokcy._invariants.bound_memory``).

Without it, one holder's arrays are views of one block a numpy array owns. Not a
bytearray's memory: numpy shows that through a memoryview any caller can ``release()``,
which frees the bytearray under the arrays. A numpy owner has no such handle, and the
twin's check before each write (that no numpy array owning bound memory was given other
memory by ``__setstate__``) reads one owner per holder, not one per array (a one-request
``prepare_inputs(out=)`` takes about 20 us so, 41 with an owner per array).
"""

import numpy as np

from tokcy import _backend

try:
    _zeroed_array = _backend.import_compiled().zeroed_array  # (a core built from another copy is refused)
except ImportError:  # no compiled core: the twin has no pointer to protect
    _zeroed_array = None

_ALIGNMENT = 64  # each array starts this many bytes apart in the shared block (whatever its dtype)


def zeros(*specs):
    """Zero-filled C-contiguous arrays, one per ``(shape, dtype)`` of ``specs`` (``shape`` an
    int or a tuple), as a list in their order."""
    specs = [(shape, np.dtype(dtype)) for shape, dtype in specs]
    counts = [int(np.prod(shape, dtype=np.int64)) for shape, _ in specs]
    if _zeroed_array is not None:
        return [_zeroed_array(count, dtype).reshape(shape) for (shape, dtype), count in zip(specs, counts)]
    starts, end = [], 0
    for (_, dtype), count in zip(specs, counts):
        starts.append(end)
        end += -(-count * dtype.itemsize // _ALIGNMENT) * _ALIGNMENT
    block = np.zeros(end, np.uint8)
    return [block[start : start + count * dtype.itemsize].view(dtype).reshape(shape)
            for (shape, dtype), count, start in zip(specs, counts, starts)]
