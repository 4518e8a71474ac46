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
    if pymalloc_in_use():
        objects = [backend.Request(number, [1, 2, 3]) for number in range(2_000)]
        objects += [backend.Int32Buffer() for _ in range(2_000)]
        assert sum(id(item) % LINE == 0 for item in objects) == len(objects)
