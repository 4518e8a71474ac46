"""Scenario ``device_feed``: ``InputPreparer.prepare`` on the device, host time per step.

B decode requests of L tokens (the ``attention`` scenario's world: full block tables, a
few new blocks per step), fed to the first CUDA device when torch sees one, else to the
CPU. Each timed iteration is one whole step as an engine runs it: the world's touch, the
``prepare`` call (the host pass, the one packed copy and, with a block size, the device
table's scatter and gather) and the reads of the inputs the model takes (``input_ids``,
``position_ids`` and, with a block size, the metadata's ``groups``). On CUDA the device's
queue is drained before every iteration, untimed, so the figure is the host's time to
issue a step with every launch in it, never a wait for the device: the figure the goal
"host time per step under 30 us at B = 256 on a GPU" is about. On a CPU "device" the
torch calls do their work inside the call, so there the figure includes that work.

* ``tokcy``: ``InputPreparer.prepare`` with a block size (tokens and attention metadata);
* ``tokcy csr``: the same gathering only the CSR block table on the device
  (``device_tables="csr"``), as a preparer for a FlashInfer-style model is made;
* ``tokcy tokens``: ``InputPreparer.prepare`` without a block size (the token inputs);
* ``prepare_inputs``: the token inputs into ``HostBuffers`` on the host alone (its
  ``input_ids`` and ``position_ids`` read likewise), the reference the goal "within 1.5x
  of prepare_inputs" is measured against: each of its rounds is timed right after one of
  ``tokcy tokens``' rounds, and the goal's figure is the median over rounds of the two
  round medians' ratio (as tokcy/floor is), not a ratio of figures timed apart.

Each row's note also gives the torch calls one step makes (counted, not timed): on a GPU
each is one or more launches, or a view, paid on the host, so the count is the part of the
GPU goal this machine can check without one.
"""

from __future__ import annotations

from tokcy.bench.scenario import Goal, Row, Scenario, pair_key
from tokcy.bench.timing import StepBeside, measure

BLOCK_SIZE = 16
GOAL_BATCH = 256
GPU_HOST_LIMIT_S = 30e-6
TOKENS_FACTOR = 1.5
PAIR = pair_key("tokcy tokens", "prepare_inputs")  # the goal's paired rounds
CONFIGS = {
    "smoke": ((16, 64),),
    "quick": ((GOAL_BATCH, 2_048),),
    "default": ((GOAL_BATCH, 2_048), (GOAL_BATCH, 32_768)),
    "full": ((64, 2_048), (GOAL_BATCH, 2_048), (GOAL_BATCH, 32_768), (1_024, 2_048)),
}


def feed_device():
    """The device the scenario feeds: "cuda" when torch sees a CUDA device, else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_call_recorder():
    """A torch function mode that records, while active (``with``), the name of every torch
    function and tensor method called, in ``.names``."""
    from torch.overrides import TorchFunctionMode

    class TorchCalls(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.append(getattr(func, "__name__", repr(func)))
            return func(*args, **(kwargs or {}))

    return TorchCalls()


def torch_calls(step):
    """The torch functions and tensor methods a steady call of ``step`` calls (a count): the
    two calls before it, not counted, have made and kept the views of its sizes (the
    first may follow other steps of the same world, and so send more changed entries)."""
    step()
    step()
    with torch_call_recorder() as calls:
        step()
    return len(calls.names)


def steps(world, device):
    """{implementation: one engine step}, and the untimed call that runs before each."""
    import torch

    from tokcy.executor import HostBuffers, InputPreparer, prepare_inputs

    batch = len(world.requests)
    with_metadata = InputPreparer(batch, batch, device=device, block_size=world.block_size,
                                  max_blocks_per_seq=world.width, max_slots=batch)
    csr_only = InputPreparer(batch, batch, device=device, block_size=world.block_size,
                             max_blocks_per_seq=world.width, max_slots=batch, device_tables="csr")
    tokens_only = InputPreparer(batch, batch, device=device)
    plain = HostBuffers(batch, batch)

    def tokcy():
        world.touch()
        inputs = with_metadata.prepare([], world.requests)
        return inputs.input_ids, inputs.position_ids, inputs.groups

    def tokcy_csr():
        world.touch()
        inputs = csr_only.prepare([], world.requests)
        return inputs.input_ids, inputs.position_ids, inputs.groups

    def tokcy_tokens():
        world.touch()
        inputs = tokens_only.prepare([], world.requests)
        return inputs.input_ids, inputs.position_ids

    def host_only():
        world.touch()
        inputs = prepare_inputs([], world.requests, out=plain)
        return inputs.input_ids, inputs.position_ids

    implementations = {"tokcy": tokcy, "tokcy csr": tokcy_csr, "tokcy tokens": tokcy_tokens,
                       "prepare_inputs": host_only}
    for step in implementations.values():
        step()  # the first step sends every table whole; the timed ones send what changed
    drain = torch.cuda.synchronize if device == "cuda" else None
    return implementations, drain


class DeviceFeed(Scenario):
    name = "device_feed"
    title = "Device feed: InputPreparer.prepare for B decode requests of L tokens, host time per step"
    columns = (("device", "device"), ("requests", "B (requests)"), ("seq_len", "L (tokens)"))
    implementations = ("tokcy", "tokcy csr", "tokcy tokens", "prepare_inputs")
    needs = ("torch", "tokcy.executor")
    legend = (
        "tokcy: InputPreparer.prepare with block size 16 (tokens, attention metadata, the device block table's "
        "scatter and gather), then input_ids, position_ids and groups read; tokcy csr: the same gathering the CSR "
        "table alone (device_tables='csr'); tokcy tokens: the same without a block size; prepare_inputs: the "
        "token inputs on the host alone (input_ids and position_ids read)",
        "device: cuda when torch sees one (its queue drained before each step, untimed: the figure is the host's "
        "time to issue the step), else cpu (the torch calls then do the device-side work inside the figure)",
    )
    plot_x = "seq_len"
    plot_xlabel = "sequence length L (tokens), block 16, one group"

    def configs(self, level):
        device = feed_device()
        return [{"device": device, "requests": batch, "seq_len": seq_len} for batch, seq_len in CONFIGS[level]]

    def describe(self, config):
        return f"{config['device']} B={config['requests']:,} L={config['seq_len']:,}"

    def run(self, config, backend, plan):
        from tokcy.bench.attention import World

        world = World(backend, config["seq_len"], BLOCK_SIZE, 1, batch=config["requests"])
        implementations, drain = steps(world, config["device"])
        # one step per sample (number=1): back-to-back steps would refill a staging slot
        # whose copy is in flight, and wait for the device. prepare_inputs is timed a round
        # at a time right after each of "tokcy tokens"' rounds: the goal is their ratio.
        host_rounds = StepBeside(implementations["prepare_inputs"], plan, before=drain)
        timings = {"tokcy": measure(implementations["tokcy"], plan, before=drain, number=1),
                   "tokcy csr": measure(implementations["tokcy csr"], plan, before=drain, number=1),
                   "tokcy tokens": measure(implementations["tokcy tokens"], plan, before=drain, number=1,
                                           after_round=host_rounds),
                   "prepare_inputs": host_rounds.timing()}
        calls = ", ".join(f"{name} {torch_calls(step)}" for name, step in implementations.items())
        return Row(config=dict(config), values={name: t.median for name, t in timings.items()},
                   timings={name: t.as_dict() for name, t in timings.items()},
                   paired_rounds={PAIR: host_rounds.ratios(timings["tokcy tokens"])},
                   note=f"B={config['requests']:,} L={config['seq_len']:,}: torch calls per step (on a GPU each one or "
                        f"more launches, or a view): {calls}")

    def goals(self, rows, backend):
        if backend == "python":
            return []
        at_goal = [row for row in rows if row.config["requests"] == GOAL_BATCH]
        tokens_text = f"InputPreparer.prepare without a block size within {TOKENS_FACTOR:g}x of prepare_inputs at " \
                      f"B = {GOAL_BATCH}"
        gpu_text = f"host time per step under {GPU_HOST_LIMIT_S * 1e6:g} us at B = {GOAL_BATCH} on a GPU " \
                   "(with a block size, every launch included)"
        if not at_goal:
            return [Goal(tokens_text, f"B = {GOAL_BATCH} not run", None), Goal(gpu_text, "not run", None)]
        worst = max(row.paired_ratio("tokcy tokens", "prepare_inputs") for row in at_goal)
        goals = [Goal(tokens_text, f"{worst:.2f}x", worst <= TOKENS_FACTOR)]
        on_gpu = [row.values["tokcy"] for row in at_goal if row.config["device"] == "cuda"]
        if on_gpu:
            goals.append(Goal(gpu_text, f"{max(on_gpu) * 1e6:.1f} us", max(on_gpu) < GPU_HOST_LIMIT_S))
        else:
            goals.append(Goal(gpu_text, "no CUDA device here", None))
        return goals


SCENARIO = DeviceFeed()
