"""The engine: scheduler, tokcy input preparation, connector report, model forward, sampling.

One ``step()``:

1. the scheduler picks the batch (and preempts if blocks ran out);
2. ``tokcy.executor.InputPreparer.prepare`` builds the flat inputs on the device; rows of
   requests whose last token is still on the device (overlap mode) are filled there from
   the previous step's ``new_tokens`` tensor, indexed by ``seq_slot``;
3. ``tokcy.connector.SchedulerOutputManager.build_scheduler_output`` reports the batch;
   the offload store applies it, and (``check_connector``) its mirror is compared with
   every scheduled request's real tokens and blocks;
4. the model runs the batch against the paged KV cache, from the prepared inputs alone:
   it writes K/V through ``slot_mapping`` and reads them through the device
   ``block_table`` (the preparer keeps that table on the device and sends only what
   changed); greedy tokens are sampled on the device and the single-token results
   scattered into ``new_tokens`` by slot;
5. the host catches up: chunk cursors advance; in overlap mode the previous step's
   tokens are appended now (after this step was launched) and this step's are left on the
   device, except draft verifications, which the next step's scheduling needs at once;
   accepted drafts are appended and the KV blocks of rejected ones are freed; finished
   requests leave (blocks freed, ``request_finished`` sent to the connector).
"""

import time
from dataclasses import dataclass, field

import numpy as np
import torch

import tokcy
from tokcy._baselines.executor import after as prepare_inputs_after
from tokcy.demo.connector import OffloadStore
from tokcy.demo.kv_cache import PagedKVCache
from tokcy.demo.scheduler import GENERATING, Scheduler
from tokcy.demo.speculation import accept


def same_named(source, names):
    """``{name: source.<name>}`` for each of ``names``: settings passed on under their own names."""
    return {name: getattr(source, name) for name in names}


#: The ``EngineConfig`` fields the scheduler takes, as keywords of the same names.
SCHEDULER_SETTINGS = ("max_num_tokens", "max_batch_size", "max_chunk", "speculation", "max_draft_len",
                      "min_ngram", "max_ngram")


@dataclass
class EngineConfig:
    num_blocks: int = 256
    block_size: int = 16
    max_num_tokens: int = 256  # token budget per iteration
    max_batch_size: int = 16  # sequences per iteration (and running requests)
    max_chunk: int | None = None  # prefill chunk cap (None: the token budget)
    speculation: bool = False
    max_draft_len: int = 4
    min_ngram: int = 1
    max_ngram: int = 3
    overlap: bool = False
    overlap_resync: int = 4  # overlap + speculation: sync a request's output after this many device steps
    cuda_graph_batch_sizes: tuple | None = None
    device: str = "cpu"
    check_connector: bool = True  # compare the offload mirror with the real state every iteration
    check_inputs: bool = False  # compare tokcy's host arrays with the "after" pattern every iteration
    time_after_pattern: bool = False  # time the "after" pattern and prepare_inputs on every batch
    poison_kv: bool = False  # NaN-fill blocks on allocation (catches reads of unwritten positions)


@dataclass
class EngineStats:
    iterations: int = 0
    decode_only_iterations: int = 0
    forward_tokens: int = 0
    padding_rows: int = 0
    device_token_rows: int = 0
    scheduled_requests: int = 0
    context_chunks: int = 0
    generated_tokens: int = 0
    drafts_proposed: int = 0
    drafts_accepted: int = 0
    draft_steps: int = 0
    preemptions: int = 0
    released_blocks: int = 0  # blocks a sliding window left behind, released and freed
    time_prepare: float = 0.0  # InputPreparer.prepare (host arrays + device feed)
    time_report: float = 0.0  # build_scheduler_output
    time_forward: float = 0.0  # model forward + sampling
    time_prepare_host: float = 0.0  # tokcy.executor.prepare_inputs alone, same batches
    time_after_pattern: float = 0.0  # the "after" pattern, same batches
    timed_batches: int = 0
    # per decode-only iteration: (input token rows, tokens in the connector report, block ids in it)
    decode_counts: list = field(default_factory=list)


class Engine:
    def __init__(self, model, config=None):
        from tokcy.connector import SchedulerOutputManager
        from tokcy.executor import InputPreparer

        self.model = model
        self.config = config = config or EngineConfig()
        self.device = torch.device(config.device)
        if model.device != self.device:
            raise ValueError(f"model is on {model.device}, engine on {self.device}")
        mc = model.config
        self.cache = PagedKVCache(config.num_blocks, config.block_size, mc.num_layers, mc.num_kv_heads, mc.head_dim,
                                  device=self.device, poison=config.poison_kv, dtype=model.dtype,
                                  sliding_window=getattr(mc, "sliding_window", None))
        self.scheduler = Scheduler(self.cache, on_preempt=self._before_preempt,
                                   **same_named(config, SCHEDULER_SETTINGS))
        self.max_draft_len = self.scheduler.max_draft_len
        pad = max(config.cuda_graph_batch_sizes or (0,))
        # a request holds at most every block of the pool; slots are the scheduler's seq_slots
        self.preparer = InputPreparer(config.max_num_tokens + pad, max(config.max_batch_size, pad),
                                      max_draft_len=self.max_draft_len, device=self.device,
                                      block_size=config.block_size, max_blocks_per_seq=config.num_blocks,
                                      max_slots=config.max_batch_size)
        self.connector = SchedulerOutputManager()
        self.store = OffloadStore()
        self.new_tokens = torch.zeros(config.max_batch_size, dtype=torch.int32, device=self.device)
        self._deferred = None  # (entries, sampled tokens tensor, gather index per entry) of the last step
        self.entries = {}
        self.outputs = {}
        self.stats = EngineStats()

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id, prompt, max_new_tokens):
        if request_id in self.entries:
            raise ValueError(f"request id {request_id} is already used")
        request = tokcy.Request(request_id, prompt, max_new_tokens=max_new_tokens)
        entry = self.scheduler.add(request, max_new_tokens)
        self.entries[request_id] = entry
        return request

    def run(self, max_iterations=None):
        """Step until every request finished; returns {request_id: generated token ids}."""
        while self.scheduler.has_work() or self._deferred is not None:
            if max_iterations is not None and self.stats.iterations >= max_iterations:
                raise RuntimeError(f"not done after {max_iterations} iterations")
            self.step()
        return self.outputs

    # ---------------------------------------------------------------------- step
    def step(self):
        config, stats = self.config, self.stats
        batch = self.scheduler.schedule()
        stats.preemptions += len(batch.preempted)
        stats.released_blocks = self.cache.num_released_total
        if not batch:
            self._catch_up()  # only tokens still on the device remain: bring them over
            return
        stats.iterations += 1
        context = [entry.request for entry in batch.context]
        drafted = [entry.request for entry in batch.drafted]
        plain = [entry.request for entry in batch.plain]
        device = [entry.request for entry in batch.device]
        generation = drafted + plain  # drafted first: the executor's row order, made explicit
        decode_only = not context
        graph_sizes = None
        if decode_only and config.cuda_graph_batch_sizes and len(batch) <= max(config.cuda_graph_batch_sizes):
            graph_sizes = config.cuda_graph_batch_sizes

        t0 = time.perf_counter()
        inputs = self.preparer.prepare(context, generation, device_token_requests=device,
                                       cuda_graph_batch_sizes=graph_sizes, previous_new_tokens=self.new_tokens)
        t1 = time.perf_counter()
        report = self.connector.build_scheduler_output(context, generation, device)
        t2 = time.perf_counter()
        stats.time_prepare += t1 - t0
        stats.time_report += t2 - t1

        received_tokens, received_blocks = self.store.apply(report)
        if config.check_connector:
            for request in context + generation + device:
                self.store.check(request)
        if config.check_inputs or config.time_after_pattern:
            self._compare_inputs(inputs.host, context, generation, device, graph_sizes)
        if decode_only:
            stats.decode_only_iterations += 1
            stats.decode_counts.append((inputs.num_tokens, received_tokens, received_blocks))
        stats.forward_tokens += inputs.num_tokens
        stats.padding_rows += inputs.padded_batch_size - inputs.num_sequences
        stats.device_token_rows += len(device)
        stats.scheduled_requests += len(batch)
        stats.context_chunks += len(context)

        t3 = time.perf_counter()
        sampled, gather_index = self._forward(inputs, batch)
        t4 = time.perf_counter()
        stats.time_forward += t4 - t3

        # the host catches up with the previous step (overlap), then handles this one
        self._catch_up()
        self._after_forward(batch, sampled, gather_index)

    def _forward(self, inputs, batch):
        """Run the model; returns (sampled tokens on the device, index of each entry's first gathered row)."""
        entries = batch.entries
        if self.config.check_inputs:
            expected = [entry.request_id for entry in entries] + [-1] * (inputs.padded_batch_size - len(entries))
            assert inputs.host.request_ids.tolist() == expected, (inputs.host.request_ids, expected)
        with torch.inference_mode():
            logits = self.model.forward(inputs, self.cache)
            sampled = logits.argmax(-1).to(torch.int32)
        # gathered rows: one per context / plain / device sequence, 1 + k per drafted one
        first, index = [], 0
        single_rows, single_slots = [], []
        for kind, group in (("context", batch.context), ("drafted", batch.drafted), ("plain", batch.plain),
                            ("device", batch.device)):
            for entry in group:
                request = entry.request
                first.append(index)
                if kind == "drafted":
                    index += 1 + request.num_draft_tokens
                    continue
                if kind != "context" or request.is_last_context_chunk:
                    single_rows.append(index)
                    single_slots.append(request.seq_slot)
                index += 1
        if single_rows:  # keep the new tokens on the device, by slot, for the device-token path
            rows = torch.tensor(single_rows, device=self.device)
            slots = torch.tensor(single_slots, device=self.device)
            self.new_tokens.index_copy_(0, slots, sampled.index_select(0, rows))
        return sampled, first

    def _after_forward(self, batch, sampled, first):
        overlap, spec = self.config.overlap, self.scheduler.speculation
        now, later = [], []
        drafted = set(map(id, batch.drafted))
        context = set(map(id, batch.context))
        for entry, index in zip(batch.entries, first):
            request = entry.request
            if id(entry) in context:
                last = request.is_last_context_chunk
                request.move_to_next_context_chunk()
                if not last:
                    continue
                request.state = GENERATING
            if id(entry) in drafted:
                now.append((entry, index, True))
            elif overlap and not (spec and entry.device_streak >= self.config.overlap_resync):
                entry.pending = True
                entry.device_streak += 1
                later.append((entry, index))
            else:
                entry.device_streak = 0
                now.append((entry, index, False))
        if now:
            host = sampled.cpu().tolist()
            for entry, index, is_drafted in now:
                if is_drafted:
                    self._verify(entry, host[index : index + 1 + entry.request.num_draft_tokens])
                else:
                    self._append(entry, [host[index]])
        self._deferred = (later, sampled) if later else None

    def _catch_up(self, only=None):
        """Append the tokens still on the device from the last step (all, or ``only`` that entry)."""
        if self._deferred is None:
            return
        later, sampled = self._deferred
        take = later if only is None else [(e, i) for e, i in later if e is only]
        if not take:
            return
        host = sampled.cpu().tolist()
        for entry, index in take:
            entry.pending = False
            self._append(entry, [host[index]])
        rest = [] if only is None else [(e, i) for e, i in later if e is not only]
        self._deferred = (rest, sampled) if rest else None

    def _before_preempt(self, entry):
        if entry.pending:
            self._catch_up(only=entry)
        entry.request.draft_tokens = []
        self.connector.reset_request(entry.request_id)

    def _verify(self, entry, predictions):
        request = entry.request
        drafts = request.draft_tokens
        tokens, accepted = accept(drafts, predictions)
        n = request.get_num_tokens(0)
        request.draft_tokens = []
        stats = self.stats
        stats.draft_steps += 1
        stats.drafts_proposed += len(drafts)
        stats.drafts_accepted += accepted
        # the KV of positions n .. n-1+k was written; only n .. n-1+accepted hold accepted tokens
        self.cache.shrink(request, n + accepted)
        self._append(entry, tokens)

    def _append(self, entry, tokens):
        request = entry.request
        for token in tokens:
            request.add_new_token(token)
        if entry.ngram is not None:
            entry.ngram.extend(tokens)
        self.stats.generated_tokens += len(tokens)
        if request.get_num_tokens(0) >= entry.target_len:
            self._finish(entry)

    def _finish(self, entry):
        request = entry.request
        self.outputs[entry.request_id] = request.get_tokens_range(0, request.orig_prompt_len, entry.target_len)
        self.scheduler.finish(entry)
        self.connector.request_finished(entry.request_id)
        self.store.finished(entry.request_id)

    # ----------------------------------------------------- the "after" pattern, same batch
    def _compare_inputs(self, host, context, generation, device, graph_sizes):
        from tokcy.executor import ARRAY_FIELDS, COUNT_FIELDS, prepare_inputs

        stats = self.stats
        t0 = time.perf_counter()
        ours = prepare_inputs(context, generation, device_token_requests=device, max_draft_len=self.max_draft_len,
                              cuda_graph_batch_sizes=graph_sizes)
        t1 = time.perf_counter()
        after = prepare_inputs_after(context, generation, device_token_requests=device,
                                     cuda_graph_batch_sizes=graph_sizes)
        t2 = time.perf_counter()
        stats.time_prepare_host += t1 - t0
        stats.time_after_pattern += t2 - t1
        stats.timed_batches += 1
        if self.config.check_inputs:
            for name in ARRAY_FIELDS:
                for label, arrays in (("prepare_inputs", ours), ("InputPreparer", host)):
                    got = np.asarray(getattr(arrays, name))
                    want = after[name]
                    if not np.array_equal(got, want):
                        raise AssertionError(f"{label}.{name} = {got.tolist()} but the after pattern gives {want.tolist()}")
            for name in COUNT_FIELDS:
                if getattr(ours, name) != after[name]:
                    raise AssertionError(f"{name}: {getattr(ours, name)} != {after[name]}")
