"""The compiled backend and the pure twin run the same random programs alike.

Every program (seeded, so a failure names its seed) is a list of ~50 operations, valid and
invalid; the trace of each backend (each result, or each exception's type and message,
and every observable after every operation) must be identical. Pickles load across
backends, Python subclasses work on both, and repr is the same text.
"""

import copy
import pickle
import random

import numpy as np
import pytest

import tokcy
from list_model import observe
from tokcy import RequestState

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
NUM_PROGRAMS = 500
PROGRAM_LENGTH = 50

BAD_SCALARS = [INT32_MAX + 1, INT32_MIN - 1, 2**64, 2**70, 1.5, np.float64(2), np.float32(1), None, "3", [1]]
BAD_SEQUENCES = [
    5,
    None,
    "ab",
    np.array([1.0, 2.0]),
    np.array([True, False]),
    np.zeros((2, 2), dtype=np.int32),
    [[1, 2], [3, 4]],
    [1, 2.5],
    [1, None],
    [INT32_MAX + 1],
    np.array([INT32_MAX + 1], dtype=np.int64),
    np.array([2**63], dtype=np.uint64),
    [[1], [2, 3]],
]


def normalize(value):
    """A plain, comparable form of a call's result."""
    if isinstance(value, np.ndarray):
        return ("ndarray", str(value.dtype), value.shape, bool(value.flags.writeable), value.tolist())
    if isinstance(value, RequestState):
        return ("RequestState", value.name)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [normalize(v) for v in value])
    if value is None or isinstance(value, (bool, int, str)):
        return (type(value).__name__, value)
    return ("other", type(value).__name__, repr(value))


class Program:
    """A random program: each operation is (name, args); args are drawn when generated, from a
    rough running estimate of the request's sizes, so they are often valid and often near a
    boundary. The same op list is replayed on each backend."""

    def __init__(self, seed):
        rng = random.Random(seed)
        self.seed = seed
        self.beam_width = rng.choice([1, 1, 2, 3])
        self.groups = rng.randint(1, 3)
        self.prompt = [rng.randint(0, 100) for _ in range(rng.randint(0, 8))]
        self.max_new_tokens = rng.choice([None, rng.randint(0, 12)])
        self.request_id = rng.randint(0, 2**40)
        n = len(self.prompt) + 2
        ops = []
        for _ in range(PROGRAM_LENGTH):
            ops.append(self._op(rng, n))
            n = max(1, n + rng.randint(-1, 2))
        self.ops = ops

    def _token(self, rng):
        return rng.choice(BAD_SCALARS) if rng.random() < 0.08 else rng.choice([rng.randint(0, 100), INT32_MAX, INT32_MIN])

    def _beam(self, rng):
        return rng.choice([0] * 6 + list(range(self.beam_width)) * 3 + [-1, self.beam_width, 7, 1.0, "0"])

    def _tokens(self, rng, k):
        if rng.random() < 0.08:
            return rng.choice(BAD_SEQUENCES)
        tokens = [rng.randint(0, 100) for _ in range(k)]
        return np.array(tokens, dtype=rng.choice([np.int32, np.int64, np.uint16])) if rng.random() < 0.3 else tokens

    def _position(self, rng, n):
        return rng.choice([rng.randint(-3, n + 3)] * 8 + [None, 1.5, 2**40, -(2**40)])

    def _op(self, rng, n):
        width = self.beam_width
        kind = rng.choice(
            ["add_new_token"] * 6
            + ["add_new_tokens"] * 3
            + [
                "set_generated_tokens", "truncate", "truncate", "pause", "move_chunk", "set_cursor", "set_chunk",
                "set_drafts", "set_state", "set_seq_slot", "get_token", "get_tokens", "get_tokens_range",
                "get_tokens_range", "get_tokens_view", "get_last_tokens", "get_num_tokens", "bt_append",
                "bt_extend", "bt_truncate", "bt_setitem", "bt_getitem", "bt_release", "bt_view", "pickle",
                "repr", "counts",
            ]
        )
        group = rng.randint(-1, self.groups) if rng.random() < 0.05 else rng.randrange(self.groups)
        if kind == "add_new_token":
            return kind, (self._token(rng), self._beam(rng))
        if kind == "add_new_tokens":
            count = width if rng.random() < 0.85 else rng.choice([0, width - 1, width + 1])
            entries = [self._token(rng) for _ in range(count)]
            if rng.random() < 0.2 and all(type(t) is int and INT32_MIN <= t <= INT32_MAX for t in entries):
                entries = np.array(entries, dtype=np.int64)
            elif rng.random() < 0.05:
                entries = rng.choice([5, None, "ab", np.array([[1]] * width)])
            return kind, (entries,)
        if kind == "set_generated_tokens":
            count = width if rng.random() < 0.9 else width + 1
            return kind, ([self._tokens(rng, rng.randint(0, 4)) for _ in range(count)],)
        if kind == "truncate":
            return kind, (rng.choice([rng.randint(-1, n + 2)] * 6 + [1.0, None]), rng.choice([None, None, self._beam(rng)]))
        if kind == "pause":
            return kind, (rng.choice([rng.randint(-1, n + 3)] * 8 + [2.0]),)
        if kind in ("set_cursor", "set_chunk"):
            return kind, (rng.choice([rng.randint(-2, n + 2)] * 8 + [1.0, None, 2**40]),)
        if kind == "set_drafts":
            return kind, (rng.choice([None, self._tokens(rng, rng.randint(0, 4))]),)
        if kind == "set_state":
            return kind, (rng.choice([0, 1, 2, 3, -1, 1.0, "x", RequestState.GENERATION_COMPLETE]),)
        if kind == "set_seq_slot":
            return kind, (rng.choice([None, 0, 3, 17, -1, 2.0, "1"]),)
        if kind == "get_token":
            return kind, (self._beam(rng), self._position(rng, n))
        if kind in ("get_tokens_range", "get_tokens_view"):
            return kind, (self._beam(rng), self._position(rng, n), self._position(rng, n))
        if kind in ("get_tokens", "get_last_tokens"):
            return kind, (rng.choice([None, self._beam(rng)]),)
        if kind == "get_num_tokens":
            return kind, (self._beam(rng),)
        if kind == "bt_append":
            return kind, (group, rng.choice([rng.randint(0, 50)] * 8 + [-1, 1.0, None, INT32_MAX + 1]))
        if kind == "bt_extend":
            ids = [rng.randint(0, 50) for _ in range(rng.randint(0, 4))]
            if rng.random() < 0.1:
                ids = rng.choice([[1, -1], [2.0], np.array([1.0]), np.zeros((1, 2), dtype=np.int64), 7])
            return kind, (group, ids)
        if kind in ("bt_truncate", "bt_release", "bt_getitem"):
            return kind, (group, rng.choice([rng.randint(-3, 6)] * 8 + [1.0]))
        if kind == "bt_setitem":
            return kind, (group, rng.randint(-4, 5), rng.choice([rng.randint(0, 50)] * 8 + [-1, 1.0]))
        return kind, (group,) if kind == "bt_view" else ()


def execute(request, kind, args):
    """Run one operation; returns (request, result). ``pickle`` replaces the request."""
    r = request
    if kind == "add_new_token":
        return r, r.add_new_token(*args)
    if kind in ("add_new_tokens", "set_generated_tokens", "truncate", "pause", "get_token", "get_tokens_range",
                "get_tokens_view", "get_num_tokens"):
        return r, getattr(r, kind)(*args)
    if kind in ("get_tokens", "get_last_tokens"):
        return r, (getattr(r, kind)() if args[0] is None else getattr(r, kind)(args[0]))
    if kind == "move_chunk":
        return r, r.move_to_next_context_chunk()
    attribute = {
        "set_cursor": "context_current_position",
        "set_chunk": "context_chunk_size",
        "set_drafts": "draft_tokens",
        "set_state": "state",
        "set_seq_slot": "seq_slot",
    }.get(kind)
    if attribute:
        setattr(r, attribute, args[0])
        return r, getattr(r, attribute)
    if kind.startswith("bt_"):
        table = r.block_tables[args[0]]
        rest = args[1:]
        if kind == "bt_append":
            return r, table.append(*rest)
        if kind == "bt_extend":
            return r, table.extend(*rest)
        if kind == "bt_truncate":
            return r, table.truncate(*rest)
        if kind == "bt_release":
            return r, table.release_front(*rest)
        if kind == "bt_getitem":
            return r, table[rest[0]]
        if kind == "bt_setitem":
            table[rest[0]] = rest[1]
            return r, table.tolist()
        if kind == "bt_view":
            return r, table.view()
    if kind == "pickle":
        copy = pickle.loads(pickle.dumps(r))
        return copy, type(copy).__name__
    if kind == "repr":
        return r, [repr(r)] + [repr(t) for t in r.block_tables]
    if kind == "counts":
        return r, [r.max_beam_num_tokens, r.max_num_generated_tokens, r.context_remaining_length,
                   r.is_first_context_chunk, r.is_last_context_chunk, r.num_draft_tokens, r.has_draft_tokens]
    raise AssertionError(kind)


def run_program(module, program, monkeypatch):
    """The trace of ``program`` on ``module``: one entry per operation."""
    monkeypatch.setattr(tokcy, "Request", module.Request)
    monkeypatch.setattr(tokcy, "BlockTable", module.BlockTable)
    request = module.Request(
        program.request_id, program.prompt, beam_width=program.beam_width,
        max_new_tokens=program.max_new_tokens, num_layer_groups=program.groups,
    )
    trace = [("created", observe(request, views=False))]
    views = []
    for step, (kind, args) in enumerate(program.ops):
        try:
            request, result = execute(request, kind, args)
        except Exception as error:  # noqa: BLE001 - the exception is the result compared
            outcome = ("raised", type(error).__name__, str(error))
        else:
            outcome = ("returned", normalize(result))
            if isinstance(result, np.ndarray):
                views.append((result, result.tolist()))
        assert type(request) is module.Request
        # views stay out of the per-step observation so writes no view can see stay uncopied
        trace.append((step, kind, outcome, observe(request, views=False)))
        for view, shown in views:
            assert view.tolist() == shown, f"seed {program.seed} step {step}: a view changed"
    trace.append(("final", observe(request), [view.tolist() for view, _ in views]))
    return trace


@pytest.mark.parametrize("chunk", range(10))
def test_random_programs_give_identical_traces(both_backends, monkeypatch, chunk):
    compiled, pure = both_backends
    per_chunk = NUM_PROGRAMS // 10
    for seed in range(chunk * per_chunk, (chunk + 1) * per_chunk):
        program = Program(seed)
        got = run_program(compiled, program, monkeypatch)
        expected = run_program(pure, program, monkeypatch)
        for a, b in zip(got, expected):
            assert a == b, f"seed {seed}: the backends diverge at {b[:3]}"
        assert len(got) == len(expected)


@pytest.mark.backend_free("checks the program generator, which runs no backend")
def test_programs_exercise_errors_and_successes():
    """The generator is not degenerate: programs mix every kind of operation, many of them failing."""
    kinds = {kind for seed in range(50) for kind, _ in Program(seed).ops}
    assert len(kinds) == 27  # every kind the generator knows


def test_random_programs_raise_often_enough(both_backends, monkeypatch):
    _, pure = both_backends
    outcomes = [step[2][0] for seed in range(40) for step in run_program(pure, Program(seed), monkeypatch)[1:-1]]
    assert 0.1 < outcomes.count("raised") / len(outcomes) < 0.6


# --------------------------------------------------------------------------- pickles
def _busy_request(module):
    r = module.Request(12, [5, 6, 7], beam_width=2, max_new_tokens=8, num_layer_groups=3)
    r.add_new_tokens([8, 9])
    r.add_new_token(10, 1)
    r.state = RequestState.GENERATION_IN_PROGRESS
    r.seq_slot = 6
    r.draft_tokens = [1, 2, 3]
    r.context_chunk_size = 2
    r.move_to_next_context_chunk()
    r.block_tables[0].extend([4, 5, 6, 7])
    r.block_tables[0].release_front(2)
    r.block_tables[2].append(9)
    return r


def _paused_request(module):
    r = module.Request(13, [1, 2], max_new_tokens=5)
    for t in (3, 4, 5):
        r.add_new_token(t)
    r.pause(4)
    r.add_new_token(6)
    return r


@pytest.mark.parametrize("make", [_busy_request, _paused_request])
@pytest.mark.parametrize("direction", ["compiled->pure", "pure->compiled"])
def test_pickles_load_in_the_other_backend(both_backends, monkeypatch, make, direction):
    compiled, pure = both_backends
    source, target = (compiled, pure) if direction == "compiled->pure" else (pure, compiled)
    original = make(source)
    data = pickle.dumps(original)
    monkeypatch.setattr(tokcy, "Request", target.Request)
    monkeypatch.setattr(tokcy, "BlockTable", target.BlockTable)
    loaded = pickle.loads(data)
    assert type(loaded) is target.Request
    assert all(type(t) is target.BlockTable for t in loaded.block_tables)
    assert observe(loaded) == observe(original)
    assert observe(loaded) == observe(make(target))
    assert repr(loaded) == repr(original)
    # the loaded object keeps working, and its hidden state (released counts...) came along
    if loaded.block_tables[0].num_released:
        with pytest.raises(ValueError):
            loaded.block_tables[0][0] = 3
    with pytest.raises(ValueError):
        loaded.truncate(loaded.prompt_len - 1)
    loaded.add_new_token(77)
    original.add_new_token(77)
    assert observe(loaded) == observe(original)


@pytest.mark.parametrize("direction", ["compiled->pure", "pure->compiled"])
def test_block_table_pickles_load_in_the_other_backend(both_backends, monkeypatch, direction):
    compiled, pure = both_backends
    source, target = (compiled, pure) if direction == "compiled->pure" else (pure, compiled)
    table = source.BlockTable([3, 4, 5])
    table.release_front(2)
    data = pickle.dumps(table)
    monkeypatch.setattr(tokcy, "BlockTable", target.BlockTable)
    loaded = pickle.loads(data)
    assert type(loaded) is target.BlockTable
    assert loaded.tolist() == [-1, -1, 5]
    assert loaded.num_released == 2
    with pytest.raises(ValueError):
        loaded.release_front(1)


def test_pickle_bytes_name_no_backend(both_backends):
    for module in both_backends:
        data = pickle.dumps(_busy_request(module))
        assert b"_core" not in data and b"_pure" not in data


# ------------------------------------------------------------------------- subclassing
def _subclass(module):
    class TaggedRequest(module.Request):
        def __init__(self, request_id, prompt, tag, **kwargs):
            super().__init__(request_id, prompt, **kwargs)
            self.tag = tag
            self.history = []

        def generated(self):
            return self.get_tokens_range(0, self.prompt_len, self.get_num_tokens(0))

    return TaggedRequest


# pickle needs to find the subclasses by name
TaggedRequestCompiled = None
TaggedRequestPure = None


@pytest.mark.parametrize("which", ["compiled", "pure"])
def test_subclass_with_extra_attributes(both_backends, monkeypatch, which):
    module = both_backends[0] if which == "compiled" else both_backends[1]
    cls = _subclass(module)
    name = "TaggedRequestCompiled" if which == "compiled" else "TaggedRequestPure"
    cls.__name__ = cls.__qualname__ = name
    monkeypatch.setitem(globals(), name, cls)
    r = cls(3, [1, 2], "hello", beam_width=2, max_new_tokens=4)
    r.history.append("created")
    r.add_new_tokens([3, 4])
    assert isinstance(r, module.Request)
    assert r.tag == "hello"
    assert r.generated() == [3]
    assert repr(r).startswith(f"{name}(request_id=3,")
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        s = pickle.loads(pickle.dumps(r, protocol=protocol))
        assert type(s) is cls
        assert s.tag == "hello"
        assert s.history == ["created"]
        assert s.history is not r.history
        assert observe(s) == observe(r)
        assert s.generated() == [3]


def test_subclass_overrides_are_used(both_backends):
    for module in both_backends:
        class Counting(module.Request):
            calls = 0

            def add_new_token(self, token, beam=0):
                Counting.calls += 1
                return super().add_new_token(token, beam)

        r = Counting(1, [1])
        assert r.add_new_token(2) == 2
        assert Counting.calls == 1
        assert r.get_tokens(0) == [1, 2]


def test_block_table_subclass(both_backends, monkeypatch):
    for module in both_backends:
        class Table(module.BlockTable):
            pass

        monkeypatch.setitem(globals(), "Table", Table)
        Table.__qualname__ = "Table"
        t = Table([1, 2])
        t.note = "x"
        assert t.tolist() == [1, 2]
        u = pickle.loads(pickle.dumps(t))
        assert type(u) is Table
        assert u.tolist() == [1, 2]


# --------------------------------------------------------------------------------- repr
def test_repr_identical(both_backends):
    compiled, pure = both_backends
    for make in (_busy_request, _paused_request, lambda m: m.Request(1, []), lambda m: m.Request(2, list(range(20)))):
        a, b = make(compiled), make(pure)
        assert repr(a) == repr(b)
        assert [repr(t) for t in a.block_tables] == [repr(t) for t in b.block_tables]
    long_a = compiled.BlockTable(range(30))
    long_b = pure.BlockTable(range(30))
    long_a.release_front(3)
    long_b.release_front(3)
    assert repr(long_a) == repr(long_b) == "BlockTable([-1, -1, -1, 3, ..., 26, 27, 28, 29], num_released=3)"


def test_repr_worked_example(both_backends):
    for module in both_backends:
        assert repr(_busy_request(module)) == (
            "Request(request_id=12, state=GENERATION_IN_PROGRESS, prompt_len=3, num_tokens=[4, 5], "
            "context=2+1, draft_tokens=3, seq_slot=6)"
        )


def _with_attributes(module):
    """Subclasses of both classes that add attributes in __slots__ (a private one too) and
    in their __dict__, and a table whose tolist() shows only the live ids."""

    class SlottedRequest(module.Request):
        __slots__ = ("tag", "__secret", "unset")

        def secret(self):
            return self.__secret

        def keep(self, tag, secret):
            self.tag, self.__secret = tag, secret

    class DictRequest(module.Request):
        pass

    class SlottedTable(module.BlockTable):
        __slots__ = ("owner",)

        def tolist(self):  # what a subclass may show; pickling reads the table itself
            return [block for block in super().tolist() if block >= 0]

    class DictTable(module.BlockTable):
        pass

    return SlottedRequest, DictRequest, SlottedTable, DictTable


def test_what_a_subclass_adds_pickles_and_copies_with_it(backend, monkeypatch):
    classes = _with_attributes(backend)
    for cls in classes:
        monkeypatch.setitem(globals(), cls.__name__, cls)
        cls.__qualname__ = cls.__name__
    SlottedRequest, DictRequest, SlottedTable, DictTable = classes
    slotted = SlottedRequest(1, [1, 2, 3])
    slotted.keep(["a"], 42)
    with_dict = DictRequest(2, [4])
    with_dict.note = {"k": 1}
    table = SlottedTable([5, 6, 7])
    table.release_front(1)
    table.owner = "me"
    plain_table = DictTable([8])
    plain_table.note = "n"
    for copy_of in (lambda x: pickle.loads(pickle.dumps(x)), copy.copy, copy.deepcopy):
        request = copy_of(slotted)
        assert (type(request), request.tag, request.secret(), request.get_tokens(0)) == (SlottedRequest, ["a"], 42,
                                                                                          [1, 2, 3])
        assert not hasattr(request, "unset")
        request = copy_of(with_dict)
        assert (type(request), request.note, request.get_tokens(0)) == (DictRequest, {"k": 1}, [4])
        restored = copy_of(table)
        assert (type(restored), restored.owner, restored.view().tolist(), restored.num_released) == (
            SlottedTable, "me", [-1, 6, 7], 1)
        restored = copy_of(plain_table)
        assert (type(restored), restored.note, restored.tolist()) == (DictTable, "n", [8])
    deep = copy.deepcopy(slotted)
    assert deep.tag == ["a"] and deep.tag is not slotted.tag


@pytest.mark.parametrize("name", ["_buffer", "_num_released", "tolist", "num_released"])
def test_a_pickle_cannot_set_a_tables_own_fields_through_a_subclass_attribute(backend, name):
    """A subclass's attributes never name the class's own fields (the twin's slots, a
    method, a property) on either backend: such a pickle is refused, naming the field;
    other names restore as the subclass's, in its slots or its __dict__."""
    from tokcy import _pickle

    class Table(backend.BlockTable):
        __slots__ = ("owner", "__dict__")

    with pytest.raises(ValueError, match=f"^subclass attribute '{name}' is one of BlockTable's own fields$"):
        _pickle.restore_block_table(Table, [3, 4], 0, 0, 0, {name: 5})
    restored = _pickle.restore_block_table(Table, [3, 4], 0, 0, 0, {"owner": "me", "note": 1})
    assert (restored.owner, restored.note, restored.tolist(), restored.num_released) == ("me", 1, [3, 4], 0)
    table = Table([1, 2])
    table.release_front(1)
    table.owner = "you"
    copied = copy.copy(table)
    assert (type(copied), copied.owner, copied.view().tolist(), copied.num_released) == (Table, "you", [-1, 2], 1)
    with pytest.raises(TypeError):  # the class itself takes no attributes
        _pickle.restore_block_table(backend.BlockTable, [3, 4], 0, 0, 0, {"extra": 1})
