# Types of tokcy/executor/_metadata.py (the module itself is left unannotated); keep in sync.
from typing import Any, Generic, Iterable, Sequence, SupportsIndex, TypeVar

import numpy as np
import numpy.typing as npt

from tokcy._core import AttentionMetadata

METADATA_FIELDS: tuple[str, ...]
GROUP_FIELDS: tuple[str, ...]

def block_sizes_arg(
    block_size: SupportsIndex | None, block_sizes: Iterable[SupportsIndex] | None
) -> tuple[int, ...] | None: ...

# A LayerGroupInputs holds numpy arrays on the host (PreparedInputs.groups) and torch
# tensors on the device (DeviceInputs.groups); the three parameters are the array types
# of slot_mapping (int64), of the int32 arrays, and of block_table / kv_indices (on the
# host None when the device gathers them from its own block table).
_SlotMapping = TypeVar("_SlotMapping", covariant=True)
_Int32Array = TypeVar("_Int32Array", covariant=True)
_TableArray = TypeVar("_TableArray", covariant=True)

class LayerGroupInputs(Generic[_SlotMapping, _Int32Array, _TableArray]):
    @property
    def block_size(self) -> int: ...
    @property
    def slot_mapping(self) -> _SlotMapping: ...
    @property
    def block_table(self) -> _TableArray: ...
    @property
    def kv_indptr(self) -> _Int32Array: ...
    @property
    def kv_indices(self) -> _TableArray: ...
    @property
    def kv_last_page_len(self) -> _Int32Array: ...
    def __init__(self, **fields: Any) -> None: ...

METADATA_BUFFER_FIELDS: tuple[str, ...]

class MetadataBuffers:
    @property
    def max_blocks_per_seq(self) -> int: ...
    @property
    def num_layer_groups(self) -> int: ...
    @property
    def kv_lens(self) -> npt.NDArray[np.int32]: ...
    @property
    def cu_kv_seqlens(self) -> npt.NDArray[np.int32]: ...
    @property
    def slot_mapping(self) -> tuple[npt.NDArray[np.int64], ...]: ...
    @property
    def block_table(self) -> tuple[npt.NDArray[np.int32], ...] | None: ...
    @property
    def kv_indptr(self) -> tuple[npt.NDArray[np.int32], ...]: ...
    @property
    def kv_indices(self) -> tuple[npt.NDArray[np.int32], ...] | None: ...
    @property
    def kv_last_page_len(self) -> tuple[npt.NDArray[np.int32], ...]: ...
    def __init__(
        self, max_num_tokens: int, max_batch_size: int, max_blocks_per_seq: int, num_layer_groups: int = 1
    ) -> None: ...
    @classmethod
    def from_arrays(
        cls,
        max_blocks_per_seq: int,
        kv_lens: npt.NDArray[np.int32],
        cu_kv_seqlens: npt.NDArray[np.int32],
        slot_mapping: Sequence[npt.NDArray[np.int64]],
        kv_indptr: Sequence[npt.NDArray[np.int32]],
        kv_last_page_len: Sequence[npt.NDArray[np.int32]],
        block_table: Sequence[npt.NDArray[np.int32]] | None = None,
        kv_indices: Sequence[npt.NDArray[np.int32]] | None = None,
    ) -> MetadataBuffers: ...
    def bound(self, module: Any = None) -> AttentionMetadata: ...

def attach(
    target: Any,
    buffers: MetadataBuffers,
    results: tuple[int, int, int, tuple[int, ...]],
    block_sizes: tuple[int, ...],
    num_tokens: int,
    padded: int,
) -> None: ...
def set_fields(
    target: Any, kv_lens: Any, cu_kv_seqlens: Any, max_query_len: int, max_kv_len: int, groups: Iterable[Any]
) -> None: ...
