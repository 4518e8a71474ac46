"""Feeding the device: persistent staging and device tensors for ``prepare_inputs``.

Layout: every array of ``PreparedInputs`` lives at a fixed offset of one packed int32
buffer (``request_ids`` as int64 pairs), the same on the host (staging) and on the device.
Per ``prepare`` the host loop writes the staging buffer of the current ring slot and ONE
``non_blocking`` copy moves the used prefix of it to the device; the arrays whose size
follows the token count come last, so that prefix ends right after the used input ids.

With CUDA the staging buffers are pinned and form a ring (``num_staging_buffers`` >= 2);
each slot's copy records a CUDA event and the next write into that slot waits for it, so
no staging buffer is refilled while its copy is in flight. Without CUDA the same code
runs with CPU tensors, no pinning and no events. torch is imported when an
``InputPreparer`` is created, never at ``import tokcy``.
"""

from types import MappingProxyType

import numpy as np

from tokcy import _backend
from tokcy._prepare_checks import DEVICE_TOKEN, check_layer_groups, request_group
from tokcy._pure.metadata import delta_end, delta_start
from tokcy.executor._host import (
    ARRAY_FIELDS,
    COUNT_FIELDS,
    _NUM_ARRAYS,
    HostBuffers,
    _count,
    _install_fields,
    _new_object,
    _used_length,
    capacity_lengths,
    written_inputs,
)
from tokcy.executor._metadata import LayerGroupInputs, _made_fields, block_sizes_arg, set_fields
from tokcy.executor._read_only import read_only

# Packed order: per-sequence arrays first, token-sized arrays last, input_ids at the end.
_PACKED_ORDER = (
    "cu_seqlens",
    "request_ids",
    "seq_lens",
    "num_cached_tokens",
    "prompt_lens",
    "draft_lens",
    "device_token_slots",
    "draft_tokens",
    "gather_ids",
    "position_ids",
    "input_ids",
)


def _metadata_lengths(max_num_tokens, max_batch_size, num_groups):
    """{packed name: entries} of the attention metadata the host writes (``name/g`` per group)."""
    lengths = {"kv_lens": max_batch_size, "cu_kv_seqlens": max_batch_size + 1, "table_slots": max_batch_size}
    for group in range(num_groups):
        lengths[f"kv_indptr/{group}"] = max_batch_size + 1
        lengths[f"kv_last_page_len/{group}"] = max_batch_size
        lengths[f"slot_mapping/{group}"] = max_num_tokens
        # what the device gather reads per sequence (AttentionMetadata.bind_device_table)
        lengths[f"gather_blocks/{group}"] = max_batch_size
        lengths[f"gather_live/{group}"] = max_batch_size
        lengths[f"gather_base/{group}"] = max_batch_size
    return lengths


_INT64_FIELDS = ("request_ids", "slot_mapping/", "gather_live/", "gather_base/")  # two int32 words per entry


def _packed_layout(max_num_tokens, max_batch_size, max_draft_len, num_groups=0):
    """{name: (offset, length in elements, width in int32 words)} and the total int32 words."""
    lengths = capacity_lengths(max_num_tokens, max_batch_size, max_draft_len)
    order = _PACKED_ORDER
    if num_groups:
        extra = _metadata_lengths(max_num_tokens, max_batch_size, num_groups)
        lengths.update(extra)
        order = tuple(extra) + _PACKED_ORDER  # input_ids stays last
    layout = {}
    offset = 0
    for name in order:
        width = 2 if name.startswith(_INT64_FIELDS) else 1
        if (width == 2 or name == "input_ids") and offset % 2:
            offset += 1  # int64 alignment (the changed entries' int64 indices follow the input ids)
        layout[name] = (offset, lengths[name], width)
        offset += lengths[name] * width
    return layout, offset


_MAX_CACHED_VIEWS = 4096  # per cache of views (per field, the copies'); their sizes are bounded anyway


def _check_still_holds(tokens):
    """RuntimeError unless ``tokens`` (a 1-D tensor) still lies inside its storage: code a
    call ran may have resized the storage it shares with the caller's tensor
    (``untyped_storage().resize_()``), and torch's gather checks the indices against the
    tensor's shape, never its storage."""
    end = tokens.storage_offset() + (tokens.shape[0] - 1) * tokens.stride(0) + 1 if tokens.shape[0] else 0
    if tokens.untyped_storage().nbytes() < end * tokens.element_size():
        raise RuntimeError("the memory of previous_new_tokens was resized by code that ran during prepare: "
                           "its tokens are no longer there")


class DeviceInputs:
    """One iteration's inputs on the device: torch views (exactly the used length) of the
    preparer's persistent device tensors, with the same names as ``PreparedInputs``, plus
    its counts and ``host`` (the ``PreparedInputs`` in the staging buffer, valid until
    that ring slot is reused).

    A view is made when first read, and the preparer keeps the views it made by length:
    slicing a tensor costs a microsecond or two, and decode batches repeat their sizes.
    ``host`` too is made when first read: a step that only feeds the device never pays
    for it.
    """

    __slots__ = ("_preparer", "_counts", "_host", "_metadata", "_views")

    # Every field is a read-only property (defined below the class), as in PreparedInputs.
    def __init__(self, preparer, host, metadata=None):
        self._preparer = preparer
        self._counts = host._counts
        self._host = host
        self._metadata = metadata  # what the metadata views are made from, on first read
        self._views = [None] * _NUM_ARRAYS

    @property
    def host(self):
        """The ``PreparedInputs`` of this step in the staging buffer (numpy views)."""
        host = self._host
        if type(host) is tuple:  # (staging HostBuffers, the metadata's results): made now, once
            host = self._host = written_inputs(host[0], self._counts, host[1], self._preparer.block_sizes)
        return host

    def _metadata_fields(self):
        return _made_fields(self, self._preparer._set_device_metadata)  # from (tables, padded, ...)

    def __reduce__(self):
        raise TypeError("a DeviceInputs cannot be pickled or copied: its tensors are views of its preparer's device "
                        "buffer, which a later prepare() overwrites; pickle its host (a snapshot of the step) or "
                        "copy the tensors it holds")

    def __repr__(self):
        counts = ", ".join(f"{name}={getattr(self, name)}" for name in COUNT_FIELDS)
        return f"DeviceInputs({counts})"


def _device_array_property(index, name):
    def read(self):
        views = self._views
        view = views[index]
        if view is None:
            view = views[index] = self._preparer._view(name, _used_length(index, self._counts))
        return view

    read.__name__ = name
    return property(read, doc=f"``{name}``: a view of the device tensor, exactly the used length.")


_install_fields(DeviceInputs, _device_array_property, "an int, the host's")


class InputPreparer:
    """Persistent host staging and device tensors for the inputs of every iteration.

    ``max_num_tokens`` token rows and ``max_batch_size`` sequences (beams and padding
    included) at most; ``max_draft_len`` draft tokens per request; ``max_beam_width``
    beams per request. ``device``: "cpu", "cuda", "cuda:1" or a ``torch.device``.
    ``tensors`` holds the full-capacity device tensors; their addresses never change, so
    CUDA graphs may capture them.

    ``block_size`` (or ``block_sizes``, one per layer group) with ``max_blocks_per_seq``:
    every ``prepare`` also builds the attention metadata (docs/attention.md), and the
    preparer keeps ``block_table``, a persistent (groups, ``max_slots``,
    ``max_blocks_per_seq``) device table indexed by ``seq_slot`` (default max_slots:
    ``max_batch_size``), updated by sending only the entries that changed.
    ``device_tables``: which of the batch's block tables each step gathers on the device,
    "dense" (``block_table``), "csr" (``kv_indices``), both (the default) or none (``()``);
    a model reads one, and each costs device ops every step. A table not gathered reads
    None in the returned inputs.
    ``last_copy_bytes``: the bytes the last ``prepare`` that succeeded copied host-to-device.
    What it is made with (the sizes, ``device``, ``block_sizes``, ``tensors``, the device
    table) is read-only.
    """

    def __init__(self, max_num_tokens, max_batch_size, *, max_draft_len=0, max_beam_width=1, device="cpu",
                 num_staging_buffers=2, block_size=None, block_sizes=None, max_blocks_per_seq=None,
                 max_slots=None, device_tables=None):
        import torch

        from tokcy.executor._device_table import DeviceBlockTable, device_tables_arg, device_zeros

        self._max_num_tokens = _count(max_num_tokens, "max_num_tokens")
        self._max_batch_size = _count(max_batch_size, "max_batch_size")
        self._max_draft_len = _count(max_draft_len, "max_draft_len")
        self._max_beam_width = _count(max_beam_width, "max_beam_width", 1)
        num_staging_buffers = _count(num_staging_buffers, "num_staging_buffers", 1)
        self._device = torch.device(device)
        self._is_cuda = self._device.type == "cuda"
        if self._is_cuda and num_staging_buffers < 2:
            raise ValueError(f"num_staging_buffers must be >= 2 with CUDA, got {num_staging_buffers}")
        self._torch = torch
        self._block_sizes = block_sizes_arg(block_size, block_sizes)
        num_groups = 0 if self._block_sizes is None else check_layer_groups(len(self._block_sizes))
        if num_groups and max_blocks_per_seq is None:
            raise ValueError("a block size needs max_blocks_per_seq (the device block table's width)")
        if num_groups and self._max_beam_width != 1:
            raise ValueError(f"attention metadata needs max_beam_width 1, got {self._max_beam_width}")
        if not num_groups and device_tables is not None:
            raise ValueError("device_tables needs a block size (the tables are the attention metadata's)")
        self._device_tables = device_tables_arg(device_tables) if num_groups else None
        layout, total = _packed_layout(self._max_num_tokens, self._max_batch_size, self._max_draft_len, num_groups)
        self._layout = layout
        self._input_ids_end = layout["input_ids"][0]  # + num_tokens: the used prefix
        self._device_table = self._max_blocks_per_seq = self._max_slots = None
        if num_groups:
            self._max_blocks_per_seq = _count(max_blocks_per_seq, "max_blocks_per_seq", 1)
            self._max_slots = self._max_batch_size if max_slots is None else _count(max_slots, "max_slots", 1)
            self._device_table = DeviceBlockTable(torch, self._device, num_groups, self._max_slots,
                                                 self._max_blocks_per_seq, self._max_batch_size, self._device_tables)
            # changed entries (an int64 index and an int32 value each) go after the used input
            # ids, from an even word (delta_start): at most every entry of every sequence's
            # row, in every group
            total += 1 + 3 * self._max_batch_size * num_groups * self._max_blocks_per_seq
        total += total % 2  # even: the device buffer's int64 view covers it all
        self.last_copy_bytes = 0
        self._device_packed = device_zeros(torch, max(total, 2), torch.int32, self._device)
        self._device_packed_int64 = self._device_packed.view(torch.int64)  # the changed entries' indices
        self._device_packed_address = self._device_packed.data_ptr()  # fixed: CUDA graphs may capture it
        self._device_packed_bytes = self._device_packed.untyped_storage().nbytes()
        # read-only: every DeviceInputs' views are made from these
        self._tensors = MappingProxyType({name: self._field(self._device_packed, name) for name in ARRAY_FIELDS})
        self._views = {name: {} for name in ARRAY_FIELDS}
        self._batch_view_cache = {}  # padded batch size -> _batch_views(): the per-sequence metadata views
        self._copies = {}  # (tokens, changed table entries) -> what _new_copy() made for them
        # On a CPU "device" the packed copy is a plain memcpy between two host buffers: done
        # through memoryviews of the same memory it costs a third of a torch copy_ call.
        self._host_copy = self._device.type == "cpu"
        self._staging = []
        self._host = []
        for _ in range(num_staging_buffers):
            staging = torch.zeros(max(total, 2), dtype=torch.int32, pin_memory=self._is_cuda)
            packed = staging.numpy()
            arrays = {}
            for name in ARRAY_FIELDS:
                offset, length, width = layout[name]
                view = packed[offset : offset + length * width]
                arrays[name] = view.view(np.int64) if width == 2 else view
            self._staging.append(staging)
            metadata = None
            if num_groups:
                metadata = self._device_table.host_metadata(
                    self._metadata_views(packed, num_groups), self._packed_field(packed, "table_slots"),
                    packed[self._input_ids_end :])
            self._host.append(HostBuffers.from_arrays(max_draft_len=self._max_draft_len,
                                                      max_beam_width=self._max_beam_width, metadata=metadata,
                                                      **arrays))
        # per staging buffer: (backend module, its InputWriter, its AttentionMetadata or None),
        # looked up again when the live backend changes
        self._writers = [(None, None, None)] * num_staging_buffers
        self._events = [torch.cuda.Event() for _ in self._staging] if self._is_cuda else None
        self._recorded = [False] * num_staging_buffers
        self._next = 0
        self._fence = True  # tests switch it off to show the fence is needed
        # set while prepare() runs: two calls at once would share a staging slot and the
        # device table's scatter and gather (a second call is refused)
        self._busy = False

    def __reduce__(self):
        raise TypeError("an InputPreparer cannot be pickled or copied: its staging buffers, writers and device "
                        "tensors belong to it (CUDA graphs may hold their addresses); make another with the same "
                        "arguments")

    def _view(self, name, length):
        """``tensors[name][:length]``, the same tensor object every time for a length."""
        views = self._views[name]
        view = views.get(length)
        if view is None:
            if len(views) >= _MAX_CACHED_VIEWS:
                views.clear()
            view = views[length] = self._tensors[name][:length]
        return view

    def _packed_field(self, packed, name):
        offset, length, width = self._layout[name]
        view = packed[offset : offset + length * width]
        return view.view(np.int64) if width == 2 else view

    def _metadata_views(self, packed, num_groups):
        groups = range(num_groups)
        return {
            "kv_lens": self._packed_field(packed, "kv_lens"),
            "cu_kv_seqlens": self._packed_field(packed, "cu_kv_seqlens"),
            "slot_mapping": [self._packed_field(packed, f"slot_mapping/{group}") for group in groups],
            "kv_indptr": [self._packed_field(packed, f"kv_indptr/{group}") for group in groups],
            "kv_last_page_len": [self._packed_field(packed, f"kv_last_page_len/{group}") for group in groups],
            **{name: [self._packed_field(packed, f"{name}/{group}") for group in groups]
               for name in ("gather_blocks", "gather_live", "gather_base")},
        }

    @property
    def block_table(self):
        """The persistent device block table (groups, max_slots, max_blocks_per_seq), or None."""
        return None if self._device_table is None else self._device_table.table

    def _field(self, packed, name):
        offset, length, width = self._layout[name]
        view = packed[offset : offset + length * width]
        return view.view(self._torch.int64) if width == 2 else view

    @property
    def num_staging_buffers(self):
        return len(self._staging)

    def prepare(self, context_requests, generation_requests, *, first_draft_requests=(), device_token_requests=(),
                cuda_graph_batch_sizes=None, previous_new_tokens=None):
        """Prepare one iteration on the device; same request arguments as ``prepare_inputs``.

        ``previous_new_tokens``: the previous step's new tokens on the device, indexed by
        ``seq_slot`` (1-D, or 2-D with one column per beam, column 0 used); required when
        there are ``device_token_requests``: their rows get ``previous_new_tokens[slot]``.
        Returns a ``DeviceInputs``. Nothing waits for the device except, with CUDA, the
        staging slot being reused (its previous copy must have finished). One call at a
        time: another thread's call meanwhile (or one re-entered from code this call runs)
        raises RuntimeError.
        """
        if self._busy:
            raise RuntimeError("this InputPreparer is in use by another call (another thread's, or one re-entered "
                               "from code this call runs)")
        self._busy = True  # no call since the check, so no other thread ran in between (the GIL)
        try:
            if type(device_token_requests) not in (list, tuple):
                device_token_requests = request_group(device_token_requests, DEVICE_TOKEN)
            previous = device_slots = None
            if device_token_requests:
                previous = self._device_token_source(previous_new_tokens)
                device_slots = previous.shape[0]
            slot = self._next
            if self._events is not None and self._recorded[slot] and self._fence:
                self._events[slot].synchronize()  # its previous copy is done: safe to refill
            module, writer, metadata = self._writers[slot]
            if module is not _backend.module:
                module, writer, metadata = self._writers[slot] = self._staging_writers(slot)
            # prepare_into(), with this staging buffer's writers at hand; each device-token
            # request's seq_slot is checked against previous_new_tokens in its pass 1, so that
            # a failed call writes nothing and consumes no block table's changes
            counts = writer.prepare(context_requests, generation_requests, first_draft_requests, device_token_requests,
                                    self._max_draft_len, cuda_graph_batch_sizes, self._max_beam_width, self._block_sizes,
                                    device_slots)
            try:
                inputs = _new_object(DeviceInputs)  # DeviceInputs(self, host, metadata), without the __init__ call
                inputs._preparer = self
                inputs._counts = counts
                inputs._views = [None] * _NUM_ARRAYS
                inputs._metadata = None
                results = None if metadata is None else metadata.results()  # (.., .., changed table entries, ..)
                inputs._host = (self._host[slot], results)  # DeviceInputs.host is made from them when read
                # the one copy of the staging buffer's used prefix (a cached view pair per
                # (tokens, changed table entries)) to the device buffer
                key = (counts[3], 0 if results is None else results[2])
                target, sources, deltas, copied = self._copies.get(key) or self._new_copy(key)
                if self._host_copy:
                    target[:] = sources[slot]
                else:
                    target.copy_(sources[slot], non_blocking=self._is_cuda)
                if self._events is not None:
                    # the copy runs on the inputs' device's current stream: fence that stream
                    self._events[slot].record(self._torch.cuda.current_stream(self._device_packed.device))
                    self._recorded[slot] = True
                if counts[10]:  # device-token rows: their ids from the previous step's tokens
                    inputs._host = written_inputs(self._host[slot], counts, results, self._block_sizes)
                    start = counts[6]  # device_token_row_start
                    slots = self._view("device_token_slots", counts[10])
                    _check_still_holds(previous)  # (nothing runs Python code from here to the gather)
                    tokens = previous.index_select(0, slots)
                    self._tensors["input_ids"][start : start + counts[10]].copy_(tokens)
                if results is not None:
                    # scatter the changed entries into the device table and gather the batch's
                    # tables (device work, issued now); _set_device_metadata makes the views
                    padded = counts[5]
                    views = self._batch_view_cache.get(padded) or self._batch_views(padded)
                    tables = self._device_table.apply(self._device_packed, self._device_packed_int64, deltas, results[2],
                                                     views[0], views[2], results[3])
                    inputs._metadata = (tables, padded, counts[3], results[0], results[1])  # (the metadata views')
                self.last_copy_bytes = copied
                self._next = (slot + 1) % len(self._staging)  # the ring moves on once nothing can fail
            except BaseException:
                if self._device_table is not None:  # the host consumed the tables' changes: resend them whole
                    self._device_table.rows().forget()
                raise
            return inputs
        finally:
            self._busy = False

    def _device_token_source(self, previous_new_tokens):
        """``previous_new_tokens`` checked, as the 1-D tensor the device-token rows read."""
        torch = self._torch
        if previous_new_tokens is None:
            raise ValueError("device_token_requests need previous_new_tokens (the previous step's device tokens)")
        previous = previous_new_tokens
        # exactly a tensor: its shape bounds the slots pass 1 accepts, and a subclass's
        # shape (or __torch_function__) may say anything
        if type(previous) is not torch.Tensor:
            raise TypeError(f"previous_new_tokens must be a torch.Tensor, not {type(previous).__name__}")
        if previous.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"previous_new_tokens must hold int32 or int64 token ids, got {previous.dtype}")
        ndim = previous.ndim
        if ndim not in (1, 2):
            raise ValueError(f"previous_new_tokens must be 1-D or 2-D, got {ndim} dimensions")
        if ndim == 2 and previous.shape[1] == 0:
            raise ValueError("previous_new_tokens has no column (its shape is (n, 0)): column 0 holds the tokens")
        if previous.device != self._device_packed.device:
            raise ValueError(f"previous_new_tokens is on {previous.device}, the inputs on {self._device}")
        storage = previous.untyped_storage()
        start = storage.data_ptr()
        if start < self._device_packed_address + self._device_packed_bytes and self._device_packed_address < (
                start + storage.nbytes()):  # shares the memory the step's copy overwrites before the rows read it
            raise ValueError("previous_new_tokens is a view of this InputPreparer's own inputs, which this step "
                             "overwrites before reading it: pass the model's output tokens (or a copy)")
        # an alias of our own: the caller's tensor may be resized or set_() to other memory by
        # code this call runs (a batch's generator, a collection's callback) after its length
        # bounded the slots pass 1 accepts
        return previous[:, 0] if ndim == 2 else previous[:]

    def _staging_writers(self, slot):
        """(the live backend, staging buffer ``slot``'s InputWriter, the AttentionMetadata it
        writes or None): made once per backend by the HostBuffers."""
        module = _backend.module
        host = self._host[slot]
        return module, host.writer(module), None if host.metadata is None else host.metadata.bound(module)

    def _batch_views(self, padded):
        """(table_slots, [kv_indptr per group], [(blocks as a column, live blocks, run
        starts) per group]) of the device packed buffer for a batch of ``padded``
        sequences, made once per size."""
        views = self._batch_view_cache.get(padded)
        if views is None:
            groups = range(len(self._block_sizes))
            views = self._batch_view_cache[padded] = (
                self._packed_view("table_slots", padded),
                [self._packed_view(f"kv_indptr/{group}", padded + 1) for group in groups],
                [(self._packed_view(f"gather_blocks/{group}", padded)[:, None],
                  self._packed_view(f"gather_live/{group}", padded), self._packed_view(f"gather_base/{group}", padded))
                 for group in groups])
        return views

    def _set_device_metadata(self, fields, tables, padded, num_tokens, max_query_len, max_kv_len):
        """The metadata attributes (device views) into ``fields``, a ``_MetadataFields``: an
        inputs object makes them on the first read of any."""
        indptrs = self._batch_views(padded)[1]
        groups = []
        for group, (block_size, (dense, indices)) in enumerate(zip(self._block_sizes, tables)):
            groups.append(LayerGroupInputs(
                block_size=block_size, slot_mapping=self._packed_view(f"slot_mapping/{group}", num_tokens),
                block_table=dense, kv_indptr=indptrs[group], kv_indices=indices,
                kv_last_page_len=self._packed_view(f"kv_last_page_len/{group}", padded)))
        set_fields(fields, self._packed_view("kv_lens", padded), self._packed_view("cu_kv_seqlens", padded + 1),
                   max_query_len, max_kv_len, groups)

    def _new_copy(self, key):
        """For a step of ``key`` (tokens, changed table entries), not cached yet: (the device
        buffer's used prefix, the staging buffers' per ring slot, where the changed entries
        start, the bytes copied), kept in ``_copies``. On a CPU device the prefixes are
        memoryviews: assigning one costs less than a numpy slice assignment."""
        num_tokens, entries = key
        used = self._input_ids_end + delta_end(num_tokens, entries)
        if len(self._copies) >= _MAX_CACHED_VIEWS:
            self._copies.clear()
        if self._host_copy:
            target, sources = (memoryview(self._device_packed.numpy()[:used]),
                               [memoryview(staging.numpy()[:used]) for staging in self._staging])
        else:
            target, sources = self._device_packed[:used], [staging[:used] for staging in self._staging]
        copy = self._copies[key] = (target, sources, self._input_ids_end + delta_start(num_tokens), used * 4)
        return copy

    def _packed_view(self, name, length):
        """A metadata field of the device packed buffer, ``[:length]``, cached by length."""
        views = self._views.get(name)
        if views is None:
            views = self._views[name] = {}
        view = views.get(length)
        if view is None:
            if len(views) >= _MAX_CACHED_VIEWS:
                views.clear()
            view = views[length] = self._field(self._device_packed, name)[:length]
        return view

    def synchronize(self):
        """Wait until every staging copy issued so far has finished (no-op without CUDA)."""
        if self._events is not None:
            for event, recorded in zip(self._events, self._recorded):
                if recorded:
                    event.synchronize()


#: What an ``InputPreparer`` is made with, read-only: its staging buffers, writers and
#: device tensors are laid out for them when it is made.
PREPARER_FIELDS = ("max_num_tokens", "max_batch_size", "max_draft_len", "max_beam_width", "device", "is_cuda",
                   "tensors", "block_sizes", "max_blocks_per_seq", "max_slots", "device_table", "device_tables")
read_only(InputPreparer, PREPARER_FIELDS)
