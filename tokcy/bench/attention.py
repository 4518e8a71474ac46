"""Scenario ``attention``: the attention metadata of a decode step, tokcy against two baselines.

Batch: 256 generation requests of L tokens each (one row per request), block size 16 or
256, one or two layer groups (both with the same block size and full tables). Every step
one request in 16 (block 16) or in 256 (block 256) has its last block id rewritten,
standing in for the new block a decode step allocates every ``block_size`` tokens, so
tokcy's device table has something to send; every implementation pays that same touch.

Implementations (seconds of host work per step):

* ``tokcy``: ``InputPreparer.prepare`` with the block size: the one pass (tokens and all
  metadata), the changed entries staged, the packed copy launched. The device-side work
  (scatter of the changed entries, gather of the batch's dense and CSR tables) is GPU work
  on a GPU; on a CPU it is CPU work, so while timing the host step it is replaced by a
  stub (``DeviceBlockTable.apply``) and timed on its own: the ``device-side`` note;
* ``prepare_inputs``: today's ``prepare_inputs`` alone (tokens, no metadata), the goal's yardstick;
* ``preparer``: ``InputPreparer.prepare`` without a block size (tokens only, staged and
  copied): the same Python and copy overhead as ``tokcy``, so ``tokcy / preparer`` is what
  the metadata adds;
* ``small_engine``: (a) the small-engine pattern: per request the block table as a Python
  list, slot and lengths in Python, the tables padded per step, new tensors per step;
* ``vllm``: (b) the vLLM pattern: a persistent numpy ``[requests, max_blocks]`` table
  (kept by the engine as blocks are allocated: not timed), numpy slot mapping, and the
  batch's full rows copied to a persistent device tensor every step;
* ``floor``: ``tokcy``'s step as plain C over C arrays, timed in C (``tokcy.bench._floor``):
  the touch, the token row and the metadata of every request, the changed device-table
  entries, the staging buffer's used prefix copied; the same bytes as tokcy's copy.

Notes per row: the bytes each sends host-to-device per step, and the host-only dense and
CSR tables of ``prepare_inputs(..., block_size=...)`` as bandwidth against a numpy copy of
the same bytes (those tables are O(blocks held) by construction).

Goals (the compiled core's; each read from the same run, with a verdict): tokcy within 1.5x
of ``prepare_inputs`` on every row; at L = 131,072 and block 16, at least 5x less host work
than ``vllm`` and 20x less than ``small_engine``; flat in L (L = 131,072 within 1.2x of
L = 2,048, block 16, one group); tokcy's bytes per step the same at every L; the host
tables at least half a numpy copy's bandwidth; tokcy within 3x of the floor on every row.
The ratios of two figures read rounds timed side by side (``timing.Beside``):
``prepare_inputs`` and the floor are timed a round at a time right after each of tokcy's
rounds, the numpy copy right after each of the host tables' rounds, and the row of
L = 131,072 (block 16, one group) times tokcy on a world of L = 2,048 beside its own.
"""

from __future__ import annotations

import numpy as np

from tokcy.bench import floor, goals
from tokcy.bench.report import format_config
from tokcy.bench.scenario import Goal, Row, Scenario, median_or_ratio, pair_key
from tokcy.bench.timing import StepBeside, after_each, measure

BATCH = 256
CONFIGS = {
    "smoke": ((64, 16, 1), (64, 16, 2)),
    "quick": ((2_048, 16, 1), (131_072, 16, 1)),
    "default": ((2_048, 16, 1), (131_072, 16, 1), (131_072, 256, 1), (131_072, 16, 2)),
    "full": tuple((L, bs, g) for g in (1, 2) for bs in (16, 256) for L in (2_048, 32_768, 131_072)),
}
# the goals: tokcy / prepare_inputs at most PREPARE_FACTOR on every row; at L = LONG and block
# GOAL_BLOCK, at least VLLM_FACTOR and SMALL_ENGINE_FACTOR less host work than those
# patterns; tokcy at L = LONG within FLAT_FACTOR of tokcy at L = SHORT (block GOAL_BLOCK, one
# group); the host tables at least TABLES_SHARE of a numpy copy's bandwidth; tokcy within
# FLOOR_FACTOR of the floor (as the executor's and the connector's goals)
PREPARE_FACTOR, VLLM_FACTOR, SMALL_ENGINE_FACTOR, FLAT_FACTOR, TABLES_SHARE = 1.5, 5, 20, 1.2, 0.5
FLOOR_FACTOR = 3.0
SHORT, LONG, GOAL_BLOCK = 2_048, 131_072, 16
PREPARE_PAIR = pair_key("tokcy", "prepare_inputs")
FLAT_PAIR = pair_key("tokcy", f"tokcy at L = {SHORT:,}")  # its paired rounds, in the flat row
TABLES_PAIR = pair_key("host tables", "numpy copy")
BYTES = "tokcy bytes per step"  # Row.counts key


def touch_every(block_size):
    """One request in this many gets a new block per step (16 at block 16, 256 at 256)."""
    return 16 if block_size <= 16 else 256


class World:
    """256 decode requests of ``seq_len`` tokens with full block tables, and the touch."""

    def __init__(self, backend, seq_len, block_size, num_groups, batch=BATCH):
        from tokcy import RequestState

        self.block_size, self.num_groups = block_size, num_groups
        self.width = -(-(seq_len + 1) // block_size)
        prompt = np.arange(seq_len, dtype=np.int32) % 50_000
        self.requests = []
        for index in range(batch):
            request = backend.Request(index, prompt, num_layer_groups=num_groups)
            request.state = RequestState.GENERATION_IN_PROGRESS
            request.seq_slot = batch - 1 - index  # slots out of batch order, as an engine's are
            for group, table in enumerate(request.block_tables):
                table.extend(np.arange(self.width, dtype=np.int32) + (group * batch + index) * self.width)
            self.requests.append(request)
        self.every = touch_every(block_size)
        # per step phase, the tables that step touches and the id it writes into each (the
        # one there, so the tables stay as they are): an engine's allocator writes a new
        # block id into a table it holds, with no lookup through the request per step
        self.phases = [[(request.block_tables[0], request.block_tables[0][-1])
                        for request in self.requests[phase :: self.every]] for phase in range(self.every)]
        self.step_index = 0

    def touch(self):
        """A decode step's new blocks: write the last block id of a few requests."""
        self.step_index += 1
        for table, block_id in self.phases[self.step_index % self.every]:
            table[-1] = block_id


def small_engine(world):
    """(a): per step, Python lists from every block table, padded, then new tensors."""
    import torch

    def step():
        world.touch()
        bs = world.block_size
        out = []
        for group in range(world.num_groups):
            input_ids, positions, slots, kv_lens, tables = [], [], [], [], []
            for request in world.requests:
                n = request.get_num_tokens(0)
                table = request.block_tables[group].tolist()
                input_ids.append(request.get_last_tokens(0))
                positions.append(n - 1)
                slots.append(table[(n - 1) // bs] * bs + (n - 1) % bs)
                kv_lens.append(n)
                tables.append(table)
            width = max(len(table) for table in tables)
            padded = [table + [0] * (width - len(table)) for table in tables]
            out.append((torch.tensor(input_ids, dtype=torch.int32), torch.tensor(positions, dtype=torch.int64),
                        torch.tensor(slots, dtype=torch.int64), torch.tensor(kv_lens, dtype=torch.int32),
                        torch.tensor(padded, dtype=torch.int32)))
        return out

    width = max(len(request.block_tables[0]) for request in world.requests)
    sent = world.num_groups * len(world.requests) * (4 + 8 + 8 + 4 + 4 * width)
    return step, sent


def vllm(world):
    """(b): persistent numpy table, numpy slots, the batch's full rows copied every step."""
    import torch

    count = len(world.requests)
    bs = world.block_size
    tables = [np.zeros((count, world.width), dtype=np.int32) for _ in range(world.num_groups)]
    for group, table in enumerate(tables):
        for index, request in enumerate(world.requests):
            ids = request.block_tables[group].tolist()  # (a view would make every touch copy-on-write)
            table[index, : len(ids)] = ids
    positions = np.array([request.get_num_tokens(0) - 1 for request in world.requests], dtype=np.int64)
    rows = np.arange(count)
    device_tables = [torch.zeros((count, world.width), dtype=torch.int32) for _ in tables]
    device_slots = [torch.zeros(count, dtype=torch.int64) for _ in tables]
    device_lens = torch.zeros(count, dtype=torch.int32)

    def step():
        world.touch()
        kv_lens = (positions + 1).astype(np.int32)
        device_lens.copy_(torch.from_numpy(kv_lens))
        for table, device_table, device_slot in zip(tables, device_tables, device_slots):
            slots = table[rows, positions // bs].astype(np.int64) * bs + positions % bs
            device_slot.copy_(torch.from_numpy(slots))
            device_table.copy_(torch.from_numpy(table))  # the batch's full rows

    sent = count * 4 + world.num_groups * count * (8 + 4 * world.width)
    return step, sent


def tokcy_preparer(world):
    """tokcy's host step with the device-side part stubbed out; that part timed apart."""
    from tokcy.executor import InputPreparer

    sizes = (world.block_size,) * world.num_groups
    preparer = InputPreparer(len(world.requests), len(world.requests), block_sizes=sizes,
                             max_blocks_per_seq=world.width, max_slots=len(world.requests))
    preparer.prepare([], world.requests)  # the first step sends every table whole
    table = preparer.device_table
    real_apply = table.apply
    views = preparer._batch_views(len(world.requests))  # (table slots, kv_indptr, what the gather reads)
    outputs = real_apply(preparer._device_packed, preparer._device_packed_int64, 0, 0, views[0], views[2],
                         _indices(world, sizes))
    recorded = []
    table.apply = lambda *args: recorded.append(args) or outputs  # one step records what apply is given

    def step():
        world.touch()
        preparer.prepare([], world.requests)

    step()
    table.apply = lambda *args: outputs  # the timed steps: the stub alone
    bytes_sent = preparer.last_copy_bytes
    device_side = lambda: real_apply(*recorded[0])  # noqa: E731
    return step, bytes_sent, device_side


def _indices(world, sizes):
    n = world.requests[0].get_num_tokens(0)
    return [len(world.requests) * -(-n // size) for size in sizes]


def host_tables(world):
    """prepare_inputs writing the dense and CSR tables on the host, and a numpy copy of as many bytes."""
    from tokcy.executor import HostBuffers, prepare_inputs

    sizes = (world.block_size,) * world.num_groups
    out = HostBuffers(len(world.requests), len(world.requests), max_blocks_per_seq=world.width,
                      num_layer_groups=world.num_groups)
    inputs = prepare_inputs([], world.requests, block_sizes=sizes, out=out)
    table_bytes = sum(group.block_table.nbytes + group.kv_indices.nbytes for group in inputs.groups)
    source = np.ones(table_bytes // 4, dtype=np.int32)
    target = np.empty_like(source)
    return (lambda: prepare_inputs([], world.requests, block_sizes=sizes, out=out),
            lambda: np.copyto(target, source), table_bytes)


class Attention(Scenario):
    name = "attention"
    title = "Attention metadata: host work of a decode step, 256 requests of L tokens"
    columns = (("seq_len", "L (tokens)"), ("block_size", "block"), ("groups", "groups"))
    implementations = ("tokcy", "prepare_inputs", "preparer", "small_engine", "vllm", "floor")
    needs = ("torch", "tokcy.executor")
    legend = (
        "tokcy: InputPreparer.prepare with a block size (tokens + slot mapping + KV lengths + CSR offsets, changed "
        "block-table entries staged, one packed copy); device-side scatter/gather stubbed out and timed apart",
        "prepare_inputs: today's token inputs alone, each round timed right after one of tokcy's; preparer: "
        "InputPreparer.prepare without a block size; small_engine: (a) padded Python lists + new tensors per step; "
        "vllm: (b) persistent numpy table, numpy slots, full rows copied per step; floor: tokcy's step as plain C "
        "over C arrays (the touch, tokens, metadata, changed entries, the packed copy), timed in C; tokcy/floor: the "
        "median over rounds of tokcy's round over the floor's, timed right after it",
    )
    plot_x = "seq_len"
    plot_xlabel = "sequence length L (tokens), block 16, one group"

    def configs(self, level):
        return [{"seq_len": L, "block_size": bs, "groups": g} for L, bs, g in CONFIGS[level]]

    def describe(self, config):
        return f"L={config['seq_len']:,} block={config['block_size']} groups={config['groups']}"

    def run(self, config, backend, plan):
        from tokcy.executor import HostBuffers, InputPreparer, prepare_inputs

        batch = 64 if config["seq_len"] <= 64 else BATCH
        world = World(backend, config["seq_len"], config["block_size"], config["groups"], batch=batch)
        tokcy_step, tokcy_bytes, device_side = tokcy_preparer(world)
        small_step, small_bytes = small_engine(world)
        vllm_step, vllm_bytes = vllm(world)
        plain = HostBuffers(len(world.requests), len(world.requests))
        tokens_only = InputPreparer(len(world.requests), len(world.requests))
        steps = {
            "tokcy": tokcy_step,
            "preparer": lambda: (world.touch(), tokens_only.prepare([], world.requests)),
            "small_engine": small_step,
            "vllm": vllm_step,
        }
        # tokcy's rounds each followed by one of prepare_inputs and, at the flat goal's long
        # row, one of tokcy on a world of the short L (as the executor scenario pairs them)
        host_rounds = StepBeside(lambda: (world.touch(), prepare_inputs([], world.requests, out=plain)), plan,
                                 number=None)
        short = None
        if goals.goals_read_pairs(backend) and (config["seq_len"], config["block_size"], config["groups"]) == (
                LONG, GOAL_BLOCK, 1):
            short = StepBeside(tokcy_preparer(World(backend, SHORT, GOAL_BLOCK, 1, batch=batch))[0], plan,
                               number=None)
        floor_rounds = floor.attention_rounds(len(world.requests), config["seq_len"], config["block_size"],
                                              config["groups"], world.every, plan)
        beside = after_each([rounds for rounds in (host_rounds, short, floor_rounds) if rounds is not None])
        timings = {name: measure(step, plan, after_round=beside if name == "tokcy" else None)
                   for name, step in steps.items()}
        timings["prepare_inputs"] = host_rounds.timing()
        timings["floor"] = floor_rounds.timing() if floor_rounds else None
        timings = {name: timings[name] for name in self.implementations}
        paired = {PREPARE_PAIR: host_rounds.ratios(timings["tokcy"])}
        if short is not None:
            paired[FLAT_PAIR] = short.ratios(timings["tokcy"])
        device_timing = measure(device_side, plan)
        tables_step, copy_step, table_bytes = host_tables(world)
        copy_rounds = StepBeside(copy_step, plan, number=None)
        tables_timing = measure(tables_step, plan, after_round=copy_rounds)
        paired[TABLES_PAIR] = copy_rounds.ratios(tables_timing)
        bandwidth = table_bytes / tables_timing.median / 1e9
        copy_bandwidth = table_bytes / copy_rounds.timing().median / 1e9
        note = (f"L={config['seq_len']:,} block={config['block_size']} groups={config['groups']}: bytes H2D per step "
                f"tokcy {tokcy_bytes:,}, small_engine {small_bytes:,}, vllm {vllm_bytes:,}; device-side "
                f"scatter+gather (CPU) {device_timing.median * 1e6:.1f} us; host dense+CSR tables "
                f"{bandwidth:.2f} GB/s vs numpy copy {copy_bandwidth:.2f} GB/s ({table_bytes:,} bytes)")
        return Row(config=dict(config), values={name: (t.median if t else None) for name, t in timings.items()},
                   timings={name: t.as_dict() for name, t in timings.items() if t}, note=note, paired_rounds=paired,
                   floor_rounds={"tokcy": floor_rounds.ratios(timings["tokcy"])} if floor_rounds else {},
                   counts={BYTES: tokcy_bytes})

    def goals(self, rows, backend):
        if backend == "python":  # the pure twin is the readable reference; these goals are the compiled core's
            return []
        long_label, short_label = (f"L = {length:,}" for length in (LONG, SHORT))
        at_long = lambda c: (c["seq_len"], c["block_size"]) == (LONG, GOAL_BLOCK)  # noqa: E731
        where = f"{long_label}, block {GOAL_BLOCK}"
        return [
            within_prepare_inputs(rows),
            goals.speedup_at_least(rows, "vllm", VLLM_FACTOR, at_long, where),
            goals.speedup_at_least(rows, "small_engine", SMALL_ENGINE_FACTOR, at_long, where),
            goals.flat(rows, lambda c: (c["seq_len"], c["block_size"], c["groups"]) == (SHORT, GOAL_BLOCK, 1),
                       lambda c: (c["seq_len"], c["block_size"], c["groups"]) == (LONG, GOAL_BLOCK, 1), FLAT_FACTOR,
                       f"tokcy flat in L: {long_label} within {FLAT_FACTOR:g}x of {short_label} (block {GOAL_BLOCK}, "
                       "one group)", (short_label, long_label), paired=FLAT_PAIR),
            bytes_independent_of_length(rows),
            tables_bandwidth(rows),
            within_floor(rows),
        ]

    def plot_series(self, rows):
        return super().plot_series([row for row in rows if (row.config["block_size"], row.config["groups"]) == (16, 1)])


def shape(config) -> str:
    """'L = 131,072, block 16, 2 groups': the row a verdict names."""
    groups = config["groups"]
    return f"L = {config['seq_len']:,}, block {config['block_size']}, {groups} group{'s' if groups != 1 else ''}"


def within_prepare_inputs(rows, factor=PREPARE_FACTOR) -> Goal:
    """tokcy / prepare_inputs at most ``factor`` on every row (the median of their paired
    rounds' ratios where a row has them), the worst row named."""
    text = f"tokcy within {factor:g}x of prepare_inputs on every row (a step with all the metadata over the " \
           "token inputs alone)"
    return worst_ratio(rows, lambda row: row.paired_ratio("tokcy", "prepare_inputs"), text, factor, "not run")


def worst_ratio(rows, ratio_of, text, factor, missing) -> Goal:
    """The goal ``text``: ``ratio_of(row)`` at most ``factor`` on every row that has one, the
    worst row named (``missing``: the verdict's text when no row has one)."""
    ratios = [(ratio, row.config) for row in rows if (ratio := ratio_of(row))]
    if not ratios:
        return Goal(text, missing, None)
    worst, config = max(ratios, key=lambda pair: pair[0])
    return Goal(text, f"worst {worst:.2f}x, at {shape(config)}", worst <= factor)


def bytes_independent_of_length(rows) -> Goal:
    """tokcy's bytes per step the same at every L, for each (block, groups) run at two L or more."""
    text = "tokcy's bytes per step independent of L (each block size and group count run at two L or more)"
    by_shape = {}
    for row in rows:
        if BYTES in row.counts:
            key = (row.config["block_size"], row.config["groups"])
            by_shape.setdefault(key, {})[row.config["seq_len"]] = row.counts[BYTES]
    compared = {key: sent for key, sent in by_shape.items() if len(sent) >= 2}
    if not compared:
        return Goal(text, "no block size and group count run at two L", None)
    parts, same = [], True
    for (block, groups), sent in sorted(compared.items()):
        figures = sorted(set(sent.values()))
        same = same and len(figures) == 1
        where = f"block {block}, {groups} group{'s' if groups != 1 else ''}"
        if len(figures) == 1:
            parts.append(f"{format_config(figures[0])} B at L = {', '.join(map(format_config, sorted(sent)))} ({where})")
        else:
            each = ", ".join(f"{format_config(sent[length])} B at L = {length:,}" for length in sorted(sent))
            parts.append(f"{each} ({where})")
    return Goal(text, "; ".join(parts), same)


def within_floor(rows, factor=FLOOR_FACTOR) -> Goal:
    """tokcy / floor at most ``factor`` on every row (the median of their paired rounds'
    ratios), the worst row named."""
    return worst_ratio(rows, lambda row: row.floor_ratio(), f"tokcy within {factor:g}x of the floor on every row",
                       factor, "no floor figure")


def tables_bandwidth(rows, share=TABLES_SHARE) -> Goal:
    """The host dense and CSR tables written at ``share`` or more of a numpy copy's bandwidth
    on every row (per round, the copy timed right after the tables)."""
    text = f"host dense+CSR tables at least {share:g} of a numpy copy's bandwidth on every row"
    shares = [(1 / ratio, row.config) for row in rows
              if (ratio := median_or_ratio(row.paired_rounds.get(TABLES_PAIR), None, None))]
    if not shares:
        return Goal(text, "not run", None)
    lowest, config = min(shares, key=lambda pair: pair[0])
    return Goal(text, f"lowest {lowest:.2f}, at {shape(config)}", lowest >= share)


SCENARIO = Attention()
