"""The host side of the attention metadata: its arrays, their holder and the arguments.

``prepare_inputs(..., block_size=16)`` (or ``block_sizes=(16, 256)``, one per layer
group) makes the backend's ``InputWriter`` write, in the same pass as the token inputs,
the KV slot of every token row, the KV lengths and the block tables in the dense and the
CSR layout (docs/attention.md). ``MetadataBuffers`` holds those arrays.
"""

import operator

import numpy as np

from tokcy import _backend
from tokcy import _prepare_checks as _checks
from tokcy.executor._memory import zeros
from tokcy.executor._read_only import read_only

#: Per-batch metadata attributes of ``PreparedInputs`` / ``DeviceInputs`` (group 0's
#: arrays also appear at the top level; ``groups`` holds one ``LayerGroupInputs`` each).
METADATA_FIELDS = ("kv_lens", "cu_kv_seqlens", "max_query_len", "max_kv_len", "slot_mapping", "block_table",
                   "kv_indptr", "kv_indices", "kv_last_page_len", "groups")
#: The attributes of one ``LayerGroupInputs``.
GROUP_FIELDS = ("block_size", "slot_mapping", "block_table", "kv_indptr", "kv_indices", "kv_last_page_len")


def block_sizes_arg(block_size, block_sizes):
    """The call's block sizes as a tuple of ints (None: no metadata)."""
    if block_size is None and block_sizes is None:
        return None
    if block_size is not None and block_sizes is not None:
        raise TypeError("give block_size or block_sizes, not both")
    values = (block_size,) if block_sizes is None else block_sizes
    try:
        values = tuple(operator.index(value) for value in values)
    except TypeError:
        raise TypeError(f"block sizes must be integers, got {values!r}") from None
    if not values or any(value < 1 for value in values):
        raise ValueError(f"block sizes must be >= 1, one per layer group, got {values}")
    return values


class LayerGroupInputs:
    """One layer group's metadata: ``block_size``, ``slot_mapping`` (int64, one per token
    row, -1 for padding), ``block_table`` (sequences x max_blocks_per_seq, int32, zero
    past each sequence's blocks, -1 for released ones), and the CSR ``kv_indptr``
    (sequences + 1), ``kv_indices`` (live blocks only) and ``kv_last_page_len``. On a
    device, ``block_table`` or ``kv_indices`` is None when the ``InputPreparer`` does not
    gather it (its ``device_tables``)."""

    __slots__ = GROUP_FIELDS

    def __init__(self, **fields):
        for name in GROUP_FIELDS:
            setattr(self, name, fields[name])

    def __repr__(self):
        indices = None if self.kv_indices is None else len(self.kv_indices)
        return f"LayerGroupInputs(block_size={self.block_size}, kv_indices={indices})"


METADATA_BUFFER_FIELDS = ("max_blocks_per_seq", "num_layer_groups", "kv_lens", "cu_kv_seqlens", "slot_mapping",
                          "block_table", "kv_indptr", "kv_indices", "kv_last_page_len")


class MetadataBuffers:
    """Preallocated metadata arrays for ``max_batch_size`` sequences, ``max_num_tokens``
    rows, ``num_layer_groups`` groups and ``max_blocks_per_seq`` blocks per sequence.

    ``block_table`` / ``kv_indices`` may be None (a device gathers them from its own table).
    Every field is read-only.
    """

    __slots__ = tuple("_" + name for name in METADATA_BUFFER_FIELDS) + ("_writers",)

    def __init__(self, max_num_tokens, max_batch_size, max_blocks_per_seq, num_layer_groups=1):
        groups = range(_checks.check_layer_groups(num_layer_groups))  # before any array is made
        per_group = ((max_num_tokens, np.int64), (max_batch_size + 1, np.int32), (max_batch_size, np.int32),
                     ((max_batch_size, max_blocks_per_seq), np.int32), (max_batch_size * max_blocks_per_seq, np.int32))
        kv_lens, cu_kv_seqlens, *arrays = zeros((max_batch_size, np.int32), (max_batch_size + 1, np.int32),
                                                *(spec for spec in per_group for _ in groups))
        slot_mapping, kv_indptr, kv_last_page_len, block_table, kv_indices = (
            arrays[index * len(groups) : (index + 1) * len(groups)] for index in range(len(per_group)))
        self._adopt(max_blocks_per_seq, kv_lens, cu_kv_seqlens, slot_mapping, kv_indptr, kv_last_page_len,
                    block_table, kv_indices)

    @classmethod
    def from_arrays(cls, max_blocks_per_seq, kv_lens, cu_kv_seqlens, slot_mapping, kv_indptr, kv_last_page_len,
                    block_table=None, kv_indices=None):
        """A holder over caller-owned arrays (e.g. views of a packed staging buffer)."""
        self = cls.__new__(cls)
        self._adopt(max_blocks_per_seq, kv_lens, cu_kv_seqlens, slot_mapping, kv_indptr, kv_last_page_len,
                    block_table, kv_indices)
        return self

    def _adopt(self, max_blocks_per_seq, kv_lens, cu_kv_seqlens, slot_mapping, kv_indptr, kv_last_page_len,
               block_table, kv_indices):
        self._max_blocks_per_seq = max_blocks_per_seq
        self._num_layer_groups = len(slot_mapping)
        self._kv_lens, self._cu_kv_seqlens = kv_lens, cu_kv_seqlens
        self._slot_mapping, self._kv_indptr = tuple(slot_mapping), tuple(kv_indptr)
        self._kv_last_page_len = tuple(kv_last_page_len)
        self._block_table = None if block_table is None else tuple(block_table)
        self._kv_indices = None if kv_indices is None else tuple(kv_indices)
        self._writers = {}

    def __reduce__(self):
        raise TypeError("a MetadataBuffers cannot be pickled or copied: its arrays are bound to its writers (a copy "
                        "would be a second writer over them); make another with the same capacities")

    def bound(self, module=None):
        """The backend's ``AttentionMetadata`` bound to these arrays (one per backend, made once)."""
        module = _backend.module if module is None else module
        metadata = self._writers.get(module)
        if metadata is None:
            metadata = module.AttentionMetadata()
            metadata.bind(self.max_blocks_per_seq, self.kv_lens, self.cu_kv_seqlens, self.slot_mapping,
                          self.kv_indptr, self.kv_last_page_len, self.block_table, self.kv_indices)
            # the first one kept wins: every writer of these outputs writes the one that
            # results are read from, even when two threads each made one
            metadata = self._writers.setdefault(module, metadata)
        return metadata


read_only(MetadataBuffers, METADATA_BUFFER_FIELDS)


class _MetadataFields:
    """The metadata attributes of one call (``METADATA_FIELDS``), made together on the
    first read of any: an inputs object's metadata properties read them from here."""

    __slots__ = METADATA_FIELDS


_NO_METADATA = _MetadataFields()
"""What the metadata properties read after a call without a block size: every field None."""
for _name in METADATA_FIELDS:
    setattr(_NO_METADATA, _name, None)
del _name


def _made_fields(inputs, fill):
    """The ``_MetadataFields`` of an inputs object: made on the first read of any metadata
    field, by ``fill(fields, *inputs._metadata)``, and kept in ``inputs._metadata``."""
    metadata = inputs._metadata
    if metadata is None:  # a call without a block size
        return _NO_METADATA
    if type(metadata) is not _MetadataFields:  # what the fields are made from: made now, once
        fields = object.__new__(_MetadataFields)
        fill(fields, *metadata)
        metadata = inputs._metadata = fields
    return metadata


def _metadata_property(name):
    """A read-only property of an inputs object (``PreparedInputs``, ``DeviceInputs``) for
    the metadata field ``name``: its ``_metadata_fields()`` holds them all."""

    def read(self):
        return getattr(self._metadata_fields(), name)

    read.__name__ = name
    return property(read, doc=f"``{name}``: attention metadata (None when the call gave no block size).")


def attach(target, buffers, results, block_sizes, num_tokens, padded):
    """Set the metadata attributes of ``target`` (a ``_MetadataFields``) from ``buffers``
    (views of the used lengths) and the writer's ``results()`` tuple."""
    max_query_len, max_kv_len, _, num_indices = results
    groups = []
    for group, block_size in enumerate(block_sizes):
        indices = buffers.kv_indices
        groups.append(LayerGroupInputs(
            block_size=block_size,
            slot_mapping=buffers.slot_mapping[group][:num_tokens],
            block_table=None if buffers.block_table is None else buffers.block_table[group][:padded],
            kv_indptr=buffers.kv_indptr[group][: padded + 1],
            kv_indices=None if indices is None else indices[group][: num_indices[group]],
            kv_last_page_len=buffers.kv_last_page_len[group][:padded],
        ))
    set_fields(target, buffers.kv_lens[:padded], buffers.cu_kv_seqlens[: padded + 1], max_query_len, max_kv_len,
               groups)


def set_fields(target, kv_lens, cu_kv_seqlens, max_query_len, max_kv_len, groups):
    """The metadata attributes of ``target``: the per-batch ones, ``groups`` and group 0's arrays."""
    first = groups[0]
    target.kv_lens = kv_lens
    target.cu_kv_seqlens = cu_kv_seqlens
    target.max_query_len = max_query_len
    target.max_kv_len = max_kv_len
    for name in GROUP_FIELDS[1:]:
        setattr(target, name, getattr(first, name))
    target.groups = tuple(groups)
