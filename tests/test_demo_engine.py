"""End to end: the demo engine built on tokcy generates exactly what the plain reference generates.

Every run also checks, on every iteration, that the offload-store mirror fed by
``tokcy.connector`` equals each scheduled request's real tokens and blocks, and that
tokcy's input arrays equal the "after" pattern's; KV blocks are NaN-filled when
allocated, so a read of an unwritten position cannot pass by luck.
"""

import pytest
import torch

from engine_runs import reference_outputs
from engine_runs import run_engine as run

from tokcy.demo.model import ModelConfig, TinyTransformer
from tokcy.demo.reference import generate
from tokcy.demo.workload import make_workload

torch.set_num_threads(1)

WORKLOAD = make_workload(8, prompt_len=(16, 120), new_tokens=(12, 24), seed=3)


@pytest.fixture(scope="module")
def model():
    return TinyTransformer(ModelConfig())


@pytest.fixture(scope="module")
def reference(model):
    return reference_outputs(generate, model, WORKLOAD)


def run_engine(model, workload=WORKLOAD, **overrides):
    settings = dict(num_blocks=200, block_size=8, max_num_tokens=512, max_batch_size=8, check_connector=True,
                    check_inputs=True, poison_kv=True)
    settings.update(overrides)
    return run(model, workload, settings, max_iterations=5000)


def assert_done(engine, outputs, reference):
    assert outputs == reference
    assert engine.store.reports == engine.stats.iterations  # every iteration was reported and mirrored
    assert engine.connector.num_tracked_requests == 0  # finished requests dropped their state
    assert engine.store.tokens == {} and engine.store.blocks == {}
    assert engine.cache.num_free == engine.cache.num_blocks  # every block came back
    assert engine.scheduler.running == [] and engine.scheduler.waiting == []


def test_plain_decode(backend, model, reference):
    engine, outputs = run_engine(model, max_num_tokens=1024)
    assert_done(engine, outputs, reference)
    assert engine.stats.preemptions == 0
    assert engine.stats.context_chunks == len(WORKLOAD)  # one chunk per prompt


def test_chunked_prefill_with_chunks_that_do_not_divide_the_prompt(backend, model, reference):
    engine, outputs = run_engine(model, max_chunk=7, max_num_tokens=30)
    assert_done(engine, outputs, reference)
    assert any(len(prompt) % 7 for prompt in WORKLOAD.prompts)
    assert engine.stats.context_chunks > sum(len(prompt) // 7 for prompt in WORKLOAD.prompts)


def test_speculation(backend, model, reference):
    engine, outputs = run_engine(model, speculation=True, max_draft_len=4)
    assert_done(engine, outputs, reference)
    stats = engine.stats
    assert stats.drafts_accepted > 0  # prompt lookup found drafts the model agreed with
    assert stats.drafts_proposed > stats.drafts_accepted  # and some were rejected (KV rolled back)


def test_overlap(backend, model, reference):
    engine, outputs = run_engine(model, overlap=True)
    assert_done(engine, outputs, reference)
    assert engine.stats.device_token_rows > 0


def test_padding(backend, model, reference):
    engine, outputs = run_engine(model, cuda_graph_batch_sizes=(1, 2, 4, 8))
    assert_done(engine, outputs, reference)
    assert engine.stats.padding_rows > 0


def test_small_pool_preempts_and_recomputes(backend, model, reference):
    engine, outputs = run_engine(model, num_blocks=24, max_chunk=32)
    assert_done(engine, outputs, reference)
    assert engine.stats.preemptions >= 3
    assert sum(1 for entry in engine.entries.values() if entry.preemptions) >= 2


def test_everything_at_once(backend, model, reference):
    engine, outputs = run_engine(model, num_blocks=24, max_chunk=13, max_num_tokens=40, speculation=True,
                                 overlap=True, overlap_resync=2, cuda_graph_batch_sizes=(4, 8))
    assert_done(engine, outputs, reference)
    stats = engine.stats
    assert stats.preemptions >= 2
    assert stats.drafts_accepted > 0 and stats.device_token_rows > 0 and stats.padding_rows > 0


def test_mirror_is_checked_on_every_iteration(backend, model, monkeypatch):
    from tokcy.demo import connector

    checked = []
    original = connector.OffloadStore.check

    def check(self, request):
        checked.append(request.request_id)
        return original(self, request)

    monkeypatch.setattr(connector.OffloadStore, "check", check)
    small = make_workload(3, prompt_len=(16, 40), new_tokens=(4, 6), seed=5)
    engine, _ = run_engine(model, small, num_blocks=8, max_chunk=9, speculation=True, overlap=True)
    assert len(checked) == engine.stats.scheduled_requests


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_decode_host_work_does_not_grow_with_context(backend, model, overlap):
    """Same decode steps at 256 and 8,192 tokens of context: the same number of tokens go
    into the inputs and into the connector report per decode step (counts, not times)."""
    counts = {}
    for context in (256, 8192):
        workload = make_workload(1, prompt_len=(context, context), new_tokens=(16, 16), seed=7)
        engine, outputs = run_engine(model, workload, num_blocks=context // 16 + 4, block_size=16,
                                     max_num_tokens=512, overlap=overlap, check_connector=False,
                                     check_inputs=False, poison_kv=False)
        assert all(len(tokens) == 16 for tokens in outputs.values())
        counts[context] = engine.stats.decode_counts
    assert counts[256] == counts[8192]
    assert len(counts[256]) >= 14
    assert {rows for rows, _, _ in counts[256]} == {1}  # one input row per decode step
    assert max(tokens for _, tokens, _ in counts[256]) == 1  # at most one new token per report
