"""The demo engine's parts on their own: prompt lookup, the block pool, the offload store, the CLI."""


import pytest
import torch

import tokcy
from tokcy import _backend
from tokcy.demo.connector import MirrorMismatch, OffloadStore
from tokcy.demo.kv_cache import PagedKVCache, PoolExhausted
from tokcy.demo.model import ModelConfig, TinyTransformer
from tokcy.demo.reference import full_forward
from tokcy.demo.speculation import NgramIndex, accept, propose
from tokcy.executor import InputPreparer

torch.set_num_threads(1)


# ---------------------------------------------------------------- prompt lookup
def test_ngram_lookup_prefers_the_longest_suffix_and_the_latest_occurrence(backend):
    request = tokcy.Request(0, [1, 2, 3, 9, 2, 3, 7, 5, 2, 3])
    index = NgramIndex(min_ngram=1, max_ngram=3)
    index.extend(request.get_tokens(0))
    # suffix (2, 3) last seen followed by 7 at position 6; (5, 2, 3) never seen before
    assert propose(request, index, 3) == [7, 5, 2]
    assert propose(request, index, 1) == [7]
    assert propose(request, index, 0) == []
    request.add_new_token(7)
    index.extend([7])
    assert propose(request, index, 2) == [5, 2]  # (2, 3, 7) was followed by 5


def test_ngram_lookup_finds_nothing_in_a_fresh_history(backend):
    request = tokcy.Request(0, [1, 2, 3, 4])
    index = NgramIndex()
    index.extend(request.get_tokens(0))
    assert propose(request, index, 4) == []


def test_ngram_index_must_follow_the_request(backend):
    request = tokcy.Request(0, [1, 2, 1])
    index = NgramIndex()
    index.extend([1, 2])
    with pytest.raises(RuntimeError):
        propose(request, index, 2)


@pytest.mark.backend_free("accept() compares two lists of ints; no backend runs")
def test_accept_longest_agreeing_prefix_plus_bonus():
    assert accept([4, 5, 6], [4, 5, 9, 8]) == ([4, 5, 9], 2)
    assert accept([4, 5, 6], [4, 5, 6, 8]) == ([4, 5, 6, 8], 3)
    assert accept([4, 5, 6], [1, 5, 6, 8]) == ([1], 0)
    assert accept([], [3]) == ([3], 0)


# ------------------------------------------------------------------- block pool
def test_pool_fills_the_block_table_and_reuses_freed_blocks_first(backend):
    cache = PagedKVCache(6, 4, 1, 1, 2)
    a, b = tokcy.Request(0, [1] * 5), tokcy.Request(1, [1] * 3)
    cache.grow(a, 5)
    assert a.block_tables[0].tolist() == [0, 1]
    cache.grow(a, 8)  # still two blocks
    assert len(a.block_tables[0]) == 2
    cache.grow(a, 9)
    assert a.block_tables[0].tolist() == [0, 1, 2]
    cache.shrink(a, 5)  # rejected drafts: keep the blocks of positions 0..4
    assert a.block_tables[0].tolist() == [0, 1]
    cache.grow(b, 3)
    assert b.block_tables[0].tolist() == [2]  # the block just freed
    with pytest.raises(PoolExhausted):
        cache.grow(b, 4 * 5)
    assert b.block_tables[0].tolist() == [2]  # all or nothing
    cache.free_all(a)
    assert len(a.block_tables[0]) == 0 and cache.num_free == 5


def test_pool_poison_fills_new_blocks_with_nan(backend):
    cache = PagedKVCache(2, 4, 1, 1, 2, poison=True)
    request = tokcy.Request(0, [1])
    cache.grow(request, 1)
    keys, _ = cache.layer(0)
    assert torch.isnan(keys[:4]).all() and not torch.isnan(keys[4:]).any()


# ---------------------------------------------------------------------- model
def cache_slot(request, position, block_size=4):
    return request.block_tables[0][position // block_size] * block_size + position % block_size


def test_paged_forward_in_chunks_equals_the_full_recompute(backend):
    """The model alone: a prompt fed in three uneven chunks through a scattered block table."""
    model = TinyTransformer(ModelConfig())
    tokens = [(7 * i) % 96 for i in range(23)]
    cache = PagedKVCache(16, 4, model.config.num_layers, model.config.num_heads, model.config.head_dim, poison=True)
    request = tokcy.Request(0, tokens)
    cache.grow(request, 4)
    cache.grow(tokcy.Request(1, [0]), 4)  # someone else's block in between
    cache.grow(request, len(tokens))
    preparer = InputPreparer(32, 2, block_size=4, max_blocks_per_seq=16, max_slots=2)
    request.seq_slot = 1
    logits = None
    for begin, end in ((0, 5), (5, 17), (17, 23)):
        request.context_current_position = begin
        request.context_chunk_size = end - begin
        inputs = preparer.prepare([request], [])
        assert inputs.slot_mapping.tolist() == [cache_slot(request, position) for position in range(begin, end)]
        logits = model.forward(inputs, cache)
    want = full_forward(model, tokens)
    assert torch.allclose(logits[0], want, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- offload store
class Row:
    def __init__(self, request_id, tokens, blocks, replaced_tokens=0, replaced_blocks=0, released=0):
        self.request_id = request_id
        self.new_tokens = tokens
        self.new_block_ids_by_group = [blocks]
        self.num_replaced_tokens = replaced_tokens
        self.num_replaced_blocks_by_group = [replaced_blocks]
        self.num_released_blocks_by_group = [released]


class Report:
    def __init__(self, new=(), cached=()):
        self.new_requests = list(new)
        self.cached_requests = list(cached)


def test_offload_store_applies_replacements_and_releases(backend):
    store = OffloadStore()
    request = tokcy.Request(3, [1, 2, 3])
    request.block_tables[0].extend([4, 5])
    assert store.apply(Report(new=[Row(3, [1, 2, 3], [4, 5])])) == (3, 2)
    store.check(request)
    request.add_new_token(8)
    request.block_tables[0].truncate(1)
    request.block_tables[0].append(9)
    store.apply(Report(cached=[Row(3, [8], [9], replaced_blocks=1)]))
    store.check(request)
    request.block_tables[0].release_front(1)
    store.apply(Report(cached=[Row(3, [], [], released=1)]))
    store.check(request)
    assert store.blocks[3] == [[-1, 9]]
    request.add_new_token(1)
    with pytest.raises(MirrorMismatch):
        store.check(request)  # not reported yet
    with pytest.raises(MirrorMismatch):
        store.apply(Report(cached=[Row(4, [1], [])]))  # never seen as new
    store.finished(3)
    assert store.tokens == {}


# -------------------------------------------------------------------------- cli
def test_cli_small_run_matches_the_reference(backend, capsys):
    from tokcy.demo.cli import main

    assert main(["--requests", "4", "--prompt-len", "16", "48", "--new-tokens", "6", "10", "--num-blocks", "12",
                 "--block-size", "8", "--max-chunk", "11", "--padding", "--graph-sizes", "4", "8"]) == 0
    out = capsys.readouterr().out
    assert f"backend {_backend.BACKEND}," in out
    assert "OK: all 4 requests equal the reference" in out
    for word in ("requests:", "tokens:", "iterations:", "preemptions:", "acceptance rate", "input preparation",
                 "connector report", "model forward", "'after' pattern"):
        assert word in out


def test_cli_help_and_bad_device(backend, capsys):
    from tokcy.demo.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    if not torch.cuda.is_available():
        assert main(["--device", "cuda"]) == 2
