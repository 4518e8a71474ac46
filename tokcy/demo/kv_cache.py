"""The paged KV cache: a pool of fixed-size blocks, a free-list allocator, the storage.

Every request's ``block_tables[0]`` (a ``tokcy.BlockTable``) lists the blocks that hold
its positions: position ``pos`` lives in slot ``table[pos // block_size] * block_size +
pos % block_size``. The allocator is a LIFO free list, so a freed block (rejected
drafts, a preempted or finished request) is the next one handed out: re-use is the
common case, which is what the connector's rewind reporting has to get right.

With a ``sliding_window`` (every layer of the model attends to the last ``window``
positions only), ``release_behind`` releases the blocks wholly behind the window of a
request's earliest next query (``BlockTable.release_front``: they read -1) and frees them.

With ``poison=True`` every block is filled with NaN when it is allocated, so a read of a
position nobody wrote shows up as a wrong token instead of passing by luck.
"""

import torch

from tokcy.demo.model import DTYPE


class PoolExhausted(RuntimeError):
    """Raised by ``grow`` when the free list cannot cover a request's positions."""


class PagedKVCache:
    def __init__(self, num_blocks, block_size, num_layers, num_heads, head_dim, *, device="cpu", poison=False,
                 dtype=DTYPE, sliding_window=None):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = torch.device(device)
        self.poison = poison
        self.sliding_window = sliding_window
        shape = (num_layers, num_blocks * block_size, num_heads, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=self.device)
        self.values = torch.zeros(shape, dtype=dtype, device=self.device)
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ... first
        self.num_allocated_total = 0
        self.num_released_total = 0

    # allocator ---------------------------------------------------------------------
    @property
    def num_free(self):
        return len(self._free)

    def blocks_for(self, num_positions):
        """Blocks needed to hold positions ``0 .. num_positions - 1``."""
        return -(-num_positions // self.block_size)

    def blocks_missing(self, request, num_positions):
        """Blocks ``request`` still needs before it can hold ``num_positions`` positions."""
        return max(0, self.blocks_for(num_positions) - len(request.block_tables[0]))

    def can_grow(self, request, num_positions):
        return self.blocks_missing(request, num_positions) <= len(self._free)

    def grow(self, request, num_positions):
        """Append blocks to ``request.block_tables[0]`` until it holds ``num_positions`` positions.

        All or nothing: ``PoolExhausted`` (and no change) when the free list is too short.
        """
        missing = self.blocks_missing(request, num_positions)
        if missing > len(self._free):
            raise PoolExhausted(f"need {missing} blocks, {len(self._free)} free")
        if missing:
            new = [self._free.pop() for _ in range(missing)]
            if self.poison:
                for block in new:
                    self._fill(block, float("nan"))
            request.block_tables[0].extend(new)
            self.num_allocated_total += missing

    def shrink(self, request, num_positions):
        """Keep only the blocks that hold positions ``0 .. num_positions - 1``; free the tail."""
        table = request.block_tables[0]
        keep = self.blocks_for(num_positions)
        if keep < len(table):
            tail = [block for block in table.view()[keep:].tolist() if block >= 0]  # -1: released, already free
            table.truncate(keep)
            self._free.extend(reversed(tail))

    def release_behind(self, request, first_query_position):
        """Release and free the blocks no query from ``first_query_position`` on can see.

        A query at position q sees keys ``q - window + 1 .. q`` (transformers' sliding-window
        mask), so block b is needed while ``(b + 1) * block_size > first_query_position -
        window + 1``. Returns how many blocks this call released.
        """
        if self.sliding_window is None:
            return 0
        table = request.block_tables[0]
        behind = max(0, first_query_position - self.sliding_window + 1) // self.block_size
        behind = min(behind, len(table))
        already = table.num_released
        if behind <= already:
            return 0
        blocks = table.view()[already:behind].tolist()
        table.release_front(behind)
        self._free.extend(reversed(blocks))
        self.num_released_total += behind - already
        return behind - already

    def free_all(self, request):
        """Return every block of ``request`` to the pool and empty its table."""
        self.shrink(request, 0)

    def _fill(self, block, value):
        start = block * self.block_size
        self.keys[:, start : start + self.block_size] = value
        self.values[:, start : start + self.block_size] = value

    # storage -----------------------------------------------------------------------
    def layer(self, index):
        """(keys, values) of one layer, each (num_slots, kv heads, head_dim), flat by slot
        (slot = block * block_size + offset: ``slot_mapping`` indexes it directly)."""
        return self.keys[index], self.values[index]
