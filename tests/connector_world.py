"""A random engine driving ``tokcy.connector.SchedulerOutputManager``, and a consumer mirror.

``run_case(seed, module)`` plays one random run on the backend ``module`` (``tokcy._core``
or ``tokcy._pure``, already made live by the ``backend`` fixture): requests join, run
chunked prefill and generation (0-4 tokens per step, drafts accepted and rejected by
truncate-then-append, shrink and regrowth between reports), have blocks freed and
re-allocated at already-reported ordinals (truncate then append, or ``table[i] = x``),
sliding-window releases, 1-3 layer groups, ``pause`` and ``reset_request`` replays,
connector-supplied tokens (recorded in context and in generation, where the next report
discards them), generation requests reported as device-token rows, requests skipped for
an iteration, finishing and id reuse.
After every report it applies the report to a ``Mirror`` built only from reports and
asserts the mirror equals each reported request's real beam-0 tokens and block tables,
the computed position and scheduled tokens follow the connector's rules in
docs/connector.md ("Computed position", "Scheduled tokens"), and the manager tracks exactly
the live requests. It returns a transcript of the reports, for differential
comparisons between backends.
"""

import random

from tokcy import RequestState
from tokcy.connector import SchedulerOutputManager


UNCHANGED = 1 << 62


class Mirror:
    """What a connector knows about one request, built only from reports."""

    def __init__(self, data):
        self.tokens = list(data.new_tokens)
        self.blocks = [list(ids) for ids in data.new_block_ids_by_group]
        self._release(data)

    def apply(self, data):
        if data.num_replaced_tokens:
            del self.tokens[len(self.tokens) - data.num_replaced_tokens :]
        self.tokens.extend(data.new_tokens)
        for blocks, replaced, new in zip(self.blocks, data.num_replaced_blocks_by_group, data.new_block_ids_by_group):
            if replaced:
                del blocks[len(blocks) - replaced :]
            blocks.extend(new)
        self._release(data)

    def _release(self, data):
        for blocks, released in zip(self.blocks, data.num_released_blocks_by_group):
            blocks[:released] = [-1] * released


def real_blocks(request):
    return [table.tolist() for table in request.block_tables]


class World:
    def __init__(self, seed, module):
        self.rng = random.Random(seed)
        self.module = module
        self.manager = SchedulerOutputManager()
        self.live = {}  # request id -> Request
        self.mirrors = {}  # request id -> Mirror, for requests whose next report is cached
        self.tracked = set()  # ids the manager must hold state for
        self.matched = {}  # request id -> connector-supplied tokens pending
        self.finished_ids = []
        self.next_id = self.rng.randrange(0, 2**40)
        self.next_block = 0
        self.block_size = self.rng.choice([1, 2, 4, 8])
        self.max_live = self.rng.randint(1, 4)
        self.transcript = []
        self.tokens_reported = 0
        # the test's own model of each buffer's low-water mark: the lowest position
        # written or dropped since the request's last report
        self.low_tokens = {}  # request id -> position
        self.low_blocks = {}  # request id -> [position per group]

    # ------------------------------------------------------------------ helpers
    def token(self):
        return self.rng.randrange(0, 50000)

    def block(self):
        self.next_block += 1
        return self.next_block

    def join(self):
        rng = self.rng
        if self.finished_ids and rng.random() < 0.2:
            request_id = self.finished_ids.pop(rng.randrange(len(self.finished_ids)))  # id reuse
        else:
            request_id = self.next_id
            self.next_id += rng.randint(1, 1000)
        prompt = [self.token() for _ in range(rng.randint(1, 40))]
        request = self.module.Request(request_id, prompt, num_layer_groups=rng.randint(1, 3))
        request.context_chunk_size = rng.randint(1, len(prompt))
        self.allocate(request, request.context_chunk_size)
        self.live[request_id] = request

    def touch_tokens(self, request, position):
        low = self.low_tokens
        low[request.request_id] = min(low.get(request.request_id, UNCHANGED), position)

    def touch_blocks(self, request, group, position):
        low = self.low_blocks.setdefault(request.request_id, [UNCHANGED] * len(request.block_tables))
        low[group] = min(low[group], position)

    def add_token(self, request):
        self.touch_tokens(request, request.get_num_tokens(0))
        request.add_new_token(self.token())

    def truncate(self, request, num_tokens):
        self.touch_tokens(request, num_tokens)
        request.truncate(num_tokens)

    def append_block(self, request, group):
        table = request.block_tables[group]
        self.touch_blocks(request, group, len(table))
        table.append(self.block())

    def allocate(self, request, num_tokens):
        """Grow every table to cover ``num_tokens`` tokens."""
        needed = -(-num_tokens // self.block_size)
        for group, table in enumerate(request.block_tables):
            while len(table) < needed:
                self.append_block(request, group)

    def mutate_blocks(self, request):
        rng = self.rng
        for group, table in enumerate(request.block_tables):
            action = rng.random()
            if action < 0.15 and len(table):  # free from the tail, then re-allocate
                size = len(table)
                kept = rng.randint(0, size)
                self.touch_blocks(request, group, kept)
                table.truncate(kept)
                for _ in range(rng.randint(0, size - len(table) + 1)):
                    self.append_block(request, group)
            elif action < 0.3 and len(table) > table.num_released:  # re-write one block in place
                position = rng.randrange(table.num_released, len(table))
                self.touch_blocks(request, group, position)
                table[position] = self.block()
            elif action < 0.4 and len(table):  # sliding window
                table.release_front(rng.randint(table.num_released, len(table)))
            elif action < 0.5:
                self.append_block(request, group)

    def mutate_generation(self, request):
        rng = self.rng
        prompt_len = request.prompt_len
        action = rng.random()
        if action < 0.3:
            for _ in range(rng.randint(0, 4)):
                self.add_token(request)
        elif action < 0.5:  # drafts: reject some (truncate), then append the accepted + bonus
            n = request.get_num_tokens(0)
            rejected = rng.randint(0, n - prompt_len)
            self.truncate(request, n - rejected)
            for _ in range(rng.randint(0, 4)):
                self.add_token(request)
        elif action < 0.6:  # shrink, regrow
            self.truncate(request, rng.randint(prompt_len, request.get_num_tokens(0)))
            for _ in range(rng.randint(0, 5)):
                self.add_token(request)
        elif action < 0.65:  # the whole generated part rewritten
            self.touch_tokens(request, prompt_len)
            request.set_generated_tokens([[self.token() for _ in range(rng.randint(0, 6))]])
        request.draft_tokens = [self.token() for _ in range(rng.choice([0, 0, 1, 3]))]
        self.allocate(request, request.get_num_tokens(0))

    # ------------------------------------------------------------------ one iteration
    def step(self):
        rng = self.rng
        manager = self.manager
        while len(self.live) < self.max_live and rng.random() < 0.6:
            self.join()
        for request_id, request in list(self.live.items()):
            if request.state == RequestState.GENERATION_IN_PROGRESS:
                if rng.random() < 0.05:
                    request.pause(request.prompt_len + rng.randint(0, request.max_num_generated_tokens))
                    self.mirrors.pop(request_id, None)
                    self.allocate(request, request.context_chunk_size)
                    if request_id in self.matched:  # the cursor is 0 again: re-match
                        manager.record_matched_tokens(request_id, 0)
                        self.matched[request_id] = 0
                else:
                    self.mutate_generation(request)
            self.mutate_blocks(request)
            if rng.random() < 0.05:
                manager.reset_request(request_id)
                self.mirrors.pop(request_id, None)
            if rng.random() < 0.15:  # used by a context row, discarded by any other
                if request.state == RequestState.CONTEXT_INIT:
                    count = rng.randint(0, request.context_current_position)
                else:
                    count = rng.randint(1, 8)
                manager.record_matched_tokens(request_id, count)
                self.matched[request_id] = count
                self.tracked.add(request_id)
        if rng.random() < 0.05:  # unknown ids are ignored
            manager.reset_request(self.next_id + 10**9)
            manager.request_finished(self.next_id + 10**9)
        scheduled = [request for request in self.live.values() if rng.random() < 0.85]
        rng.shuffle(scheduled)
        context = [request for request in scheduled if request.state == RequestState.CONTEXT_INIT]
        generation, device = [], []
        for request in scheduled:
            if request.state != RequestState.CONTEXT_INIT:
                (device if rng.random() < 0.3 else generation).append(request)
        expected = [self.expect(request, "context") for request in context]
        expected += [self.expect(request, "generation") for request in generation]
        expected += [self.expect(request, "device") for request in device]
        if device or rng.random() < 0.5:
            output = manager.build_scheduler_output(context, generation, device)
        else:
            output = manager.build_scheduler_output(context, generation)
        self.check(output, context + generation + device, expected)
        self.advance(context)

    def expect(self, request, kind):
        request_id = request.request_id
        matched = self.matched.pop(request_id, 0)  # pending until the next report, whatever its kind
        n = request.get_num_tokens(0)
        if kind == "context":
            return request_id, request.context_current_position - matched, request.context_chunk_size
        if kind == "generation":
            return request_id, n - 1, 1 + request.num_draft_tokens
        return request_id, n, 1  # device token: fed at position n

    def check(self, output, requests, expected):
        rows = output.requests
        assert len(rows) == len(requests)
        self.transcript.append([row.as_dict() for row in rows])
        assert [data.request_id for data in output.new_requests] == [data.request_id for data in rows if data.is_new]
        assert [data.request_id for data in output.cached_requests] == [
            data.request_id for data in rows if not data.is_new
        ]
        for data, request, (request_id, position, scheduled) in zip(rows, requests, expected):
            assert data.request_id == request_id
            assert data.is_new == (request_id not in self.mirrors), request_id
            assert data.computed_position == position, (request_id, data.computed_position, position)
            assert data.num_scheduled_tokens == scheduled
            if data.is_new:
                assert data.num_replaced_tokens == 0
                assert data.num_replaced_blocks_by_group == [0] * len(request.block_tables)
                self.mirrors[request_id] = Mirror(data)
            else:
                # each change carried once: the delta starts exactly at the lowest changed position
                mirror = self.mirrors[request_id]
                low = min(len(mirror.tokens), self.low_tokens.get(request_id, UNCHANGED))
                assert data.num_replaced_tokens == len(mirror.tokens) - low, request_id
                assert len(data.new_tokens) == request.get_num_tokens(0) - low, request_id
                low_blocks = self.low_blocks.get(request_id, [UNCHANGED] * len(mirror.blocks))
                for blocks, low, replaced, new, table in zip(
                    mirror.blocks,
                    low_blocks,
                    data.num_replaced_blocks_by_group,
                    data.new_block_ids_by_group,
                    request.block_tables,
                ):
                    low = min(len(blocks), low)
                    assert replaced == len(blocks) - low, request_id
                    assert len(new) == len(table) - low, request_id
                mirror.apply(data)
            self.low_tokens.pop(request_id, None)
            self.low_blocks.pop(request_id, None)
            mirror = self.mirrors[request_id]
            assert mirror.tokens == request.get_tokens(0), request_id
            assert mirror.blocks == real_blocks(request), request_id
            self.tracked.add(request_id)
            self.tokens_reported += len(data.new_tokens)
        assert self.manager.tracked_request_ids() == sorted(self.tracked)
        assert self.manager.num_tracked_requests == len(self.tracked)

    def advance(self, context):
        rng = self.rng
        for request in context:
            request.move_to_next_context_chunk()
            if request.context_remaining_length == 0:
                request.state = RequestState.GENERATION_IN_PROGRESS
                self.add_token(request)
            else:
                request.context_chunk_size = rng.randint(1, request.context_remaining_length)
            self.allocate(request, request.get_num_tokens(0))
        for request_id, request in list(self.live.items()):
            if request.state == RequestState.GENERATION_IN_PROGRESS and rng.random() < 0.08:
                request.state = RequestState.GENERATION_COMPLETE
                del self.live[request_id]
                self.manager.request_finished(request_id)
                self.mirrors.pop(request_id, None)
                self.matched.pop(request_id, None)
                self.low_tokens.pop(request_id, None)
                self.low_blocks.pop(request_id, None)
                self.tracked.discard(request_id)
                self.finished_ids.append(request_id)
        assert self.manager.tracked_request_ids() == sorted(self.tracked)


def run_case(seed, module):
    """One random run; returns its transcript (every report's rows as dicts)."""
    world = World(seed, module)
    for _ in range(world.rng.randint(3, 12)):
        world.step()
    return world.transcript
