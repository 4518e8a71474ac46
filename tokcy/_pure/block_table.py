"""``BlockTable`` in plain Python/numpy: the readable reference of the semantics.

The compiled ``tokcy._core`` implements exactly this, call for call and error for error.
Every method validates all of its arguments before it changes anything, so a call that
raises leaves the table as it was. ``Request`` (``tokcy._pure.request``) holds one per
layer group.
"""

import inspect

import numpy as np

from tokcy import _invariants, _pickle, _repr
from tokcy._pure.buffer import Int32Buffer
from tokcy._tokens import as_index, as_int32_array, check_token


def _block_ids_array(block_ids, name):
    ids = as_int32_array(block_ids, name, "block")
    if ids.size and ids.min() < 0:
        raise ValueError(f"{name}: block id {int(ids[ids < 0][0])} is negative")
    return ids


def _check_block_id(block_id, name):
    block_id = check_token(block_id, name, "block")
    if block_id < 0:
        raise ValueError(f"{name}: block id {block_id} is negative")
    return block_id


def signature_of_init(init):
    """``__init__``'s signature without ``self``: what help() and inspect show for the class
    (its ``__new__`` takes ``*args, **kwargs`` only to make the blank object)."""
    signature = inspect.signature(init)
    return signature.replace(parameters=list(signature.parameters.values())[1:])


class BlockTable:
    """Growable int32 list of the KV-cache block ids assigned to one request (one layer group).

    ``release_front(k)`` marks the first ``k`` entries -1, as a sliding window frees them.
    """

    __slots__ = ("_buffer", "_num_released")

    def __new__(cls, *args, **kwargs):
        # an empty table until __init__ runs, as the compiled core's __cinit__ makes it
        self = super().__new__(cls)
        self._buffer = Int32Buffer(np.empty(0, dtype=np.int32))
        self._num_released = 0
        return self

    def __init__(self, block_ids=()):
        self._buffer = Int32Buffer(_block_ids_array(block_ids, "block_ids"))
        self._num_released = 0

    __signature__ = signature_of_init(__init__)

    def _restore(self, block_ids, num_released, dirty_from, table_dirty_from=0, attributes=None):
        ids, released, mark, table_mark = _invariants.checked_block_table(
            block_ids, num_released, dirty_from, table_dirty_from)
        self._buffer = Int32Buffer(ids)
        self._buffer.dirty_from = mark
        self._buffer.table_dirty_from = table_mark
        self._num_released = released
        if attributes:
            _pickle.restore_subclass_attributes(self, BlockTable, attributes)

    def __reduce__(self):
        return _pickle.read_whole(self._reduce)

    def _reduce(self):
        # the table's own fields, never a subclass's methods or properties
        cls = None if type(self) is BlockTable else type(self)
        state = (cls, self._buffer.tolist(0, self._buffer.size), self._num_released, self._buffer.dirty_from,
                 self._buffer.table_dirty_from)
        attributes = None if cls is None else _pickle.subclass_attributes(self, BlockTable)
        return (_pickle.restore_block_table, state if attributes is None else state + (attributes,))

    def __repr__(self):
        return _repr.block_table_repr(type(self).__name__, self.tolist(), self._num_released)

    def __len__(self):
        return self._buffer.size

    def _position(self, index):
        index = as_index(index, "block table index")
        position = index + self._buffer.size if index < 0 else index
        if not 0 <= position < self._buffer.size:
            raise IndexError(f"block table index {index} is out of range for {self._buffer.size} blocks")
        return position

    def __getitem__(self, index):
        return self._buffer.get(self._position(index))

    def __setitem__(self, index, block_id):
        index = as_index(index, "block table index")  # converted once, as the compiled twin's typed argument
        position = self._position(index)
        block_id = _check_block_id(block_id, "block_id")
        position = self._position(index)  # block_id's __index__ may have run Python code
        if position < self._num_released:
            raise ValueError(f"block {position} was released by the sliding window and cannot be set")
        self._buffer.set(position, block_id)

    def __delitem__(self, index):
        _invariants.no_item_deletion(self)

    def __iter__(self):
        return iter(self.tolist())

    def __eq__(self, other):
        if isinstance(other, BlockTable):
            return self._num_released == other._num_released and self.tolist() == other.tolist()
        if isinstance(other, list):
            return self.tolist() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def append(self, block_id):
        """Add one block id at the end; returns the new length."""
        self._buffer.append(_check_block_id(block_id, "block_id"))
        return self._buffer.size

    def extend(self, block_ids):
        """Add block ids at the end; returns the new length."""
        self._buffer.extend(_block_ids_array(block_ids, "block_ids"))
        return self._buffer.size

    def truncate(self, num_blocks):
        """Keep only the first ``num_blocks`` entries (blocks freed from the tail)."""
        num_blocks = as_index(num_blocks, "num_blocks")
        if not 0 <= num_blocks <= self._buffer.size:
            raise ValueError(f"num_blocks {num_blocks} is outside [0, {self._buffer.size}]")
        released = min(self._num_released, num_blocks)  # (computed first: nothing allocates once it changes)
        self._buffer.truncate(num_blocks)
        self._num_released = released

    def clear(self):
        """Drop every entry (``truncate(0)``): the table holds no blocks afterwards."""
        self.truncate(0)

    def release_front(self, num_released):
        """Mark the first ``num_released`` entries -1; the count may grow, never shrink."""
        num_released = as_index(num_released, "num_released")
        buffer = self._buffer
        # a copy-on-write first (it can run code: a collection); then the count is checked,
        # as the compiled twin does. Both readers (connector, device block table) learn of
        # releases through the count, not as rewritten ids: no change mark moves.
        while self._num_released < num_released and self._num_released < buffer.shared_end:
            buffer._make_writable(self._num_released, buffer.size)
        if num_released < self._num_released:
            _invariants.released_below(num_released, self._num_released)
        if num_released > buffer.size:
            _invariants.released_past(num_released, buffer.size)
        buffer.storage[self._num_released : num_released] = -1
        self._num_released = num_released

    @property
    def num_released(self):
        """How many leading entries a sliding window has released (they read -1)."""
        return self._num_released

    def tolist(self):
        """The block ids as a new list."""
        return self._buffer.tolist(0, self._buffer.size)

    def view(self):
        """A read-only zero-copy numpy snapshot of the block ids."""
        return self._buffer.view(0, self._buffer.size)
