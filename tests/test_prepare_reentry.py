"""A prepare call re-entered while it is in progress: refused in every phase.

``prepare_inputs(..., out=holder)`` returns a ``PreparedInputs`` whose counts describe
what the call wrote into the holder's arrays. Python code that runs during the call (a
collection's callback, which may start at any allocation of a tracked object, a batch's
generator, a batch size's ``__index__``) may call it again on the same holder, or on a
holder that shares its metadata outputs. That inner call raises RuntimeError and writes
nothing, in every phase of the outer call, including the one after the rows are written,
while the returned inputs are made: the outer call returns exactly what the same batch
prepared into buffers of its own gives. The same holds for ``InputPreparer.prepare``.
"""

import functools
import operator
import sys

import pytest
from hostile_code import IndexRuns
from test_collector_reach import at_every_collection

from tokcy import RequestState
from tokcy.executor import ARRAY_FIELDS, COUNT_FIELDS, HostBuffers, prepare_inputs
from tokcy.executor._metadata import GROUP_FIELDS, METADATA_FIELDS

WRITER_BUSY = ("this InputWriter is in use by another call (another thread's, or one re-entered from code this "
               "call runs)")
METADATA_BUSY = "these attention-metadata outputs are in use by another call (a writer that shares them)"


def generation(request, *blocks):
    request.state = RequestState.GENERATION_IN_PROGRESS
    request.block_tables[0].extend(blocks)
    return request


def outer_batch(module):
    """(context, generation): a chunk [4, 8) of a 10-token prompt, a request with two
    drafts and a plain decode row; block size 4, every row within its blocks."""
    context = module.Request(1, list(range(100, 110)))
    context.context_current_position = 4
    context.context_chunk_size = 4
    context.block_tables[0].extend([1, 2])
    drafted = generation(module.Request(2, list(range(200, 207))), 3, 4, 5)
    drafted.draft_tokens = [900, 901]
    plain = generation(module.Request(3, list(range(300, 306))), 6, 7)
    return [context], [plain, drafted]


def inner_batch(module):
    """Other requests, other rows: what a call that got in would leave in the arrays."""
    return [], [generation(module.Request(10 + index, [50 + index, 60 + index, 70 + index]), 20 + index)
                for index in range(5)]


def buffers():
    return HostBuffers(32, 8, 2, max_blocks_per_seq=4)


def sharing_metadata(holder):
    """Another holder of the same capacities writing its metadata into ``holder``'s."""
    arrays = dict(zip(ARRAY_FIELDS, buffers().arrays))
    return HostBuffers.from_arrays(max_draft_len=2, metadata=holder.metadata, **arrays)


def snapshot(inputs):
    """Every field of ``inputs`` as plain values (arrays as lists, each layer group as a dict)."""
    fields = {}
    for name in ARRAY_FIELDS + COUNT_FIELDS + METADATA_FIELDS:
        value = getattr(inputs, name)
        if name == "groups" and value is not None:
            value = [snapshot_group(group) for group in value]
        fields[name] = plain(value)
    return fields


def snapshot_group(group):
    return {name: plain(getattr(group, name)) for name in GROUP_FIELDS}


def plain(value):
    return value.tolist() if hasattr(value, "tolist") else value


class Reentry:
    """``call()`` run from code the call under test runs, once per time that code runs
    while ``armed`` (never from inside itself); ``outcomes`` lists what each attempt
    gave: the RuntimeError's message, or "ran"."""

    def __init__(self, call):
        self.call = call
        self.armed = False
        self.running = False
        self.outcomes = []

    def __call__(self):
        if not self.armed or self.running:
            return
        self.running = True
        try:
            self.call()
            self.outcomes.append("ran")
        except RuntimeError as error:
            self.outcomes.append(str(error))
        finally:
            self.running = False


def refused_from_the_guard_on(outcomes, message):
    """``outcomes`` (a Reentry's) show the call's guard held from its first refusal to the
    end of the call: an attempt before it (the argument checks, a first call making the
    holder's writer) ran to its end before the call wrote anything, which is harmless, but
    none ran once one was refused. Up to CPython 3.11 a collection starts at the allocation
    that asks for it, so some attempt falls inside the guard; from 3.12 it waits for the
    interpreter's next check for pending work, which compiled code that calls no Python
    function never makes: such a call may then see no attempt while it holds its guard."""
    if message not in outcomes:
        assert sys.version_info >= (3, 12), outcomes
        return
    assert set(outcomes[outcomes.index(message):]) == {message}, outcomes


def prepared_during_collections(reentry, batch, **kwargs):
    """``prepare_inputs(*batch, **kwargs)`` with a collection starting at every allocation
    of a tracked object it makes, each running ``reentry`` while the call runs.

    ``reentry`` is disarmed from C as the call returns (``map`` over two C callables, no
    bytecode in between): from CPython 3.12 a collection an allocation asked for runs at
    the interpreter's next check for pending work, which, for a call made from bytecode,
    comes right after the call returns. A call on the holder there is one made after this
    call returned, which may overwrite its arrays (``out=`` results are the next call's to
    overwrite)."""
    call = functools.partial(prepare_inputs, *batch, **kwargs)
    disarm = functools.partial(setattr, reentry, "armed", False)
    with at_every_collection(reentry):
        reentry.armed = True  # (a store that allocates nothing)
        inputs, _ = map(operator.call, (call, disarm))
    return inputs


@pytest.mark.parametrize("block_size", [None, 4], ids=["rows", "metadata"])
@pytest.mark.parametrize("warm", [False, True], ids=["first-call", "warm"])
def test_a_collection_cannot_prepare_into_the_holder_a_call_is_writing(backend, warm, block_size):
    """Every collection during the call (in its checks, its write, and while it makes the
    inputs it returns) calls prepare_inputs on the same holder with another batch: each is
    refused, and the outer call returns what the same batch gives in fresh buffers. (The
    compiled core's first call on a holder takes the Python path, a warm one its C entry.)"""
    holder = buffers()
    batch, other = outer_batch(backend), inner_batch(backend)
    if warm:
        prepare_inputs(*other, max_draft_len=2, out=holder, block_size=block_size)
    reentry = Reentry(lambda: prepare_inputs(*other, max_draft_len=2, out=holder, block_size=block_size))
    inputs = prepared_during_collections(reentry, batch, max_draft_len=2, out=holder, block_size=block_size)
    assert snapshot(inputs) == snapshot(prepare_inputs(*batch, max_draft_len=2, out=buffers(), block_size=block_size))
    refused_from_the_guard_on(reentry.outcomes, WRITER_BUSY)
    # the holder serves the next call
    assert prepare_inputs(*other, max_draft_len=2, out=holder).request_ids.tolist() == [10, 11, 12, 13, 14]


@pytest.mark.parametrize("warm", [False, True], ids=["first-call", "warm"])
def test_a_collection_cannot_prepare_into_a_holder_sharing_the_metadata_a_call_is_writing(backend, warm):
    """The same with the inner call on another holder whose metadata outputs are the
    outer holder's: refused too (the metadata the outer call returns is its own)."""
    holder = buffers()
    other_holder = sharing_metadata(holder)
    batch, other = outer_batch(backend), inner_batch(backend)
    if warm:
        prepare_inputs(*other, max_draft_len=2, out=holder, block_size=4)
        prepare_inputs(*other, max_draft_len=2, out=other_holder, block_size=4)
    reentry = Reentry(lambda: prepare_inputs(*other, max_draft_len=2, out=other_holder, block_size=4))
    inputs = prepared_during_collections(reentry, batch, max_draft_len=2, out=holder, block_size=4)
    assert snapshot(inputs) == snapshot(prepare_inputs(*batch, max_draft_len=2, out=buffers(), block_size=4))
    refused_from_the_guard_on(reentry.outcomes, METADATA_BUSY)


@pytest.mark.parametrize("hook", ["generator", "batch size"])
def test_a_call_from_the_batch_cannot_prepare_into_the_same_holder(backend, hook):
    """A generator group, or a batch size's ``__index__``, that calls prepare_inputs on
    the same holder while the call reads it: refused, and the outer rows are its own."""
    holder = buffers()
    context, generations = outer_batch(backend)
    other = inner_batch(backend)
    reentry = Reentry(lambda: prepare_inputs(*other, max_draft_len=2, out=holder, block_size=4))
    reentry.armed = True

    def generation_group():
        reentry()
        yield from generations

    group, sizes = (generation_group(), None) if hook == "generator" else (generations, [IndexRuns(8, reentry)])
    inputs = prepare_inputs(context, group, max_draft_len=2, cuda_graph_batch_sizes=sizes, out=holder, block_size=4)
    assert reentry.outcomes == [WRITER_BUSY]
    assert snapshot(inputs) == snapshot(prepare_inputs(context, generations, max_draft_len=2, out=buffers(),
                                                       block_size=4))


def test_make_result_runs_while_the_writer_is_still_busy(backend):
    """``InputWriter.prepare(..., make_result=f)`` returns ``f(counts)``, called before the
    guard drops: a call on the writer from there is refused."""
    writer = buffers().writer(backend)
    _, requests = inner_batch(backend)

    def made(counts):
        with pytest.raises(RuntimeError, match=r"^this InputWriter is in use by another call"):
            writer.prepare([], requests, (), (), 0, None, 0)
        return "made", counts[3]

    assert writer.prepare([], requests, (), (), 0, None, 0, make_result=made) == ("made", 5)
    assert writer.prepare([], requests, (), (), 0, None, 0)[3] == 5  # the guard dropped


def device_snapshot(inputs):
    fields = {name: getattr(inputs, name).tolist() for name in ARRAY_FIELDS}
    fields.update((name, getattr(inputs, name)) for name in COUNT_FIELDS)
    return fields, snapshot(inputs.host)


@pytest.mark.parametrize("block_size", [None, 4], ids=["rows", "metadata"])
def test_a_collection_cannot_reenter_an_input_preparer_while_it_prepares(backend, block_size):
    """InputPreparer.prepare under the same collections: each re-entered prepare on the same
    preparer is refused, and the step is what a preparer of its own gives."""
    pytest.importorskip("torch")
    from tokcy.executor import InputPreparer

    def preparer():
        return InputPreparer(32, 8, max_draft_len=2, block_size=block_size,
                             max_blocks_per_seq=None if block_size is None else 4)

    def with_slots(batch):
        for slot, request in enumerate(batch[0] + batch[1]):
            request.seq_slot = slot
        return batch

    # (a device table sends a request's blocks once: each preparer is given requests of its own)
    batch, other = with_slots(outer_batch(backend)), with_slots(inner_batch(backend))
    feeding = preparer()
    feeding.prepare(*other)
    reentry = Reentry(lambda: feeding.prepare(*other))
    with at_every_collection(reentry):
        reentry.armed = True
        inputs = feeding.prepare(*batch)
        reentry.armed = False
    refused_from_the_guard_on(reentry.outcomes, "this InputPreparer is in use by another call (another thread's, or "
                                                "one re-entered from code this call runs)")
    assert device_snapshot(inputs) == device_snapshot(preparer().prepare(*with_slots(outer_batch(backend))))
