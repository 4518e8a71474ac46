# Types of tokcy/executor/_device.py (the module itself is left unannotated); keep in sync.
from typing import Iterable, SupportsIndex

import torch

from tokcy._core import Request
from tokcy.executor._host import PreparedInputs

class DeviceInputs:
    host: PreparedInputs
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    gather_ids: torch.Tensor
    seq_lens: torch.Tensor
    num_cached_tokens: torch.Tensor
    prompt_lens: torch.Tensor
    cu_seqlens: torch.Tensor
    request_ids: torch.Tensor
    draft_tokens: torch.Tensor
    draft_lens: torch.Tensor
    device_token_slots: torch.Tensor
    num_context_requests: int
    num_context_tokens: int
    num_generation_tokens: int
    num_tokens: int
    num_sequences: int
    padded_batch_size: int
    device_token_row_start: int
    def __init__(self, preparer: InputPreparer, host: PreparedInputs) -> None: ...
    def __getattr__(self, name: str) -> torch.Tensor | int: ...

class InputPreparer:
    max_num_tokens: int
    max_batch_size: int
    max_draft_len: int
    max_beam_width: int
    device: torch.device
    is_cuda: bool
    tensors: dict[str, torch.Tensor]
    def __init__(
        self,
        max_num_tokens: SupportsIndex,
        max_batch_size: SupportsIndex,
        *,
        max_draft_len: SupportsIndex = 0,
        max_beam_width: SupportsIndex = 1,
        device: str | torch.device = "cpu",
        num_staging_buffers: SupportsIndex = 2,
    ) -> None: ...
    @property
    def num_staging_buffers(self) -> int: ...
    def prepare(
        self,
        context_requests: Iterable[Request],
        generation_requests: Iterable[Request],
        *,
        first_draft_requests: Iterable[Request] = (),
        device_token_requests: Iterable[Request] = (),
        cuda_graph_batch_sizes: Iterable[SupportsIndex] | None = None,
        previous_new_tokens: torch.Tensor | None = None,
    ) -> DeviceInputs: ...
    def synchronize(self) -> None: ...
