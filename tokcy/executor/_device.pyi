# Types of tokcy/executor/_device.py (the module itself is left unannotated); keep in sync.
from typing import Iterable, Mapping, SupportsIndex, TypeAlias

import torch

from tokcy._core import Request
from tokcy.executor._device_table import DeviceBlockTable
from tokcy.executor._host import PreparedInputs, _Counts
from tokcy.executor._metadata import LayerGroupInputs

# block_table / kv_indices are None for a table the preparer does not gather (device_tables)
_DeviceGroup: TypeAlias = LayerGroupInputs[torch.Tensor, torch.Tensor, torch.Tensor | None]

class DeviceInputs(_Counts):
    @property
    def host(self) -> PreparedInputs: ...
    @property
    def input_ids(self) -> torch.Tensor: ...
    @property
    def position_ids(self) -> torch.Tensor: ...
    @property
    def gather_ids(self) -> torch.Tensor: ...
    @property
    def seq_lens(self) -> torch.Tensor: ...
    @property
    def num_cached_tokens(self) -> torch.Tensor: ...
    @property
    def prompt_lens(self) -> torch.Tensor: ...
    @property
    def cu_seqlens(self) -> torch.Tensor: ...
    @property
    def request_ids(self) -> torch.Tensor: ...
    @property
    def draft_tokens(self) -> torch.Tensor: ...
    @property
    def draft_lens(self) -> torch.Tensor: ...
    @property
    def device_token_slots(self) -> torch.Tensor: ...
    # attention metadata (device views): None when the preparer has no block size
    @property
    def kv_lens(self) -> torch.Tensor | None: ...
    @property
    def cu_kv_seqlens(self) -> torch.Tensor | None: ...
    @property
    def max_query_len(self) -> int | None: ...
    @property
    def max_kv_len(self) -> int | None: ...
    @property
    def slot_mapping(self) -> torch.Tensor | None: ...  # group 0's, like the four below
    @property
    def block_table(self) -> torch.Tensor | None: ...
    @property
    def kv_indptr(self) -> torch.Tensor | None: ...
    @property
    def kv_indices(self) -> torch.Tensor | None: ...
    @property
    def kv_last_page_len(self) -> torch.Tensor | None: ...
    @property
    def groups(self) -> tuple[_DeviceGroup, ...] | None: ...
    def __init__(self, preparer: InputPreparer, host: PreparedInputs, metadata: object | None = None) -> None: ...

PREPARER_FIELDS: tuple[str, ...]

class InputPreparer:
    # what it is made with, read-only
    @property
    def max_num_tokens(self) -> int: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def max_draft_len(self) -> int: ...
    @property
    def max_beam_width(self) -> int: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def is_cuda(self) -> bool: ...
    @property
    def tensors(self) -> Mapping[str, torch.Tensor]: ...
    @property
    def block_sizes(self) -> tuple[int, ...] | None: ...
    @property
    def max_blocks_per_seq(self) -> int | None: ...  # None without a block size
    @property
    def max_slots(self) -> int | None: ...  # None without a block size
    @property
    def device_table(self) -> DeviceBlockTable | None: ...
    @property
    def device_tables(self) -> tuple[str, ...] | None: ...  # the batch tables gathered on the device ("dense", "csr")
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
        device_tables: str | Iterable[str] | None = None,
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
