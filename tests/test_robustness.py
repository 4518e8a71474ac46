"""Misuse that must end in a clear exception, never in a crash or a changed object."""

import copy
import gc
import pickle

import numpy as np
import pytest

from tokcy import RequestState
from tokcy.executor import HostBuffers, prepare_inputs


def test_request_whose_init_was_skipped_is_rejected_not_dereferenced(backend):
    class Lazy(backend.Request):
        def __init__(self):  # forgets super().__init__
            pass

    lazy = Lazy()
    # both backends: a blank request (id 0, one empty beam) in CONTEXT_INIT, never a crash
    assert (lazy.request_id, lazy.get_tokens(), lazy.block_tables) == (0, [[]], ())
    with pytest.raises(ValueError, match="request 0 in generation_requests must be in state GENERATION_IN_PROGRESS"):
        prepare_inputs([], [lazy])
    with pytest.raises(ValueError, match="context request 0 has an empty chunk"):
        prepare_inputs([lazy], [])


@pytest.mark.parametrize("name, value", [("max_draft_len", -1), ("max_beam_width", -2)])
def test_input_writer_rejects_negative_limits(backend, name, value):
    request = backend.Request(1, list(range(10)))
    request.state = RequestState.GENERATION_IN_PROGRESS
    limits = {"max_draft_len": 0, "max_beam_width": 1, name: value}
    writer = backend.InputWriter()
    with pytest.raises(ValueError, match=f"{name} must be >= 0, got {value}"):
        writer.plan((), (), (request,), (), limits["max_draft_len"], None, limits["max_beam_width"])


def test_device_slot_beyond_previous_tokens_leaves_device_tensors_alone(backend):
    torch = pytest.importorskip("torch")
    from tokcy.executor import InputPreparer

    request = backend.Request(3, [5, 6, 7])
    request.state = RequestState.GENERATION_IN_PROGRESS
    request.seq_slot = 1
    preparer = InputPreparer(16, 4)
    first = preparer.prepare([], [], device_token_requests=[request], previous_new_tokens=torch.tensor([40, 41]))
    assert first.input_ids.tolist() == [41]
    request.seq_slot = 2
    with pytest.raises(ValueError, match="seq_slot 2 is out of range for previous_new_tokens of 2 slots"):
        preparer.prepare([], [], device_token_requests=[request], previous_new_tokens=torch.tensor([40, 41]))
    assert first.input_ids.tolist() == [41]
    assert first.position_ids.tolist() == [3]


@pytest.mark.parametrize("device_slots, error, message", [
    (-1, ValueError, "device_slots must be >= 0 or None, got -1"),
    (2.0, TypeError, "device_slots must be an integer, not float"),
    (1 << 63, OverflowError, "device_slots 9223372036854775808 does not fit in int64"),
    (1, ValueError, "request 3 in device_token_requests: seq_slot 1 is out of range for previous_new_tokens of 1 slots"),
])
def test_a_writer_checks_device_slots_before_the_batch(backend, device_slots, error, message):
    """InputWriter.plan/prepare's device_slots (what InputPreparer passes: the rows of
    previous_new_tokens) bounds every device-token request's seq_slot in the host pass;
    the writer stays usable after the refusal, and within the bound the row is written."""
    request = backend.Request(3, [5, 6, 7])
    request.state = RequestState.GENERATION_IN_PROGRESS
    request.seq_slot = 1
    writer = backend.InputWriter()
    writer.bind(*HostBuffers(4, 2).arrays)
    for call in (writer.plan, writer.prepare):
        with pytest.raises(error, match=f"^{message}$"):
            call((), (), (), (request,), 0, None, 1, None, device_slots)
    assert writer.prepare((), (), (), (request,), 0, None, 1, None, 2)[10] == 1  # one device-token row


@pytest.mark.parametrize("per_beam", [{0: 5}, {7}, (x for x in [9])], ids=["dict", "set", "generator"])
def test_add_new_tokens_takes_any_iterable_the_same_way(both_backends, per_beam):
    outcomes = []
    for module in both_backends:
        request = module.Request(1, [1, 2])
        values = per_beam if not hasattr(per_beam, "__next__") else iter([9])
        try:
            outcomes.append(("ok", request.add_new_tokens(values), request.get_tokens(0)))
        except Exception as error:  # noqa: BLE001 - compared across backends
            outcomes.append((type(error), str(error), request.get_tokens(0)))
    assert outcomes[0] == outcomes[1]


def test_pickle_keeps_the_change_marks_the_connector_reads(backend):
    from tokcy.connector import SchedulerOutputManager

    request = backend.Request(1, [1, 2, 3, 4])
    request.block_tables[0].extend([4, 5, 6])
    manager = SchedulerOutputManager()
    manager.build_scheduler_output([request], [])
    request.block_tables[0][1] = 9
    clone = pickle.loads(pickle.dumps(request))
    (report,) = manager.build_scheduler_output([clone], []).cached_requests
    # only what changed since the last report: block 1 onwards, not the whole table
    assert report.new_block_ids == [9, 6]
    assert report.num_replaced_blocks_by_group == [2]
    assert report.new_tokens == []


def test_views_outlive_a_thousand_reallocations(backend):
    request = backend.Request(1, np.arange(4, dtype=np.int32))
    views = []
    for step in range(1000):
        views.append(request.get_tokens_view(0))
        request.add_new_token(step)
    for length, view in enumerate(views, start=4):
        assert len(view) == length
        assert view[-1] == (length - 5 if length > 4 else 3)


def test_prepare_while_another_thread_drops_the_request_buffers(backend):
    """The compiled loop copies without the GIL: it must own the storage it reads. Another
    thread re-initialising the request (dropping its 32 MiB buffer, which unmaps it) while
    the chunk is copied must neither crash nor change what this call emits. (The thread
    may also win the race before the call reads the request, as it can in the Python
    code before either backend's pass: the call then emits the new prompt, whole.)"""
    import sys
    import threading

    size = 1 << 23
    prompt = np.arange(size, dtype=np.int32) % 50000
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for _ in range(3):
            request = backend.Request(1, prompt)
            start = threading.Event()

            def drop():
                start.wait()
                request.__init__(1, [7, 8, 9])

            thread = threading.Thread(target=drop)
            thread.start()
            start.set()
            inputs = prepare_inputs([request], [])
            thread.join()
            if inputs.num_tokens == size:  # read before the re-initialisation: the old prompt, whole
                assert np.array_equal(inputs.input_ids, prompt)
            else:
                assert inputs.input_ids.tolist() == [7, 8, 9]
            assert request.get_tokens(0) == [7, 8, 9]
    finally:
        sys.setswitchinterval(interval)


@pytest.mark.parametrize("copy_of", [pickle.dumps, copy.copy, copy.deepcopy], ids=["pickle", "copy", "deepcopy"])
def test_holders_and_managers_refuse_to_be_copied_used_or_not(backend, copy_of):
    """A HostBuffers, a MetadataBuffers and a SchedulerOutputManager are refused by pickle
    and copy alike, before and after a call (a copy of a holder would be a second writer
    over its arrays; a manager's state lives in the requests' marks too)."""
    from tokcy.connector import SchedulerOutputManager
    from tokcy.executor._metadata import MetadataBuffers

    request = backend.Request(1, [1, 2, 3])
    request.state = RequestState.GENERATION_IN_PROGRESS
    request.block_tables[0].append(4)
    holder = HostBuffers(16, 4, max_blocks_per_seq=4)
    manager = SchedulerOutputManager()
    objects = {"a HostBuffers": holder, "a MetadataBuffers": holder.metadata,
               "a SchedulerOutputManager": manager, "a fresh MetadataBuffers": MetadataBuffers(4, 16, 4)}
    for used in (False, True):
        if used:
            prepare_inputs([], [request], block_size=4, out=holder)
            manager.build_scheduler_output([], [request])
        for name, item in objects.items():
            with pytest.raises(TypeError, match=f"^{name.replace('fresh ', '')} cannot be pickled or copied: "):
                copy_of(item)
    plain = HostBuffers(16, 4)
    inputs = prepare_inputs([], [request], out=plain)
    restored = pickle.loads(pickle.dumps(inputs))  # a result without metadata pickles as its arrays
    assert restored.input_ids.tolist() == [3] and restored.num_tokens == 1


@pytest.mark.parametrize("copy_of", [pickle.dumps, copy.copy, copy.deepcopy], ids=["pickle", "copy", "deepcopy"])
def test_private_writers_and_report_state_refuse_to_be_copied_on_both_backends(backend, copy_of):
    """A writer, its metadata and device-table rows, a report's state, columns and row
    columns: the compiled core's cannot be pickled or copied (a copy of a writer would be a
    second writer of its arrays), and the twin's refuse the same way, naming the class (they
    copied)."""
    from tokcy.connector import SchedulerOutputManager

    manager = SchedulerOutputManager()
    request = backend.Request(1, [1, 2, 3])
    output = manager.build_scheduler_output([request], [])
    objects = [backend.InputWriter(), backend.AttentionMetadata(), backend.DeviceTableRows(2, 1, 2), manager._state,
               output._source]
    # a row's columns, where the collector hands them out (the twin's; the compiled ones it does not)
    objects += [item for item in gc.get_referents(output.request_data(0)) if type(item) is backend.RowColumns]
    for item in objects:
        name = f"{type(item).__module__}.{type(item).__qualname__}"
        with pytest.raises(TypeError, match=f"^cannot pickle '{name}' object$"):
            copy_of(item)


def test_an_empty_chunk_after_the_whole_prompt_says_where_the_request_belongs(backend):
    """The usual empty chunk: the prompt's last chunk ran and the engine did not move the
    request to generation. The message says so; a chunk merely left at 0 says only that."""
    done = backend.Request(7, [1, 2, 3, 4, 5])
    done.context_current_position = 5
    with pytest.raises(ValueError) as caught:
        prepare_inputs([done], [])
    assert str(caught.value) == (
        "context request 7 has an empty chunk (context_chunk_size is 0): its prompt is all computed "
        "(context_current_position 5 = prompt_len 5), so it belongs in generation_requests, in state "
        "GENERATION_IN_PROGRESS")
    halfway = backend.Request(8, [1, 2, 3, 4, 5])
    halfway.context_current_position = 2
    halfway.context_chunk_size = 0
    with pytest.raises(ValueError) as caught:
        prepare_inputs([halfway], [])
    assert str(caught.value) == "context request 8 has an empty chunk (context_chunk_size is 0)"
