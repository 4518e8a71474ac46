"""The attention metadata of the common decode sequence (one row, an exact block table per
layer group): the compiled backend plans a run of them with its totals in locals and
writes them in loops of their own, and each table's device-table delta is planned with
it; only the tables that send entries are committed. Checked here, both backends, with
one layer group, two and three (of different block sizes; the compiled plan takes one
group, two and more along three different paths):

* a worked example: exact arrays, the entries each step sends and the device rows;
* random runs mixing that sequence with every other one (Request subclasses, drafts,
  first drafts, shuffled ids, block sizes that are and are not powers of two, released
  blocks, rewinds, rewritten ids, tables refilled through ``__init__``), against the
  independent reference, the device rows against the tables, and the bytes each step
  sends against the other backend running the same script (with the CPU copy and with the
  torch copy a GPU takes);
* errors met inside a run: the same error as the other backend, and nothing consumed.
"""

import numpy as np
import pytest

from attention_reference import assert_metadata, attention_reference
from tokcy import RequestState, _backend
from tokcy.executor import InputPreparer

torch = pytest.importorskip("torch")

GENERATING = RequestState.GENERATION_IN_PROGRESS
SLOTS = 24
WIDTH = 40
MAX_DRAFT_LEN = 2


def decoding(module, request_id, num_tokens, blocks, slot, released=0, more_groups=()):
    """A request in generation; ``more_groups``: the block ids of groups 1 and up."""
    request = module.Request(request_id, list(range(num_tokens)), num_layer_groups=1 + len(more_groups))
    request.state = GENERATING
    request.seq_slot = slot
    request.block_tables[0].extend(blocks)
    request.block_tables[0].release_front(released)
    for table, ids in zip(request.block_tables[1:], more_groups):
        table.extend(ids)
    return request


def test_worked_example_block_size_4(backend):
    # A: 6 tokens, row at position 5 = block 1 (id 11), offset 1: slot 45, last page 2.
    a = decoding(backend, 1, 6, [10, 11], slot=2)
    # B: 4 tokens, position 3 = block 0 (id 7), offset 3: slot 31, last page 4.
    b = decoding(backend, 2, 4, [7], slot=0)
    # C: 9 tokens, position 8 = block 2 (id 8), offset 0: slot 32, last page 1; block 0
    # released by a sliding window: 2 live blocks, its device row reads -1 there.
    c = decoding(backend, 3, 9, [3, 5, 8], slot=1, released=1)
    preparer = InputPreparer(8, 4, block_size=4, max_blocks_per_seq=4, max_slots=4)
    inputs = preparer.prepare([], [a, b, c])
    assert inputs.slot_mapping.tolist() == [45, 31, 32]
    assert inputs.kv_lens.tolist() == [6, 4, 9]
    assert inputs.cu_kv_seqlens.tolist() == [0, 6, 10, 19]
    assert inputs.kv_indptr.tolist() == [0, 2, 3, 5]
    assert inputs.kv_last_page_len.tolist() == [2, 4, 1]
    assert inputs.kv_indices.tolist() == [10, 11, 7, 5, 8]
    assert inputs.block_table.tolist() == [[10, 11, 0, 0], [7, 0, 0, 0], [-1, 5, 8, 0]]
    assert (inputs.max_query_len, inputs.max_kv_len) == (1, 9)
    first_bytes = preparer.last_copy_bytes
    # step 2: A's new token stays in block 1; no table changed: no entry sent
    a.add_new_token(1)
    inputs = preparer.prepare([], [a, b, c])
    assert inputs.slot_mapping.tolist() == [46, 31, 32]
    no_change_bytes = preparer.last_copy_bytes
    # the first step sent 2 + 1 + 3 entries (int64 index, int32 value), from an even word
    # after the 3 ids: one padding word, which a step without entries does not send
    assert first_bytes - no_change_bytes == 4 + 6 * 12
    # step 3: B's new token opens block 1 (id 9); C's window releases block 1: one entry each
    b.add_new_token(1)
    b.block_tables[0].append(9)
    c.block_tables[0].release_front(2)
    inputs = preparer.prepare([], [a, b, c])
    assert preparer.last_copy_bytes - no_change_bytes == 4 + 2 * 12
    assert inputs.slot_mapping.tolist() == [46, 36, 32]
    assert inputs.kv_indptr.tolist() == [0, 2, 4, 5]
    assert inputs.kv_indices.tolist() == [10, 11, 7, 9, 8]
    assert preparer.block_table[0].tolist() == [[7, 9, 0, 0], [-1, -1, 8, 0], [10, 11, 0, 0], [0, 0, 0, 0]]


def lowest_keep(request, block_sizes):
    """The fewest tokens a rewind keeps: a first draft's rows stay after every group's released blocks."""
    return max([request.prompt_len] + [table.num_released * size + MAX_DRAFT_LEN + 1
                                       for table, size in zip(request.block_tables, block_sizes)])


MORE_GROUPS = {1: (2, 3), 3: (4, 2), 16: (32, 8)}  # groups 1 and 2's block sizes beside group 0's


class Run:
    """One backend's requests and preparer, driven by a seeded script."""

    def __init__(self, module, seed, block_size, torch_copy, num_groups=1):
        self.module, self.rng = module, np.random.default_rng(seed)
        self.sizes = ((block_size,) + MORE_GROUPS[block_size])[:num_groups]
        self.preparer = InputPreparer(256, SLOTS, max_draft_len=MAX_DRAFT_LEN, block_sizes=self.sizes,
                                      max_blocks_per_seq=WIDTH, max_slots=SLOTS)
        self.preparer._host_copy = not torch_copy
        subclass = type("Subclassed", (module.Request,), {})  # takes the general loop in both passes
        self.next_block = 1
        self.requests = []
        for slot in range(SLOTS):
            cls = subclass if self.rng.random() < 0.25 else module.Request
            request = cls(slot, list(range(int(self.rng.integers(1, 8 * block_size)))), num_layer_groups=num_groups)
            request.state = GENERATING
            request.seq_slot = slot
            self.cover(request, request.get_num_tokens(0) + 1)
            self.requests.append(request)
        self.kinds = set()

    def cover(self, request, num_positions):
        for table, size in zip(request.block_tables, self.sizes):
            missing = -(-num_positions // size) - len(table)
            if missing > 0:
                table.extend(range(self.next_block, self.next_block + missing))
                self.next_block += missing

    def step(self):
        rng = self.rng
        first_drafts = []
        for request in self.requests:
            group = int(rng.integers(0, len(self.sizes)))  # the table an event on one table changes
            table, size, n = request.block_tables[group], self.sizes[group], request.get_num_tokens(0)
            request.draft_tokens = []
            event = rng.random()
            if event < 0.45:
                request.add_new_token(1)
            elif event < 0.52:
                table[-1] = self.next_block  # a block re-allocated
                self.next_block += 1
            elif event < 0.55:  # the table refilled whole (new ids, none released)
                table.__init__(range(self.next_block, self.next_block + len(table)))
                self.next_block += len(table)
            elif event < 0.65:  # the window frees blocks before the first row any kind would read
                window = max(0, n - MAX_DRAFT_LEN - 1) // size
                table.release_front(max(table.num_released, int(rng.integers(0, window + 1))))
            elif event < 0.72 and n > lowest_keep(request, self.sizes):  # rejected tokens and their blocks
                request.truncate(int(rng.integers(lowest_keep(request, self.sizes), n)))
                for table, size in zip(request.block_tables, self.sizes):
                    table.truncate(max(table.num_released + 1, -(-(request.get_num_tokens(0) + 1) // size)))
            elif event < 0.8:
                request.draft_tokens = [3] * int(rng.integers(1, MAX_DRAFT_LEN + 1))
            elif event < 0.85:
                first_drafts.append(request)
            self.cover(request, request.get_num_tokens(0) + MAX_DRAFT_LEN + 1)
        generation = [request for request in self.requests if request not in first_drafts]
        if rng.random() < 0.3:
            rng.shuffle(generation)
        self.kinds.update(type(request).__name__ + ("+drafts" if request.num_draft_tokens else "")
                          for request in generation)
        return generation, first_drafts


@pytest.mark.parametrize("block_size", [1, 3, 16])
@pytest.mark.parametrize("torch_copy", [False, True])
@pytest.mark.parametrize("num_groups", [1, 2, 3])
def test_random_runs_match_reference_and_other_backend(backend, both_backends, monkeypatch, block_size, torch_copy,
                                                       num_groups):
    other = both_backends[1] if backend is both_backends[0] else both_backends[0]
    runs = {module: Run(module, 4242 + block_size, block_size, torch_copy, num_groups) for module in (backend, other)}
    for _ in range(25):
        sent = {}
        for module, run in runs.items():
            monkeypatch.setattr(_backend, "module", module)
            generation, first_drafts = run.step()
            inputs = run.preparer.prepare([], generation, first_draft_requests=first_drafts)
            # the bytes sent and the changed entries staged after the ids, in order
            ids_end, num_tokens = run.preparer._input_ids_end, inputs.num_tokens
            staged = run.preparer._device_packed[ids_end + num_tokens : run.preparer.last_copy_bytes // 4]
            sent[module] = (run.preparer.last_copy_bytes, staged.tolist())
            if module is backend:
                batch = {"context": [], "generation": generation, "first_draft": first_drafts, "device": []}
                top, groups = attention_reference(batch, MAX_DRAFT_LEN, None, run.sizes, WIDTH)
                assert_metadata(inputs, top, groups)
                for group, rows in enumerate(run.preparer.block_table):
                    for request in run.requests:
                        table = request.block_tables[group].tolist()
                        assert rows[request.seq_slot].tolist() == table + [0] * (WIDTH - len(table))
        assert sent[backend] == sent[other]  # the same entries sent, in the same order
    assert runs[backend].kinds == {"Request", "Request+drafts", "Subclassed", "Subclassed+drafts"}


@pytest.mark.parametrize("num_groups", [1, 2])
def test_an_error_inside_a_run_is_the_other_backends_and_consumes_nothing(backend, both_backends, monkeypatch,
                                                                         num_groups):
    # with two groups the errors lie in group 1 (block size 8), group 0 (block size 4) covers every row
    other = both_backends[1] if backend is both_backends[0] else both_backends[0]
    sizes = (4, 8)[:num_groups]
    more = lambda ids: [ids] if num_groups == 2 else []  # noqa: E731  (group 1's ids)
    results = {}
    for module in (backend, other):
        monkeypatch.setattr(_backend, "module", module)
        preparer = InputPreparer(16, 8, block_sizes=sizes, max_blocks_per_seq=8, max_slots=8)
        requests = [decoding(module, index, 5 + index, [10 * index + 1, 10 * index + 2, 10 * index + 3], slot=index,
                             more_groups=more([100 + index, 110 + index]))
                    for index in range(6)]
        preparer.prepare([], requests)
        requests[1].block_tables[-1][-1] = 99  # a change the failing calls must not consume
        bad_slot = decoding(module, 6, 5, [70, 71], slot=3, more_groups=more([170]))  # slot 3 is request 3's
        # position 12 needs block 3 of group 0 (it has 1), or block 1 of group 1 (it has 1)
        short = decoding(module, 7, 13, [80] if num_groups == 1 else [80, 81, 82, 83], slot=7,
                         more_groups=more([180]))
        context = module.Request(8, [1, 2, 3], num_layer_groups=num_groups)  # a context request among them
        # the last group's block of position 8 (block 2 of group 0, block 1 of group 1) released
        released = decoding(module, 9, 9, [90, 91, 92], slot=6, more_groups=more([190, 191]))
        released.block_tables[-1].release_front(3 if num_groups == 1 else 2)
        # the last group's table longer than max_blocks_per_seq (8)
        too_long = decoding(module, 10, 5, list(range(100, 100 + (9 if num_groups == 1 else 2))), slot=6,
                            more_groups=more(list(range(200, 209))))
        errors = []
        for batch in ([requests[0], requests[1], short, context],  # the first error in order: the blocks
                      [requests[0], context, short],  # the state, before the blocks of a later request
                      requests[:4] + [bad_slot],
                      requests[:2] + [released],
                      requests[:2] + [too_long]):
            with pytest.raises((ValueError, TypeError)) as error:
                preparer.prepare([], batch)
            errors.append((type(error.value), str(error.value)))
        preparer.prepare([], requests)
        results[module] = (errors, preparer.last_copy_bytes, preparer.block_table[-1, 1].tolist())
    assert results[backend] == results[other]
    errors, _, row = results[backend]
    missing = ("request 7 group 0: its rows need 4 blocks, but its block table holds only 1 (position 12 has none)"
               if num_groups == 1 else
               "request 7 group 1: its rows need 2 blocks, but its block table holds only 1 (position 12 has none)")
    last = num_groups - 1
    assert errors == [
        (ValueError, missing),
        (ValueError, "request 8 in generation_requests must be in state GENERATION_IN_PROGRESS, but it is CONTEXT_INIT"),
        (ValueError, "seq_slot 3 is used by both request 3 and request 6"),
        (ValueError, f"request 9 group {last}: position 8 is in block {2 if num_groups == 1 else 1}, which the "
                     f"sliding window released"),
        (ValueError, f"request 10 group {last}: its block table holds 9 blocks, above max_blocks_per_seq 8"),
    ]
    # the change reached the row after the failures
    assert row == ([11, 12, 99] if num_groups == 1 else [101, 99]) + [0] * (8 - (3 if num_groups == 1 else 2))


@pytest.mark.parametrize("num_groups", [1, 2, 3])
def test_planned_blocks_give_the_longest_table_of_any_group(backend, num_groups):
    """``InputWriter.plan`` with block sizes, then ``planned_blocks()``: the longest block
    table of every group (here the last group's 7 blocks) and the live blocks each group's
    kv_indices needs. Two decode rows at position 8, block size 4 (block 2 holds the row):
    3 live blocks per group, but request 1's group 0, which released one."""
    from tokcy.executor import HostBuffers

    out = HostBuffers(8, 4, max_blocks_per_seq=16, num_layer_groups=num_groups)
    writer = out.writer(backend)
    longest = [list(range(70, 77))]  # the last group's table of request 0
    first = decoding(backend, 0, 9, [1, 2, 3] if num_groups > 1 else longest[0], slot=0,
                     more_groups=[[11, 12, 13]] * (num_groups - 2) + longest if num_groups > 1 else ())
    second = decoding(backend, 1, 9, [4, 5, 6], slot=1, released=1, more_groups=[[14, 15, 16]] * (num_groups - 1))
    writer.plan([], [first, second], [], [], 0, None, 0, (4,) * num_groups)
    assert writer.planned_blocks() == (7, (5, 6, 6)[:num_groups])
    writer.write()
