"""End to end on real architectures: the demo engine over tokcy generates what transformers generates.

For each of a small random Llama (Llama-3 RoPE scaling), Mistral (a sliding window shorter
than every prompt, so blocks are released as the window moves) and Qwen2 (q/k/v biases,
tied embeddings), all with grouped-query attention and in float64: the engine's greedy
output equals ``transformers``' own ``generate(..., do_sample=False)``, one request at a
time, in every engine mode and all of them at once. Every iteration the connector's mirror
is compared with the real tokens and blocks; KV blocks are NaN-filled on allocation, so a
read of a position nobody wrote (or of a block released too early) cannot pass by luck.
"""

import pytest
import torch

pytest.importorskip("transformers", reason="the model tests compare with transformers")
pytest.importorskip("safetensors", reason="checkpoint directories are read with safetensors")

from engine_runs import reference_outputs  # noqa: E402
from engine_runs import run_engine as run  # noqa: E402
from model_checkpoints import ARCHITECTURES, random_model  # noqa: E402

from tokcy.demo.engine import Engine, EngineConfig  # noqa: E402
from tokcy.demo.models import load_model  # noqa: E402
from tokcy.demo.models.reference import generate  # noqa: E402
from tokcy.demo.workload import make_workload  # noqa: E402

torch.set_num_threads(1)

# prompts longer than Mistral's window (11), block size 4: releases start inside the prompt
WORKLOAD = make_workload(5, prompt_len=(14, 40), new_tokens=(6, 12), vocab_size=80, seed=11)


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def case(request, tmp_path_factory):
    """(name, transformers model, checkpoint directory, greedy outputs of transformers' generate)."""
    name = request.param
    reference = random_model(name, seed=len(name))
    directory = tmp_path_factory.mktemp(name)
    reference.save_pretrained(directory)
    expected = reference_outputs(generate, reference, WORKLOAD)
    return name, reference, directory, expected


@pytest.fixture(scope="module")
def model(case):
    return load_model(case[2], dtype=torch.float64)


def run_engine(model, workload=WORKLOAD, **overrides):
    settings = dict(num_blocks=64, block_size=4, max_num_tokens=256, max_batch_size=8, check_connector=True,
                    check_inputs=True, poison_kv=True)
    settings.update(overrides)
    return run(model, workload, settings, max_iterations=2000)


def assert_done(engine, outputs, expected, model):
    assert outputs == expected
    assert engine.store.reports == engine.stats.iterations  # every iteration reported and its mirror checked
    assert engine.connector.num_tracked_requests == 0
    assert engine.cache.num_free == engine.cache.num_blocks  # released and finished blocks all came back
    if model.config.sliding_window is not None:
        assert engine.stats.released_blocks > 0
    else:
        assert engine.stats.released_blocks == 0


MODES = {
    "plain": dict(),
    "chunked": dict(max_chunk=7, max_num_tokens=16),  # 7 divides no prompt length of WORKLOAD
    "speculation": dict(speculation=True, max_draft_len=3),
    "overlap": dict(overlap=True),
    "padding": dict(cuda_graph_batch_sizes=(2, 4, 8)),
    "preemption": dict(num_blocks=14, max_chunk=8),
    "everything": dict(num_blocks=14, max_chunk=7, max_num_tokens=24, speculation=True, max_draft_len=3,
                       overlap=True, overlap_resync=2, cuda_graph_batch_sizes=(4, 8)),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_engine_equals_transformers_generate(backend, case, model, mode):
    engine, outputs = run_engine(model, **MODES[mode])
    assert_done(engine, outputs, case[3], model)
    stats = engine.stats
    if mode == "chunked":
        assert all(len(prompt) % 7 for prompt in WORKLOAD.prompts)
        assert stats.context_chunks > sum(len(prompt) // 7 for prompt in WORKLOAD.prompts)
    if mode in ("speculation", "everything"):
        assert stats.drafts_accepted > 0 and stats.drafts_proposed > stats.drafts_accepted
    if mode in ("overlap", "everything"):
        assert stats.device_token_rows > 0
    if mode in ("padding", "everything"):
        assert stats.padding_rows > 0
    if mode in ("preemption", "everything"):
        assert stats.preemptions >= 1


def test_model_object_drives_the_engine_like_the_directory(backend, case):
    name, reference, _, expected = case
    engine, outputs = run_engine(load_model(reference, dtype=torch.float64), max_chunk=9, overlap=True)
    assert outputs == expected


def test_kv_cache_is_sized_by_kv_heads_and_dtype(backend, model):
    engine = Engine(model, EngineConfig(num_blocks=6, block_size=4))
    keys, values = engine.cache.layer(model.config.num_layers - 1)
    assert keys.shape == values.shape == (24, model.config.num_kv_heads, model.config.head_dim)
    assert keys.dtype == torch.float64
    assert model.config.num_kv_heads < model.config.num_heads  # grouped-query attention is exercised


def test_sliding_window_releases_exactly_the_blocks_behind_the_window(backend, case, model, monkeypatch):
    """At every forward, each sequence's block table has released (-1) exactly the leading blocks
    that lie wholly behind the window of its earliest query (a query at p sees p - window + 1 ..
    p), and without a window none."""
    window, block, released_seen = model.config.sliding_window, 4, []
    forward = model.forward

    def checking_forward(inputs, kv_cache):
        cu, positions = inputs.cu_seqlens.tolist(), inputs.position_ids.tolist()
        for s, row in enumerate(inputs.block_table.tolist()[: inputs.num_sequences]):
            first = positions[cu[s]]
            released = next((i for i, b in enumerate(row) if b != -1), len(row))
            expected = 0 if window is None else max(0, first - window + 1) // block
            assert released == expected, (s, first, row)
            released_seen.append(released)
        return forward(inputs, kv_cache)

    monkeypatch.setattr(model, "forward", checking_forward)
    engine, outputs = run_engine(model, max_chunk=6, max_num_tokens=20, num_blocks=20, overlap=True,
                                 speculation=True, max_draft_len=2)
    assert_done(engine, outputs, case[3], model)
    assert engine.stats.preemptions >= 1
    assert max(released_seen) >= (5 if window is not None else 0)


def test_release_behind_worked_example(backend):
    """Window 6, blocks of 4: a query at q sees q - 5 .. q."""
    import tokcy
    from tokcy.demo.kv_cache import PagedKVCache

    cache = PagedKVCache(8, 4, 1, 1, 2, sliding_window=6)
    request = tokcy.Request(0, list(range(20)))
    cache.grow(request, 20)
    table = request.block_tables[0]
    assert table.tolist() == [0, 1, 2, 3, 4] and cache.num_free == 3
    assert cache.release_behind(request, 8) == 0  # sees 3 .. 8: block 0 (0 .. 3) is still needed
    assert cache.release_behind(request, 9) == 1  # sees 4 .. 9
    assert table.tolist() == [-1, 1, 2, 3, 4] and cache.num_free == 4
    assert cache.release_behind(request, 9) == 0  # nothing new
    assert cache.release_behind(request, 17) == 2  # sees 12 .. 17: blocks 1 and 2 (4 .. 11) are behind
    assert table.tolist() == [-1, -1, -1, 3, 4] and cache.num_free == 6
    cache.shrink(request, 14)  # rejected drafts: positions 14 .. 19 dropped, block 4 freed
    assert table.tolist() == [-1, -1, -1, 3] and cache.num_free == 7
    cache.free_all(request)  # released blocks are not freed twice
    assert len(table) == 0 and sorted(cache._free) == list(range(8))
    assert cache.num_released_total == 3
    full = PagedKVCache(8, 4, 1, 1, 2)
    other = tokcy.Request(1, list(range(20)))
    full.grow(other, 20)
    assert full.release_behind(other, 19) == 0 and other.block_tables[0].tolist() == [0, 1, 2, 3, 4]
