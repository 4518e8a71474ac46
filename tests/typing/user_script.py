"""A user's script over tokcy's public API; mypy must infer real types for every name here.

CI runs ``mypy tests/typing/user_script.py`` (it must pass: every ``assert_type`` holds) and
the test suite runs this file as a program, so it is also a working example.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

import tokcy
from tokcy.connector import RequestData, SchedulerOutput, SchedulerOutputManager
from tokcy.executor import DeviceInputs, HostBuffers, InputPreparer, PreparedInputs, prepare_inputs

if TYPE_CHECKING:
    from typing_extensions import assert_type
else:
    def assert_type(value, _type):
        return value


def main() -> list[int]:
    request = tokcy.Request(1, [5, 6, 7], max_new_tokens=2)
    assert_type(request, tokcy.Request)
    assert_type(request.get_num_tokens(0), int)
    assert_type(request.get_tokens(0), list[int])
    assert_type(request.get_tokens(), list[list[int]])
    assert_type(request.get_last_tokens(0), int)
    assert_type(request.get_last_tokens(), list[int])
    assert_type(request.get_tokens_view(0), npt.NDArray[np.int32])
    assert_type(request.max_new_tokens, int | None)
    assert_type(request.reached_max_new_tokens, bool)
    for block_id in request.block_tables[0]:
        assert_type(block_id, int)

    out = HostBuffers(max_num_tokens=64, max_batch_size=8)
    assert_type(out.input_ids, npt.NDArray[np.int32])
    assert_type(out.request_ids, npt.NDArray[np.int64])
    manager = SchedulerOutputManager()
    generated: list[int] = []
    while not request.reached_max_new_tokens:
        is_context = request.state == tokcy.RequestState.CONTEXT_INIT
        context, generation = ([request], []) if is_context else ([], [request])
        inputs = prepare_inputs(context, generation, out=out)
        assert_type(inputs, PreparedInputs)
        assert_type(inputs.input_ids, npt.NDArray[np.int32])
        assert_type(inputs.num_tokens, int)
        report = manager.build_scheduler_output(context, generation)
        assert_type(report, SchedulerOutput)
        assert_type(report.tokens, npt.NDArray[np.int32])
        assert_type(report.is_new, npt.NDArray[np.bool_])
        for data in report.new_requests + report.cached_requests:
            assert_type(data, RequestData)
            assert_type(data.new_tokens, list[int])
        if is_context:
            request.move_to_next_context_chunk()
            request.state = tokcy.RequestState.GENERATION_IN_PROGRESS
        token = int(inputs.input_ids[-1]) + 1  # a toy "model"
        assert_type(request.add_new_token(token), int)
        generated.append(token)
    attention_metadata()
    freed = request.pause(request.get_num_tokens(0))
    assert_type(freed, list[list[int]])
    manager.request_finished(request.request_id)
    return generated


def attention_metadata() -> None:
    """The attention metadata of one context chunk, on the host and through a preparer."""
    request = tokcy.Request(2, [1, 2, 3, 4, 5])
    request.block_tables[0].extend([7, 9])
    request.seq_slot = 0
    inputs = prepare_inputs([request], [], block_size=4)
    assert_type(inputs.slot_mapping, npt.NDArray[np.int64] | None)
    assert_type(inputs.max_kv_len, int | None)
    assert inputs.groups is not None
    group = inputs.groups[0]
    assert_type(group.block_table, npt.NDArray[np.int32] | None)
    assert_type(group.kv_indptr, npt.NDArray[np.int32])
    assert_type(group.block_size, int)
    assert group.block_table is not None and group.block_table.tolist() == [[7, 9]]
    try:
        import torch
    except ImportError:  # the preparer needs torch (pip install torch==2.13.0)
        return
    preparer = InputPreparer(64, 8, block_size=4, max_blocks_per_seq=4)
    assert_type(preparer.last_copy_bytes, int)
    assert_type(preparer.block_table, torch.Tensor | None)
    device_inputs = preparer.prepare([request], [])
    assert_type(device_inputs, DeviceInputs)
    assert device_inputs.groups is not None
    assert_type(device_inputs.groups[0].block_table, torch.Tensor | None)  # None unless gathered (device_tables)
    assert_type(device_inputs.groups[0].kv_indptr, torch.Tensor)
    csr_only = InputPreparer(64, 8, block_size=4, max_blocks_per_seq=4, device_tables="csr")
    assert_type(csr_only.device_tables, tuple[str, ...] | None)
    assert_type(device_inputs.slot_mapping, torch.Tensor | None)
    assert preparer.last_copy_bytes > 0


if __name__ == "__main__":
    print(main())
