"""Scenario ``soak``: an engine-like loop run long enough to show any growth or drift.

Each iteration is one engine step over a few live requests: requests join (random
prompts) and prefill in chunks; generation rows carry draft tokens that are partly
accepted (appended, then the rejected tail truncated); KV blocks are added as tokens grow,
dropped with rejected tokens and released from the front by a sliding window; requests
are paused (preempted) and finish. Every step goes through ``prepare_inputs`` (into one
``HostBuffers``) and the connector's ``build_scheduler_output``, whose reports a mirror
applies; the mirror is checked against the real tokens and blocks when a request
finishes and at every sample. The resident set size (RSS) is sampled every
``sample_every`` iterations: a flat trend after the first samples means nothing leaks.

Only on request: ``python -m tokcy bench --scenario soak`` (10^6 iterations; ``--quick``:
10^5). Not part of the default run, nor of CI.
"""

from __future__ import annotations

import os
import random
import sys
import time

from tokcy.bench.scenario import Row, Scenario

BLOCK_SIZE = 16
MAX_DRAFT_LEN = 3
LIVE_REQUESTS = 8

SIZES = {  # (iterations, sample every)
    "smoke": ((2_000, 500),),
    "quick": ((100_000, 10_000),),
    "default": ((1_000_000, 100_000),),
    "full": ((3_000_000, 100_000),),
}


def rss_mib() -> float:
    """This process's resident set size in MiB (Linux /proc; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


class Mirror:
    """What a connector knows, rebuilt from the reports alone."""

    def __init__(self):
        self.tokens = {}  # request id -> list of token ids
        self.blocks = {}  # request id -> [list of block ids per group]
        self.checks = 0

    def apply(self, output) -> None:
        tokens, block_ids = output.tokens.tolist(), output.block_ids.tolist()
        token_offsets, group_offsets = output.token_offsets.tolist(), output.group_offsets.tolist()
        block_offsets = output.block_offsets.tolist()
        replaced_blocks, released = output.num_replaced_blocks.tolist(), output.num_released_blocks.tolist()
        for row, request_id in enumerate(output.request_ids.tolist()):
            new = tokens[token_offsets[row] : token_offsets[row + 1]]
            segments = range(group_offsets[row], group_offsets[row + 1])
            if output.is_new[row]:
                self.tokens[request_id] = new
                self.blocks[request_id] = [[] for _ in segments]
            else:
                mine = self.tokens[request_id]
                del mine[len(mine) - int(output.num_replaced_tokens[row]) :]
                mine.extend(new)
            for group, segment in enumerate(segments):
                table = self.blocks[request_id][group]
                del table[len(table) - replaced_blocks[segment] :]
                table.extend(block_ids[block_offsets[segment] : block_offsets[segment + 1]])
                table[: released[segment]] = [-1] * released[segment]

    def check(self, request) -> None:
        """AssertionError unless the mirror equals the request's real tokens and blocks."""
        key = request.request_id
        assert self.tokens[key] == request.get_tokens(0), f"soak: connector mirror of request {key} drifted (tokens)"
        assert self.blocks[key] == [table.tolist() for table in request.block_tables], (
            f"soak: connector mirror of request {key} drifted (blocks)"
        )
        self.checks += 1

    def forget(self, request_id) -> None:
        self.tokens.pop(request_id, None)
        self.blocks.pop(request_id, None)


class Engine:
    """The loop's state: live requests, the connector, the host buffers, the mirror."""

    def __init__(self, module, seed=0):
        from tokcy import RequestState
        from tokcy.connector import SchedulerOutputManager
        from tokcy.executor import HostBuffers

        self.module, self.states = module, RequestState
        self.rng = random.Random(seed)
        self.manager = SchedulerOutputManager()
        self.buffers = HostBuffers(LIVE_REQUESTS * 64 + 64, 2 * LIVE_REQUESTS, MAX_DRAFT_LEN)
        self.mirror = Mirror()
        self.live, self.targets = [], {}
        self.next_id = self.next_block = 0
        self.finished = self.paused = self.drafted = self.rejected = 0

    def join(self) -> None:
        rng = self.rng
        request = self.module.Request(self.next_id, [rng.randrange(32_000) for _ in range(rng.randrange(16, 257))],
                                      num_layer_groups=rng.choice((1, 2)))
        request.context_chunk_size = rng.choice((16, 32, 64))
        self.targets[self.next_id] = request.prompt_len + rng.randrange(8, 129)
        self.next_id += 1
        self.live.append(request)

    def fit_blocks(self, request) -> None:
        """One block per BLOCK_SIZE tokens: add the missing ones, drop the surplus."""
        needed = -(-request.get_num_tokens(0) // BLOCK_SIZE)
        for table in request.block_tables:
            if len(table) > needed:
                table.truncate(needed)
            elif len(table) < needed:
                table.extend(range(self.next_block, self.next_block + needed - len(table)))
                self.next_block += needed - len(table)

    def step(self, check=False) -> None:
        """One iteration; ``check``: compare the mirror with every scheduled request."""
        rng, states = self.rng, self.states
        if len(self.live) < LIVE_REQUESTS and rng.random() < 0.3:
            self.join()
        context = [r for r in self.live if r.state == states.CONTEXT_INIT]
        generation = [r for r in self.live if r.state == states.GENERATION_IN_PROGRESS]
        for request in generation:
            if rng.random() < 0.5:
                request.draft_tokens = [rng.randrange(32_000) for _ in range(rng.randrange(1, MAX_DRAFT_LEN + 1))]
        from tokcy.executor import prepare_inputs

        prepare_inputs(context, generation, max_draft_len=MAX_DRAFT_LEN, out=self.buffers)
        self.mirror.apply(self.manager.build_scheduler_output(context, generation))
        if check:
            for request in context + generation:
                self.mirror.check(request)
        for request in context:
            last = request.is_last_context_chunk
            request.move_to_next_context_chunk()
            if last:
                request.state = states.GENERATION_IN_PROGRESS
                request.add_new_token(rng.randrange(32_000))
            self.fit_blocks(request)
        for request in generation:
            self.advance(request)

    def advance(self, request) -> None:
        rng = self.rng
        drafts = request.num_draft_tokens
        n = request.get_num_tokens(0)
        if drafts:  # the target model's tokens for every draft, then the rejected tail dropped
            self.drafted += 1
            request.add_new_tokens([rng.randrange(32_000)])
            for _ in range(drafts):
                request.add_new_token(rng.randrange(32_000))
            accepted = rng.randrange(drafts + 1)
            self.rejected += drafts - accepted
            self.fit_blocks(request)
            request.truncate(n + 1 + accepted)
            request.draft_tokens = []
        else:
            request.add_new_token(rng.randrange(32_000))
        self.fit_blocks(request)
        table = request.block_tables[-1]
        if len(table) > 6 and rng.random() < 0.05:  # a sliding window frees the oldest blocks
            table.release_front(max(table.num_released, len(table) - 4))
        if request.get_num_tokens(0) >= self.targets[request.request_id]:
            self.finish(request)
        elif rng.random() < 0.01:
            request.pause(request.get_num_tokens(0))
            request.context_chunk_size = rng.choice((16, 32, 64))
            self.paused += 1

    def finish(self, request) -> None:
        # the connector's last report (the tokens generated since), then the mirror is whole
        self.mirror.apply(self.manager.build_scheduler_output([], [request]))
        self.mirror.check(request)
        request.state = self.states.GENERATION_COMPLETE
        self.manager.request_finished(request.request_id)
        self.mirror.forget(request.request_id)
        del self.targets[request.request_id]
        self.live.remove(request)
        self.finished += 1


def soak(module, iterations: int, sample_every: int, seed: int = 0, progress=None):
    """Run the loop; returns (seconds, [(iteration, RSS MiB)], engine)."""
    engine = Engine(module, seed)
    samples = [(0, rss_mib())]
    started = time.perf_counter()
    for iteration in range(1, iterations + 1):
        engine.step(check=iteration % sample_every == 0)
        if iteration % sample_every == 0:
            samples.append((iteration, rss_mib()))
            if progress:
                progress(f"    soak: {iteration:,} iterations, RSS {samples[-1][1]:.1f} MiB")
    return time.perf_counter() - started, samples, engine


def trend(samples) -> str:
    """The RSS samples, and the growth from the second sample (after warm-up) to the last."""
    values = " ".join(f"{mib:.1f}" for _, mib in samples)
    after_warmup = samples[1][1] if len(samples) > 2 else samples[0][1]
    return f"RSS MiB {values}; {samples[-1][1] - after_warmup:+.1f} MiB after the first sample"


class Soak(Scenario):
    name = "soak"
    title = "Soak: an engine loop through prepare_inputs and the connector (requests join, prefill, draft, pause, finish)"
    columns = (("iterations", "iterations"), ("sample_every", "RSS sampled every"))
    implementations = ("tokcy",)
    legend = ("tokcy: seconds per iteration; the note gives iterations/s, the RSS trend and the mirror checks",)

    def configs(self, level: str) -> list:
        return [{"iterations": n, "sample_every": every} for n, every in SIZES.get(level, SIZES["quick"])]

    def run(self, config: dict, backend, plan) -> Row:
        def progress(text):
            print(text, file=sys.stderr, flush=True)

        seconds, samples, engine = soak(backend, config["iterations"], config["sample_every"], progress=progress)
        iterations = config["iterations"]
        note = (
            f"{iterations / seconds:,.0f} iterations/s; {trend(samples)}; {engine.next_id:,} requests joined, "
            f"{engine.finished:,} finished, {engine.paused:,} paused, {engine.drafted:,} drafted steps "
            f"({engine.rejected:,} tokens rejected); connector mirror checked {engine.mirror.checks:,} times, always equal"
        )
        return Row(config=dict(config), values={"tokcy": seconds / iterations}, note=note)


SCENARIO = Soak()
