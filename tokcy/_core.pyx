"""The compiled core of tokcy: token buffer, Request, BlockTable and the two hot loops.

The code lives in the ``_core_*.pxi`` files included below (one job each); they compile
into this one extension module so the hot loops read the buffers' C fields directly.
Compiler directives are set once, in setup.py. ``tokcy/_pure`` is the readable twin.
"""

cimport cython
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy

import numpy as np

from tokcy import _pickle, _repr, _tokens
from tokcy._state import RequestState

# read once: an attribute lookup can allocate, and the calls that set it (Request.__init__,
# pause) allocate nothing once they start changing the request
cdef object CONTEXT_INIT = RequestState.CONTEXT_INIT

# No list comprehension in the compiled core: Cython 3.3's code for one releases the item
# twice when the append fails for lack of memory (it gives the item to the list, which
# releases it on failure, and releases it again on the error path). A loop of ``append``
# calls on a list keeps the item until the call returns.

# C assert(): compiled out (NDEBUG) in release builds; TOKCY_CYTHON_DEBUG=1 builds keep
# it, so a write past an output's capacity in the nogil loops aborts the debug test run.
cdef extern from "assert.h" nogil:
    void debug_assert "assert"(bint condition)

cdef int64_t INT32_MIN = -2147483648
cdef int64_t INT32_MAX = 2147483647

# Both loops' pass 2 releases the GIL only when it writes at least this many int32 entries
# (1 MiB): releasing first takes a reference to every storage the plan reads (one or more
# per sequence), and taking the GIL back waits up to sys.getswitchinterval() (5 ms) while
# another thread runs Python code. A shorter copy holds it no longer than that wait.
cdef Py_ssize_t NOGIL_MIN_ENTRIES = 1 << 18

include "_core_buffer.pxi"
include "_core_array_fields.pxi"
include "_core_block_table.pxi"
include "_core_request.pxi"
include "_core_request_fields.pxi"

include "_core_metadata_plan.pxi"
include "_core_metadata.pxi"
include "_core_metadata_bind.pxi"
include "_core_rows.pxi"
include "_core_metadata_write.pxi"
include "_core_seen.pxi"
include "_core_prepare.pxi"
include "_core_prepare_plan.pxi"
include "_core_prepare_entry.pxi"
include "_core_report_output.pxi"
include "_core_report_jobs.pxi"
include "_core_report_slots.pxi"
include "_core_report.pxi"
include "_core_report_fast.pxi"
include "_core_request_data.pxi"
