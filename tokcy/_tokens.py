"""Validation of token ids and indices at the Python boundary, shared by both backends.

Both backends call these functions (the compiled one only on its slow path), so a bad
argument raises the same exception with the same message whichever backend is live.
"""

import operator

import numpy as np

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


SSIZE_MIN = -(2**63)
SSIZE_MAX = 2**63 - 1


def as_index(value, name=None):
    """Return ``value`` as a Python int that fits a C ssize_t / int64, as the compiled
    backend's typed arguments do (same exceptions, same messages)."""
    number = operator.index(value)
    if not SSIZE_MIN <= number <= SSIZE_MAX:
        raise OverflowError("Python int too large to convert to C ssize_t")
    return number


def as_integer(value, name):
    """``as_index`` for an argument both backends convert through this module (never a
    compiled typed argument): a value that is no integer raises a TypeError, one beyond
    int64 an OverflowError, each naming it."""
    if not hasattr(type(value), "__index__"):  # (an error raised by a value's own __index__ passes through)
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    number = operator.index(value)
    if not SSIZE_MIN <= number <= SSIZE_MAX:
        raise OverflowError(f"{name} {shown(number)} does not fit in int64")
    return number


def shown(number):
    """``number`` as a message shows it: digits, unless it has too many to print (Python
    refuses to convert an int of over 4,300 digits to text)."""
    if number.bit_length() <= 256:
        return str(number)
    return f"({'a negative' if number < 0 else 'an'} integer of {number.bit_length():,} bits)"


def shown_repr(value, limit=200):
    """``repr(value)`` for a message, cut to ``limit`` characters; one Python refuses to make
    (an int too long to print, inside a tuple) is described instead."""
    try:
        text = repr(value)
    except ValueError:
        return f"a {type(value).__name__} holding an integer too long to print"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_clamped_index(value):
    """An index argument that is clamped anyway (``get_tokens_range``'s begin and end):
    any int is accepted, and one beyond the C ssize_t range saturates instead of raising."""
    return min(max(operator.index(value), SSIZE_MIN), SSIZE_MAX)


def check_token(value, name, kind="token"):
    """Return one token id (``kind`` "block": a block id) as a Python int; TypeError /
    OverflowError if it is not an int32."""
    if isinstance(value, (float, np.floating)) or value is None:
        raise TypeError(f"{name} must be an integer {kind} id, not {type(value).__name__}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer {kind} id, not {type(value).__name__}") from None
    if not INT32_MIN <= number <= INT32_MAX:
        raise OverflowError(f"{name}: {kind} id {shown(number)} does not fit in int32")
    return number


def as_int32_array(values, name, kind="token"):
    """Return a new contiguous 1-D int32 array holding ``values``, validated.

    Accepts any sequence of integers or a 1-D integer numpy array. Floats, None, bools
    arrays, strings, 2-D input and ids outside int32 raise TypeError / ValueError /
    OverflowError naming ``name`` and the ``kind`` of id; nothing is ever silently wrapped.
    """
    if isinstance(values, (str, bytes, bytearray)) or not hasattr(values, "__len__"):
        raise TypeError(f"{name} must be a sequence of integer {kind} ids, not {type(values).__name__}")
    if isinstance(values, (list, tuple)):
        values = tuple(values)  # owned: what is checked below is what is converted
    if isinstance(values, np.ndarray):
        # a plain view: the checks below read numpy's own ndim, dtype, min and max (a
        # subclass's may say anything, and the conversion would then wrap or truncate)
        array = np.ndarray.view(values, np.ndarray)
    elif len(values) == 0:
        return np.empty(0, dtype=np.int32)
    else:
        try:
            array = np.asarray(values)
        except (ValueError, OverflowError):  # ragged input, or ints numpy cannot hold
            array = np.asarray(values, dtype=object)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got {array.ndim} dimensions")
    if array.dtype.kind in "iu":
        if array.size and (array.min() < INT32_MIN or array.max() > INT32_MAX):
            bad = array[(array < INT32_MIN) | (array > INT32_MAX)][0]
            raise OverflowError(f"{name}: {kind} id {int(bad)} does not fit in int32")
        return np.array(array, dtype=np.int32, copy=True)
    if isinstance(values, np.ndarray):
        raise TypeError(f"{name} must hold integers, got an array of dtype {array.dtype}")
    # A sequence holding something other than ints: check each element once, name the first
    # bad one, and build the array from the checked numbers (never from a second conversion).
    elements = values if isinstance(values, tuple) else array
    return np.array([check_token(value, f"{name}[{position}]", kind) for position, value in enumerate(elements)],
                    dtype=np.int32)


def check_beam(beam, beam_width):
    """IndexError unless ``0 <= beam < beam_width`` (beams are never indexed from the end)."""
    if not 0 <= beam < beam_width:
        raise IndexError(f"beam {beam} is out of range for beam_width {beam_width}")
