"""What an engine needs around a request's life: pause hands back the blocks to free,
BlockTable.clear, the generation budget, and constructor signatures as help() shows them."""

import inspect
import pickle
import re

import pytest

from tokcy import RequestState


def test_pause_returns_the_block_ids_held_per_group_and_empties_the_tables(backend):
    request = backend.Request(3, [1, 2, 3, 4], num_layer_groups=2)
    request.block_tables[0].extend([7, 8, 9])
    request.block_tables[1].extend([20, 21, 22, 23])
    request.block_tables[1].release_front(2)  # a sliding window already freed 20 and 21
    request.add_new_token(5)
    assert request.pause(10) == [[7, 8, 9], [22, 23]]
    assert [table.tolist() for table in request.block_tables] == [[], []]
    assert [table.num_released for table in request.block_tables] == [0, 0]
    assert request.prompt_len == 5 and request.state == RequestState.CONTEXT_INIT


def test_pause_without_blocks_returns_empty_lists(backend):
    assert backend.Request(1, [1]).pause(1) == [[]]


def test_pause_that_raises_keeps_the_blocks(backend):
    request = backend.Request(1, [1, 2, 3])
    request.block_tables[0].extend([4, 5])
    with pytest.raises(ValueError, match="max_input_len 2 is below prompt_len 3"):
        request.pause(2)
    assert request.block_tables[0].tolist() == [4, 5]


def test_block_table_clear_drops_every_entry_and_the_released_count(backend):
    table = backend.BlockTable([1, 2, 3])
    table.release_front(1)
    assert table.clear() is None
    assert (table.tolist(), table.num_released, len(table)) == ([], 0, 0)
    table.append(9)
    assert table.tolist() == [9]


def test_reached_max_new_tokens_counts_the_longest_beam(backend):
    request = backend.Request(1, [1, 2], beam_width=2, max_new_tokens=2)
    assert request.reached_max_new_tokens is False
    request.add_new_token(3, 1)
    assert request.reached_max_new_tokens is False
    request.add_new_token(4, 1)
    assert request.reached_max_new_tokens is True  # beam 1 has generated 2
    request.add_new_token(5, 1)  # tokcy does not refuse: the engine enforces the budget
    assert request.get_num_tokens(1) == 5 and request.reached_max_new_tokens is True


def test_without_a_budget_the_limit_is_never_reached(backend):
    request = backend.Request(1, [1])
    for token in range(100):
        request.add_new_token(token)
    assert request.reached_max_new_tokens is False


def test_a_zero_budget_is_reached_at_once(backend):
    assert backend.Request(1, [1], max_new_tokens=0).reached_max_new_tokens is True


def test_the_budget_survives_pause_and_pickling(backend):
    request = backend.Request(1, [1, 2], max_new_tokens=3)
    request.add_new_token(3)
    request.add_new_token(4)
    request.pause(100)  # 2 generated tokens become prompt: 1 left
    assert (request.max_new_tokens, request.reached_max_new_tokens) == (1, False)
    request.add_new_token(5)
    assert pickle.loads(pickle.dumps(request)).reached_max_new_tokens is True


@pytest.mark.parametrize(
    ("name", "signature"),
    [
        ("Request", "(request_id, prompt, *, beam_width=1, max_new_tokens=None, num_layer_groups=1)"),
        ("BlockTable", "(block_ids=())"),
    ],
)
def test_help_shows_the_real_constructor_signature(backend, name, signature):
    cls = getattr(backend, name)
    assert str(inspect.signature(cls)) == signature
    assert f"{name}{signature}" in inspect.getdoc(cls) or _squeezed(f"{name}{signature}") in _squeezed(_help_text(cls))


def _help_text(cls):
    import pydoc

    return pydoc.render_doc(cls, renderer=pydoc.plaintext)


def _squeezed(text):
    """``text`` without blanks and pydoc's margins (from Python 3.13 help() breaks a long
    signature over lines, one parameter per line)."""
    return re.sub(r"[\s|]+", "", text)


def test_beam_width_is_keyword_only(backend):
    with pytest.raises(TypeError):
        backend.Request(1, [1], 2)
    assert backend.Request(1, [1], beam_width=2).beam_width == 2
