# Types of tokcy/connector/output.py (the module itself is left unannotated); keep in sync.
import abc
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

COLUMNS: tuple[str, ...]

class SchedulerOutput:
    num_context_requests: int
    request_ids: npt.NDArray[np.int64]
    is_new: npt.NDArray[np.bool_]
    computed_positions: npt.NDArray[np.int64]
    num_scheduled_tokens: npt.NDArray[np.int64]
    num_replaced_tokens: npt.NDArray[np.int64]
    token_offsets: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.int32]
    group_offsets: npt.NDArray[np.int64]
    block_offsets: npt.NDArray[np.int64]
    block_ids: npt.NDArray[np.int32]
    num_replaced_blocks: npt.NDArray[np.int64]
    num_released_blocks: npt.NDArray[np.int64]
    def __init__(
        self,
        num_context_requests: int,
        request_ids: npt.NDArray[np.int64],
        is_new: npt.NDArray[np.bool_],
        computed_positions: npt.NDArray[np.int64],
        num_scheduled_tokens: npt.NDArray[np.int64],
        num_replaced_tokens: npt.NDArray[np.int64],
        token_offsets: npt.NDArray[np.int64],
        tokens: npt.NDArray[np.int32],
        group_offsets: npt.NDArray[np.int64],
        block_offsets: npt.NDArray[np.int64],
        block_ids: npt.NDArray[np.int32],
        num_replaced_blocks: npt.NDArray[np.int64],
        num_released_blocks: npt.NDArray[np.int64],
    ) -> None: ...
    def __len__(self) -> int: ...
    def request_data(self, row: int) -> RequestData: ...
    @property
    def requests(self) -> list[RequestData]: ...
    @property
    def new_requests(self) -> list[RequestData]: ...
    @property
    def cached_requests(self) -> list[RequestData]: ...
    @property
    def num_new_tokens(self) -> int: ...
    @property
    def num_new_blocks(self) -> int: ...

def from_report(report: tuple[int, Any]) -> SchedulerOutput: ...

# the documented type of a report's rows; each backend's row class is a virtual subclass
class RequestData(abc.ABC):
    __hash__: ClassVar[None]  # type: ignore[assignment]
    @property
    def request_id(self) -> int: ...
    @property
    def is_new(self) -> bool: ...
    @property
    def new_tokens(self) -> list[int]: ...
    @property
    def computed_position(self) -> int: ...
    @property
    def num_scheduled_tokens(self) -> int: ...
    @property
    def num_replaced_tokens(self) -> int: ...
    @property
    def num_layer_groups(self) -> int: ...
    @property
    def new_block_ids_by_group(self) -> list[list[int]]: ...
    @property
    def new_block_ids(self) -> list[int]: ...
    @property
    def num_replaced_blocks_by_group(self) -> list[int]: ...
    @property
    def num_released_blocks_by_group(self) -> list[int]: ...
    @abc.abstractmethod
    def as_dict(self) -> dict[str, Any]: ...
    def __eq__(self, other: object, /) -> bool: ...
