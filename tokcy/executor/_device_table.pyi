# Types of tokcy/executor/_device_table.py (the module itself is left unannotated); keep in sync.
from typing import Any, Iterable, Sequence

import numpy as np
import numpy.typing as npt
import torch

from tokcy._core import AttentionMetadata, DeviceTableRows
from tokcy.executor._metadata import MetadataBuffers

DEVICE_TABLES: tuple[str, str]

def device_tables_arg(value: str | Iterable[str] | None) -> tuple[str, ...]: ...
def device_zeros(
    torch: Any, shape: int | tuple[int, ...], dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor: ...

class DeviceBlockTable:
    tables: tuple[str, ...]
    num_groups: int
    max_slots: int
    width: int
    table: torch.Tensor  # (groups, max_slots, max_blocks_per_seq) int32, indexed by seq_slot
    block_table: torch.Tensor  # (groups, max_batch_size, max_blocks_per_seq): the batch's dense tables
    kv_indices: torch.Tensor  # (groups, max_batch_size * max_blocks_per_seq): the batch's CSR indices
    def __init__(
        self,
        torch: Any,
        device: torch.device,
        num_groups: int,
        max_slots: int,
        max_blocks_per_seq: int,
        max_batch_size: int,
        tables: tuple[str, ...] = ...,
    ) -> None: ...
    def rows(self, module: Any = None) -> DeviceTableRows: ...
    def host_metadata(
        self, arrays: dict[str, Any], table_slots: npt.NDArray[np.int32], delta_area: npt.NDArray[np.int32]
    ) -> MetadataBuffers: ...
    def apply(
        self,
        packed: torch.Tensor,
        packed_int64: torch.Tensor,
        delta_offset: int,
        num_changed: int,
        table_slots: torch.Tensor,
        gathers: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        num_indices: Sequence[int],
    ) -> list[tuple[torch.Tensor | None, torch.Tensor | None]]: ...

class _StagedMetadata(MetadataBuffers):
    def __init__(
        self,
        device_table: DeviceBlockTable,
        arrays: dict[str, Any],
        table_slots: npt.NDArray[np.int32],
        delta_area: npt.NDArray[np.int32],
    ) -> None: ...
    def bound(self, module: Any = None) -> AttentionMetadata: ...
