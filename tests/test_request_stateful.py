"""Random operation sequences on ``Request`` and its ``BlockTable``s against the list model.

After every step, every observable of the real request equals the model's, and every view
taken so far (they are all kept to the end) still shows exactly what it showed when taken.
Invalid calls are part of the programs: the real object must raise the exception type the
model raises and stay unchanged.
"""

import pickle

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import list_model
from list_model import ModelRequest, observe, observe_table

ERRORS = (IndexError, ValueError, TypeError, OverflowError)
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

good_tokens = st.one_of(st.integers(0, 60), st.sampled_from([INT32_MIN, INT32_MAX, -1]))
bad_tokens = st.sampled_from([INT32_MAX + 1, INT32_MIN - 1, 2**64, 1.5, np.float32(2), None, "7"])
block_ids = st.integers(0, 500)


def maybe_bad(good, bad, p_bad=0.1):
    """Mostly ``good``, sometimes ``bad``."""
    return st.integers(0, 99).flatmap(lambda roll: bad if roll < p_bad * 100 else good)


def make_machine(backend):
    class RequestMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.real = None
            self.model = None
            self.views = []  # (numpy view, tuple it showed when taken, label)

        # ----------------------------------------------------------------- helpers
        def both(self, call):
            """``call(obj)`` on model and real: the same result, or the same exception type
            and then the real object must be exactly as it was."""
            try:
                expected = call(self.model)
            except ERRORS as error:
                before = observe(self.real, views=False)
                with pytest.raises(ERRORS) as info:
                    call(self.real)
                assert type(info.value) is type(error), f"model raised {error!r}, real raised {info.value!r}"
                assert observe(self.real, views=False) == before
                return None
            got = call(self.real)
            assert got == expected
            return got

        def width(self):
            return self.model.beam_width

        def draw_beam(self, data):
            return data.draw(maybe_bad(st.integers(0, self.width() - 1), st.sampled_from([-1, self.width(), 2.0])))

        def draw_group(self, data):
            return data.draw(st.integers(0, len(self.model.block_tables) - 1))

        # ------------------------------------------------------------------ set-up
        @initialize(
            prompt=st.lists(good_tokens, max_size=10),
            as_array=st.booleans(),
            beam_width=st.integers(1, 3),
            max_new_tokens=st.none() | st.integers(0, 20),
            groups=st.integers(1, 3),
            request_id=st.integers(0, 2**40),
        )
        def create(self, prompt, as_array, beam_width, max_new_tokens, groups, request_id):
            source = np.array(prompt, dtype=np.int64) if as_array else list(prompt)
            self.real = backend.Request(
                request_id, source, beam_width=beam_width, max_new_tokens=max_new_tokens, num_layer_groups=groups
            )
            self.model = ModelRequest(
                request_id, list(prompt), beam_width=beam_width, max_new_tokens=max_new_tokens, num_layer_groups=groups
            )
            assert type(self.real) is backend.Request

        # ------------------------------------------------------------------ tokens
        @rule(data=st.data())
        def add_new_token(self, data):
            fault = data.draw(st.sampled_from([None] * 8 + ["token", "beam"]))
            token = data.draw(bad_tokens if fault == "token" else good_tokens)
            beam = self.draw_beam(data) if fault == "beam" else data.draw(st.integers(0, self.width() - 1))
            self.both(lambda r: r.add_new_token(token, beam))

        @rule(data=st.data(), count=st.integers(1, 40))
        def add_many_tokens(self, data, count):
            beam = data.draw(st.integers(0, self.width() - 1))
            first = data.draw(st.integers(0, 1000))
            for token in range(first, first + count):
                self.both(lambda r: r.add_new_token(token, beam))

        @rule(data=st.data())
        def add_new_tokens(self, data):
            length = data.draw(maybe_bad(st.just(self.width()), st.sampled_from([self.width() - 1, self.width() + 1])))
            entries = good_tokens if length != self.width() else maybe_bad(good_tokens, bad_tokens, 0.05)
            tokens = data.draw(st.lists(entries, min_size=length, max_size=length))
            if data.draw(st.booleans()) and all(type(t) is int and INT32_MIN <= t <= INT32_MAX for t in tokens):
                tokens = np.array(tokens, dtype=data.draw(st.sampled_from([np.int32, np.int64])))
            self.both(lambda r: r.add_new_tokens(tokens))

        @rule(data=st.data())
        def set_generated_tokens(self, data):
            length = data.draw(maybe_bad(st.just(self.width()), st.just(self.width() + 1)))
            entries = good_tokens if length != self.width() else maybe_bad(good_tokens, bad_tokens, 0.03)
            rows = data.draw(st.lists(st.lists(entries, max_size=6), min_size=length, max_size=length))
            self.both(lambda r: r.set_generated_tokens(rows))

        @rule(data=st.data())
        def truncate(self, data):
            longest = self.model.max_beam_num_tokens
            beam = data.draw(st.none() | st.integers(-1, self.width()))
            if beam is None or 0 <= beam < self.width():
                num_tokens = data.draw(st.integers(self.model.prompt_len - 1, longest + 1))
            else:  # one fault at a time: a bad beam with a count that would be fine
                num_tokens = self.model.prompt_len
            self.both(lambda r: r.truncate(num_tokens, beam))

        @rule(data=st.data())
        def pause(self, data):
            value = data.draw(st.integers(self.model.prompt_len - 1, self.model.max_beam_num_tokens + 2))
            self.both(lambda r: r.pause(value))

        # ------------------------------------------------------------------- reads
        @rule(data=st.data())
        def get_token(self, data):
            beam = self.draw_beam(data)
            pos = data.draw(st.integers(-2, self.model.max_beam_num_tokens + 1))
            self.both(lambda r: r.get_token(beam, pos))

        @rule(data=st.data())
        def get_tokens_range(self, data):
            beam = self.draw_beam(data)
            n = self.model.max_beam_num_tokens
            begin = data.draw(maybe_bad(st.integers(-3, n + 3), st.just(1.0), 0.03))
            end = data.draw(maybe_bad(st.integers(-3, n + 3), st.just(None), 0.03))
            if not isinstance(begin, int) or not isinstance(end, int):
                beam = 0
            got = self.both(lambda r: r.get_tokens_range(beam, begin, end))
            assert got is None or all(type(t) is int for t in got)

        @rule(data=st.data())
        def get_last_tokens(self, data):
            beam = data.draw(st.none() | st.integers(-1, self.width()))
            self.both(lambda r: r.get_last_tokens(beam))

        # ------------------------------------------------------------------- views
        @rule(data=st.data())
        def take_view(self, data):
            beam = self.draw_beam(data)
            n = self.model.max_beam_num_tokens
            begin = data.draw(st.integers(-2, n + 2))
            end = data.draw(st.none() | st.integers(-2, n + 2))
            try:
                expected = self.model.get_tokens_view(beam, begin, end)
            except ERRORS as error:
                with pytest.raises(type(error)):
                    self.real.get_tokens_view(beam, begin, end)
                return
            view = self.real.get_tokens_view(beam, begin, end)
            assert isinstance(view, np.ndarray) and view.dtype == np.int32 and view.ndim == 1
            assert not view.flags.writeable
            assert view.tolist() == list(expected)
            self.views.append((view, expected, f"beam {beam} [{begin}, {end})"))

        @rule(data=st.data())
        def take_block_table_view(self, data):
            group = self.draw_group(data)
            view = self.real.block_tables[group].view()
            expected = self.model.block_tables[group].view()
            assert view.dtype == np.int32 and not view.flags.writeable
            assert view.tolist() == list(expected)
            self.views.append((view, expected, f"block table {group}"))

        # ---------------------------------------------------------- chunked prefill
        @rule()
        def move_to_next_context_chunk(self):
            self.both(lambda r: r.move_to_next_context_chunk())

        @rule(data=st.data())
        def set_cursor(self, data):
            value = data.draw(maybe_bad(st.integers(-1, self.model.prompt_len + 1), st.just(1.0)))
            self.both(lambda r: setattr(r, "context_current_position", value))

        @rule(data=st.data())
        def set_chunk(self, data):
            value = data.draw(maybe_bad(st.integers(-1, self.model.prompt_len + 2), st.just(None)))
            self.both(lambda r: setattr(r, "context_chunk_size", value))

        # ------------------------------------------------------- drafts, state, slot
        @rule(data=st.data())
        def set_drafts(self, data):
            drafts = data.draw(
                st.none()
                | st.lists(maybe_bad(good_tokens, bad_tokens, 0.05), max_size=5)
                | st.lists(st.integers(0, 9), max_size=4).map(lambda xs: np.array(xs, dtype=np.int32))
                | st.just(np.array([1.0, 2.0]))
            )
            self.both(lambda r: setattr(r, "draft_tokens", drafts))

        @rule(value=st.sampled_from([0, 1, 2, 3, -1, 1.0]) | st.sampled_from(list(list_model_states())))
        def set_state(self, value):
            self.both(lambda r: setattr(r, "state", value))

        @rule(value=st.none() | st.integers(-1, 10) | st.just(2.5))
        def set_seq_slot(self, value):
            self.both(lambda r: setattr(r, "seq_slot", value))

        # ------------------------------------------------------------ block tables
        @rule(data=st.data())
        def bt_append(self, data):
            group = self.draw_group(data)
            block_id = data.draw(maybe_bad(block_ids, st.sampled_from([-1, -7, INT32_MAX + 1, 1.0, None])))
            self.both(lambda r: r.block_tables[group].append(block_id))

        @rule(data=st.data())
        def bt_extend(self, data):
            group = self.draw_group(data)
            ids = data.draw(st.lists(maybe_bad(block_ids, st.sampled_from([-1, 2.0, INT32_MAX + 1]), 0.05), max_size=6))
            if data.draw(st.booleans()) and all(type(i) is int and 0 <= i for i in ids):
                ids = np.array(ids, dtype=np.int64)
            self.both(lambda r: r.block_tables[group].extend(ids))

        @rule(data=st.data())
        def bt_truncate(self, data):
            group = self.draw_group(data)
            n = data.draw(st.integers(-1, len(self.model.block_tables[group]) + 1))
            self.both(lambda r: r.block_tables[group].truncate(n))

        @rule(data=st.data())
        def bt_clear(self, data):
            group = self.draw_group(data)
            self.both(lambda r: r.block_tables[group].clear())

        @rule(data=st.data())
        def bt_setitem(self, data):
            group = self.draw_group(data)
            n = len(self.model.block_tables[group])
            index = data.draw(st.integers(-n - 1, n))
            if -n <= index < n:
                block_id = data.draw(maybe_bad(block_ids, st.sampled_from([-1, 1.5])))
            else:  # one fault at a time
                block_id = data.draw(block_ids)
            self.both(lambda r: r.block_tables[group].__setitem__(index, block_id))

        @rule(data=st.data())
        def bt_getitem(self, data):
            group = self.draw_group(data)
            n = len(self.model.block_tables[group])
            index = data.draw(st.integers(-n - 1, n))
            self.both(lambda r: r.block_tables[group][index])

        @rule(data=st.data())
        def bt_release_front(self, data):
            group = self.draw_group(data)
            table = self.model.block_tables[group]
            k = data.draw(st.integers(table.num_released - 1, len(table) + 1))
            self.both(lambda r: r.block_tables[group].release_front(k))

        @rule(data=st.data(), protocol=st.integers(2, pickle.HIGHEST_PROTOCOL))
        def bt_pickle(self, data, protocol):
            group = self.draw_group(data)
            copy = pickle.loads(pickle.dumps(self.real.block_tables[group], protocol=protocol))
            assert type(copy) is backend.BlockTable
            assert observe_table(copy) == observe_table(self.model.block_tables[group])

        # ----------------------------------------------------------------- pickling
        @rule(protocol=st.integers(0, pickle.HIGHEST_PROTOCOL))
        def pickle_round_trip(self, protocol):
            old = self.real
            self.real = pickle.loads(pickle.dumps(old, protocol=protocol))
            assert type(self.real) is backend.Request
            assert self.real is not old
            assert all(a is not b for a, b in zip(self.real.block_tables, old.block_tables))

        # --------------------------------------------------------------- invariants
        @invariant()
        def same_observables(self):
            if self.real is not None:
                assert observe(self.real, views=False) == observe(self.model, views=False)

        @invariant()
        def views_unchanged(self):
            for view, expected, label in self.views:
                assert view.tolist() == list(expected), label
                assert not view.flags.writeable, label

        def teardown(self):
            if self.real is not None:
                assert observe(self.real) == observe(self.model)
            self.views_unchanged()

    RequestMachine.__name__ = f"RequestMachine_{backend.__name__.replace('.', '_')}"
    return RequestMachine


def list_model_states():
    """The real RequestState members (the model keeps states as plain ints)."""
    from tokcy import RequestState

    return list(RequestState)


assert list_model.STATES == tuple(int(s) for s in list_model_states())


def test_request_state_machine(backend):
    machine = make_machine(backend)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=200,
            stateful_step_count=40,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
        ),
    )
