"""The growable int32 buffer behind every token list and block table (pure-Python twin).

Three counters make it what the hot loops need:

* ``size`` of ``storage``: the first ``size`` entries are the live values; the array grows
  by 1.25x, so appends are amortised O(1) and the spare capacity stays under 25 %.
* ``shared_end``: read-only views handed out since ``storage`` was allocated may show
  ``storage[:shared_end]``. A write below it would change what a view shows, so it first
  moves the values into fresh storage (copy-on-write) and the views keep the old one.
* Change marks, one per reader, so that each reader sees every change exactly once
  whatever the other does (docs/change-tracking.md):

  - ``dirty_from``: the lowest position written or dropped since the connector last read
    the buffer, so a shrink followed by a regrowth between two reports is never missed;
  - ``table_dirty_from``: the same since the device block table last read it, and
    ``table_stamp``, the stamp of the device-table row that read it (0: none yet). A
    reader compares the stamp with the one it left in its row: equal means the row holds
    this buffer as of that read, so only ``[table_dirty_from, size)`` can differ.

  Every write or drop lowers both marks: O(1). A reader consumes its own mark by setting
  it to ``size`` when it reads the buffer.
"""

import numpy as np

MIN_CAPACITY = 16


def grown_capacity(capacity, needed):
    """Capacity after growing to hold ``needed`` entries: 1.25x, at least MIN_CAPACITY."""
    return max(needed, capacity + capacity // 4, MIN_CAPACITY)


def readonly_alias(storage):
    """``storage`` seen through a read-only buffer: views sliced from it cannot be made
    writeable again (numpy refuses, as their base is not writeable)."""
    return np.frombuffer(memoryview(storage).toreadonly(), dtype=np.int32)


class Int32Buffer:
    __slots__ = ("storage", "size", "shared_end", "dirty_from", "table_dirty_from", "table_stamp", "_readonly")

    def __init__(self, values):
        """``values``: a validated 1-D int32 array; the buffer holds a copy."""
        self.storage = np.array(values, dtype=np.int32, copy=True)
        self.size = len(values)
        self.shared_end = 0
        self.dirty_from = 0
        self.table_dirty_from = 0
        self.table_stamp = 0
        self._readonly = None

    def _make_writable(self, start, new_size):
        """Make positions ``[start, new_size)`` writable without changing any view."""
        capacity = len(self.storage)
        if start < self.shared_end or new_size > capacity:
            if new_size > capacity:
                capacity = grown_capacity(capacity, new_size)
            fresh = np.empty(capacity, dtype=np.int32)
            fresh[: self.size] = self.storage[: self.size]
            self.storage = fresh
            self.shared_end = 0
            self._readonly = None
        if start < self.dirty_from:
            self.dirty_from = start
        if start < self.table_dirty_from:
            self.table_dirty_from = start

    def append(self, value):
        self._make_writable(self.size, self.size + 1)
        self.storage[self.size] = value
        self.size += 1

    def extend(self, values):
        end = self.size + len(values)
        self._make_writable(self.size, end)
        self.storage[self.size : end] = values
        self.size = end

    def set(self, position, value):
        self._make_writable(position, self.size)
        self.storage[position] = value

    def fill(self, begin, end, value):
        if begin < end:
            self._make_writable(begin, self.size)
            self.storage[begin:end] = value

    def truncate(self, size):
        self.size = size
        if size < self.dirty_from:
            self.dirty_from = size
        if size < self.table_dirty_from:
            self.table_dirty_from = size

    def get(self, position):
        return int(self.storage[position])

    def last(self):
        return int(self.storage[self.size - 1])

    def tolist(self, begin, end):
        return self.storage[begin:end].tolist()

    def view(self, begin, end):
        """Read-only snapshot of ``[begin, end)``, zero-copy."""
        if end > self.shared_end:
            self.shared_end = end
        if self._readonly is None:
            self._readonly = readonly_alias(self.storage)
        return self._readonly[begin:end]

    def clamp(self, begin, end):
        """The engine's clamping: b = clamp(begin, 0, n), e = clamp(end, b, n)."""
        begin = min(max(begin, 0), self.size)
        end = min(max(end, begin), self.size)
        return begin, end
