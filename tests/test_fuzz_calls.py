"""Random public calls, mostly with bad arguments, on both backends in lockstep.

One seeded program of calls (request and block-table methods, setters and deleters,
``__init__`` again, crafted restore states, ``prepare_inputs`` and connector reports) runs
against a world of objects per backend. After every call both backends must agree: the
same result, or the same exception type and message; and after a raising call every
observable of the world is as it was. ``TOKCY_FUZZ_EXAMPLES`` sets the number of calls
(the suite's default keeps it to a few seconds); under the sanitizer build a memory error
anywhere in a call aborts the run.
"""

import os
import random
from collections import Counter

import numpy as np

from tokcy import RequestState, _backend
from tokcy.connector import SchedulerOutputManager
from tokcy.connector.output import COLUMNS
from tokcy.executor import HostBuffers, prepare_inputs

EXAMPLES = int(os.environ.get("TOKCY_FUZZ_EXAMPLES", "3000"))
SEED = int(os.environ.get("TOKCY_FUZZ_SEED", "20261201"))

# argument recipes: each makes a fresh value (a generator is consumed once per backend)
INTS = [0, 1, 2, 3, 5, -1, -7, 2**31 - 1, 2**31, -(2**31) - 1, 2**63 - 1, 2**63, 1024, 1025]
BAD = [None, 1.5, "3", b"x", [1], (), {}, np.float32(2.0), np.int64(4), True, object()]


def make_value(rng):
    roll = rng.random()
    if roll < 0.7:
        return ("int", rng.choice(INTS) if rng.random() < 0.3 else rng.randrange(-2, 12))
    if roll < 0.82:
        return ("bad", rng.randrange(len(BAD)))
    return ("seq", make_sequence(rng))


def make_sequence(rng):
    kind = rng.choice(["list", "tuple", "array", "generator", "nested", "badlist", "i64", "f32"])
    values = [rng.choice(INTS) if rng.random() < 0.1 else rng.randrange(0, 50) for _ in range(rng.randrange(0, 6))]
    return (kind, values)


def materialize(recipe):
    kind, payload = recipe
    if kind == "int":
        return payload
    if kind == "bad":
        value = BAD[payload]
        return list(value) if isinstance(value, list) else value
    sequence_kind, values = payload
    if sequence_kind == "list":
        return list(values)
    if sequence_kind == "tuple":
        return tuple(values)
    if sequence_kind == "array":
        return np.array([v for v in values if -(2**31) <= v < 2**31], dtype=np.int32)
    if sequence_kind == "generator":
        return (v for v in values)
    if sequence_kind == "nested":
        return [list(values)] * 2
    if sequence_kind == "badlist":
        return list(values) + [None]
    if sequence_kind == "i64":
        return np.array([v for v in values if -(2**63) <= v < 2**63], dtype=np.int64)
    return np.array(values, dtype=np.float32)


REQUEST_METHODS = {
    "add_new_token": 2, "add_new_tokens": 1, "set_generated_tokens": 1, "truncate": 2, "pause": 1,
    "get_tokens": 1, "get_tokens_range": 3, "get_token": 2, "get_last_tokens": 1, "get_tokens_view": 3,
    "get_num_tokens": 1, "move_to_next_context_chunk": 0,
}
SETTABLE = ["state", "seq_slot", "context_current_position", "context_chunk_size", "draft_tokens"]
TABLE_METHODS = {"append": 1, "extend": 1, "truncate": 1, "release_front": 1, "__getitem__": 1,
                 "__setitem__": 2, "__delitem__": 1, "_restore": 3}
STATE_FIELDS = ["request_id", "beams", "dirty_from", "prompt_len", "orig_prompt_len", "max_new_tokens", "state",
                "seq_slot", "context_current_position", "context_chunk_size", "draft_tokens", "block_tables",
                "num_pauses"]


def make_call(rng, num_requests):
    """A backend-neutral description of one call."""
    target = rng.randrange(num_requests)
    roll = rng.random()
    if roll < 0.40:
        name = rng.choice(sorted(REQUEST_METHODS))
        return ("request", target, name, [make_value(rng) for _ in range(REQUEST_METHODS[name])])
    if roll < 0.52:
        return ("setattr", target, rng.choice(SETTABLE), [make_value(rng)])
    if roll < 0.54:
        return ("delattr", target, rng.choice(SETTABLE), [])
    if roll < 0.68:
        name = rng.choice(sorted(TABLE_METHODS))
        return ("table", target, name, [make_value(rng) for _ in range(TABLE_METHODS[name])])
    if roll < 0.72:
        keywords = {key: make_value(rng) for key in ("beam_width", "num_layer_groups") if rng.random() < 0.4}
        return ("init", target, None, [make_value(rng), make_value(rng), keywords])
    if roll < 0.82:
        fields = {rng.choice(STATE_FIELDS): make_value(rng) for _ in range(rng.randrange(0, 3))}
        return ("restore", target, None, [fields])
    if roll < 0.92:
        groups = [[rng.randrange(num_requests) for _ in range(rng.randrange(0, 3))] for _ in range(4)]
        sizes = None if rng.random() < 0.6 else [make_value(rng) for _ in range(rng.randrange(1, 3))]
        return ("prepare", target, None, [groups, make_value(rng) if rng.random() < 0.3 else ("int", 2), sizes])
    groups = [[rng.randrange(num_requests) for _ in range(rng.randrange(0, 3))] for _ in range(3)]
    action = rng.choice(["build", "build", "build", "record", "reset", "finished"])
    return ("connector", target, action, [groups, make_value(rng)])


class World:
    """The objects one backend's calls act on, and everything observable about them."""

    def __init__(self, module):
        self.module = module
        self.requests = []
        for number in range(6):
            request = module.Request(number, list(range(3 + number)), beam_width=1 + number % 2,
                                     max_new_tokens=None if number % 3 else 20, num_layer_groups=1 + number % 2)
            request.block_tables[0].extend(range(number))
            if number % 2:
                request.state = RequestState.GENERATION_IN_PROGRESS
                request.seq_slot = number
            self.requests.append(request)
        self.manager = SchedulerOutputManager()
        self.buffers = HostBuffers(64, 16, 4)

    def observe(self):
        requests = [
            (r.request_id, r.beam_width, r.get_tokens(), r.prompt_len, r.orig_prompt_len, r.max_new_tokens,
             int(r.state), r.seq_slot, r.context_current_position, r.context_chunk_size, r.draft_tokens,
             [(t.tolist(), t.num_released) for t in r.block_tables])
            for r in self.requests
        ]
        return requests, self.manager.tracked_request_ids(), [array.tolist() for array in self.buffers.arrays]

    def apply(self, call):
        kind, target, name, args = call
        request = self.requests[target]
        if kind == "request":
            return getattr(request, name)(*[materialize(arg) for arg in args])
        if kind == "setattr":
            return setattr(request, name, materialize(args[0]))
        if kind == "delattr":
            return delattr(request, name)
        if kind == "table":
            if not request.block_tables:
                return None
            return getattr(request.block_tables[0], name)(*[materialize(arg) for arg in args])
        if kind == "init":
            identifier, prompt, keywords = args
            return request.__init__(materialize(identifier), materialize(prompt),
                                    **{key: materialize(value) for key, value in keywords.items()})
        if kind == "restore":
            state = request.__reduce__()[1][1]
            state.update({field: materialize(value) for field, value in args[0].items()})
            self.requests[target] = type(request)._from_state(state)
            return None
        if kind == "prepare":
            groups, max_draft_len, sizes = args
            batch = [[self.requests[number] for number in group] for group in groups]
            return prepare_inputs(batch[0], batch[1], first_draft_requests=batch[2], device_token_requests=batch[3],
                                  max_draft_len=materialize(max_draft_len),
                                  cuda_graph_batch_sizes=None if sizes is None else [materialize(s) for s in sizes],
                                  out=self.buffers)
        groups, value = args
        if name == "build":
            batch = [[self.requests[number] for number in group] for group in groups]
            return self.manager.build_scheduler_output(*batch)
        if name == "record":
            return self.manager.record_matched_tokens(request.request_id, materialize(value))
        if name == "reset":
            return self.manager.reset_request(materialize(value))
        return self.manager.request_finished(materialize(value))


def plain(result):
    """A result as comparable plain data."""
    if isinstance(result, np.ndarray):
        return result.tolist()
    if isinstance(result, (list, tuple)):
        return [plain(item) for item in result]
    if hasattr(result, "asdict"):
        return {key: plain(value) for key, value in result.asdict().items()}
    if hasattr(result, "block_offsets"):  # a SchedulerOutput: its columns
        return {key: plain(getattr(result, key)) for key in ("num_context_requests", *COLUMNS)}
    return result


def outcome(world, call):
    saved = _backend.module
    _backend.module = world.module
    before = world.observe()
    try:
        return ("ok", plain(world.apply(call)))
    except Exception as error:  # noqa: BLE001 - compared across backends
        assert world.observe() == before, (world.module.__name__, call, error)
        return ("raised", type(error).__name__, str(error).replace("tokcy._core.", "").replace("tokcy._pure.request.", ""))
    finally:
        _backend.module = saved


def test_random_calls_agree_and_a_raising_call_changes_nothing(both_backends):
    rng = random.Random(SEED)
    saved = _backend.module
    try:
        worlds = []
        for module in both_backends:
            _backend.module = module  # the manager takes the live backend's report state
            worlds.append(World(module))
    finally:
        _backend.module = saved
    counts = Counter()
    for _ in range(EXAMPLES):
        call = make_call(rng, len(worlds[0].requests))
        compiled, pure = (outcome(world, call) for world in worlds)
        assert compiled == pure, call
        counts[compiled[0]] += 1
        counts[call[0]] += 1
        assert worlds[0].observe() == worlds[1].observe(), call
    print(f"fuzz: {EXAMPLES} calls per backend, {counts['raised']} raising, {dict(counts)}")
    assert counts["raised"] > EXAMPLES // 4 and counts["ok"] > EXAMPLES // 10
