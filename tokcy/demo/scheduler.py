"""Which requests run in the next forward, and how many tokens each: continuous batching.

Per iteration, under a token budget (``max_num_tokens``) and a sequence budget
(``max_batch_size``):

1. running requests that are generating, oldest first: one row, or 1 + k rows when
   prompt lookup found k drafts, or a device-token row when their last token is still
   on the device (overlap mode);
2. running requests in the middle of a chunked prefill, oldest first, then waiting
   requests in arrival order: a chunk of at most ``max_chunk`` tokens (and whatever the
   budget and the free blocks allow; chunks need not divide the prompt).

Every scheduled request gets the KV blocks its rows will write. When a generating
request cannot get them, the newest running request is preempted (its blocks freed,
``Request.pause`` folds its generated tokens into the prompt, it goes back to the waiting
queue and is recomputed later), possibly the request itself. Prefill never preempts; if
nothing at all could be scheduled while requests hold blocks, the newest is preempted
so the others can move.
"""

import bisect
from dataclasses import dataclass, field

import tokcy
from tokcy.demo.speculation import NgramIndex, propose

CONTEXT = tokcy.RequestState.CONTEXT_INIT
GENERATING = tokcy.RequestState.GENERATION_IN_PROGRESS


class Entry:
    """The engine's bookkeeping around one ``tokcy.Request``."""

    __slots__ = ("request", "arrival", "target_len", "ngram", "pending", "device_streak", "preemptions")

    def __init__(self, request, arrival, max_new_tokens, ngram):
        self.request = request
        self.arrival = arrival
        self.target_len = request.get_num_tokens(0) + max_new_tokens
        self.ngram = ngram
        self.pending = False  # the last sampled token is still on the device
        self.device_streak = 0  # consecutive steps whose output was left on the device
        self.preemptions = 0

    @property
    def request_id(self):
        return self.request.request_id

    @property
    def length(self):
        """Tokens including the one still on the device."""
        return self.request.get_num_tokens(0) + self.pending

    @property
    def remaining(self):
        return self.target_len - self.length

    def __lt__(self, other):
        return self.arrival < other.arrival


@dataclass
class Batch:
    context: list = field(default_factory=list)  # entries, chunk size set on the request
    drafted: list = field(default_factory=list)  # generating, host last token, drafts set
    plain: list = field(default_factory=list)  # generating, host last token, no drafts
    device: list = field(default_factory=list)  # generating, last token on the device
    num_tokens: int = 0
    preempted: list = field(default_factory=list)

    @property
    def entries(self):
        return self.context + self.drafted + self.plain + self.device

    def __len__(self):
        return len(self.context) + len(self.drafted) + len(self.plain) + len(self.device)


class Scheduler:
    def __init__(
        self,
        cache,
        *,
        max_num_tokens,
        max_batch_size,
        max_chunk=None,
        speculation=False,
        max_draft_len=0,
        min_ngram=1,
        max_ngram=3,
        on_preempt=None,
    ):
        if max_num_tokens < 1 or max_batch_size < 1:
            raise ValueError("max_num_tokens and max_batch_size must be >= 1")
        self.cache = cache
        self.max_num_tokens = max_num_tokens
        self.max_batch_size = max_batch_size
        self.max_chunk = max_chunk or max_num_tokens
        self.speculation = speculation and max_draft_len > 0
        self.max_draft_len = max_draft_len if self.speculation else 0
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.on_preempt = on_preempt
        self.waiting = []  # sorted by arrival
        self.running = []  # sorted by arrival; every running request has a seq_slot
        self._free_slots = list(range(max_batch_size - 1, -1, -1))
        self._arrivals = 0
        self.num_preemptions = 0

    # ------------------------------------------------------------------ requests
    def add(self, request, max_new_tokens):
        reserve = self.cache.blocks_for(request.get_num_tokens(0) + max_new_tokens + self.max_draft_len)
        if reserve > self.cache.num_blocks:
            raise ValueError(
                f"request {request.request_id} needs up to {reserve} blocks; the pool has {self.cache.num_blocks}"
            )
        ngram = NgramIndex(min_ngram=self.min_ngram, max_ngram=self.max_ngram) if self.speculation else None
        if ngram is not None:
            ngram.extend(request.get_tokens_view(0))
        entry = Entry(request, self._arrivals, max_new_tokens, ngram)
        self._arrivals += 1
        self.waiting.append(entry)
        return entry

    def has_work(self):
        return bool(self.waiting or self.running)

    def finish(self, entry):
        """Forget a finished request: blocks back to the pool, slot released."""
        self.cache.free_all(entry.request)
        self.running.remove(entry)
        self._free_slots.append(entry.request.seq_slot)
        entry.request.seq_slot = None
        entry.request.state = tokcy.RequestState.GENERATION_COMPLETE

    def preempt(self, entry):
        """Send ``entry`` back to the waiting queue; False if it finished instead (its last
        token came over from the device in ``on_preempt``)."""
        if self.on_preempt is not None:
            self.on_preempt(entry)  # e.g. bring a token still on the device to the host first
            if entry not in self.running:
                return False
        request = entry.request
        self.cache.free_all(request)
        self._free_slots.append(request.seq_slot)
        request.pause(request.get_num_tokens(0))  # everything generated becomes prompt
        self.running.remove(entry)
        bisect.insort(self.waiting, entry)
        entry.preemptions += 1
        entry.device_streak = 0
        self.num_preemptions += 1
        return True

    def _admit(self, entry):
        self.waiting.remove(entry)
        bisect.insort(self.running, entry)
        entry.request.seq_slot = self._free_slots.pop()

    # ---------------------------------------------------------------- scheduling
    def schedule(self):
        """The next batch (possibly empty: everything left is waiting for device tokens)."""
        preempted = []
        while True:
            batch = self._schedule_once(preempted)
            stuck = not batch and self.running and not any(entry.pending for entry in self.running)
            if not stuck:
                batch.preempted = preempted
                return batch
            victim = self.running[-1]
            self.preempt(victim)
            preempted.append(victim)

    def _reserve(self, entry, num_positions, preempted):
        """Blocks for ``num_positions`` positions, preempting the newest running requests if needed.

        False when ``entry`` itself had to be preempted.
        """
        while not self.cache.can_grow(entry.request, num_positions):
            victim = self.running[-1]
            if self.preempt(victim):
                preempted.append(victim)
            if victim is entry:
                return False
        self.cache.grow(entry.request, num_positions)
        return True

    def _schedule_once(self, preempted):
        batch = Batch()
        budget = self.max_num_tokens
        sequences = 0

        for entry in list(self.running):
            request = entry.request
            if entry not in self.running or request.state != GENERATING or entry.remaining <= 0:
                continue
            if sequences >= self.max_batch_size or budget < 1:
                break
            n = request.get_num_tokens(0)
            drafts = []
            if entry.pending:
                num_positions = n + 1  # the device token sits at position n
            else:
                if self.speculation:
                    drafts = propose(request, entry.ngram, min(self.max_draft_len, entry.remaining - 1, budget - 1))
                num_positions = n + len(drafts)
            self.cache.release_behind(request, n if entry.pending else n - 1)  # earliest query of this step
            if not self._reserve(entry, num_positions, preempted):
                continue
            request.draft_tokens = drafts
            if entry.pending:
                batch.device.append(entry)
            elif drafts:
                batch.drafted.append(entry)
            else:
                batch.plain.append(entry)
            budget -= 1 + len(drafts)
            sequences += 1

        generating = sum(1 for entry in self.running if entry.request.state == GENERATING)
        for entry in list(self.running) + list(self.waiting):
            if budget < 1 or sequences >= self.max_batch_size:
                break
            request = entry.request
            admitting = entry not in self.running
            if admitting and entry in preempted:
                break  # just preempted for want of blocks: not back in this step
            if admitting and len(self.running) >= self.max_batch_size:
                break
            if not admitting and request.state != CONTEXT:
                continue
            position = request.context_current_position
            if not admitting:
                self.cache.release_behind(request, position)
            free_positions = (len(request.block_tables[0]) + self.cache.num_free) * self.cache.block_size - position
            if admitting:  # leave a block per generating request so admission does not force preemption
                free_positions -= generating * self.cache.block_size
            chunk = min(request.context_remaining_length, self.max_chunk, budget, free_positions)
            if chunk <= 0:
                if admitting:
                    break  # strict arrival order for admission
                continue
            if admitting:
                self._admit(entry)
            request.context_chunk_size = chunk
            self.cache.grow(request, position + chunk)
            batch.context.append(entry)
            budget -= chunk
            sequences += 1

        batch.num_tokens = self.max_num_tokens - budget
        return batch
