"""The bench's floor (tokcy.bench._floor): the same work as tokcy's loops, counted, never timed.

The floor returns, beside its timings, how much it wrote: the token rows of every timed
``prepare`` call, the tokens plus block ids of every timed ``report``, and the bytes every
timed ``attention`` step copied to the device. Those counts must equal what tokcy's own
loops produce for the same batch (the floor is only a fair floor if it does the same work).
"""

import pytest

from tokcy.bench import floor

pytestmark = pytest.mark.skipif(not floor.available(), reason=f"the floor is not built here: {floor.WHY_MISSING}")


@pytest.mark.parametrize("num_generation, seq_len, num_drafts, chunk", [(7, 64, 0, 0), (7, 64, 3, 16), (1, 5, 2, 0)])
def test_prepare_writes_the_rows_prepare_inputs_writes(backend, num_generation, seq_len, num_drafts, chunk):
    from tokcy._baselines.executor import make_batch
    from tokcy.executor import prepare_inputs

    context, generation = make_batch(backend, seq_len, num_drafts, chunk=max(chunk, 1), num_generation=num_generation)
    inputs = prepare_inputs(context if chunk else [], generation, max_draft_len=num_drafts)
    reps, rounds = 3, 2
    seconds, rows = floor._floor.prepare(num_generation, seq_len, num_drafts, chunk, reps, rounds)
    assert len(seconds) == rounds and all(value >= 0 for value in seconds)
    assert rows == reps * rounds * inputs.num_tokens
    assert inputs.num_tokens == chunk + num_generation * (1 + num_drafts)  # by hand


@pytest.mark.parametrize("num_requests, num_tokens", [(3, 64), (5, 30)])
def test_report_copies_the_entries_the_connector_reports(backend, num_requests, num_tokens):
    """Steady decode: every step one token per request, and a block when the length passes
    a multiple of 32; the timed steps are the ones after the warm-up round."""
    from tokcy.bench.connector import BLOCK, DecodeWorld

    reps, rounds = 4, 3
    _, entries = floor._floor.report(num_requests, num_tokens, BLOCK, reps, rounds)
    timed_steps = range(reps + 1, reps * (rounds + 1) + 1)
    by_hand = sum(num_requests * (1 + ((num_tokens + step) % BLOCK == 1)) for step in timed_steps)
    assert entries == by_hand
    world = DecodeWorld(backend, num_requests, num_tokens, "tokcy")  # has reported step 1
    for _ in range(2, reps + 1):
        world.advance()
        world.report()
    reported = 0
    for _ in timed_steps:
        world.advance()
        output = world.report()
        reported += output.num_new_tokens + output.num_new_blocks
    assert reported == by_hand


@pytest.mark.parametrize("seq_len, block_size, num_groups", [(64, 16, 1), (64, 16, 2), (50, 3, 2), (16, 16, 1)])
def test_attention_copies_the_bytes_the_preparer_copies(backend, seq_len, block_size, num_groups):
    """The attention scenario's step (32 requests, one table in 16 touched per step: two a
    step) copies as many bytes in the floor as InputPreparer.prepare does: the same packed
    layout, the same changed entries."""
    pytest.importorskip("torch")
    from tokcy.bench.attention import World
    from tokcy.executor import InputPreparer

    world = World(backend, seq_len, block_size, num_groups, batch=32)
    preparer = InputPreparer(32, 32, block_sizes=(block_size,) * num_groups, max_blocks_per_seq=world.width,
                             max_slots=32)
    preparer.prepare([], world.requests)  # the first step sends every table whole
    sent = []
    for _ in range(3):
        world.touch()
        preparer.prepare([], world.requests)
        sent.append(preparer.last_copy_bytes)
    assert len(set(sent)) == 1  # steady: two tables touched every step
    reps, rounds = 3, 2
    _, copied = floor._floor.attention(32, seq_len, block_size, num_groups, world.every, reps, rounds)
    assert copied == reps * rounds * sent[0]
    if (seq_len, block_size, num_groups) == (64, 16, 1):
        # by hand: kv_lens 32, cu_kv_seqlens 33, table_slots 32, kv_indptr 33, last-page 32,
        # slots 64 (int64), gather blocks 32, live 64, run starts 64, cu_seqlens 33, a word to
        # align the request ids 64, seq_lens, cached, prompt lens, draft lens, device slots 32
        # each, gather ids 32, positions 32; then the ids 32 and two entries of 3 words
        words = 32 + 33 + 32 + 33 + 32 + 64 + 32 + 64 + 64 + 33 + 1 + 64 + 5 * 32 + 32 + 32
        assert sent[0] == 4 * (words + 32 + 2 * 3)


@pytest.mark.parametrize("seq_len, block_size, num_groups", [(64, 16, 1), (50, 3, 2), (16, 16, 2)])
def test_attention_writes_what_the_preparer_sends(backend, seq_len, block_size, num_groups):
    """After the same steps (the first sends every table, then each touches two tables),
    the floor's device buffer holds, byte for byte, what InputPreparer copied to its
    device: every token input, every metadata array and the changed entries, in order."""
    pytest.importorskip("torch")
    from tokcy.bench.attention import World
    from tokcy.executor import InputPreparer

    world = World(backend, seq_len, block_size, num_groups, batch=32)
    preparer = InputPreparer(32, 32, block_sizes=(block_size,) * num_groups, max_blocks_per_seq=world.width,
                             max_slots=32)
    preparer.prepare([], world.requests)
    for _ in range(3):
        world.touch()
        preparer.prepare([], world.requests)
    sent = preparer._device_packed.numpy()[: preparer.last_copy_bytes // 4].tobytes()
    # the floor's world starts as the preparer's after its first step: every row sent
    assert floor._floor.attention_buffer(32, seq_len, block_size, num_groups, world.every, 3) == sent


@pytest.mark.backend_free("the floor is plain C of its own, not a tokcy backend")
def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="reps, rounds >= 1"):
        floor._floor.prepare(4, 16, 0, 0, 0, 1)
    with pytest.raises(ValueError, match=r"num_drafts must be in \[0, 8\]"):
        floor._floor.prepare(4, 16, 9, 0, 1, 1)
    with pytest.raises(ValueError, match="block_size and num_tokens must be >= 1"):
        floor._floor.report(4, 16, 0, 1, 1)
    with pytest.raises(TypeError):
        floor._floor.report(4, 16, 32, 1)
    with pytest.raises(ValueError, match="num_groups 1 or 2"):
        floor._floor.attention(4, 16, 16, 3, 16, 1, 1)
    with pytest.raises(ValueError, match="sizes too large"):
        floor._floor.attention(1, 2**62, 1, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="sizes too large"):
        floor._floor.prepare(1, 2**62, 0, 0, 1, 1)
    with pytest.raises(ValueError, match="2\\*\\*31 entries or more"):
        floor._floor.attention_buffer(2**16, 2**14, 1, 2, 1, 1)


@pytest.mark.backend_free("the floor is plain C of its own, not a tokcy backend")
def test_timing_wraps_the_rounds():
    from tokcy.bench.timing import Plan

    timing = floor.report(Plan(rounds=3, per_round=4), 8, 64, 32)
    assert timing.rounds == len(timing.round_medians) == 3 and timing.per_round == 4 and timing.number >= 1
    assert min(timing.round_medians) <= timing.median <= max(timing.round_medians)


def test_a_floor_round_runs_after_each_of_tokcys_rounds(backend):
    """measure(after_round=...) calls it once per timed round, after the round's samples:
    the floor's round i is the one timed beside tokcy's round i."""
    from tokcy.bench.timing import Plan, measure

    events = []
    rounds = floor.report_rounds(8, 64, 32, Plan(rounds=3, per_round=4))

    def after_round():
        events.append("floor")
        rounds()

    timing = measure(lambda: events.append("step"), Plan(warmup=1, rounds=3, per_round=4), number=1,
                     after_round=after_round)
    timed = events[events.index("floor") - 4 :]  # the first timed round, then the floor's, and so on
    assert timed == (["step"] * 4 + ["floor"]) * 3
    assert len(rounds.round_medians) == timing.rounds == 3
    assert rounds.timing().round_medians == rounds.round_medians


def test_tokcy_over_the_floor_is_the_median_of_the_paired_rounds(backend):
    """A worked example: round medians 10, 30, 20 against floors 5, 5, 2 are ratios 2, 6
    and 10 (median 6), where the ratio of the medians would be 20 / 5 = 4."""
    from tokcy.bench.scenario import Row
    from tokcy.bench.timing import Plan, Timing

    rounds = floor.Rounds(lambda reps, samples: ([5.0] * samples, 0), Plan(rounds=3, per_round=1), 1)
    rounds.round_medians = [5.0, 5.0, 2.0]
    tokcy = Timing(median=20.0, round_medians=[10.0, 30.0, 20.0], rounds=3, per_round=1, warmup=1, number=1)
    assert rounds.ratios(tokcy) == [2.0, 6.0, 10.0]
    row = Row(config={}, values={"tokcy": 20.0, "floor": 5.0}, floor_rounds={"tokcy": rounds.ratios(tokcy)})
    assert row.floor_ratio() == 6.0
    assert Row(config={}, values={"tokcy": 20.0, "floor": 5.0}).floor_ratio() == 4.0  # unpaired: the medians
    assert row.as_dict()["tokcy_over_floor"] == 6.0 and row.as_dict()["floor_rounds"] == {"tokcy": [2.0, 6.0, 10.0]}
