# Types of tokcy/executor/_device.py (the module itself is left unannotated); keep in sync.
from typing import Iterable, SupportsIndex, TypeAlias

import torch

from tokcy._core import Request
from tokcy.executor._device_table import DeviceBlockTable
from tokcy.executor._host import PreparedInputs
from tokcy.executor._metadata import LayerGroupInputs

_DeviceGroup: TypeAlias = LayerGroupInputs[torch.Tensor, torch.Tensor, torch.Tensor]

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
    # attention metadata (device views): None when the preparer has no block size
    kv_lens: torch.Tensor | None
    cu_kv_seqlens: torch.Tensor | None
    max_query_len: int | None
    max_kv_len: int | None
    slot_mapping: torch.Tensor | None  # group 0's, like the four below
    block_table: torch.Tensor | None
    kv_indptr: torch.Tensor | None
    kv_indices: torch.Tensor | None
    kv_last_page_len: torch.Tensor | None
    groups: tuple[_DeviceGroup, ...] | None
    # metadata: what the device metadata views are made from on first read (internal)
    def __init__(self, preparer: InputPreparer, host: PreparedInputs, metadata: object | None = None) -> None: ...
    def __getattr__(self, name: str) -> torch.Tensor | int: ...

class InputPreparer:
    max_num_tokens: int
    max_batch_size: int
    max_draft_len: int
    max_beam_width: int
    device: torch.device
    is_cuda: bool
    tensors: dict[str, torch.Tensor]
    block_sizes: tuple[int, ...] | None
    max_blocks_per_seq: int  # set only with a block size
    max_slots: int  # set only with a block size
    device_table: DeviceBlockTable | None
    last_copy_bytes: int  # bytes the last prepare copied host-to-device
    def __init__(
        self,
        max_num_tokens: SupportsIndex,
        max_batch_size: SupportsIndex,
        *,
        max_draft_len: SupportsIndex = 0,
        max_beam_width: SupportsIndex = 1,
        device: str | torch.device = "cpu",
        num_staging_buffers: SupportsIndex = 2,
        block_size: SupportsIndex | None = None,
        block_sizes: Iterable[SupportsIndex] | None = None,
        max_blocks_per_seq: SupportsIndex | None = None,
        max_slots: SupportsIndex | None = None,
    ) -> None: ...
    @property
    def block_table(self) -> torch.Tensor | None: ...
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
