"""A bind takes its pointers into the memory its guards keep: an output array given memory
of its own while the bind runs (a collection's callback), or whose owner hides behind
``as_strided``'s base, is refused, never written after that memory is freed (each test on
both backends; the sanitizer build sees the freed memory written)."""

import sys

import numpy as np
import pytest
from test_bound_array_setstate import CAPACITY, SENTINEL, decoding, owned_arrays, views_of_one_buffer
from test_collector_reach import at_every_collection

from tokcy import _invariants
from tokcy.executor import HostBuffers, prepare_inputs
from tokcy.executor._metadata import MetadataBuffers

STALE = "^an output array was given other memory by code that ran while it was bound: nothing was bound$"
MOVED = r"was given new memory by __setstate__ while bound: nothing was written; bind the arrays again$"


def give_own_memory(array):
    """``__setstate__`` with a state under the 1000 bytes numpy copies: ``array`` then owns
    new memory (200 entries), whatever it showed before."""
    array.__setstate__(np.full(200, SENTINEL, array.dtype).__reduce__()[2])
    assert array.flags.owndata


def free_its_memory(array):
    """``__setstate__`` with a state over those 1000 bytes: ``array`` then shows the state's
    bytes object (alive before, so never where its old memory was), and numpy frees the
    memory it owned."""
    state = np.zeros(CAPACITY, array.dtype).__reduce__()[2]
    # numpy keeps up to 7 freed blocks of each size under 1024 bytes for reuse: fill its
    # cache for this size first, so that the block goes back to malloc (which the sanitizer
    # build then sees written)
    full = [np.empty_like(array) for _ in range(16)]
    del full
    array.__setstate__(state)


def bind_with_a_change_at(k, change, bind):
    """``bind()`` with a collection at every allocation, ``change()`` run at the k-th only;
    returns whether the bind went through (False: refused with the stale-memory error)."""
    count = [0]

    def at_kth():
        count[0] += 1
        if count[0] == k:
            change()

    try:
        with at_every_collection(at_kth):
            bind()
    except RuntimeError as error:
        assert str(error).startswith("an output array was given other memory") or "new memory by __setstate__" in str(
            error), error
        return False
    return True


def next_call_writes_what_it_was_bound_to(target, staging, call, name, wrote):
    """After a bind that went through: ``target`` (a bound view of ``staging``) frees the
    memory it owns; ``call()`` then is refused naming ``name``, or writes ``staging`` (the
    memory bound: ``wrote()``), never the freed memory (which the arrays made next take)."""
    staging.fill(SENTINEL)
    free_its_memory(target)
    churn = [np.full(4096, 99, staging.dtype) for _ in range(64)]
    try:
        call()
    except RuntimeError as error:
        assert name in str(error)
        return
    assert wrote()
    assert not (churn[0] - 99).any()


@pytest.mark.parametrize("k", range(1, 41))
def test_a_bound_view_given_its_own_memory_while_the_writer_binds(backend, k):
    """A bound array that is a view of a staging buffer, given memory of its own (``__setstate__``,
    here from a collection's callback, 200 entries it owns) after the bind recorded which numpy arrays own the
    bound memory but before it took its pointer (or plain view) into it: the writer then
    writes memory that no recorded owner holds, which the next ``__setstate__`` of the view
    frees (heap-use-after-free). Each bind must either be refused, or write memory that is
    still alive: after the view's second ``__setstate__`` the next call writes the staging
    buffer (the memory the writer was bound to) or is refused."""
    arrays, staging = views_of_one_buffer()
    target = arrays["input_ids"]
    out = HostBuffers.from_arrays(max_draft_len=2, **arrays)
    requests = decoding(backend)
    if bind_with_a_change_at(k, lambda: give_own_memory(target), lambda: out.writer(backend)):
        for request in requests:
            request.add_new_token(40 + request.request_id)
        next_call_writes_what_it_was_bound_to(
            target, staging, lambda: prepare_inputs([], requests, out=out), "input_ids",
            lambda: staging.view(np.int32)[:4].tolist() == [40, 41, 42, 43])


@pytest.mark.parametrize("k", range(1, 81))
def test_a_bound_metadata_view_given_its_own_memory_while_the_metadata_binds(backend, k):
    """The same for ``AttentionMetadata.bind`` (``MetadataBuffers.from_arrays``): ``kv_lens``
    a view of a staging buffer, given memory of its own between the record and the pointer."""
    seqs = CAPACITY // 4
    staging = np.zeros(4 * CAPACITY, np.int32)
    kv_lens = staging[:seqs]
    metadata = MetadataBuffers.from_arrays(4, kv_lens, np.zeros(seqs + 1, np.int32), [np.zeros(CAPACITY, np.int64)],
                                           [np.zeros(seqs + 1, np.int32)], [np.zeros(seqs, np.int32)])
    out = HostBuffers.from_arrays(metadata=metadata, **owned_arrays())
    requests = decoding(backend)
    if bind_with_a_change_at(k, lambda: give_own_memory(kv_lens), lambda: metadata.bound(backend)):
        for request in requests:
            request.add_new_token(40)
        next_call_writes_what_it_was_bound_to(kv_lens, staging,
                                              lambda: prepare_inputs([], requests, block_size=16, out=out),
                                              "kv_lens", lambda: staging[:4].tolist() == [4, 4, 4, 4])


def test_an_owner_behind_as_strided_given_new_memory_is_refused(backend):
    """``np.lib.stride_tricks.as_strided(x)`` (writable, contiguous: bindable) has as its base
    an object that shows numpy ``x``'s memory and keeps ``x`` in an attribute, not numpy's
    ``base``: the bound-memory record did not reach ``x``, so ``__setstate__`` on ``x`` freed
    the memory the writer wrote, unchecked (the compiled core then wrote freed memory: a
    crash, or a heap-use-after-free under the sanitizer build)."""
    arrays = owned_arrays()
    owner = arrays["input_ids"]
    arrays["input_ids"] = np.lib.stride_tricks.as_strided(owner)
    out = HostBuffers.from_arrays(max_draft_len=2, **arrays)
    requests = decoding(backend)
    assert prepare_inputs([], requests, out=out).input_ids.tolist() == [30, 31, 32, 33]
    free_its_memory(owner)
    for request in requests:
        request.add_new_token(40 + request.request_id)
    with pytest.raises(RuntimeError, match="^out array input_ids " + r"\(or the array its memory comes from\) " + MOVED):
        prepare_inputs([], requests, out=out)


@pytest.mark.parametrize("holder", ["HostBuffers", "MetadataBuffers"])
def test_no_collection_runs_while_a_bind_records_the_memory_of_its_arrays(backend, holder):
    """The record reads a bound array's address, then walks its bases to the owner and
    records that: a collection's callback in between could give the owner other memory (a
    smaller block at the same address), which the record would then take for what the array
    shows. The collector is paused for that walk (``_invariants._record_memory``);
    collections still run elsewhere in the bind."""
    inside, outside = [], []

    def note():
        frame = sys._getframe()
        while frame is not None and frame.f_code is not _invariants._record_memory.__code__:
            frame = frame.f_back
        (inside if frame is not None else outside).append(1)

    arrays, _ = views_of_one_buffer()
    if holder == "HostBuffers":
        bind = HostBuffers.from_arrays(max_draft_len=2, **arrays).writer
    else:
        seqs = CAPACITY // 4
        bind = MetadataBuffers.from_arrays(4, arrays["input_ids"][:seqs], np.zeros(seqs + 1, np.int32),
                                           [np.zeros(CAPACITY, np.int64)], [np.zeros(seqs + 1, np.int32)],
                                           [np.zeros(seqs, np.int32)]).bound
    with at_every_collection(note):
        bind(backend)
    assert not inside and outside  # (collections ran in the bind, none inside the record)
