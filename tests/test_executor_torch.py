"""tokcy.executor.InputPreparer: the torch wrapper on CPU, and on CUDA when there is one."""

import numpy as np
import pytest

from executor_reference import make_request, random_batch, reference
from tokcy import RequestState
from tokcy.executor import ARRAY_FIELDS, COUNT_FIELDS, InputPreparer, prepare_inputs

torch = pytest.importorskip("torch")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def build(module, groups):
    return {group: [make_request(module, desc) for desc in descs] for group, descs in groups.items()}


def prepare(preparer, batch, sizes, previous):
    return preparer.prepare(batch["context"], batch["generation"], first_draft_requests=batch["first_draft"],
                            device_token_requests=batch["device"], cuda_graph_batch_sizes=sizes,
                            previous_new_tokens=previous)


def expected_arrays(batch, max_draft_len, sizes, previous):
    """The reference host arrays, with the device rows filled from ``previous``."""
    arrays, counts = reference(batch["context"], batch["generation"], batch["first_draft"], batch["device"],
                               max_draft_len, sizes)
    start = counts["device_token_row_start"]
    slots = arrays["device_token_slots"]
    arrays["input_ids"][start : start + len(slots)] = previous.cpu().numpy()[slots]
    return arrays, counts


def padding_ok(batch, sizes):
    if sizes is None or batch["context"] or batch["first_draft"]:
        return True
    return max(sizes) >= sum(len(r.get_last_tokens()) for r in batch["generation"]) + len(batch["device"])


def test_cpu_values_pointers_and_overlap_rows(backend):
    rng = np.random.default_rng(3)
    preparer = InputPreparer(512, 128, max_draft_len=4, max_beam_width=4, device="cpu")
    assert preparer.num_staging_buffers == 2
    pointers = {name: tensor.data_ptr() for name, tensor in preparer.tensors.items()}
    previous = torch.arange(1000, 1016, dtype=torch.int64)  # slot s held token 1000 + s
    checked = 0
    while checked < 100:
        groups, _, sizes = random_batch(rng)
        batch = build(backend, groups)
        if not padding_ok(batch, sizes):
            continue
        result = prepare(preparer, batch, sizes, previous)
        arrays, counts = expected_arrays(batch, 4, sizes, previous)
        for name in ARRAY_FIELDS:
            tensor = getattr(result, name)
            assert tensor.device.type == "cpu"
            assert tensor.dtype == (torch.int64 if name == "request_ids" else torch.int32), name
            np.testing.assert_array_equal(tensor.numpy(), arrays[name], err_msg=name)
            if tensor.numel():  # (torch reports 0 for an empty view)
                assert tensor.data_ptr() == pointers[name], name  # a view from the persistent start
        for name in COUNT_FIELDS:
            assert getattr(result, name) == counts[name], name
        # the host arrays hold the placeholder 0 in the device rows
        host = result.host
        start, count = host.device_token_row_start, len(host.device_token_slots)
        assert (host.input_ids[start : start + count] == 0).all()
        checked += 1
    assert {name: tensor.data_ptr() for name, tensor in preparer.tensors.items()} == pointers


def test_cpu_worked_example_device_rows(backend):
    context = backend.Request(1, list(range(100, 110)))
    context.context_current_position = 4
    context.context_chunk_size = 4
    plain = backend.Request(3, list(range(300, 307)))
    plain.state = RequestState.GENERATION_IN_PROGRESS
    plain.seq_slot = 5
    preparer = InputPreparer(16, 4)
    previous = torch.tensor([[10], [11], [12], [13], [14], [15]], dtype=torch.int32)  # 2-D: column 0
    result = preparer.prepare([context], [], device_token_requests=[plain], previous_new_tokens=previous)
    assert result.input_ids.tolist() == [104, 105, 106, 107, 15]
    assert result.position_ids.tolist() == [4, 5, 6, 7, 7]
    assert result.device_token_slots.tolist() == [5]
    assert result.num_tokens == 5 and result.num_context_tokens == 4
    with pytest.raises(ValueError, match="previous_new_tokens"):
        preparer.prepare([], [], device_token_requests=[plain])
    with pytest.raises(TypeError, match="previous_new_tokens"):
        preparer.prepare([], [], device_token_requests=[plain], previous_new_tokens=[1, 2])


class ClaimsMoreRows(torch.Tensor):
    """A tensor whose shape says it holds 1,048,576 rows, whatever it holds."""

    @property
    def shape(self):
        return torch.Size([1 << 20])


def test_previous_new_tokens_are_an_integer_tensor_and_a_refused_call_moves_no_ring_slot(backend):
    """The previous step's tokens bound the device rows' slots, so they must be exactly a
    tensor (a subclass's shape let slot 5 pass against 2 rows: index_select then failed
    after the staging buffer was written and the ring had moved on) of int32 or int64 ids
    (floats were cut to ints). A refused call leaves the ring where it was."""
    plain = backend.Request(3, list(range(300, 307)))
    plain.state = RequestState.GENERATION_IN_PROGRESS
    plain.seq_slot = 5
    preparer = InputPreparer(16, 4)
    bad = {
        "a subclass": (torch.tensor([1, 2]).as_subclass(ClaimsMoreRows), TypeError,
                       "previous_new_tokens must be a torch.Tensor, not ClaimsMoreRows"),
        "floats": (torch.tensor([0.0, 1, 2, 3, 4, 7.9]), TypeError,
                   "previous_new_tokens must hold int32 or int64 token ids, got torch.float32"),
        "too few rows": (torch.tensor([1, 2], dtype=torch.int64), ValueError, "seq_slot 5"),
    }
    for value, error, message in bad.values():
        with pytest.raises(error, match=message):
            preparer.prepare([], [], device_token_requests=[plain], previous_new_tokens=value)
        assert preparer._next == 0
    good = torch.arange(10, 16, dtype=torch.int64)
    assert preparer.prepare([], [], device_token_requests=[plain], previous_new_tokens=good).input_ids.tolist() == [15]
    assert preparer._next == 1


def test_device_inputs_fields_are_read_only_views_made_once(backend):
    """A DeviceInputs field is a view of the persistent tensor made on its first read and
    kept (counted: the views made); counts come from the host, and metadata is None
    without a block size; every field is read-only."""
    plain = backend.Request(3, list(range(300, 307)))
    plain.state = RequestState.GENERATION_IN_PROGRESS
    preparer = InputPreparer(16, 4)
    result = preparer.prepare([], [plain])
    assert result._views == [None] * len(ARRAY_FIELDS)
    ids = result.input_ids
    assert ids is result.input_ids and ids.tolist() == [306] and ids.data_ptr() == preparer.tensors["input_ids"].data_ptr()
    assert sum(view is not None for view in result._views) == 1
    assert (result.num_tokens, result.padded_batch_size, result.groups, result.block_table) == (1, 1, None, None)
    for name in ("input_ids", "num_tokens", "groups"):
        with pytest.raises(AttributeError):
            setattr(result, name, None)


def test_device_inputs_host_is_made_on_first_read(backend, monkeypatch):
    """``DeviceInputs.host`` is made when first read (counted: the PreparedInputs made), then
    kept, and holds what ``prepare_inputs`` returns for the same step: token arrays, counts
    and the host-written metadata."""
    from tokcy.executor import _device

    made = []
    real = _device.written_inputs
    monkeypatch.setattr(_device, "written_inputs", lambda *args: made.append(args) or real(*args))

    def batch():
        requests = []
        for index, length in enumerate((5, 9, 17)):
            request = backend.Request(index, list(range(10 * index, 10 * index + length)))
            request.state = RequestState.GENERATION_IN_PROGRESS
            request.seq_slot = index
            request.block_tables[0].extend([7 * index + block for block in range(length // 4 + 1)])
            requests.append(request)
        return requests

    preparer = InputPreparer(8, 4, block_size=4, max_blocks_per_seq=6)
    result = preparer.prepare([], batch())
    assert made == []
    host = result.host
    assert len(made) == 1 and result.host is host and len(made) == 1
    expected = prepare_inputs([], batch(), block_size=4)
    for name in ARRAY_FIELDS:
        np.testing.assert_array_equal(getattr(host, name), getattr(expected, name), err_msg=name)
    for name in COUNT_FIELDS:
        assert getattr(host, name) == getattr(result, name) == getattr(expected, name), name
    assert host.kv_lens.tolist() == expected.kv_lens.tolist() == [5, 9, 17]
    assert host.groups[0].slot_mapping.tolist() == expected.groups[0].slot_mapping.tolist() == [4, 36, 72]


def test_cpu_errors_leave_device_tensors_alone(backend):
    preparer = InputPreparer(4, 2)
    generation = backend.Request(1, [1, 2, 3])
    generation.state = RequestState.GENERATION_IN_PROGRESS
    first = preparer.prepare([], [generation])
    assert first.input_ids.tolist() == [3]
    with pytest.raises(ValueError, match="5 token rows"):
        preparer.prepare([backend.Request(2, [1, 2, 3, 4, 5])], [])  # 5 tokens > 4
    assert preparer.tensors["input_ids"][:1].tolist() == [3]


def test_import_does_not_need_torch(backend):
    import os
    import subprocess
    import sys

    name = "cython" if backend.__name__ == "tokcy._core" else "python"
    code = ("import sys, tokcy, tokcy.executor, tokcy.connector; assert 'torch' not in sys.modules, 'torch imported'; "
            f"assert tokcy.BACKEND == {name!r}, tokcy.BACKEND")
    env = {**os.environ, "TOKCY_PURE_PYTHON": "1" if name == "python" else ""}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


# ------------------------------------------------------------------------------ CUDA
def cuda_batches(module, count, seed):
    rng = np.random.default_rng(seed)
    batches = []
    while len(batches) < count:
        groups, _, sizes = random_batch(rng)
        batch = build(module, groups)
        if padding_ok(batch, sizes):
            batches.append((batch, sizes))
    return batches


@needs_cuda
def test_cuda_pinned_non_blocking_equals_blocking(backend):
    preparer = InputPreparer(512, 128, max_draft_len=4, max_beam_width=4, device="cuda")
    assert all(staging.is_pinned() for staging in preparer._staging)
    previous = torch.arange(1000, 1016, dtype=torch.int32, device="cuda")
    for batch, sizes in cuda_batches(backend, 200, seed=11):
        result = prepare(preparer, batch, sizes, previous)
        host = prepare_inputs(batch["context"], batch["generation"], first_draft_requests=batch["first_draft"],
                              device_token_requests=batch["device"], max_draft_len=4, cuda_graph_batch_sizes=sizes)
        for name in ARRAY_FIELDS:
            blocking = torch.from_numpy(getattr(host, name).copy()).to("cuda")  # a plain blocking copy
            if name == "input_ids" and len(host.device_token_slots):
                start = host.device_token_row_start
                blocking[start : start + len(host.device_token_slots)] = previous[
                    torch.from_numpy(host.device_token_slots.astype(np.int64)).cuda()]
            assert torch.equal(getattr(result, name), blocking), name


def _stress(backend, fence):
    """Refill staging right after launching each copy while the stream is kept busy, and
    snapshot every result on the stream; True if every snapshot is exact."""
    preparer = InputPreparer(512, 128, max_draft_len=4, max_beam_width=4, device="cuda")
    preparer._fence = fence
    previous = torch.arange(1000, 1016, dtype=torch.int32, device="cuda")
    batches = cuda_batches(backend, 60, seed=12)
    snapshots = []
    for batch, sizes in batches:
        torch.cuda._sleep(2_000_000)  # the copy queues behind this: the host runs ahead
        result = prepare(preparer, batch, sizes, previous)
        snapshots.append({name: getattr(result, name).clone() for name in ARRAY_FIELDS})  # stream-ordered
    torch.cuda.synchronize()
    for (batch, sizes), snapshot in zip(batches, snapshots):
        arrays, _ = expected_arrays(batch, 4, sizes, previous)
        for name in ARRAY_FIELDS:
            if not np.array_equal(snapshot[name].cpu().numpy(), arrays[name]):
                return False
    return True


@needs_cuda
def test_cuda_stress_ring_is_fenced(backend):
    assert _stress(backend, fence=True)


@needs_cuda
def test_cuda_stress_without_fence_goes_wrong(backend):
    """The same stress with the event fence switched off reads refilled staging memory."""
    assert not _stress(backend, fence=False)


def test_what_a_preparer_is_made_with_is_read_only(backend):
    """Its staging buffers, writers and device tensors are laid out for its sizes when it is
    made: each refuses a new value, naming it, and keeps its own."""
    preparer = InputPreparer(16, 4, block_size=16, max_blocks_per_seq=4)
    fields = ("max_num_tokens", "max_batch_size", "max_draft_len", "max_beam_width", "device", "is_cuda", "tensors",
              "block_sizes", "max_blocks_per_seq", "max_slots", "device_table", "device_tables")
    before = {name: getattr(preparer, name) for name in fields}
    assert (before["max_num_tokens"], before["max_batch_size"], before["block_sizes"], before["max_slots"]) == (
        16, 4, (16,), 4)
    for name in fields:
        with pytest.raises(AttributeError, match=f"InputPreparer.{name} is read-only"):
            setattr(preparer, name, before[name])
        assert getattr(preparer, name) is before[name]
    plain = InputPreparer(16, 4)  # no block size: no table, no width, no slots
    assert (plain.block_sizes, plain.max_blocks_per_seq, plain.max_slots, plain.device_table) == (None,) * 4


@pytest.mark.parametrize("copy_of", ["pickle", "copy", "deepcopy"])
def test_a_preparer_and_its_device_inputs_refuse_to_be_copied_and_say_why(backend, copy_of):
    """An InputPreparer (its buffers are its own) and a DeviceInputs (views of a device
    buffer the next step overwrites) raise TypeError naming the object, where they raised
    "cannot pickle 'module' object"; the step's host inputs pickle as a snapshot."""
    import copy
    import pickle

    copier = {"pickle": pickle.dumps, "copy": copy.copy, "deepcopy": copy.deepcopy}[copy_of]
    decode = backend.Request(1, [1, 2, 3])
    decode.state = RequestState.GENERATION_IN_PROGRESS
    decode.seq_slot = 0
    decode.block_tables[0].append(8)
    preparer = InputPreparer(16, 4, block_size=4, max_blocks_per_seq=4)
    inputs = preparer.prepare([], [decode])
    with pytest.raises(TypeError, match="^an InputPreparer cannot be pickled or copied: "):
        copier(preparer)
    with pytest.raises(TypeError, match="^a DeviceInputs cannot be pickled or copied: .* pickle its host"):
        copier(inputs)
    host = pickle.loads(pickle.dumps(inputs.host))
    assert (host.input_ids.tolist(), host.slot_mapping.tolist(), host.num_tokens) == ([3], [34], 1)


def test_a_preparer_runs_one_call_at_a_time(backend):
    """A call into the same InputPreparer from code a call runs (here an iterable of
    device-token requests; another thread's call alike) is refused with RuntimeError: two
    calls would share a staging buffer and the device table's scatter and gather. The
    outer call completes, and the preparer stays usable."""
    preparer = InputPreparer(16, 4, block_size=4, max_blocks_per_seq=4, max_slots=4)
    decode = backend.Request(1, [1, 2, 3])
    decode.state = RequestState.GENERATION_IN_PROGRESS
    decode.seq_slot = 0
    decode.block_tables[0].extend([8])
    refusals = []

    def calling_back():
        try:
            preparer.prepare([], [decode])
        except RuntimeError as error:
            refusals.append(str(error))
        yield from ()

    inputs = preparer.prepare([], [decode], device_token_requests=calling_back())
    assert refusals == ["this InputPreparer is in use by another call (another thread's, or one re-entered from "
                        "code this call runs)"]
    assert (inputs.input_ids.tolist(), inputs.slot_mapping.tolist()) == ([3], [34])
    decode.add_new_token(4)
    assert preparer.prepare([], [decode]).slot_mapping.tolist() == [35]
