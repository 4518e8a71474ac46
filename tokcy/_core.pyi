"""Type stub shared by both backends (``tokcy._core`` and ``tokcy._pure``).

Every name here exists, with the same behaviour and the same exceptions, in the
compiled core and in the pure-Python twin.
"""

from types import ModuleType
from typing import (
    Any, Callable, ClassVar, Iterable, Iterator, Sequence, SupportsIndex, TypeAlias, TypeVar, final, overload
)

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

from tokcy._state import RequestState
from tokcy.connector.output import RequestData as _DocumentedRequestData

# token or block ids: a sequence of ints or an integer numpy array (checked to fit int32)
_TokenIds: TypeAlias = Sequence[SupportsIndex] | npt.NDArray[np.integer]

def zeroed_array(count: int, dtype: Any) -> npt.NDArray[Any]:
    """``count`` zeros of ``dtype`` in memory the compiled core owns, as a 1-D numpy array."""

@disjoint_base
class BlockTable:
    """Growable int32 list of the KV-cache block ids assigned to one request.

    ``release_front(k)`` marks the first ``k`` entries ``-1`` (a sliding window
    freed them); the released count never decreases except by ``truncate``.
    """

    def __init__(self, block_ids: _TokenIds = ...) -> None: ...
    def __len__(self) -> int: ...
    def __getitem__(self, index: SupportsIndex, /) -> int: ...
    def __setitem__(self, index: SupportsIndex, block_id: SupportsIndex, /) -> None: ...
    def __delitem__(self, index: SupportsIndex, /) -> None: ...  # always TypeError: use truncate()
    def __iter__(self) -> Iterator[int]: ...
    def __eq__(self, other: object, /) -> bool: ...
    def append(self, block_id: SupportsIndex) -> int: ...
    def extend(self, block_ids: _TokenIds) -> int: ...
    def truncate(self, num_blocks: SupportsIndex) -> None: ...
    def clear(self) -> None: ...
    def release_front(self, num_released: SupportsIndex) -> None: ...
    @property
    def num_released(self) -> int: ...
    def tolist(self) -> list[int]: ...
    def view(self) -> npt.NDArray[np.int32]: ...

@disjoint_base
class Request:
    """One request's token ids (per beam), chunked-prefill cursor, drafts and block tables."""

    def __init__(
        self,
        request_id: SupportsIndex,
        prompt: _TokenIds,
        *,
        beam_width: SupportsIndex = 1,
        max_new_tokens: SupportsIndex | None = None,
        num_layer_groups: SupportsIndex = 1,
    ) -> None: ...
    # plain fields
    @property
    def request_id(self) -> int: ...
    @property
    def beam_width(self) -> int: ...
    @property
    def max_new_tokens(self) -> int | None: ...
    @property
    def prompt_len(self) -> int: ...
    @property
    def orig_prompt_len(self) -> int: ...
    state: RequestState
    seq_slot: int | None
    @property
    def block_tables(self) -> tuple[BlockTable, ...]: ...
    # token buffer
    def get_num_tokens(self, beam: SupportsIndex) -> int: ...
    @overload
    def get_tokens(self, beam: None = None) -> list[list[int]]: ...
    @overload
    def get_tokens(self, beam: SupportsIndex) -> list[int]: ...
    def get_tokens_range(self, beam: SupportsIndex, begin: SupportsIndex, end: SupportsIndex) -> list[int]: ...
    def get_tokens_view(
        self, beam: SupportsIndex = 0, begin: SupportsIndex = 0, end: SupportsIndex | None = None
    ) -> npt.NDArray[np.int32]: ...
    def get_token(self, beam: SupportsIndex, pos: SupportsIndex) -> int: ...
    @overload
    def get_last_tokens(self, beam: None = None) -> list[int]: ...
    @overload
    def get_last_tokens(self, beam: SupportsIndex) -> int: ...
    @property
    def max_beam_num_tokens(self) -> int: ...
    @property
    def max_num_generated_tokens(self) -> int: ...
    @property
    def reached_max_new_tokens(self) -> bool: ...
    def add_new_token(self, token: SupportsIndex, beam: SupportsIndex = 0) -> int: ...
    def add_new_tokens(self, per_beam: _TokenIds) -> int: ...
    def set_generated_tokens(self, per_beam: Sequence[_TokenIds]) -> None: ...
    def truncate(self, num_tokens: SupportsIndex, beam: SupportsIndex | None = None) -> None: ...
    # chunked prefill
    context_current_position: int
    context_chunk_size: int
    @property
    def context_remaining_length(self) -> int: ...
    @property
    def is_first_context_chunk(self) -> bool: ...
    @property
    def is_last_context_chunk(self) -> bool: ...
    def move_to_next_context_chunk(self) -> None: ...
    # speculative decoding
    draft_tokens: list[int]
    @property
    def num_draft_tokens(self) -> int: ...
    @property
    def has_draft_tokens(self) -> bool: ...
    # preemption
    def pause(self, max_input_len: SupportsIndex) -> list[list[int]]: ...

# ---------------------------------------------------- input preparation (tokcy.executor)
# what InputWriter.write and prepare return (their docstrings name each count)
_WriterCounts: TypeAlias = tuple[int, int, int, int, int, int, int, int, int, int, int]
_Result = TypeVar("_Result")

@final
class InputWriter:
    """The one-pass input-preparation loop; ``tokcy.executor.prepare_inputs`` is its public face.

    ``bind`` the eleven output arrays (int32, ``request_ids`` int64), then per iteration
    ``prepare`` (= ``plan`` + ``write``). Not thread-safe: one writer per thread.
    """

    tokens_copied: int  # token ids the last plan/write copied from request buffers
    def __init__(self) -> None: ...
    def bind(
        self,
        input_ids: npt.NDArray[np.int32],
        position_ids: npt.NDArray[np.int32],
        gather_ids: npt.NDArray[np.int32],
        seq_lens: npt.NDArray[np.int32],
        num_cached_tokens: npt.NDArray[np.int32],
        prompt_lens: npt.NDArray[np.int32],
        cu_seqlens: npt.NDArray[np.int32],
        request_ids: npt.NDArray[np.int64],
        draft_tokens: npt.NDArray[np.int32],
        draft_lens: npt.NDArray[np.int32],
        device_token_slots: npt.NDArray[np.int32],
    ) -> None: ...
    def plan(
        self,
        context_requests: Iterable[Request],
        generation_requests: Iterable[Request],
        first_draft_requests: Iterable[Request],
        device_token_requests: Iterable[Request],
        max_draft_len: int,
        cuda_graph_batch_sizes: Iterable[SupportsIndex] | None,
        max_beam_width: int,
        block_sizes: tuple[int, ...] | None = None,
        device_slots: int | None = None,
    ) -> tuple[int, int, int, int, int, int]: ...
    def write(self) -> _WriterCounts: ...
    def set_metadata(self, metadata: AttentionMetadata | None) -> None: ...
    def planned_blocks(self) -> tuple[int, tuple[int, ...]]: ...
    # make_result: called with the counts before the busy guard drops; prepare returns what it returns
    @overload
    def prepare(
        self,
        context_requests: Iterable[Request],
        generation_requests: Iterable[Request],
        first_draft_requests: Iterable[Request],
        device_token_requests: Iterable[Request],
        max_draft_len: int,
        cuda_graph_batch_sizes: Iterable[SupportsIndex] | None,
        max_beam_width: int,
        block_sizes: tuple[int, ...] | None = None,
        device_slots: int | None = None,
        *,
        make_result: None = None,
    ) -> _WriterCounts: ...
    @overload
    def prepare(
        self,
        context_requests: Iterable[Request],
        generation_requests: Iterable[Request],
        first_draft_requests: Iterable[Request],
        device_token_requests: Iterable[Request],
        max_draft_len: int,
        cuda_graph_batch_sizes: Iterable[SupportsIndex] | None,
        max_beam_width: int,
        block_sizes: tuple[int, ...] | None = None,
        device_slots: int | None = None,
        *,
        make_result: Callable[[_WriterCounts], _Result],
    ) -> _Result: ...

def prepare_inputs_entry(
    python_prepare_inputs: Callable[..., Any], host_buffers: type, prepared_inputs: type, backend_choice: ModuleType
) -> Callable[..., Any]:
    """Bind the compiled ``prepare_inputs`` (tokcy.executor's, on this backend) and return it."""

# Attention metadata, written by InputWriter in the same pass when a call gives block
# sizes (tokcy.executor is the public face; docs/attention.md the semantics).
@final
class DeviceTableRows:
    """What each row of a device block table holds (shared by one preparer's staging buffers)."""

    @property
    def max_slots(self) -> int: ...
    @property
    def num_groups(self) -> int: ...
    @property
    def width(self) -> int: ...
    # the compiled core takes its arguments in __cinit__ (so __new__); the twin in __init__
    def __new__(cls, max_slots: SupportsIndex, num_groups: SupportsIndex, width: SupportsIndex) -> DeviceTableRows: ...
    def forget(self) -> None: ...

@final
class AttentionMetadata:
    """The metadata outputs of an InputWriter and the per-step state of a device table."""

    has_device_table: bool
    num_changed_entries: int  # device-table entries the last call sent
    max_query_len: int
    max_kv_len: int
    longest_table: int
    plan_serial: int
    busy: bool  # a writer's call is using it: bind() and other writers' calls are refused meanwhile
    def __init__(self) -> None: ...
    def bind(
        self,
        max_blocks_per_seq: int,
        kv_lens: npt.NDArray[np.int32],
        cu_kv_seqlens: npt.NDArray[np.int32],
        slot_mapping: Sequence[npt.NDArray[np.int64]],
        kv_indptr: Sequence[npt.NDArray[np.int32]],
        kv_last_page_len: Sequence[npt.NDArray[np.int32]],
        block_table: Sequence[npt.NDArray[np.int32]] | None = None,
        kv_indices: Sequence[npt.NDArray[np.int32]] | None = None,
    ) -> None: ...
    def bind_device_table(
        self,
        rows: DeviceTableRows,
        table_slots: npt.NDArray[np.int32],
        delta_area: npt.NDArray[np.int32],
        gather_blocks: Sequence[npt.NDArray[np.int32]],
        gather_live: Sequence[npt.NDArray[np.int64]],
        gather_base: Sequence[npt.NDArray[np.int64]],
    ) -> None: ...
    def results(self) -> tuple[int, int, int, tuple[int, ...]]: ...

# ------------------------------------------------ the KV-connector report (tokcy.connector)
# The per-request report state behind tokcy.connector.SchedulerOutputManager; build()
# returns the report's ReportColumns (num_context: its context rows), whose arrays() are the
# columns of tokcy.connector.SchedulerOutput in its constructor's order (rows: context,
# generation, then device-token requests). The arrays are slices of arrays the state keeps
# and reuses for a later report only once nothing references them. While a build() runs
# (its copy may run without the GIL), build / record_matched_tokens / reset_request /
# request_finished raise RuntimeError. Error messages: tokcy/_report_checks.py.

# The twelve columns by name: a ReportColumns makes each on its first read and keeps it;
# a tokcy.connector.SchedulerOutput reads its source's (stub only: each class has its own).
class _ColumnsByName:
    @property
    def request_ids(self) -> npt.NDArray[np.int64]: ...
    @property
    def is_new(self) -> npt.NDArray[np.bool_]: ...
    @property
    def computed_positions(self) -> npt.NDArray[np.int64]: ...
    @property
    def num_scheduled_tokens(self) -> npt.NDArray[np.int64]: ...
    @property
    def num_replaced_tokens(self) -> npt.NDArray[np.int64]: ...
    @property
    def token_offsets(self) -> npt.NDArray[np.int64]: ...
    @property
    def tokens(self) -> npt.NDArray[np.int32]: ...
    @property
    def group_offsets(self) -> npt.NDArray[np.int64]: ...
    @property
    def block_offsets(self) -> npt.NDArray[np.int64]: ...
    @property
    def block_ids(self) -> npt.NDArray[np.int32]: ...
    @property
    def num_replaced_blocks(self) -> npt.NDArray[np.int64]: ...
    @property
    def num_released_blocks(self) -> npt.NDArray[np.int64]: ...

@final
class ReportColumns(_ColumnsByName):
    @property
    def num_context(self) -> int: ...  # the report's context rows (they come first)
    def arrays(self) -> tuple[
        npt.NDArray[np.int64],  # request_ids
        npt.NDArray[np.bool_],  # is_new
        npt.NDArray[np.int64],  # computed_positions
        npt.NDArray[np.int64],  # num_scheduled_tokens
        npt.NDArray[np.int64],  # num_replaced_tokens
        npt.NDArray[np.int64],  # token_offsets
        npt.NDArray[np.int32],  # tokens
        npt.NDArray[np.int64],  # group_offsets
        npt.NDArray[np.int64],  # block_offsets
        npt.NDArray[np.int32],  # block_ids
        npt.NDArray[np.int64],  # num_replaced_blocks
        npt.NDArray[np.int64],  # num_released_blocks
    ]: ...

# The RequestData rows of a SchedulerOutput (the fields are documented on
# tokcy.connector.RequestData), made lazily: (every row, the new rows, the cached rows).
def request_rows(
    output: Any,
) -> tuple[tuple[RequestData, ...], tuple[RequestData, ...], tuple[RequestData, ...]]: ...

@final
class RequestData(_DocumentedRequestData):  # a virtual subclass at run time
    def __init__(self, *args: object, **kwargs: object) -> None: ...  # raises TypeError: a report makes its rows
    def as_dict(self) -> dict[str, Any]: ...
    def __ne__(self, other: object, /) -> bool: ...
    def __reduce__(self) -> tuple[Any, ...]: ...

@final
class ReportState:
    def __init__(self) -> None: ...
    def build(
        self,
        context_requests: Iterable[Request],
        generation_requests: Iterable[Request],
        device_token_requests: Iterable[Request] = (),
    ) -> ReportColumns: ...
    def record_matched_tokens(self, request_id: SupportsIndex, num_tokens: SupportsIndex) -> None: ...
    def reset_request(self, request_id: SupportsIndex) -> None: ...
    def request_finished(self, request_id: SupportsIndex) -> None: ...
    @property
    def num_tracked_requests(self) -> int: ...
    @property
    def num_output_allocations(self) -> int: ...
    def tracked_request_ids(self) -> list[int]: ...
