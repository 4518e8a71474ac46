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

from tokcy._tokens import INT32_MAX

MIN_CAPACITY = 16


def grown_capacity(capacity, needed):
    """Capacity after growing to hold ``needed`` entries: 1.25x, at least MIN_CAPACITY."""
    return max(needed, capacity + capacity // 4, MIN_CAPACITY)


def new_storage(capacity):
    """A new zero-filled int32 array of ``capacity`` entries over a bytearray (as the
    compiled twin's storage is a bytearray's memory, which nothing can resize while the
    buffer holds it)."""
    return np.frombuffer(bytearray(4 * capacity), dtype=np.int32)


# every empty buffer's storage: nothing is ever written into its 0 entries (a write grows
# into new storage first), so one serves them all and an empty buffer costs no allocation
EMPTY_STORAGE = new_storage(0)


def readonly_alias(storage):
    """``storage`` seen through a read-only buffer of its bytearray: views sliced from it
    cannot be made writeable again (numpy refuses, as their base is not writeable), and
    their chain of bases reaches the bytearray, never ``storage`` itself."""
    return np.frombuffer(memoryview(storage.base.obj).toreadonly(), dtype=np.int32)


class Int32Buffer:
    __slots__ = ("storage", "size", "shared_end", "dirty_from", "table_dirty_from", "table_stamp", "_readonly")

    def __init__(self, values):
        """``values``: a validated 1-D int32 array; the buffer holds a copy."""
        storage = new_storage(len(values)) if len(values) else EMPTY_STORAGE  # (capacity 0: never written)
        storage[:] = values
        self.storage = storage
        self.size = len(values)
        self.shared_end = 0
        self.dirty_from = 0
        self.table_dirty_from = 0
        self.table_stamp = 0
        self._readonly = None

    def _make_writable(self, start, new_size):
        """Make positions ``[start, new_size)`` writable without changing any view (the
        values stay as they are, so no change mark moves: a writer lowers them itself).

        Code that runs while the new storage is allocated (a collection's callbacks) can
        change this buffer, so this only makes progress: a caller checks its condition
        again on return and calls again until it holds (as the compiled twin does)."""
        capacity = len(self.storage)
        if start < self.shared_end or new_size > capacity:
            if new_size > capacity:
                if new_size > INT32_MAX:  # positions and lengths travel as int32
                    raise ValueError(f"a token buffer holds at most {INT32_MAX} entries")
                capacity = grown_capacity(capacity, new_size)
            fresh = new_storage(capacity)
            if self.size <= capacity:  # else code that ran grew it past this: the caller calls again
                fresh[: self.size] = self.storage[: self.size]
                self.storage = fresh
                self.shared_end = 0
                self._readonly = None

    def append(self, value):
        while self.size >= len(self.storage) or self.size < self.shared_end:
            self._make_writable(self.size, self.size + 1)
        self.storage[self.size] = value
        self.size += 1

    def extend(self, values):
        while self.size + len(values) > len(self.storage) or self.size < self.shared_end:
            self._make_writable(self.size, self.size + len(values))
        end = self.size + len(values)
        self.storage[self.size : end] = values
        self.size = end

    def has_room(self, start, count):
        """Whether writing ``count`` entries from ``start`` (at most the size) needs no
        allocation: no copy-on-write, no growth."""
        return start >= self.shared_end and start + count <= len(self.storage)

    def room(self, start, count):
        """Make writing ``count`` entries from ``start`` (at most the size) need no
        allocation, and return what ``put`` writes them through: (the storage, its entries
        ``[start, start + count)``, the new size). A caller writing several buffers makes
        every one's room before it writes any, so a failure changes none."""
        while not self.has_room(start, count):
            self._make_writable(start, start + count)
        storage = self.storage
        return storage, storage[start : start + count], start + count

    def put(self, start, values, room):
        """The entries from ``start`` on become ``values`` (an int32 array), written through
        ``room`` (``room(start, len(values))``'s) with no allocation; as ``truncate(start)``
        then ``extend`` if code that ran since changed the buffer."""
        storage, target, end = room
        if storage is not self.storage or start < self.shared_end or start > self.size:
            self.truncate(start)
            self.extend(values)
            return
        self.truncate(start)
        target[...] = values
        self.size = end

    def set(self, position, value):
        while position < self.shared_end:
            self._make_writable(position, self.size)
        if not 0 <= position < self.size:
            raise IndexError(f"position {position} is past the {self.size} entries left by code that ran meanwhile")
        # both readers' marks lowered to the position written, inline: from the last check
        # of shared_end to the write no Python function is called, so no other thread runs
        # (and makes a view of this storage) in between
        if position < self.dirty_from:
            self.dirty_from = position
        if position < self.table_dirty_from:
            self.table_dirty_from = position
        self.storage[position] = value

    def truncate(self, size):
        # never grows, never negative (as the compiled twin); no min()/max(), whose call
        # allocates an argument tuple: a caller relies on this allocating nothing
        size = 0 if size < 0 else (self.size if size > self.size else size)
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
        end = min(end, self.size)
        return self.storage[min(max(begin, 0), end) : end].tolist()

    def view(self, begin, end):
        """Read-only snapshot of ``[begin, end)`` (clamped to the size), zero-copy."""
        while self._readonly is None:
            storage = self.storage
            readonly = readonly_alias(storage)
            if self.storage is storage:  # else code that ran meanwhile replaced it: again
                self._readonly = readonly
        readonly = self._readonly
        end = min(end, self.size)
        begin = min(max(begin, 0), end)
        if end > self.shared_end:
            self.shared_end = end
        return readonly[begin:end]

    def clamp(self, begin, end):
        """The engine's clamping: b = clamp(begin, 0, n), e = clamp(end, b, n)."""
        begin = min(max(begin, 0), self.size)
        end = min(max(end, begin), self.size)
        return begin, end
