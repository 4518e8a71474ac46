"""The compiled types' sizes that the hot loops' cache-line layout relies on.

Only speed depends on them (docs/invariants.md, "Field order the hot loops rely on"): a
Request fills a 192-byte block of CPython's small-object allocator and a token or block
buffer a 128-byte one (each with the collector's 16-byte header), so that every one
starts on a 64-byte line and a row reads one line of each. A field added without taking
it from the pad would silently cost a line per row; this catches it. The sizes are those
of a 64-bit CPython with the GIL; with pymalloc and no debug hooks, the allocator these
sizes are chosen for, the objects are checked to start on a line.
"""

import os
import sys
import sysconfig
import tracemalloc

import numpy as np
import pytest

from tokcy.bench.backends import name_of

GC_HEADER = 16  # PyGC_Head, before every object the collector tracks
LINE = 64


def pymalloc_in_use():
    """CPython's small-object allocator, without the debug hooks that shift its blocks."""
    return (os.environ.get("PYTHONMALLOC", "pymalloc") in ("", "pymalloc") and not sys.flags.dev_mode
            and bool(sysconfig.get_config_var("WITH_PYMALLOC")) and not hasattr(sys, "gettotalrefcount"))


def test_objects_fill_whole_allocator_blocks_and_start_a_line(backend):
    if name_of(backend) == "python":
        pytest.skip("the pure twin's objects are Python objects with no C layout to keep")
    if sys.maxsize < 2**32 or sysconfig.get_config_var("Py_GIL_DISABLED"):
        pytest.skip("the layout is chosen for a 64-bit CPython with the GIL (another object header here)")
    sizes = {name: getattr(backend, name).__basicsize__ for name in ("Request", "Int32Buffer")}
    assert sizes == {"Request": 192 - GC_HEADER, "Int32Buffer": 128 - GC_HEADER}
    # a buffer's Storage (not tracked: no collector's header) stays out of the buffers'
    # 128-byte size class: sharing their pools would spread them over twice the pages
    assert backend.Storage.__basicsize__ <= 112
    if pymalloc_in_use():
        objects = [backend.Request(number, [1, 2, 3]) for number in range(2_000)]
        objects += [backend.Int32Buffer() for _ in range(2_000)]
        assert sum(id(item) % LINE == 0 for item in objects) == len(objects)


def test_large_token_buffers_end_on_many_cache_sets(backend):
    """64 prompts of 65,536 tokens (256 KiB each): the C allocator hands out blocks this
    large page-aligned (above its mmap threshold) or at a stride of its own, so their last
    tokens, the ones a decode step reads, fall on few distinct offsets within a page, on
    the same few cache sets (17 distinct lines of 64 here without the offsets). The core
    starts a large buffer a rotating number of lines in: the ends fall on at least 32
    distinct lines of a page, and the offset costs at most a sixteenth of the buffer (what
    tracemalloc counts)."""
    if name_of(backend) == "python":
        pytest.skip("the pure twin's buffers are numpy's allocations: no layout of its own to keep")
    prompt = np.zeros(65_536, np.int32)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        requests = [backend.Request(index, prompt) for index in range(64)]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    ends = {(view.ctypes.data + view.nbytes - 4) % 4096 // LINE for view in map(backend.Request.get_tokens_view,
                                                                                 requests)}
    assert len(ends) >= 32, sorted(ends)
    assert held <= 64 * (prompt.nbytes * 17 // 16 + 1024)
