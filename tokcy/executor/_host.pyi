# Types of tokcy/executor/_host.py (the module itself is left unannotated); keep in sync.
from typing import Any, Iterable, SupportsIndex, TypeAlias

import numpy as np
import numpy.typing as npt

from tokcy._core import InputWriter, Request
from tokcy.executor._metadata import LayerGroupInputs, MetadataBuffers

# one layer group's host arrays (block_table / kv_indices are None in an InputPreparer's
# staging buffer: the device gathers them from its own block table)
_HostGroup: TypeAlias = LayerGroupInputs[
    npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.int32] | None
]

ARRAY_FIELDS: tuple[str, ...]
COUNT_FIELDS: tuple[str, ...]

def capacity_lengths(max_num_tokens: int, max_batch_size: int, max_draft_len: int) -> dict[str, int]: ...

class PreparedInputs:
    input_ids: npt.NDArray[np.int32]
    position_ids: npt.NDArray[np.int32]
    gather_ids: npt.NDArray[np.int32]
    seq_lens: npt.NDArray[np.int32]
    num_cached_tokens: npt.NDArray[np.int32]
    prompt_lens: npt.NDArray[np.int32]
    cu_seqlens: npt.NDArray[np.int32]
    request_ids: npt.NDArray[np.int64]
    draft_tokens: npt.NDArray[np.int32]
    draft_lens: npt.NDArray[np.int32]
    device_token_slots: npt.NDArray[np.int32]
    num_context_requests: int
    num_context_tokens: int
    num_generation_tokens: int
    num_tokens: int
    num_sequences: int
    padded_batch_size: int
    device_token_row_start: int
    # attention metadata: None when the call gave no block size
    kv_lens: npt.NDArray[np.int32] | None
    cu_kv_seqlens: npt.NDArray[np.int32] | None
    max_query_len: int | None
    max_kv_len: int | None
    slot_mapping: npt.NDArray[np.int64] | None  # group 0's, like the four below
    block_table: npt.NDArray[np.int32] | None
    kv_indptr: npt.NDArray[np.int32] | None
    kv_indices: npt.NDArray[np.int32] | None
    kv_last_page_len: npt.NDArray[np.int32] | None
    groups: tuple[_HostGroup, ...] | None
    def __init__(self, arrays: Iterable[npt.NDArray[Any]], counts: tuple[int, ...]) -> None: ...
    def asdict(self) -> dict[str, Any]: ...

class HostBuffers:
    arrays: tuple[npt.NDArray[Any], ...]
    max_num_tokens: int
    max_batch_size: int
    max_draft_len: int
    max_beam_width: int | None
    metadata: MetadataBuffers | None
    def __init__(
        self,
        max_num_tokens: SupportsIndex,
        max_batch_size: SupportsIndex,
        max_draft_len: SupportsIndex = 0,
        *,
        max_beam_width: SupportsIndex | None = None,
        max_blocks_per_seq: SupportsIndex | None = None,
        num_layer_groups: SupportsIndex = 1,
    ) -> None: ...
    @classmethod
    def from_arrays(
        cls,
        *,
        max_draft_len: SupportsIndex = 0,
        max_beam_width: SupportsIndex | None = None,
        metadata: MetadataBuffers | None = None,
        **arrays: npt.NDArray[Any],
    ) -> HostBuffers: ...
    def __getattr__(self, name: str) -> npt.NDArray[Any]: ...
    def writer(self, module: Any = None) -> InputWriter: ...

def prepare_into(
    out: HostBuffers,
    module: Any,
    context_requests: Iterable[Request],
    generation_requests: Iterable[Request],
    first_draft_requests: Iterable[Request],
    device_token_requests: Iterable[Request],
    max_draft_len: SupportsIndex,
    cuda_graph_batch_sizes: Iterable[SupportsIndex] | None,
    sizes_per_group: tuple[int, ...] | None,
) -> PreparedInputs: ...
def prepare_inputs(
    context_requests: Iterable[Request],
    generation_requests: Iterable[Request],
    *,
    first_draft_requests: Iterable[Request] = (),
    device_token_requests: Iterable[Request] = (),
    max_draft_len: SupportsIndex = 0,
    cuda_graph_batch_sizes: Iterable[SupportsIndex] | None = None,
    out: HostBuffers | None = None,
    block_size: SupportsIndex | None = None,
    block_sizes: Iterable[SupportsIndex] | None = None,
    max_blocks_per_seq: SupportsIndex | None = None,
) -> PreparedInputs: ...
