"""Attention metadata against an independent reference over random batches, both backends:
every row kind, 1-3 layer groups, block sizes 1-64, sliding-window releases."""

import numpy as np

from attention_reference import assert_metadata, attention_reference
from executor_reference import make_request, random_batch, reference
from tokcy.executor import HostBuffers, prepare_inputs

NUM_BATCHES = 1000
WIDTH = 64


def give_blocks(rng, batch, max_draft_len, sizes, block_sizes):
    """Tables covering each sequence's KV (plus up to 2 spare blocks), some released in front."""
    arrays, _ = reference(batch["context"], batch["generation"], batch["first_draft"], batch["device"],
                          max_draft_len, sizes)
    first, last = {}, {}
    positions, cu = arrays["position_ids"].tolist(), arrays["cu_seqlens"].tolist()
    for index, request_id in enumerate(arrays["request_ids"].tolist()):
        first[request_id] = positions[cu[index]]
        last[request_id] = positions[cu[index + 1] - 1]
    for request in (request for group in batch.values() for request in group):
        for table, block_size in zip(request.block_tables, block_sizes):
            needed = last[request.request_id] // block_size + 1
            count = min(WIDTH, needed + int(rng.integers(0, 3)))
            table.extend([int(block) for block in rng.integers(0, 1_000_000, count)])
            if rng.random() < 0.3:
                table.release_front(int(rng.integers(0, first[request.request_id] // block_size + 1)))


def test_random_batches_match_reference(backend):
    rng = np.random.default_rng(909)
    outs = {groups: HostBuffers(512, 128, 4, max_blocks_per_seq=WIDTH, num_layer_groups=groups)
            for groups in (1, 2, 3)}
    kinds, releases, padded = set(), 0, 0
    for iteration in range(NUM_BATCHES):
        descs, max_draft_len, sizes = random_batch(rng)
        sizes = None if sizes is None else sorted(set(sizes) | {64})
        num_groups = int(rng.integers(1, 4))
        block_sizes = tuple(int(rng.integers(1, 65)) for _ in range(num_groups))
        for desc in (desc for group in descs.values() for desc in group):
            desc["beam_width"] = 1  # beams are refused with a block size
            desc["generated"] = desc.get("generated", [[]])[:1]
        batch = {group: [] for group in descs}
        for group, items in descs.items():
            for desc in items:
                request = make_request(backend, desc)
                batch[group].append(request if num_groups == 1 else _with_groups(request, num_groups))
        give_blocks(rng, batch, max_draft_len, sizes, block_sizes)
        releases += sum(table.num_released > 0 for group in batch.values() for request in group
                        for table in request.block_tables)
        top, groups = attention_reference(batch, max_draft_len, sizes, block_sizes, WIDTH)
        out = outs[num_groups] if iteration % 2 else None
        result = prepare_inputs(batch["context"], batch["generation"], first_draft_requests=batch["first_draft"],
                                device_token_requests=batch["device"], max_draft_len=max_draft_len,
                                cuda_graph_batch_sizes=sizes, out=out, block_sizes=block_sizes,
                                max_blocks_per_seq=WIDTH)
        assert_metadata(result, top, groups)
        kinds.update(group for group, items in batch.items() if items)
        padded += result.padded_batch_size > result.num_sequences
    assert kinds == {"context", "generation", "first_draft", "device"}
    assert releases > 100 and padded > 50


def _with_groups(request, num_groups):
    """The same request with ``num_groups`` block tables (rebuilt through its pickled state)."""
    state = request._state_dict()
    state["block_tables"] = [([], 0, 0, 0)] * num_groups
    return type(request)._from_state(state)
