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

import numpy as np

from tokcy.executor._host import (
    ARRAY_FIELDS,
    COUNT_FIELDS,
    HostBuffers,
    _count,
    capacity_lengths,
    prepare_inputs,
)

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


def _packed_layout(max_num_tokens, max_batch_size, max_draft_len):
    """{name: (offset, length in elements, width in int32 words)} and the total int32 words."""
    lengths = capacity_lengths(max_num_tokens, max_batch_size, max_draft_len)
    layout = {}
    offset = 0
    for name in _PACKED_ORDER:
        width = 2 if name == "request_ids" else 1
        if width == 2 and offset % 2:
            offset += 1  # int64 alignment
        layout[name] = (offset, lengths[name], width)
        offset += lengths[name] * width
    return layout, offset


_MAX_CACHED_VIEWS = 4096  # per field; lengths are bounded by the capacities anyway


class DeviceInputs:
    """One iteration's inputs on the device: torch views (exactly the used length) of the
    preparer's persistent device tensors, with the same names as ``PreparedInputs``, plus
    its counts and ``host`` (the ``PreparedInputs`` in the staging buffer, valid until
    that ring slot is reused).

    A view is made when first read, and the preparer keeps the views it made by length:
    slicing a tensor costs a microsecond or two, and decode batches repeat their sizes.
    """

    __slots__ = ARRAY_FIELDS + ("host", "_preparer")

    def __init__(self, preparer, host):
        self._preparer = preparer
        self.host = host

    def __getattr__(self, name):  # only called for a field not read yet
        if name in ARRAY_FIELDS:
            view = self._preparer._view(name, len(getattr(self.host, name)))
            setattr(self, name, view)
            return view
        if name in COUNT_FIELDS:
            return getattr(self.host, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self):
        counts = ", ".join(f"{name}={getattr(self, name)}" for name in COUNT_FIELDS)
        return f"DeviceInputs({counts})"


class InputPreparer:
    """Persistent host staging and device tensors for the inputs of every iteration.

    ``max_num_tokens`` token rows and ``max_batch_size`` sequences (beams and padding
    included) at most; ``max_draft_len`` draft tokens per request; ``max_beam_width``
    beams per request. ``device``: "cpu", "cuda", "cuda:1" or a ``torch.device``.
    ``tensors`` holds the full-capacity device tensors; their addresses never change, so
    CUDA graphs may capture them.
    """

    def __init__(self, max_num_tokens, max_batch_size, *, max_draft_len=0, max_beam_width=1, device="cpu",
                 num_staging_buffers=2):
        import torch

        self.max_num_tokens = _count(max_num_tokens, "max_num_tokens")
        self.max_batch_size = _count(max_batch_size, "max_batch_size")
        self.max_draft_len = _count(max_draft_len, "max_draft_len")
        self.max_beam_width = _count(max_beam_width, "max_beam_width", 1)
        num_staging_buffers = _count(num_staging_buffers, "num_staging_buffers", 1)
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        if self.is_cuda and num_staging_buffers < 2:
            raise ValueError(f"num_staging_buffers must be >= 2 with CUDA, got {num_staging_buffers}")
        self._torch = torch
        layout, total = _packed_layout(self.max_num_tokens, self.max_batch_size, self.max_draft_len)
        self._layout = layout
        self._input_ids_end = layout["input_ids"][0]  # + num_tokens: the used prefix
        self._device_packed = torch.zeros(max(total, 1), dtype=torch.int32, device=self.device)
        self.tensors = {name: self._field(self._device_packed, name) for name in ARRAY_FIELDS}
        self._views = {name: {} for name in ARRAY_FIELDS}
        self._staging = []
        self._host = []
        for _ in range(num_staging_buffers):
            staging = torch.zeros(max(total, 1), dtype=torch.int32, pin_memory=self.is_cuda)
            packed = staging.numpy()
            arrays = {}
            for name in ARRAY_FIELDS:
                offset, length, width = layout[name]
                view = packed[offset : offset + length * width]
                arrays[name] = view.view(np.int64) if width == 2 else view
            self._staging.append(staging)
            self._host.append(HostBuffers.from_arrays(max_draft_len=self.max_draft_len,
                                                      max_beam_width=self.max_beam_width, **arrays))
        self._events = [torch.cuda.Event() for _ in self._staging] if self.is_cuda else None
        self._recorded = [False] * num_staging_buffers
        self._next = 0
        self._fence = True  # tests switch it off to show the fence is needed

    def _view(self, name, length):
        """``tensors[name][:length]``, the same tensor object every time for a length."""
        views = self._views[name]
        view = views.get(length)
        if view is None:
            if len(views) >= _MAX_CACHED_VIEWS:
                views.clear()
            view = views[length] = self.tensors[name][:length]
        return view

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
        staging slot being reused (its previous copy must have finished).
        """
        torch = self._torch
        if type(device_token_requests) not in (list, tuple):
            device_token_requests = tuple(device_token_requests)
        previous = None
        if device_token_requests:
            if previous_new_tokens is None:
                raise ValueError("device_token_requests need previous_new_tokens (the previous step's device tokens)")
            previous = previous_new_tokens
            if not isinstance(previous, torch.Tensor):
                raise TypeError(f"previous_new_tokens must be a torch.Tensor, not {type(previous).__name__}")
            if previous.ndim == 2:
                previous = previous[:, 0]
            elif previous.ndim != 1:
                raise ValueError(f"previous_new_tokens must be 1-D or 2-D, got {previous.ndim} dimensions")
            if previous.device != self._device_packed.device:
                raise ValueError(f"previous_new_tokens is on {previous.device}, the inputs on {self.device}")
        slot = self._next
        if self._events is not None and self._recorded[slot] and self._fence:
            self._events[slot].synchronize()  # its previous copy is done: safe to refill
        host = prepare_inputs(context_requests, generation_requests, first_draft_requests=first_draft_requests,
                              device_token_requests=device_token_requests, max_draft_len=self.max_draft_len,
                              cuda_graph_batch_sizes=cuda_graph_batch_sizes, out=self._host[slot])
        count = len(host.device_token_slots)
        if count and int(host.device_token_slots.max()) >= previous.shape[0]:
            # checked before the copy: a failed call leaves the device tensors as they were
            bad = int(host.device_token_slots.max())
            raise ValueError(f"seq_slot {bad} is out of range for previous_new_tokens of {previous.shape[0]} slots")
        self._next = (slot + 1) % len(self._staging)
        used = self._input_ids_end + host.num_tokens
        self._device_packed[:used].copy_(self._staging[slot][:used], non_blocking=self.is_cuda)
        if self._events is not None:
            # the copy runs on the inputs' device's current stream: fence that stream
            self._events[slot].record(torch.cuda.current_stream(self._device_packed.device))
            self._recorded[slot] = True
        if count:
            start = host.device_token_row_start
            tokens = previous.index_select(0, self._view("device_token_slots", count))
            self.tensors["input_ids"][start : start + count].copy_(tokens)
        return DeviceInputs(self, host)

    def synchronize(self):
        """Wait until every staging copy issued so far has finished (no-op without CUDA)."""
        if self._events is not None:
            for event, recorded in zip(self._events, self._recorded):
                if recorded:
                    event.synchronize()
