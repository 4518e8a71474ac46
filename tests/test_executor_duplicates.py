"""A request id given twice in one batch is refused, whatever the order of the ids.

The compiled plan skips its hash set while the ids only increase (the usual batch) and
fills it with the ids planned so far at the first one out of order; these cases put the
repeated id before, at and after that point, in every request group.
"""

import numpy as np
import pytest

from tokcy import RequestState
from tokcy.executor import HostBuffers, prepare_inputs


def generation(module, request_id, beam_width=1, slot=None):
    request = module.Request(request_id, [1, 2, 3], beam_width=beam_width)
    request.state = RequestState.GENERATION_IN_PROGRESS
    request.seq_slot = slot
    return request


def context(module, request_id):
    return module.Request(request_id, [4, 5, 6])


def batch_of(module, layout):
    """layout: {group: [id, ...]}; beam ids as (id, beams)."""
    made = {"context": [], "generation": [], "first_draft": [], "device": []}
    for group, ids in layout.items():
        for item in ids:
            request_id, beams = item if isinstance(item, tuple) else (item, 1)
            if group == "context":
                made[group].append(context(module, request_id))
            else:
                made[group].append(generation(module, request_id, beams, slot=0 if group == "device" else None))
    return made


def prepare(batch, out):
    return prepare_inputs(batch["context"], batch["generation"], first_draft_requests=batch["first_draft"],
                          device_token_requests=batch["device"], max_draft_len=2, out=out)


REPEATED = [
    ({"generation": [3, 1, 3]}, 3),
    ({"generation": [1, 2, 3, 2]}, 2),
    ({"generation": [1, 2, 3, 3]}, 3),
    ({"generation": [-5, -9, -5]}, -5),
    ({"generation": [7, 8, 9, 1, 8]}, 8),
    ({"context": [4], "generation": [1, 4]}, 4),
    ({"context": [4, 9], "generation": [10, 11], "first_draft": [9]}, 9),
    ({"generation": [2, 5], "device": [1, 2]}, 2),
    ({"generation": [(7, 2), 8], "first_draft": [7]}, 7),
    ({"generation": [8, (7, 2), (7, 3)]}, 7),
]


@pytest.mark.parametrize("layout, repeated", REPEATED)
def test_a_repeated_id_is_refused_and_nothing_is_written(backend, layout, repeated):
    out = HostBuffers(64, 16, 2)
    for array in out.arrays:
        array.fill(-7)
    with pytest.raises(ValueError, match=rf"request {repeated} is given twice in the batch"):
        prepare(batch_of(backend, layout), out)
    assert all((array == -7).all() for array in out.arrays)


@pytest.mark.parametrize("layout", [{"generation": [5, 9, 7, 1, 2]}, {"generation": [3, 2, 1], "device": [0]},
                                    {"context": [9], "generation": [1, (2, 2)], "first_draft": [3, 0]}])
def test_distinct_ids_in_any_order_pass(backend, layout):
    out = HostBuffers(64, 16, 2)
    inputs = prepare(batch_of(backend, layout), out)
    expected = [request_id if not isinstance(request_id, tuple) else request_id[0]
                for group in ("context", "generation", "first_draft", "device") for request_id in layout.get(group, ())]
    assert sorted(set(inputs.request_ids.tolist())) == sorted(expected)


def test_random_orders_agree_with_a_set(backend):
    """300 random batches of decode requests, ids permuted, a repeat planted in half of
    them: refused exactly when a plain Python set sees a repeat."""
    rng = np.random.default_rng(11)
    out = HostBuffers(128, 128)
    for _ in range(300):
        ids = [int(value) for value in rng.permutation(200)[: rng.integers(1, 60)]]
        if rng.random() < 0.5:
            ids.insert(int(rng.integers(0, len(ids) + 1)), ids[int(rng.integers(0, len(ids)))])
        requests = [generation(backend, request_id) for request_id in ids]
        if len(set(ids)) < len(ids):
            with pytest.raises(ValueError, match="given twice"):
                prepare_inputs([], requests, out=out)
        else:
            assert prepare_inputs([], requests, out=out).request_ids.tolist() == ids
