"""Output arrays of an ndarray subclass whose buffer export is its own: from Python 3.12
(PEP 688) a class's ``__buffer__`` method is what the buffer protocol calls, so such an
array may export other memory than its own, memory that lives only as long as the export.
The writers keep pointers into their output arrays from one call to the next: they take
them through plain views of the arrays (numpy's own export, over the arrays' memory), never
through the caller's class. Before, the compiled writers asked the array itself: every
write then went into a temporary copy freed at the end of ``bind`` (under the sanitizer
build, a heap-use-after-free), and the caller's arrays stayed as they were.

Python 3.11 ignores a Python-level ``__buffer__``: these tests run on 3.12 and later
(.ci/run runs the suite on the newest CPython it finds, 3.12 or later, as well).
"""

import sys

import numpy as np
import pytest
from test_hostile_callbacks import decode_requests

from tokcy.executor import HostBuffers, prepare_inputs
from tokcy.executor._host import ARRAY_FIELDS
from tokcy.executor._metadata import MetadataBuffers

pytestmark = pytest.mark.skipif(sys.version_info < (3, 12),
                                reason="a Python class's __buffer__ is the buffer protocol from Python 3.12 (PEP 688)")


class ExportsACopy(np.ndarray):
    """An array whose buffer export is a fresh copy of it, freed once the export is
    released; ``exports`` counts the exports asked of the class."""

    exports = 0

    def __buffer__(self, flags):
        type(self).exports += 1
        return memoryview(np.ndarray.view(self, np.ndarray).copy())


@pytest.fixture(autouse=True)
def _count_exports():
    ExportsACopy.exports = 0
    yield


def exporting(array):
    return array.view(ExportsACopy)


def plain_list(array):
    """What ``array`` holds, read through numpy (not through its class's export)."""
    return np.ndarray.view(array, np.ndarray).tolist()


def test_host_buffers_and_metadata_write_into_the_callers_arrays_not_into_an_export(backend):
    """Token inputs and metadata (dense and CSR tables too) of two decode requests (prompt
    [10 + i, 20 + i, 30 + i], block i), block size 16: the values land in the caller's
    arrays (a worked example), and no buffer export was asked of the caller's class."""
    arrays = {name: exporting(np.full(8 if name != "cu_seqlens" else 9, -1, np.int64 if name == "request_ids"
                                      else np.int32)) for name in ARRAY_FIELDS}
    metadata = MetadataBuffers.from_arrays(
        max_blocks_per_seq=2, kv_lens=exporting(np.full(4, -1, np.int32)),
        cu_kv_seqlens=exporting(np.full(5, -1, np.int32)), slot_mapping=(exporting(np.full(8, -1, np.int64)),),
        kv_indptr=(exporting(np.full(5, -1, np.int32)),), kv_last_page_len=(exporting(np.full(4, -1, np.int32)),),
        block_table=(exporting(np.full((4, 2), -1, np.int32)),), kv_indices=(exporting(np.full(8, -1, np.int32)),))
    out = HostBuffers.from_arrays(metadata=metadata, **arrays)
    prepare_inputs([], decode_requests(backend, 2), out=out, block_size=16)
    assert plain_list(arrays["input_ids"])[:2] == [30, 31]
    assert plain_list(arrays["position_ids"])[:2] == [2, 2]
    assert plain_list(arrays["seq_lens"])[:2] == [1, 1]  # tokens scheduled this step
    assert plain_list(arrays["cu_seqlens"])[:3] == [0, 1, 2]
    assert plain_list(arrays["request_ids"])[:2] == [0, 1]
    assert plain_list(metadata.kv_lens)[:2] == [3, 3]
    assert plain_list(metadata.cu_kv_seqlens)[:3] == [0, 3, 6]
    assert plain_list(metadata.slot_mapping[0])[:2] == [2, 18]  # block 0 and block 1, position 2
    assert plain_list(metadata.kv_indptr[0])[:3] == [0, 1, 2]
    assert plain_list(metadata.kv_last_page_len[0])[:2] == [3, 3]
    assert plain_list(metadata.block_table[0])[:2] == [[0, 0], [1, 0]]  # zero past each sequence's blocks
    assert plain_list(metadata.kv_indices[0])[:2] == [0, 1]
    assert ExportsACopy.exports == 0


def test_a_device_table_binds_its_arrays_through_numpy_not_the_callers_class(backend):
    """``bind_device_table``'s arrays are kept as pointers too: none is taken through an
    export asked of the caller's class."""
    metadata = backend.AttentionMetadata()
    metadata.bind(8, np.zeros(8, np.int32), np.zeros(9, np.int32), (np.zeros(64, np.int64),),
                  (np.zeros(9, np.int32),), (np.zeros(8, np.int32),))
    rows = backend.DeviceTableRows(8, 1, 8)
    delta_area = np.zeros(66, np.int32)  # 8-byte aligned (numpy's allocations are)
    metadata.bind_device_table(rows, exporting(np.zeros(8, np.int32)), exporting(delta_area),
                               (exporting(np.zeros(8, np.int32)),), (exporting(np.zeros(8, np.int64)),),
                               (exporting(np.zeros(8, np.int64)),))
    assert metadata.has_device_table
    assert ExportsACopy.exports == 0
