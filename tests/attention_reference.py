"""An independent reference for the attention metadata: every slot computed position by
position from ``BlockTable.tolist()``, the tables built as Python lists.

It takes the rows (positions, sequences, request ids) from the executor's naive
reference (tests/executor_reference.py) and nothing from ``tokcy.executor``.
"""

import numpy as np

from executor_reference import reference


def attention_reference(batch, max_draft_len, sizes, block_sizes, width):
    """{name: array} of the top-level metadata and a list of {name: array} per group."""
    arrays, _ = reference(batch["context"], batch["generation"], batch["first_draft"], batch["device"],
                          max_draft_len, sizes)
    by_id = {request.request_id: request for group in batch.values() for request in group}
    positions = arrays["position_ids"].tolist()
    cu = arrays["cu_seqlens"].tolist()
    sequences = []  # (request or None, positions of its rows)
    for index, request_id in enumerate(arrays["request_ids"].tolist()):
        rows = positions[cu[index] : cu[index + 1]]
        sequences.append((by_id.get(request_id), rows))
    kv_lens = [0 if request is None else rows[-1] + 1 for request, rows in sequences]
    top = {
        "kv_lens": np.array(kv_lens, dtype=np.int32),
        "cu_kv_seqlens": np.array([0] + list(np.cumsum(kv_lens)), dtype=np.int32),
        "max_query_len": max([len(rows) for _, rows in sequences] + [0]),
        "max_kv_len": max(kv_lens + [0]),
    }
    groups = []
    for group, block_size in enumerate(block_sizes):
        slots, dense, indptr, indices, last = [], [], [0], [], []
        for (request, rows), kv_len in zip(sequences, kv_lens):
            if request is None:  # padding
                slots.append(-1)
                dense.append([0] * width)
                indptr.append(indptr[-1])
                last.append(0)
                continue
            table = request.block_tables[group].tolist()
            for position in rows:
                slots.append(table[position // block_size] * block_size + position % block_size)
            num_blocks = -(-kv_len // block_size)
            dense.append(table[:num_blocks] + [0] * (width - num_blocks))
            live = [block for block in table[:num_blocks] if block != -1]
            indices.extend(live)
            indptr.append(indptr[-1] + len(live))
            last.append(kv_len - (num_blocks - 1) * block_size)
        groups.append({
            "slot_mapping": np.array(slots, dtype=np.int64),
            "block_table": np.array(dense, dtype=np.int32).reshape(len(dense), width),
            "kv_indptr": np.array(indptr, dtype=np.int32),
            "kv_indices": np.array(indices, dtype=np.int32),
            "kv_last_page_len": np.array(last, dtype=np.int32),
        })
    return top, groups


def assert_metadata(result, top, groups, *, dense=True, tables=("dense", "csr")):
    """``result`` (PreparedInputs or DeviceInputs) equals the reference; a batch table not
    in ``tables`` (an ``InputPreparer``'s ``device_tables``) must be None."""
    absent = {"dense": "block_table", "csr": "kv_indices"}
    for name, expected in top.items():
        actual = getattr(result, name)
        if isinstance(expected, int):
            assert actual == expected, name
        else:
            np.testing.assert_array_equal(np.asarray(actual), expected, err_msg=name)
    assert len(result.groups) == len(groups)
    for index, (actual, expected) in enumerate(zip(result.groups, groups)):
        for name, array in expected.items():
            if name in ("block_table", "kv_indices") and not dense:
                continue
            if name in [absent[table] for table in absent if table not in tables]:
                assert getattr(actual, name) is None, (index, name)
                continue
            value = np.asarray(getattr(actual, name))
            assert value.dtype == array.dtype, (index, name)
            np.testing.assert_array_equal(value, array, err_msg=f"group {index} {name}")
    for name in ("slot_mapping", "block_table", "kv_indptr", "kv_indices", "kv_last_page_len"):
        assert getattr(result, name) is getattr(result.groups[0], name)
