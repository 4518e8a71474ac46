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

from tokcy.executor._host import ARRAY_FIELDS, COUNT_FIELDS, HostBuffers, PreparedInputs, _count, prepare_inputs

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
    lengths = {
        "input_ids": max_num_tokens,
        "position_ids": max_num_tokens,
        "gather_ids": max_num_tokens,
        "seq_lens": max_batch_size,
        "num_cached_tokens": max_batch_size,
        "prompt_lens": max_batch_size,
        "cu_seqlens": max_batch_size + 1,
        "request_ids": max_batch_size,
        "draft_tokens": max_batch_size * max_draft_len,
        "draft_lens": max_batch_size,
        "device_token_slots": max_batch_size,
    }
    layout = {}
    offset = 0
    for name in _PACKED_ORDER:
        width = 2 if name == "request_ids" else 1
        if width == 2 and offset % 2:
            offset += 1  # int64 alignment
        layout[name] = (offset, lengths[name], width)
        offset += lengths[name] * width
    return layout, offset


class DeviceInputs:
    """One iteration's inputs on the device: torch views (exactly the used length) of the
    preparer's persistent device tensors, with the same names as ``PreparedInputs``, plus
    its counts and ``host`` (the ``PreparedInputs`` in the staging buffer, valid until
    that ring slot is reused)."""

    __slots__ = ARRAY_FIELDS + COUNT_FIELDS + ("host",)

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
        self._next = (slot + 1) % len(self._staging)
        used = self._input_ids_end + host.num_tokens
        self._device_packed[:used].copy_(self._staging[slot][:used], non_blocking=self.is_cuda)
        if self._events is not None:
            self._events[slot].record()
            self._recorded[slot] = True
        tensors = self.tensors
        count = len(host.device_token_slots)
        if count:
            start = host.device_token_row_start
            tokens = previous.index_select(0, tensors["device_token_slots"][:count])
            tensors["input_ids"][start : start + count].copy_(tokens)
        result = DeviceInputs()
        for name in ARRAY_FIELDS:
            setattr(result, name, tensors[name][: len(getattr(host, name))])
        for name in COUNT_FIELDS:
            setattr(result, name, getattr(host, name))
        result.host = host
        return result

    def synchronize(self):
        """Wait until every staging copy issued so far has finished (no-op without CUDA)."""
        if self._events is not None:
            for event, recorded in zip(self._events, self._recorded):
                if recorded:
                    event.synchronize()
