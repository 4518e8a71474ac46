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

# The ARRAY_FIELDS arrays by name: a PreparedInputs shows each at its used length, a
# HostBuffers whole (stub only: at run time each class has its own properties).
class _ArraysByName:
    @property
    def input_ids(self) -> npt.NDArray[np.int32]: ...
    @property
    def position_ids(self) -> npt.NDArray[np.int32]: ...
    @property
    def gather_ids(self) -> npt.NDArray[np.int32]: ...
    @property
    def seq_lens(self) -> npt.NDArray[np.int32]: ...
    @property
    def num_cached_tokens(self) -> npt.NDArray[np.int32]: ...
    @property
    def prompt_lens(self) -> npt.NDArray[np.int32]: ...
    @property
    def cu_seqlens(self) -> npt.NDArray[np.int32]: ...
    @property
    def request_ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def draft_tokens(self) -> npt.NDArray[np.int32]: ...
    @property
    def draft_lens(self) -> npt.NDArray[np.int32]: ...
    @property
    def device_token_slots(self) -> npt.NDArray[np.int32]: ...

# The COUNT_FIELDS of a PreparedInputs and a DeviceInputs (stub only, as above).
class _Counts:
    @property
    def num_context_requests(self) -> int: ...
    @property
    def num_context_tokens(self) -> int: ...
    @property
    def num_generation_tokens(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_sequences(self) -> int: ...
    @property
    def padded_batch_size(self) -> int: ...
    @property
    def device_token_row_start(self) -> int: ...

class PreparedInputs(_ArraysByName, _Counts):
    # attention metadata: None when the call gave no block size
    @property
    def kv_lens(self) -> npt.NDArray[np.int32] | None: ...
    @property
    def cu_kv_seqlens(self) -> npt.NDArray[np.int32] | None: ...
    @property
    def max_query_len(self) -> int | None: ...
    @property
    def max_kv_len(self) -> int | None: ...
    @property
    def slot_mapping(self) -> npt.NDArray[np.int64] | None: ...  # group 0's, like the four below
    @property
    def block_table(self) -> npt.NDArray[np.int32] | None: ...
    @property
    def kv_indptr(self) -> npt.NDArray[np.int32] | None: ...
    @property
    def kv_indices(self) -> npt.NDArray[np.int32] | None: ...
    @property
    def kv_last_page_len(self) -> npt.NDArray[np.int32] | None: ...
    @property
    def groups(self) -> tuple[_HostGroup, ...] | None: ...
    def __init__(self, arrays: Iterable[npt.NDArray[Any]], counts: tuple[int, ...]) -> None: ...
    def asdict(self) -> dict[str, Any]: ...

HOST_BUFFER_FIELDS: tuple[str, ...]

class HostBuffers(_ArraysByName):
    @property
    def arrays(self) -> tuple[npt.NDArray[Any], ...]: ...
    @property
    def max_num_tokens(self) -> int: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def max_draft_len(self) -> int: ...
    @property
    def max_beam_width(self) -> int | None: ...
    @property
    def metadata(self) -> MetadataBuffers | None: ...
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
def written_inputs(
    out: HostBuffers, counts: tuple[int, ...], results: tuple[Any, ...] | None, sizes_per_group: tuple[int, ...] | None
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
