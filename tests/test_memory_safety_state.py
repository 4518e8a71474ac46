"""Memory errors the compiled core once had, reached through restored or crafted state.

A pickle anyone could have written (``tokcy._pickle``'s restore functions) or
``Request._from_state`` given fields outside their bounds, of the wrong type or missing: each
is refused before anything uses it, and every valid state round-trips on both backends.

The numbers in the tests' names count fifteen such ways in, one test each, across
test_memory_safety_calls.py, test_memory_safety_state.py and test_memory_safety_views.py.

Each asserts a clean exception or a defined result, the same on both backends, and that
every observable is unchanged after a refused call. Under the sanitizer build (.ci/run,
docs/invariants.md) a regression shows as an AddressSanitizer report, not a wrong value.
"""

import pickle

import pytest
from hostile_code import observe

from tokcy import _pickle
from tokcy.connector import SchedulerOutputManager
from tokcy.executor import prepare_inputs


class Crafted:
    """Pickles as a call of ``function(*args)``: a pickle anyone could have written."""

    def __init__(self, function, *args):
        self.reduced = (function, args)

    def __reduce__(self):
        return self.reduced


def valid_request(cls):
    request = cls(7, [1, 2, 3, 4, 5], beam_width=2, num_layer_groups=2)
    request.block_tables[0].extend([3, 4, 5])
    request.block_tables[0].release_front(1)
    return request


def valid_state(backend):
    return valid_request(backend.Request).__reduce__()[1][1]


def test_7_a_negative_released_count_is_refused_on_restore(backend):
    crafted = pickle.dumps(Crafted(_pickle.restore_block_table, None, [1, 2], -4096))
    with pytest.raises(ValueError, match=r"num_released -4096 is outside \[0, 2\]"):
        pickle.loads(crafted).release_front(1)  # accepted, this would write before the buffer
    table = backend.BlockTable([1, 2])
    with pytest.raises(ValueError, match=r"num_released 3 is outside \[0, 2\]"):
        table._restore([1, 2], 3, 0)
    with pytest.raises(ValueError, match="the first 1 entries are released and must read -1"):
        _pickle.restore_block_table(None, [1, 2], 1)
    assert (table.tolist(), table.num_released) == ([1, 2], 0)
    restored = _pickle.restore_block_table(None, [-1, 2], 1)
    restored.release_front(2)
    assert (restored.tolist(), restored.num_released) == ([-1, -1], 2)


def crafted_request(backend, **fields):
    state = dict(valid_state(backend), **fields)
    return pickle.dumps(Crafted(_pickle.restore_request, None, state))


def prefill(request):
    prepare_inputs([request], [])  # copies the chunk [cursor, cursor + chunk) of beam 0


def regenerate(request):
    request.set_generated_tokens([[1]] * request.beam_width)


def rewind_and_grow(request):
    request.truncate(request.prompt_len)
    request.add_new_token(1)


def report_again(request):
    """A first report of a valid request with the same id, then the restored one's."""
    manager = SchedulerOutputManager()
    manager.build_scheduler_output([valid_request(type(request))], [])
    manager.build_scheduler_output([request], [])


# Each crafted state, and what an attacker does next with it: where the state is refused,
# the second step never runs; on a build that accepted it, that step is the memory error
# (a read or write outside the buffer) which the sanitizer build reports.
@pytest.mark.parametrize(
    "fields, message, use",
    [
        ({"prompt_len": 6}, r"prompt_len 6 is outside \[0, 5\]", prefill),  # 8: past the tokens
        ({"prompt_len": 6, "context_chunk_size": 1, "context_current_position": 5}, r"prompt_len 6 is outside", prefill),
        ({"beams": [[1, 2, 3, 4, 5], [1, 2]], "prompt_len": 5}, r"prompt_len 5 is outside \[0, 2\]", regenerate),
        ({"prompt_len": -1}, r"prompt_len -1 is outside \[0, 5\]", rewind_and_grow),  # 9
        ({"context_current_position": -2}, r"context_current_position -2 is outside \[0, 5\]", prefill),  # 10
        ({"context_chunk_size": 6}, r"context_chunk_size 6 is outside \[0, 5\]", prefill),
        ({"dirty_from": [-4096, 0]}, r"dirty_from\[0\] -4096 is outside \[0, 5\]", report_again),  # 11
        ({"dirty_from": [0, 6]}, r"dirty_from\[1\] 6 is outside \[0, 5\]", report_again),
        ({"block_tables": [([-1, 4, 5], 1, -4096), ([], 0)]}, r"dirty_from -4096 is outside \[0, 3\]", report_again),
        ({"beams": [], "dirty_from": []}, r"beams: 0 beams is outside \[1, 1024\]", prefill),  # 12
        ({"beams": [[1]] * 1025, "dirty_from": [0] * 1025, "prompt_len": 0}, r"1025 beams is outside \[1, 1024\]", None),
        ({"block_tables": [([], 0)] * 1025}, "1025 layer groups is above 1024", None),
        ({"orig_prompt_len": 5, "prompt_len": 4}, r"orig_prompt_len 5 is outside \[0, 4\]", None),
        ({"seq_slot": 2**31}, r"seq_slot 2147483648 is outside \[0, 2147483647\]", None),
        ({"state": 9}, "state must be a RequestState, got 9", None),
        ({"num_pauses": -1}, r"num_pauses -1 is outside", None),
        ({"max_new_tokens": -1}, r"max_new_tokens -1 is outside", None),
    ],
    ids=lambda value: "-".join(f"{key}={value[key]}"[:24] for key in value).replace(" ", "") if isinstance(value, dict) else "",
)
def test_8_to_12_crafted_request_states_are_refused(backend, fields, message, use):
    crafted = crafted_request(backend, **fields)
    with pytest.raises(ValueError, match=message):
        request = pickle.loads(crafted)
        if use is not None:
            use(request)
    with pytest.raises(ValueError, match=message):
        backend.Request._from_state(dict(valid_state(backend), **fields))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"beams": "abc"}, "beams must be a sequence, not str"),
        ({"beams": [[1.5]], "dirty_from": [0]}, r"beams\[0\]\[0\] must be an integer token id, not float"),
        ({"prompt_len": 2.0}, "prompt_len must be an integer, not float"),
        ({"dict": [1]}, "dict must be a dict or None, not list"),
    ],
    ids=["beams-str", "beams-float", "prompt_len-float", "dict-list"],
)
def test_crafted_state_of_the_wrong_type_is_a_type_error(backend, fields, message):
    with pytest.raises(TypeError, match=message):
        pickle.loads(crafted_request(backend, **fields))


def test_a_state_missing_a_field_names_it(backend):
    state = valid_state(backend)
    del state["dirty_from"]
    with pytest.raises(ValueError, match="lacks the field"):
        backend.Request._from_state(state)
    with pytest.raises(TypeError, match="Request state must be a dict, not list"):
        backend.Request._from_state([])


def test_12_every_valid_state_round_trips_on_both_backends(both_backends):
    compiled, pure = both_backends
    for module in both_backends:
        state = valid_state(module)
        for target in both_backends:
            assert observe(target.Request._from_state(state)) == observe(module.Request._from_state(state))
    blank = compiled.Request.__new__(compiled.Request)
    assert observe(pickle.loads(pickle.dumps(blank))) == observe(pure.Request.__new__(pure.Request))
