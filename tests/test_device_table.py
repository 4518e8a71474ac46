"""The device block table kept by deltas (CPU tensors here), both backends.

* Random runs (appends, rewinds that free and re-allocate blocks, sliding-window releases,
  pauses, requests leaving and slots handed to new requests, decode batches padded to a
  CUDA-graph size, decode rows whose newest token comes from the device, either reader
  skipping steps): after every step the device rows of the scheduled requests equal their tables,
  the gathered dense and CSR tables equal the host ones, and the connector reading the
  same tables in the same run still passes its mirror check.
* Counting: ``last_copy_bytes`` per decode step does not depend on the context length and
  grows with the batch and with blocks added, not with blocks held.
* With CUDA: the delta-updated table equals a full re-upload over many steps.
"""

import numpy as np
import pytest
import torch

from attention_reference import assert_metadata, attention_reference
from tokcy import RequestState
from tokcy.connector import SchedulerOutputManager
from tokcy.demo.connector import OffloadStore
from tokcy.executor import InputPreparer, prepare_inputs

GENERATING = RequestState.GENERATION_IN_PROGRESS
WIDTH = 64
SLOTS = 6


class World:
    """Requests, a LIFO block pool and two readers of the same tables."""

    def __init__(self, module, rng, block_sizes, device="cpu", device_tables=None):
        self.module, self.rng, self.block_sizes = module, rng, block_sizes
        self.preparer = InputPreparer(64 + SLOTS, SLOTS, block_sizes=block_sizes, max_blocks_per_seq=WIDTH,
                                      max_slots=SLOTS, device=device, device_tables=device_tables)
        self.manager, self.store = SchedulerOutputManager(), OffloadStore()
        self.free = list(range(200, 0, -1))
        self.used_slots = set()
        self.live = []
        self.next_id = 0
        self.events = dict.fromkeys(("leave", "pause", "rewind", "release", "reused slot", "padded", "device rows"), 0)
        # the previous step's sampled tokens on the device, by seq_slot
        self.sampled = torch.arange(1000, 1000 + SLOTS, dtype=torch.int32, device=device)

    def blocks(self, count):
        return [self.free.pop() for _ in range(count)]

    def cover(self, request, num_positions):
        for table, block_size in zip(request.block_tables, self.block_sizes):
            missing = -(-num_positions // block_size) - len(table)
            if missing > 0:
                table.extend(self.blocks(missing))

    def shrink(self, request, num_positions):
        for table, block_size in zip(request.block_tables, self.block_sizes):
            keep = -(-num_positions // block_size)
            if keep < len(table):
                self.free.extend(block for block in table.tolist()[keep:] if block >= 0)
                table.truncate(keep)

    def free_slot(self):
        used = {request.seq_slot for request in self.live}
        return next(slot for slot in range(SLOTS) if slot not in used)

    def add(self):
        prompt_len = int(self.rng.integers(1, 20))
        request = self.module.Request(self.next_id, list(range(prompt_len)), num_layer_groups=len(self.block_sizes))
        self.next_id += 1
        request.seq_slot = self.free_slot()
        self.events["reused slot"] += request.seq_slot in self.used_slots
        self.used_slots.add(request.seq_slot)
        self.live.append(request)

    def step(self, index):
        rng = self.rng
        if len(self.live) < SLOTS and rng.random() < 0.3:
            self.add()
        for request in list(self.live):
            event = rng.random()
            if event < 0.05 or request.get_num_tokens(0) > 56:  # leaves: its slot goes to the next new request
                self.events["leave"] += 1
                self.shrink(request, 0)
                self.live.remove(request)
                self.manager.request_finished(request.request_id)
                self.store.finished(request.request_id)
            elif event < 0.1 and request.state == GENERATING:  # preempted, re-slotted
                self.free.extend(b for t in request.block_tables for b in t.tolist() if b >= 0)
                self.events["pause"] += 1
                request.pause(10_000)
                self.manager.reset_request(request.request_id)
                request.seq_slot = self.free_slot()
            elif event < 0.2 and request.state == GENERATING and request.get_num_tokens(0) > request.prompt_len:
                keep = int(rng.integers(request.prompt_len, request.get_num_tokens(0)))
                if len(self.block_sizes) > 1:  # never back into what the sliding window released
                    keep = max(keep, request.block_tables[1].num_released * self.block_sizes[1] + 1)
                self.events["rewind"] += 1
                request.truncate(keep)  # rejected tokens: their blocks are freed, re-allocated below
                self.shrink(request, keep)
            elif event < 0.3 and request.state == GENERATING and len(self.block_sizes) > 1:
                table, block_size = request.block_tables[1], self.block_sizes[1]
                window = (request.get_num_tokens(0) - 1) // block_size  # keeps the block being written
                before = table.num_released
                table.release_front(max(before, int(rng.integers(0, window + 1))))
                self.events["release"] += table.num_released > before
        context = [r for r in self.live if r.state != GENERATING]
        decoding = [r for r in self.live if r.state == GENERATING]
        # overlap scheduling: some decode rows take their newest token (position n) from the device
        device = [r for r in decoding if rng.random() < 0.25]
        generation = [r for r in decoding if r not in device]
        for request in context:
            self.cover(request, request.prompt_len)
        for request in generation:
            self.cover(request, request.get_num_tokens(0))
        for request in device:
            self.cover(request, request.get_num_tokens(0) + 1)
        batch = {"context": context, "generation": generation, "first_draft": [], "device": device}
        sizes = [SLOTS] if rng.random() < 0.5 else None  # a decode batch is then padded to SLOTS sequences
        if index % 3 or rng.random() < 0.5:  # the device table skips some steps
            inputs = self.preparer.prepare(context, generation, device_token_requests=device,
                                           previous_new_tokens=self.sampled, cuda_graph_batch_sizes=sizes)
            self.events["padded"] += inputs.padded_batch_size > inputs.num_sequences
            self.events["device rows"] += len(device)
            self.check_device(inputs, batch, sizes)
        if index % 4 or rng.random() < 0.5:  # the connector skips others
            self.store.apply(self.manager.build_scheduler_output(context, generation, device))
            for request in context + generation + device:
                self.store.check(request)
        for request in context:
            request.move_to_next_context_chunk()
            request.state = GENERATING
        for request in generation:
            request.add_new_token(int(rng.integers(0, 100)))
        for request in device:  # the token the device sampled reaches the host
            request.add_new_token(int(self.sampled[request.seq_slot]))

    def check_device(self, inputs, batch, sizes):
        table = self.preparer.block_table
        for request in batch["context"] + batch["generation"]:
            for group, real in enumerate(request.block_tables):
                row = table[group, request.seq_slot].tolist()
                assert row == real.tolist() + [0] * (WIDTH - len(real)), (request.request_id, group)
        top, groups = attention_reference(batch, 0, sizes, self.block_sizes, WIDTH)
        assert_metadata(inputs, top, groups, tables=self.preparer.device_tables)
        start = inputs.device_token_row_start
        expected = [int(self.sampled[request.seq_slot]) for request in batch["device"]]
        assert inputs.input_ids[start : start + len(expected)].tolist() == expected
        host = prepare_inputs(batch["context"], batch["generation"], device_token_requests=batch["device"],
                              block_sizes=self.block_sizes, max_blocks_per_seq=WIDTH, cuda_graph_batch_sizes=sizes)
        assert_metadata(host, top, groups)


@pytest.mark.parametrize("block_sizes", [(1,), (4,), (2, 8)])
@pytest.mark.parametrize("device_tables", [None, "dense", "csr", ()])
def test_random_runs(backend, block_sizes, device_tables):
    """Every ``device_tables``: the tables it names equal the reference, the others are None."""
    rng = np.random.default_rng(len(block_sizes) * 100 + block_sizes[0])
    events = {}
    for run in range(6):
        world = World(backend, rng, block_sizes, device_tables=device_tables)
        for index in range(40):
            world.step(index)
        for name, count in world.events.items():
            events[name] = events.get(name, 0) + count
    assert all(events[name] > 0 for name in ("leave", "pause", "rewind", "reused slot", "padded", "device rows")), events
    assert (events["release"] > 0) == (len(block_sizes) > 1), events


def decode_bytes(module, context_len, batch, steps, block_size=16):
    width = -(-(context_len + steps + 1) // block_size)
    preparer = InputPreparer(batch, batch, block_size=block_size, max_blocks_per_seq=width, max_slots=batch)
    requests = []
    for request_id in range(batch):
        request = module.Request(request_id, np.zeros(context_len, dtype=np.int32))
        request.state = GENERATING
        request.seq_slot = request_id
        request.block_tables[0].extend(np.arange(-(-(context_len + 1) // block_size)) + request_id * 100_000)
        requests.append(request)
    preparer.prepare([], requests)  # the first step sends every table whole
    sent = []
    for step in range(steps):
        for request in requests:
            request.add_new_token(1)
            n = request.get_num_tokens(0)
            if n > block_size * len(request.block_tables[0]) - 1:
                request.block_tables[0].append(request.request_id * 100_000 + 50_000 + step)
        preparer.prepare([], requests)
        sent.append(preparer.last_copy_bytes)
    return sent


def test_bytes_per_decode_step_do_not_grow_with_context(backend):
    short = decode_bytes(backend, 2048, 8, 40)
    long = decode_bytes(backend, 131_072, 8, 40)
    assert short == long  # block boundaries fall at the same steps: 2048 and 131072 are multiples of 16
    assert max(short) - min(short) == 8 * 12  # a step where every request gains a block: 8 entries of int64 + int32


def test_bytes_grow_with_the_batch_and_blocks_added_not_blocks_held(backend):
    small, large = decode_bytes(backend, 2048, 4, 20), decode_bytes(backend, 2048, 8, 20)
    assert min(large) > min(small)
    held = decode_bytes(backend, 2048 * 16, 4, 20)
    assert held == small


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_deltas_equal_a_full_upload(backend):
    """Pinned staging, non_blocking copies: after each step every scheduled row of the
    delta-updated table equals the table uploaded whole (World.check_device)."""
    world = World(backend, np.random.default_rng(3), (4, 16), device="cuda")
    assert world.preparer._staging[0].is_pinned()
    for index in range(200):
        world.step(index)


def staged_gather(preparer, name, slot=0):
    """A per-sequence gather field of ring slot ``slot``'s staging buffer (group 0)."""
    return preparer._packed_field(preparer._staging[slot].numpy(), f"{name}/0")


def slotted_requests(backend, rows, generating=False):
    """A Request per (request_id, seq_slot, token count, block ids), tokens 0, 1, ..."""
    requests = []
    for request_id, slot, length, table in rows:
        request = backend.Request(request_id, np.arange(length, dtype=np.int32))
        if generating:
            request.state = GENERATING
        request.seq_slot = slot
        request.block_tables[0].extend(table)
        requests.append(request)
    return requests


def one_group_arrays():
    """kv_lens, cu_kv_seqlens, slot_mapping, kv_indptr, kv_last_page_len for bind(): 2
    sequences, 8 token rows, one group, all zero."""
    return (np.zeros(2, np.int32), np.zeros(3, np.int32), [np.zeros(8, np.int64)], [np.zeros(3, np.int32)],
            [np.zeros(2, np.int32)])


# (prefill, blocks A's window released) -> per sequence (blocks, live, run starts), then
# kv_indptr, kv_indices and the dense rows (4 columns)
GATHER_EXAMPLES = {
    (False, 1): ([3, 1, 0], [2, 1, 0], [17, -2, -3], [0, 2, 3, 3], [31, 32, 40],
                 [[-1, 31, 32, 0], [40, 0, 0, 0], [0, 0, 0, 0]]),
    (True, 0): ([3, 1], [3, 1], [16, -3], [0, 3, 4], [30, 31, 32, 40], [[30, 31, 32, 0], [40, 0, 0, 0]]),
}


@pytest.mark.parametrize("prefill, released", list(GATHER_EXAMPLES), ids=["decode", "context"])
def test_worked_example_what_the_gather_reads(backend, prefill, released):
    """Block size 4, 8 columns, three slots. A (slot 2): 10 tokens, KV 10 -> 3 blocks; B
    (slot 0): 4 tokens, KV 4 -> 1 block. Decode step, padded to 3 (a padding sequence has
    no blocks and reads slot 0), A's first block released (2 live): CSR offsets [0, 2, 3,
    3]; run starts (slot * 8 + blocks - CSR end): A 16 + 3 - 2 = 17, B 0 + 1 - 3 = -2,
    padding 0 + 0 - 3 = -3; the CSR output o of a sequence reads the group's flat table
    entry start + o: A's outputs 0, 1 read entries 17, 18 (slot 2's live blocks), B's
    output 2 entry 0 (slot 0's first). As context chunks (the general writer, no padding;
    nothing released, the chunk covers block 0): A 16 + 3 - 3 = 16, B 0 + 1 - 4 = -3."""
    blocks, live, starts, indptr, indices, dense = GATHER_EXAMPLES[prefill, released]
    requests = slotted_requests(backend, [(7, 2, 10, [30, 31, 32]), (8, 0, 4, [40])], generating=not prefill)
    requests[0].block_tables[0].release_front(released)
    preparer = InputPreparer(32, 4, block_size=4, max_blocks_per_seq=8, max_slots=3)
    context, generation = (requests, []) if prefill else ([], requests)
    inputs = preparer.prepare(context, generation, cuda_graph_batch_sizes=[3])
    padded = inputs.padded_batch_size
    assert padded == len(blocks)
    np.testing.assert_array_equal(staged_gather(preparer, "gather_blocks")[:padded], blocks)
    np.testing.assert_array_equal(staged_gather(preparer, "gather_live")[:padded], live)
    np.testing.assert_array_equal(staged_gather(preparer, "gather_base")[:padded], starts)
    (group,) = inputs.groups
    assert group.kv_indptr.tolist() == indptr
    assert group.kv_indices.tolist() == indices
    assert group.block_table[:, :4].tolist() == dense


def test_binding_the_gather_arrays_checks_them_first(backend):
    """A wrong count or dtype of the gather arrays raises and binds nothing: the writer
    keeps its staging buffer's arrays, and the step after writes them (two sequences of
    block size 4: A, 6 tokens -> 2 blocks, run start 0; B, 3 tokens -> 1 block, run start
    4 + 1 - 3 = 2), never the rejected ones."""
    requests = slotted_requests(backend, [(5, 0, 6, [3, 4]), (6, 1, 3, [5])])
    preparer = InputPreparer(16, 2, block_size=4, max_blocks_per_seq=4, max_slots=2)
    metadata = preparer._host[0].metadata.bound(backend)  # the first staging buffer's writer
    rows = preparer.device_table.rows(backend)
    slots, deltas = np.zeros(2, np.int32), np.zeros(64, np.int32)
    blocks, live, base = np.zeros(2, np.int32), np.zeros(2, np.int64), np.zeros(2, np.int64)
    with pytest.raises(ValueError, match="one gather_blocks, gather_live and gather_base per layer group"):
        metadata.bind_device_table(rows, slots, deltas, [blocks, blocks], [live], [base])
    with pytest.raises(ValueError):  # an int32 array where the run starts (int64) go
        metadata.bind_device_table(rows, slots, deltas, [blocks], [live], [blocks])
    with pytest.raises(ValueError):  # an int32 array where the live blocks (int64: repeat_interleave's counts) go
        metadata.bind_device_table(rows, slots, deltas, [blocks], [blocks], [base])
    with pytest.raises(ValueError, match="delta_area must be 8-byte aligned"):  # int64 indices are written there
        metadata.bind_device_table(rows, slots, deltas[1:], [blocks], [live], [base])
    with pytest.raises(ValueError):  # int64 table slots (int32 on both backends)
        metadata.bind_device_table(rows, base, deltas, [blocks], [live], [base])
    inputs = preparer.prepare(requests, [])
    assert inputs.groups[0].kv_indices.tolist() == [3, 4, 5]
    assert staged_gather(preparer, "gather_blocks")[:2].tolist() == [2, 1]
    assert staged_gather(preparer, "gather_live")[:2].tolist() == [2, 1]
    assert staged_gather(preparer, "gather_base")[:2].tolist() == [0, 2]
    for array in (slots, deltas, blocks, live, base):
        assert not array.any()


def test_the_delta_area_holds_the_ids_then_three_words_per_changed_entry(backend):
    """The changed entries go after the used input ids, from the first even word: request A,
    3 tokens (odd) in one block of 4, sends one entry (its block), so its step needs the
    3 ids, a padding word and 3 words (an int64 index, an int32 value): 7 words. With 6
    it raises, naming the entries, and consumes nothing: with 7 the retry sends that entry.
    A step that changes no entry needs no padding word: its decode row (1 token) fits in 1."""
    (request,) = slotted_requests(backend, [(5, 1, 3, [9])])
    preparer = InputPreparer(16, 2, block_size=4, max_blocks_per_seq=4, max_slots=2, num_staging_buffers=1)
    host = preparer._host[0]
    area = host.metadata._delta_area

    def rebind(words):  # new writers for the staging buffer, its delta area cut to `words`
        host._writers.clear()
        host.metadata._writers.clear()
        host.metadata._delta_area = area[:words]
        preparer._writers[0] = (None, None, None)  # the preparer's own record of them

    rebind(6)
    with pytest.raises(ValueError, match="needs 1 changed block-table entries but the output has room for 0"):
        preparer.prepare([request], [])
    assert request.state != GENERATING and not preparer.block_table.any()
    rebind(7)
    inputs = preparer.prepare([request], [])
    assert inputs.groups[0].kv_indices.tolist() == [9]
    assert preparer.block_table[0, 1].tolist() == [9, 0, 0, 0]
    assert area[4:6].view(np.int64).tolist() == [4] and area[6] == 9  # row 1 x 4 columns + column 0
    assert preparer.last_copy_bytes == 4 * (preparer._input_ids_end + 7)
    request.move_to_next_context_chunk()
    request.state = GENERATING
    request.add_new_token(3)
    rebind(1)
    inputs = preparer.prepare([], [request])
    assert inputs.input_ids.tolist() == [3] and inputs.groups[0].kv_indices.tolist() == [9]
    assert preparer.last_copy_bytes == 4 * (preparer._input_ids_end + 1)


def test_the_device_table_may_hold_at_most_int32_max_entries(backend):
    """DeviceTableRows refuses a table of more than 2**31 - 1 entries (groups x slots x
    columns) before it allocates anything, and sizes below 1."""
    assert backend.DeviceTableRows(1, 1, 2**31 - 1).width == 2**31 - 1
    for max_slots, groups, width in [(1, 1, 2**31), (2**16, 2, 2**14), (3, 1, 2**30)]:
        with pytest.raises(ValueError, match=f"{max_slots * groups} x {width} entries is too large: "
                                             f"it may hold at most 2147483647 entries"):
            backend.DeviceTableRows(max_slots, groups, width)
    for sizes in [(0, 1, 4), (2, 0, 4), (2, 1, 0)]:
        with pytest.raises(ValueError, match="max_slots, layer groups and max_blocks_per_seq must be >= 1"):
            backend.DeviceTableRows(*sizes)


def test_bind_device_table_checks_the_delta_area_before_the_gathers(backend):
    """The twins check in one order: a misaligned delta area is named before a gather
    array of the wrong dtype; an empty area (never written) needs no alignment."""
    metadata = backend.AttentionMetadata()
    metadata.bind(4, *one_group_arrays())
    rows = backend.DeviceTableRows(2, 1, 4)
    deltas = np.zeros(33, np.int32)
    with pytest.raises(ValueError, match="delta_area must be 8-byte aligned"):
        metadata.bind_device_table(rows, np.zeros(2, np.int32), deltas[1:], [np.zeros(2, np.int64)],
                                   [np.zeros(2, np.int64)], [np.zeros(2, np.int64)])
    assert not metadata.has_device_table
    metadata.bind_device_table(rows, np.zeros(2, np.int32), deltas[1:1], [np.zeros(2, np.int32)],
                               [np.zeros(2, np.int64)], [np.zeros(2, np.int64)])
    assert metadata.has_device_table


@pytest.mark.parametrize("wrong", range(7), ids=["kv_lens", "cu_kv_seqlens", "slot_mapping", "kv_indptr",
                                                 "kv_last_page_len", "block_table", "kv_indices"])
def test_bind_refuses_an_array_of_the_wrong_dtype_and_keeps_the_old_ones(backend, wrong):
    """bind() takes each array's dtype as the writer's pointers do (slot_mapping int64, the
    rest int32): one of another dtype raises, and the writer still writes its staging
    buffer (device table included), never the rejected arrays."""
    requests = slotted_requests(backend, [(5, 1, 6, [3, 4])])
    preparer = InputPreparer(16, 2, block_size=4, max_blocks_per_seq=4, max_slots=2)
    metadata = preparer._host[0].metadata.bound(backend)
    arrays = [*one_group_arrays(), [np.zeros((2, 4), np.int32)], [np.zeros(8, np.int32)]]
    if wrong in (0, 1):
        arrays[wrong] = arrays[wrong].astype(np.int64)
    else:
        arrays[wrong] = [arrays[wrong][0].astype(np.int32 if wrong == 2 else np.int64)]
    with pytest.raises(ValueError):
        metadata.bind(4, *arrays)
    assert metadata.has_device_table
    inputs = preparer.prepare(requests, [])
    assert inputs.groups[0].kv_indices.tolist() == [3, 4]
    assert preparer.block_table[0, 1, :2].tolist() == [3, 4]
    for array in arrays[:2] + [group[0] for group in arrays[2:]]:
        assert not array.any()


def test_binding_new_arrays_unbinds_the_device_table(backend):
    """bind() replaces the arrays the device table's were kept with: the writer then has no
    device table (it writes no table slots, gather values or changed entries) until
    bind_device_table() is called again."""
    metadata = backend.AttentionMetadata()
    metadata.bind(4, *one_group_arrays())
    gathers = ([np.zeros(2, np.int32)], [np.zeros(2, np.int64)], [np.zeros(2, np.int64)])
    metadata.bind_device_table(backend.DeviceTableRows(2, 1, 4), np.zeros(2, np.int32), np.zeros(32, np.int32),
                               *gathers)
    assert metadata.has_device_table
    metadata.bind(4, *one_group_arrays())
    assert not metadata.has_device_table


def test_a_writer_whose_device_table_failed_to_bind_is_not_kept(backend):
    """A staging buffer's writer is kept only once its device table is bound: a writer
    without one would leave the table slots and gather arrays apply() reads unwritten."""
    preparer = InputPreparer(16, 2, block_size=4, max_blocks_per_seq=4, max_slots=2)
    staged = preparer._host[0].metadata
    gathers, staged._gathers = staged._gathers, ([], [], [])
    with pytest.raises(ValueError, match="one gather_blocks, gather_live and gather_base per layer group"):
        staged.bound(backend)
    staged._gathers = gathers
    assert staged.bound(backend).has_device_table


def test_a_rejected_bind_keeps_the_arrays_it_had(backend):
    """bind() checks every array before it changes anything: a block table of the wrong
    width raises, and the writer still writes its staging buffer (device table included)."""
    requests = slotted_requests(backend, [(5, 1, 6, [3, 4])])
    preparer = InputPreparer(16, 2, block_size=4, max_blocks_per_seq=4, max_slots=2)
    metadata = preparer._host[0].metadata.bound(backend)
    host = one_group_arrays()
    with pytest.raises(ValueError, match=r"block_table\[0\] must have 4 columns, got 3"):
        metadata.bind(4, *host, [np.zeros((2, 3), np.int32)], [np.zeros(8, np.int32)])
    assert metadata.has_device_table
    inputs = preparer.prepare(requests, [])
    assert inputs.groups[0].kv_indices.tolist() == [3, 4]
    assert preparer.block_table[0, 1, :2].tolist() == [3, 4]
    for array in host[:2]:
        assert not array.any()
