"""prepare_inputs against a naive reference, over random batches, on both backends."""

import numpy as np
import pytest

from executor_reference import assert_matches, make_request, random_batch, reference
from tokcy import RequestState, _backend, _pure
from tokcy.executor import HostBuffers, prepare_inputs

NUM_BATCHES = 1000


def build(module, groups):
    return {group: [make_request(module, desc) for desc in descs] for group, descs in groups.items()}


def run(batch, max_draft_len, sizes, out):
    return prepare_inputs(batch["context"], batch["generation"], first_draft_requests=batch["first_draft"],
                          device_token_requests=batch["device"], max_draft_len=max_draft_len,
                          cuda_graph_batch_sizes=sizes, out=out)


def test_random_batches_match_reference(backend):
    rng = np.random.default_rng(20240603)
    out = HostBuffers(512, 128, 4, max_beam_width=4)  # reused: stale rows must never leak
    kinds_seen = set()
    padded = 0
    for iteration in range(NUM_BATCHES):
        groups, max_draft_len, sizes = random_batch(rng)
        batch = build(backend, groups)
        try:
            expected = reference(batch["context"], batch["generation"], batch["first_draft"], batch["device"],
                                 max_draft_len, sizes)
        except ValueError:
            with pytest.raises(ValueError, match="CUDA-graph batch size"):
                run(batch, max_draft_len, sizes, out)
            continue
        result = run(batch, max_draft_len, sizes, out if iteration % 2 else None)
        assert_matches(result, *expected)
        kinds_seen.update(group for group, items in batch.items() if items)
        if any(request.beam_width > 1 for request in batch["generation"]):
            kinds_seen.add("beams")
        if any(request.num_draft_tokens for request in batch["generation"]):
            kinds_seen.add("drafts")
        padded += result.padded_batch_size > result.num_sequences
    assert kinds_seen == {"context", "generation", "first_draft", "device", "beams", "drafts"}
    assert padded > 50


FAULTS = ("state", "empty_chunk", "past_prompt", "slot", "twice", "drafts", "capacity", "beams")


EXPECTED = {
    "state": ["must be in state"],
    "empty_chunk": ["empty chunk"],
    "past_prompt": ["empty chunk"],  # such a state is refused on restore: see build_broken
    "slot": ["has no seq_slot"],
    "twice": ["given twice"],
    "drafts": ["above max_draft_len"],
    "beams": ["above max_beam_width"],
    "capacity": ["the batch needs", "CUDA-graph batch size"],
}


def inject(rng, groups, max_draft_len):
    """Break one random request of the batch; returns the fault's name and max_draft_len."""
    fault = FAULTS[rng.integers(0, len(FAULTS))]
    generation = groups["generation"]
    if fault == "state":
        group = [g for g in groups.values() if g]
        victim = group[rng.integers(0, len(group))]
        desc = victim[rng.integers(0, len(victim))]
        desc["state"] = RequestState.GENERATION_COMPLETE
    elif fault in ("empty_chunk", "past_prompt"):
        desc = {"kind": "context", "id": 10**8, "prompt": [1, 2, 3], "cursor": 1, "chunk": 2}
        groups["context"].insert(rng.integers(0, len(groups["context"]) + 1), desc)
        desc["breaks"] = fault
    elif fault == "slot":
        groups["device"].append({"kind": "device", "id": 10**8 + 1, "prompt": [4], "slot": None})
    elif fault == "twice":
        desc = {"kind": "generation", "id": 10**8 + 2, "prompt": [1, 2]}
        generation.append(desc)
        groups["first_draft"].append(dict(desc, kind="first_draft"))
    elif fault == "drafts":
        generation.append({"kind": "generation", "id": 10**8 + 3, "prompt": [1], "drafts": [1] * (max_draft_len + 1)})
    elif fault == "beams":
        generation.append({"kind": "generation", "id": 10**8 + 4, "prompt": [1], "beam_width": 5})
    return fault


def build_broken(module, groups):
    batch = build(module, groups)
    for index, desc in enumerate(groups["context"]):
        request = batch["context"][index]
        if desc.get("breaks") == "empty_chunk":
            request.context_chunk_size = 0
        elif desc.get("breaks") == "past_prompt":
            # the setters clamp the chunk to the prompt, and restoring refuses a chunk past
            # it (the loop keeps its check as a second line of defence): break it otherwise
            state = request._state_dict()
            state["context_chunk_size"] = len(desc["prompt"])
            with pytest.raises(ValueError, match=r"context_chunk_size 3 is outside \[0, 2\]"):
                type(request)._from_state(state)
            request.context_chunk_size = 0
    return batch


def test_random_bad_batches_fail_alike(backend):
    """One fault per batch: ValueError/TypeError with the same message on both backends,
    and nothing written into the output holder."""
    rng = np.random.default_rng(7)
    out_live = HostBuffers(512, 128, 4, max_beam_width=4)
    out_pure = HostBuffers(512, 128, 4, max_beam_width=4)
    for _ in range(300):
        groups, max_draft_len, sizes = random_batch(rng)
        fault = inject(rng, groups, max_draft_len)
        if fault == "capacity":
            out_live_, out_pure_ = HostBuffers(2, 1, 0), HostBuffers(2, 1, 0)
            groups["generation"].append({"kind": "generation", "id": 10**8 + 5, "prompt": [1]})
            groups["generation"].append({"kind": "generation", "id": 10**8 + 6, "prompt": [1]})
        else:
            out_live_, out_pure_ = out_live, out_pure
        for array in out_live_.arrays:
            array.fill(-7)
        errors = []
        for module, out in ((backend, out_live_), (_pure, out_pure_)):
            batch = build_broken(module, groups)
            saved = _backend.module
            _backend.module = module
            try:
                with pytest.raises((ValueError, TypeError)) as info:
                    run(batch, max_draft_len, sizes, out)
            finally:
                _backend.module = saved
            errors.append((info.type, str(info.value)))
        assert errors[0] == errors[1], fault
        assert any(fragment in errors[0][1] for fragment in EXPECTED[fault]), (fault, errors[0])
        assert all((array == -7).all() for array in out_live_.arrays), fault
