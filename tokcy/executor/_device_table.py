"""The device block table: persistent per layer group, indexed by ``seq_slot``, kept by deltas.

``DeviceBlockTable.table`` is a (groups, max_slots, max_blocks_per_seq) int32 tensor on the
device: row (g, s) holds the block table, group g, of the request in slot s (zero past its
blocks, -1 for blocks a sliding window released). Each step the host loop writes, after
the used input ids of the packed staging buffer, only the entries that changed since the
previous step (flat indices into ``table``, then their values); they travel in the same
copy as the other inputs and ``apply`` scatters them, then gathers the batch-order dense
table and the CSR indices on the device, into persistent output tensors (addresses fixed).

Nothing here waits for the device: the sizes it needs (entries changed, CSR length) are
read from the host arrays of the same step.
"""

import numpy as np

from tokcy import _backend
from tokcy.executor._metadata import MetadataBuffers

#: The batch-order tables ``apply`` can gather: the dense ``block_table`` and the CSR ``kv_indices``.
DEVICE_TABLES = ("dense", "csr")


def device_tables_arg(value):
    """``InputPreparer``'s ``device_tables`` as a tuple of names in ``DEVICE_TABLES`` order
    (None: both). One name alone may be given as a string."""
    if value is None:
        return DEVICE_TABLES
    names = (value,) if isinstance(value, str) else value
    try:
        names = tuple(names)
    except TypeError:
        raise TypeError(f"device_tables must be 'dense', 'csr' or a sequence of them, "
                        f"not {type(value).__name__}") from None
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"device_tables must name tables as strings, got {name!r}")
        if name not in DEVICE_TABLES:
            raise ValueError(f"device_tables: unknown table {name!r} (known: 'dense', 'csr')")
    return tuple(name for name in DEVICE_TABLES if name in names)


def device_zeros(torch, shape, dtype, device):
    """``torch.zeros(shape, dtype=dtype, device=device)`` whose storage cannot be resized
    where torch would allow it: on the CPU it is numpy's memory (``torch.from_numpy``
    makes tensors whose storage is not resizable), so no one holding a view of a
    persistent tensor can shrink the memory that the preparer's copies, scatters and
    gathers write. (A CUDA tensor's storage stays resizable: docs/executor.md.)"""
    if torch.device(device).type == "cpu":
        numpy_dtype = {torch.int32: np.int32, torch.int64: np.int64}[dtype]
        return torch.from_numpy(np.zeros(shape, dtype=numpy_dtype))
    return torch.zeros(shape, dtype=dtype, device=device)


class DeviceBlockTable:
    def __init__(self, torch, device, num_groups, max_slots, max_blocks_per_seq, max_batch_size,
                 tables=DEVICE_TABLES):
        self.tables = tables  # which batch-order tables apply() gathers (device_tables_arg)
        self._dense = "dense" in tables
        self._csr = "csr" in tables
        self.num_groups = num_groups
        self.max_slots = max_slots
        self.width = max_blocks_per_seq
        self._torch = torch
        self.table = device_zeros(torch, (num_groups, max_slots, max_blocks_per_seq), torch.int32, device)
        self._flat = self.table.view(-1)
        # per group its table (what the dense rows are gathered from, by slot) and the same, flat (the CSR's source)
        self._group_tables = [self.table[group] for group in range(num_groups)]
        self._group_flat = [table.view(-1) for table in self._group_tables]
        self.block_table = device_zeros(torch, (num_groups, max_batch_size, max_blocks_per_seq), torch.int32, device)
        self.kv_indices = device_zeros(torch, (num_groups, max_batch_size * max_blocks_per_seq), torch.int32, device)
        self._columns = torch.arange(max_blocks_per_seq, dtype=torch.int32, device=device)[None, :]
        self._views = {}  # padded batch size -> per group views (see _batch_views)
        self._indices = {}  # (group, CSR length) -> (kv_indices view, arange view)
        self._deltas = {}  # (delta offset, changed entries) -> (their indices' view, their values' view)
        self._offsets = torch.arange(max_batch_size * max_blocks_per_seq, dtype=torch.int64, device=device)
        self._rows = {}  # backend module -> its DeviceTableRows (what each row holds)

    def rows(self, module=None):
        """The backend's record of what each row holds (one per backend: a request object
        belongs to one backend, so the other's rows start empty and are sent whole)."""
        module = _backend.module if module is None else module
        rows = self._rows.get(module)
        if rows is None:
            rows = self._rows[module] = module.DeviceTableRows(self.max_slots, self.num_groups, self.width)
        return rows

    def host_metadata(self, arrays, table_slots, delta_area):
        """``MetadataBuffers`` over one staging buffer's views, bound to this table per backend."""
        return _StagedMetadata(self, arrays, table_slots, delta_area)

    def apply(self, packed, packed_int64, delta_offset, num_changed, table_slots, gathers, num_indices):
        """On the device, after the staging copy: scatter the changed entries (from the
        even word ``delta_offset`` of ``packed``: their int64 indices, read through
        ``packed_int64``, a view of the same memory, then their int32 values), then per
        group gather the batch's dense table (masked past each sequence's blocks) and its
        CSR indices, from what the host wrote per sequence (``gathers``, per group: its
        blocks as a column, its live blocks and where its CSR run starts in the group's
        flat table, its slot's row; see ``AttentionMetadata.bind_device_table``). Returns,
        per group, (block_table view, kv_indices view), None for a table not in ``tables``.

        Every view of a persistent tensor it needs is made once per size and kept
        (``_batch_views``, ``_delta_views``, ``_indices_views``). Per group the dense table costs three torch calls (the rows
        gathered by slot, masked past each sequence's blocks) and the CSR three (each run
        start repeated over its live blocks, plus the output index, gathered from the
        table itself), each one or more device ops."""
        torch = self._torch
        if num_changed:  # int64 indices: index_put_ converts no others (one device op fewer)
            indices, values = (self._deltas.get((delta_offset, num_changed))
                               or self._delta_views(packed, packed_int64, delta_offset, num_changed))
            self._flat[indices] = values
        if not self.tables:
            return [(None, None)] * self.num_groups
        views = self._batch_views(table_slots.shape[0]) if self._dense else None
        outputs = []
        for group, (num_blocks, live, base) in enumerate(gathers):
            dense = indices = None
            if self._dense:
                dense = views[group]
                torch.index_select(self._group_tables[group], 0, table_slots, out=dense)
                dense.masked_fill_(self._columns >= num_blocks, 0)
            if self._csr:
                total = num_indices[group]
                indices, offsets = self._indices_views(group, total)
                if total:
                    flat = torch.repeat_interleave(base, live, output_size=total)
                    flat += offsets
                    torch.index_select(self._group_flat[group], 0, flat, out=indices)
            outputs.append((dense, indices))
        return outputs

    def _batch_views(self, padded):
        """Per group, the batch's dense output ``block_table[group, :padded]``."""
        views = self._views.get(padded)
        if views is None:
            views = self._views[padded] = [self.block_table[group, :padded] for group in range(self.num_groups)]
        return views

    def _delta_views(self, packed, packed_int64, delta_offset, num_changed):
        """(the changed entries' int64 indices, their int32 values): views of the packed
        device buffer, kept per (offset, count), as decode steps repeat them."""
        if len(self._deltas) >= 4096:
            self._deltas.clear()
        values = delta_offset + 2 * num_changed
        pair = self._deltas[delta_offset, num_changed] = (
            packed_int64[delta_offset // 2 : delta_offset // 2 + num_changed], packed[values : values + num_changed])
        return pair

    def _indices_views(self, group, total):
        """(kv_indices[group, :total], arange(total)), kept per length."""
        key = (group, total)
        pair = self._indices.get(key)
        if pair is None:
            if len(self._indices) >= 4096:
                self._indices.clear()
            pair = self._indices[key] = (self.kv_indices[group, :total], self._offsets[:total])
        return pair


class _StagedMetadata(MetadataBuffers):
    """A staging buffer's metadata arrays; its bound writers keep ``table``'s rows."""

    __slots__ = ("_device_table", "_table_slots", "_delta_area", "_gathers")

    def __init__(self, device_table, arrays, table_slots, delta_area):
        self._adopt(device_table.width, arrays["kv_lens"], arrays["cu_kv_seqlens"], arrays["slot_mapping"],
                    arrays["kv_indptr"], arrays["kv_last_page_len"], None, None)
        self._gathers = (arrays["gather_blocks"], arrays["gather_live"], arrays["gather_base"])
        self._device_table = device_table
        self._table_slots = table_slots
        self._delta_area = delta_area

    def bound(self, module=None):
        module = _backend.module if module is None else module
        metadata = self._writers.get(module)
        if metadata is None:
            metadata = super().bound(module)
            try:
                metadata.bind_device_table(self._device_table.rows(module), self._table_slots, self._delta_area,
                                           *self._gathers)
            except BaseException:  # not kept: a writer without its device table would feed apply() stale arrays
                del self._writers[module]
                raise
        return metadata
