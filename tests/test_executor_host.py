"""tokcy.executor.prepare_inputs: the worked example, bad input, outputs, complexity."""

import numpy as np
import pytest

from executor_reference import make_request, reference
from hostile_code import RefusesIteration
from tokcy import RequestState, _backend, _pure
from tokcy.executor import ARRAY_FIELDS, HostBuffers, prepare_inputs
from tokcy.executor._host import COUNT_FIELDS
from tokcy.executor._metadata import GROUP_FIELDS, METADATA_FIELDS, MetadataBuffers

IN_PROGRESS = RequestState.GENERATION_IN_PROGRESS


def worked_example(module):
    """Context request: prompt 10, chunk 4, cursor 4. Generation request: 9 tokens and
    2 drafts. Plain generation request: 7 tokens."""
    context = module.Request(1, list(range(100, 110)))
    context.context_current_position = 4
    context.context_chunk_size = 4
    drafted = module.Request(2, list(range(200, 207)))
    drafted.state = IN_PROGRESS
    drafted.add_new_token(207)
    drafted.add_new_token(208)
    drafted.draft_tokens = [900, 901]
    plain = module.Request(3, list(range(300, 305)))
    plain.state = IN_PROGRESS
    plain.add_new_token(305)
    plain.add_new_token(306)
    plain.seq_slot = 3
    return context, drafted, plain


def check(result, **expected):
    for name, value in expected.items():
        actual = getattr(result, name)
        if isinstance(value, list):
            assert actual.tolist() == value, name
            assert actual.dtype == (np.int64 if name == "request_ids" else np.int32), name
        else:
            assert actual == value, name


@pytest.mark.parametrize("use_out", [False, True], ids=["alloc", "out"])
def test_worked_example(backend, use_out):
    context, drafted, plain = worked_example(backend)
    out = HostBuffers(64, 8, 2) if use_out else None
    # the plain request is listed first: the draft request still comes first in the rows
    result = prepare_inputs([context], [plain, drafted], max_draft_len=2, out=out)
    check(
        result,
        input_ids=[104, 105, 106, 107, 208, 900, 901, 306],
        position_ids=[4, 5, 6, 7, 8, 9, 10, 6],
        gather_ids=[3, 4, 5, 6, 7],
        seq_lens=[4, 3, 1],
        num_cached_tokens=[4, 8, 6],
        prompt_lens=[10, 7, 5],
        cu_seqlens=[0, 4, 7, 8],
        request_ids=[1, 2, 3],
        draft_tokens=[900, 901],
        draft_lens=[2],
        device_token_slots=[],
        num_context_requests=1,
        num_context_tokens=4,
        num_generation_tokens=4,
        num_tokens=8,
        num_sequences=3,
        padded_batch_size=3,
        device_token_row_start=8,
    )


@pytest.mark.parametrize("use_out", [False, True], ids=["alloc", "out"])
def test_worked_example_device_token(backend, use_out):
    context, drafted, plain = worked_example(backend)
    out = HostBuffers(64, 8, 2) if use_out else None
    result = prepare_inputs([context], [drafted], device_token_requests=[plain], max_draft_len=2, out=out)
    check(
        result,
        input_ids=[104, 105, 106, 107, 208, 900, 901, 0],
        position_ids=[4, 5, 6, 7, 8, 9, 10, 7],
        gather_ids=[3, 4, 5, 6, 7],
        seq_lens=[4, 3, 1],
        num_cached_tokens=[4, 8, 7],
        prompt_lens=[10, 7, 5],
        cu_seqlens=[0, 4, 7, 8],
        request_ids=[1, 2, 3],
        draft_tokens=[900, 901],
        draft_lens=[2],
        device_token_slots=[3],
        num_context_requests=1,
        num_context_tokens=4,
        num_generation_tokens=4,
        num_tokens=8,
        num_sequences=3,
        padded_batch_size=3,
        device_token_row_start=7,
    )


def test_first_draft_beams_and_padding(backend):
    first = backend.Request(10, [1, 2, 3, 4, 5, 6])
    first.state = IN_PROGRESS
    beams = backend.Request(11, [7, 8], beam_width=2)
    beams.state = IN_PROGRESS
    beams.add_new_token(50, 0)
    beams.add_new_token(60, 1)
    beams.add_new_token(61, 1)
    # first draft, M = 3: tokens [6 - 4, 6) = [2, 6)
    result = prepare_inputs([], [beams], first_draft_requests=[first], max_draft_len=3,
                            cuda_graph_batch_sizes=[8])  # no padding: a first-draft request is present
    check(result, input_ids=[3, 4, 5, 6, 50, 61], position_ids=[2, 3, 4, 5, 3, 3], gather_ids=[3, 4, 5],
          seq_lens=[4, 1, 1], num_cached_tokens=[2, 3, 3], prompt_lens=[6, 2, 2], request_ids=[10, 11, 11],
          num_generation_tokens=6, padded_batch_size=3, num_sequences=3)
    # decode-only: padded from 2 sequences up to the smallest size that holds them
    result = prepare_inputs([], [beams], cuda_graph_batch_sizes=[8, 1, 4])
    check(result, input_ids=[50, 61, 0, 0], position_ids=[3, 3, 0, 0], gather_ids=[0, 1], seq_lens=[1, 1, 1, 1],
          num_cached_tokens=[3, 3, 0, 0], prompt_lens=[2, 2, 0, 0], cu_seqlens=[0, 1, 2, 3, 4],
          request_ids=[11, 11, -1, -1], num_generation_tokens=2, num_tokens=4, num_sequences=2,
          padded_batch_size=4, device_token_row_start=2)


def test_out_is_reused_and_views_are_exact(backend):
    out = HostBuffers(32, 4, 2)
    context, drafted, plain = worked_example(backend)
    first = prepare_inputs([context], [plain, drafted], max_draft_len=2, out=out)
    assert np.shares_memory(first.input_ids, out.input_ids)
    again = prepare_inputs([], [plain], max_draft_len=2, out=out)
    assert again.input_ids.tolist() == [306] and again.cu_seqlens.tolist() == [0, 1]
    assert len(again.draft_tokens) == 0 and len(again.gather_ids) == 1


def test_fields_are_read_only_and_an_array_view_is_made_once_when_read(backend):
    """Each array's view is made on its first read and kept (counted: the views made);
    the counts and the metadata (None without a block size) are read-only like the arrays."""
    context, drafted, plain = worked_example(backend)
    inputs = prepare_inputs([context], [plain, drafted], max_draft_len=2, out=HostBuffers(32, 4, 2))
    assert inputs._views == [None] * 11  # nothing made before a read
    ids = inputs.input_ids
    assert ids is inputs.input_ids and sum(view is not None for view in inputs._views) == 1
    assert ids.tolist() == [104, 105, 106, 107, 208, 900, 901, 306]  # drafted rows first
    assert (inputs.num_tokens, inputs.groups, inputs.kv_lens, inputs.max_kv_len) == (8, None, None, None)
    for name in ("input_ids", "num_tokens", "groups", "slot_mapping"):
        with pytest.raises(AttributeError):
            setattr(inputs, name, None)
    with pytest.raises(AttributeError, match="no attribute 'not_a_field'"):
        inputs.not_a_field  # noqa: B018


def python_calls(call):
    """``call()``'s result and the names of the Python functions it ran (a profile hook;
    ``call`` itself not counted)."""
    import sys

    calls = []
    own = call.__code__
    sys.setprofile(lambda frame, event, arg: calls.append(frame.f_code.co_name)
                   if event == "call" and frame.f_code is not own else None)
    try:
        result = call()
    finally:
        sys.setprofile(None)
    return result, calls


def compiled_entry_live(backend):
    """Whether ``prepare_inputs`` is the compiled function, and the compiled core is live."""
    import types

    return backend.__name__ == "tokcy._core" and not isinstance(prepare_inputs, types.FunctionType)


def test_a_step_into_a_holder_is_compiled_end_to_end_on_the_compiled_core(backend):
    """Once a holder has its writer (made by its first call), a step with no block size is
    compiled end to end when the compiled core is live and was chosen at import: no Python
    function runs (counted with a profile hook), and it gives what the first call, through
    the Python function, gave. Otherwise the Python function runs."""
    out = HostBuffers(32, 4, 2)
    context, drafted, plain = worked_example(backend)
    first = prepare_inputs([context], [plain, drafted], max_draft_len=2, out=out)
    expected = {name: (value.tolist() if isinstance(value, np.ndarray) else value)
                for name, value in first.asdict().items()}
    second, calls = python_calls(lambda: prepare_inputs([context], [plain, drafted], max_draft_len=2, out=out))
    if compiled_entry_live(backend):
        assert calls == []
    else:
        assert "prepare_inputs" in calls and "prepare_into" in calls
    assert second._views == [None] * 11 and second.input_ids.tolist() == expected["input_ids"]
    assert {name: (value.tolist() if isinstance(value, np.ndarray) else value)
            for name, value in second.asdict().items()} == expected
    assert repr(second) == repr(first)


@pytest.mark.parametrize("sizes", [{"block_size": 4}, {"block_sizes": (4,)}, {"block_size": np.int64(4)},
                                   {"block_sizes": [4]}])
def test_a_step_with_a_block_size_into_a_holder_is_compiled_but_its_metadata_record(backend, sizes):
    """With a block size and a holder with metadata, a step is compiled end to end too,
    but for ``PreparedInputs._set_metadata`` (and the Python check of block sizes that are
    not plain ints in a tuple); its rows and metadata are those worked by hand, the same
    as the first call's (through the Python function). Block size 4: the context chunk
    [4, 8) lies in block 1 (id 12), the drafted rows at 8-10 in block 2 (id 23), the plain
    row at 6 in block 1 (id 32)."""
    out = HostBuffers(32, 4, 2, max_blocks_per_seq=4)
    context, drafted, plain = worked_example(backend)
    for request, ids in ((context, [11, 12]), (drafted, [21, 22, 23]), (plain, [31, 32])):
        request.block_tables[0].extend(ids)
    results = []
    for _ in range(2):  # the first through the Python function, which makes the holder's writers
        inputs, calls = python_calls(lambda: prepare_inputs([context], [plain, drafted], max_draft_len=2, out=out,
                                                            **sizes))
        group = inputs.groups[0]
        results.append((inputs.input_ids.tolist(), inputs.kv_lens.tolist(), group.slot_mapping.tolist(),
                        group.kv_indptr.tolist(), group.kv_indices.tolist(), group.kv_last_page_len.tolist(),
                        group.block_table.tolist(), inputs.max_kv_len))
    expected = ([104, 105, 106, 107, 208, 900, 901, 306], [8, 11, 7], [48, 49, 50, 51, 92, 93, 94, 130],
                [0, 2, 5, 7], [11, 12, 21, 22, 23, 31, 32], [4, 3, 3],
                [[11, 12, 0, 0], [21, 22, 23, 0], [31, 32, 0, 0]], 11)
    assert results == [expected, expected]
    if compiled_entry_live(backend):  # (calls: the second call's)
        assert "prepare_inputs" not in calls and "prepare_into" not in calls
        if type(sizes.get("block_size", sizes.get("block_sizes"))) in (int, tuple):
            assert calls == ["_set_metadata"]
    else:
        assert "prepare_inputs" in calls and "prepare_into" in calls


def test_block_sizes_from_a_generator_are_read_once_on_every_path(backend):
    """Block sizes given as a one-pass iterable: on a holder whose metadata was bound
    before its first call (so the metadata writer is cached, the holder's writer not),
    on a holder sharing another's metadata, and on a warmed holder, each call reads them
    once and writes the plain row's slot (block 1 of [31, 32], offset 2: 130)."""
    def plain_request():
        request = worked_example(backend)[2]
        request.block_tables[0].extend([31, 32])
        return request

    bound_first = HostBuffers(32, 4, 2, max_blocks_per_seq=4)
    bound_first.metadata.bound()  # public: the metadata writer cached, the holder's writer not yet made
    sharing = HostBuffers.from_arrays(metadata=bound_first.metadata,
                                      **{name: np.empty_like(array) for name, array in
                                         zip(ARRAY_FIELDS, bound_first.arrays, strict=True)})
    for out in (bound_first, sharing, bound_first):
        inputs = prepare_inputs([], [plain_request()], out=out, block_sizes=(size for size in [4]))
        assert inputs.groups[0].slot_mapping.tolist() == [130] and inputs.input_ids.tolist() == [306]


def test_a_compiled_step_names_bad_block_sizes_as_the_python_function_does(backend):
    """Bad block sizes on a holder whose writers are made (the compiled step's case) raise
    the Python function's errors, and change nothing."""
    out = HostBuffers(32, 4, 2, max_blocks_per_seq=4)
    plain = worked_example(backend)[2]
    plain.block_tables[0].extend([31, 32])
    prepare_inputs([], [plain], out=out, block_size=4)
    for kwargs, error, message in (
            ({"block_size": 0}, ValueError, "block sizes must be >= 1, one per layer group, got (0,)"),
            ({"block_sizes": ()}, ValueError, "block sizes must be >= 1, one per layer group, got ()"),
            ({"block_sizes": (4, "a")}, TypeError, "block sizes must be integers, got (4, 'a')"),
            ({"block_size": 4, "block_sizes": (4,)}, TypeError, "give block_size or block_sizes, not both"),
            ({"block_size": 4.0}, TypeError, "block sizes must be integers, got (4.0,)")):
        with pytest.raises(error) as raised:
            prepare_inputs([], [plain], out=out, **kwargs)
        assert str(raised.value) == message
    assert out.metadata.slot_mapping[0][0] == 130 and out.input_ids[0] == 306


def fields_as_lists(inputs):
    fields = {name: getattr(inputs, name) for name in ARRAY_FIELDS + COUNT_FIELDS + METADATA_FIELDS}
    fields["groups"] = [[getattr(group, name) for name in GROUP_FIELDS] for group in fields["groups"] or ()]
    fields["groups"] = [[value.tolist() if isinstance(value, np.ndarray) else value for value in group]
                        for group in fields["groups"]]
    return {name: value.tolist() if isinstance(value, np.ndarray) else value for name, value in fields.items()}


def pickle_batch(module, groups):
    """The worked example's three requests, with ``groups`` block tables of 8 blocks each."""
    context = module.Request(1, list(range(100, 110)), num_layer_groups=groups)
    context.context_current_position = 4
    context.context_chunk_size = 4
    drafted = module.Request(2, list(range(200, 209)), num_layer_groups=groups)
    drafted.state = IN_PROGRESS
    drafted.draft_tokens = [900, 901]
    plain = module.Request(3, list(range(300, 307)), num_layer_groups=groups)
    plain.state = IN_PROGRESS
    for request in (context, drafted, plain):
        for table in request.block_tables:
            table.extend(range(8 * request.request_id, 8 * request.request_id + 8))
    return [context], [drafted, plain]


@pytest.mark.parametrize("block_sizes", [None, (4,), (4, 2)])
def test_prepared_inputs_pickle_as_a_snapshot_of_what_the_call_wrote(backend, block_sizes):
    """A PreparedInputs written into a holder pickles the used lengths of its arrays and
    its metadata: a copy of its own, unchanged by the holder's next call, of as many bytes
    whatever the holder's capacity (only the block tables' width shows)."""
    import pickle

    groups = 1 if block_sizes is None else len(block_sizes)
    sizes = []
    for capacity in (64, 4096):
        out = HostBuffers(capacity, capacity // 4, max_draft_len=4, max_blocks_per_seq=8, num_layer_groups=groups)
        context, generation = pickle_batch(backend, groups)
        inputs = prepare_inputs(context, generation, block_sizes=block_sizes, max_draft_len=4, out=out)
        expected = fields_as_lists(inputs)
        assert expected["num_tokens"] == 8 and (block_sizes is None) == (expected["kv_lens"] is None)
        data = pickle.dumps(inputs)
        restored = pickle.loads(data)
        assert fields_as_lists(restored) == expected
        prepare_inputs([], generation, block_sizes=block_sizes, max_draft_len=4, out=out)  # the holder's next call
        assert fields_as_lists(inputs) != expected and fields_as_lists(restored) == expected
        sizes.append(len(data))
    assert sizes[0] == sizes[1]


def test_a_holders_arrays_by_name_are_its_whole_arrays(backend):
    """``HostBuffers.<name>`` is the full-capacity array (``arrays`` in ``ARRAY_FIELDS``
    order), read-only as an attribute; any other name is an AttributeError."""
    out = HostBuffers(32, 4, 2)
    prepare_inputs([], [worked_example(backend)[2]], out=out)
    assert all(getattr(out, name) is array for name, array in zip(ARRAY_FIELDS, out.arrays, strict=True))
    assert out.input_ids.shape == (32,) and out.input_ids[0] == 306 and out.request_ids.dtype == np.int64
    with pytest.raises(AttributeError):
        out.input_ids = np.zeros(32, np.int32)
    with pytest.raises(AttributeError, match="no attribute 'input_idz'"):
        out.input_idz  # noqa: B018


def test_empty_batch(backend):
    result = prepare_inputs([], [])
    assert result.num_tokens == 0 and result.cu_seqlens.tolist() == [0] and result.padded_batch_size == 0


# ------------------------------------------------------------------------ bad input
def error_of(call):
    try:
        call()
    except (TypeError, ValueError, RuntimeError) as error:
        return type(error), str(error)
    return None


def run_on(module, build, **kwargs):
    """Build the batch on ``module`` and run prepare_inputs there; the error it raises."""
    saved = _backend.module
    _backend.module = module
    try:
        args, extra = build(module)
        options = {**kwargs, **extra}
        error = error_of(lambda: prepare_inputs(*args, **options))
        if isinstance(options.get("out"), HostBuffers) and error is not None:
            # again, now that the holder has its writer: the compiled core's own path
            assert error_of(lambda: prepare_inputs(*args, **options)) == error
        return error
    finally:
        _backend.module = saved


def _gen(module, request_id, tokens=(1, 2, 3), **fields):
    request = module.Request(request_id, list(tokens), beam_width=fields.pop("beam_width", 1))
    request.state = fields.pop("state", IN_PROGRESS)
    for name, value in fields.items():
        setattr(request, name, value)
    return request


def _ctx(module, request_id, cursor=0, chunk=3, prompt=(1, 2, 3, 4)):
    request = module.Request(request_id, list(prompt))
    request.context_current_position = cursor
    request.context_chunk_size = chunk
    return request


ERROR_CASES = {
    "no arguments": (lambda m: ((), {}), TypeError, "missing 2 required positional arguments"),
    "one argument": (lambda m: (([],), {"out": HostBuffers(8, 2)}), TypeError, "missing 1 required positional"),
    "three arguments": (lambda m: (([], [], []), {"out": HostBuffers(8, 2)}), TypeError,
                        "takes 2 positional arguments but 3 positional arguments (and 1 keyword-only argument)"),
    "unknown keyword": (lambda m: (([], []), {"out": HostBuffers(8, 2), "block_szie": 16}), TypeError,
                        "prepare_inputs() got an unexpected keyword argument 'block_szie'"),
    "not a request": (lambda m: (([object()], []), {}), TypeError, "context_requests[0]"),
    "empty chunk": (lambda m: (([_ctx(m, 5, chunk=0)], []), {}), ValueError, "request 5"),
    "context in generation state": (lambda m: (([_gen(m, 6)], []), {}), ValueError, "request 6"),
    "generation in context state": (lambda m: (([], [_ctx(m, 7)]), {}), ValueError, "request 7"),
    "complete": (lambda m: (([], [_gen(m, 8, state=RequestState.GENERATION_COMPLETE)]), {}), ValueError, "request 8"),
    "device without slot": (lambda m: (([], []), {"device_token_requests": [_gen(m, 9)]}), ValueError, "request 9"),
    "device with beams": (lambda m: (([], []), {"device_token_requests": [_gen(m, 10, beam_width=2, seq_slot=1)]}),
                          ValueError, "request 10"),
    "device with drafts": (lambda m: (([], []), {"device_token_requests": [_gen(m, 11, seq_slot=1, draft_tokens=[5])],
                                                 "max_draft_len": 2}), ValueError, "request 11"),
    "given twice": (lambda m: (lambda r: (([], [r]), {"device_token_requests": [r]}))(_gen(m, 12, seq_slot=0)),
                    ValueError, "request 12"),
    "same id twice": (lambda m: (([], [_gen(m, 13), _gen(m, 13)]), {}), ValueError, "request 13"),
    "too many drafts": (lambda m: (([], [_gen(m, 14, draft_tokens=[1, 2, 3])]), {"max_draft_len": 2}), ValueError,
                        "request 14"),
    "drafts with beams": (lambda m: (([], [_gen(m, 15, beam_width=2, draft_tokens=[1])]), {"max_draft_len": 2}),
                          ValueError, "request 15"),
    "first draft with beams": (lambda m: (([], []), {"first_draft_requests": [_gen(m, 16, beam_width=2)]}),
                               ValueError, "request 16"),
    "no padding size": (lambda m: (([], [_gen(m, 17), _gen(m, 18)]), {"cuda_graph_batch_sizes": [1]}), ValueError,
                        "sizes"),
    "bad padding size": (lambda m: (([], [_gen(m, 19)]), {"cuda_graph_batch_sizes": [0, 4]}), ValueError, ">= 1"),
    "bad max_draft_len": (lambda m: (([], []), {"max_draft_len": -1}), ValueError, "max_draft_len"),
    "float max_draft_len": (lambda m: (([], []), {"max_draft_len": 1.5}), TypeError, "max_draft_len"),
    "bad out": (lambda m: (([], []), {"out": {}}), TypeError, "HostBuffers"),
    "too many tokens": (lambda m: (([_ctx(m, 20, chunk=4)], []), {"out": HostBuffers(3, 4)}), ValueError,
                        "token rows"),
    "too many sequences": (lambda m: (([], [_gen(m, 21), _gen(m, 22)]), {"out": HostBuffers(8, 1)}), ValueError,
                           "sequences"),
    "too many padded sequences": (lambda m: (([], [_gen(m, 23)]), {"out": HostBuffers(8, 2),
                                                                   "cuda_graph_batch_sizes": [4]}),
                                  ValueError, "sequences"),
    "too many drafts for out": (lambda m: (([], [_gen(m, 24, draft_tokens=[1, 2])]),
                                           {"out": HostBuffers(8, 1, 1), "max_draft_len": 2}),
                                ValueError, "draft tokens"),
    "too many beams": (lambda m: (([], [_gen(m, 25, beam_width=3)]), {"out": HostBuffers(8, 4, max_beam_width=2)}),
                       ValueError, "request 25"),
    # isinstance() believes an object's __class__; both backends check its real type
    "claims to be a Request": (lambda m: (([], [type("Impostor", (), {"__class__": property(lambda _: m.Request)})()]),
                                          {}), TypeError,
                               "generation_requests[0] must be a Request, not test_executor_host.Impostor"),
}


@pytest.mark.parametrize("group", ["context_requests", "generation_requests", "first_draft_requests",
                                   "device_token_requests"])
def test_a_request_of_the_other_backend_is_named_as_such(backend, both_backends, group):
    """prepare_inputs, in every request group, refuses the other backend's Request with the
    connector's message: the class it got and the class the live backend takes."""
    compiled, pure = both_backends
    other = pure if backend is compiled else compiled
    live = "tokcy._core.Request" if backend is compiled else "tokcy._pure.request.Request"
    given = "tokcy._pure.request.Request" if backend is compiled else "tokcy._core.Request"
    groups = {"context_requests": [], "generation_requests": []}
    groups[group] = [other.Request(1, [1, 2])]
    with pytest.raises(TypeError) as caught:
        prepare_inputs(**groups, max_draft_len=1)
    assert str(caught.value) == f"{group}[0] must be a Request, not {given} (the live backend takes {live})"


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_bad_input(backend, case):
    build, kind, fragment = ERROR_CASES[case]
    error = run_on(backend, build)
    assert error is not None and error[0] is kind and fragment in error[1], error
    assert run_on(_pure, build) == error  # same type and message on both backends


def test_failed_call_writes_nothing(backend):
    out = HostBuffers(8, 2)
    for array in out.arrays:
        array.fill(77)
    context = _ctx(backend, 1, chunk=3)
    with pytest.raises(ValueError, match="sequences"):
        prepare_inputs([context], [_gen(backend, 2), _gen(backend, 3)], out=out)
    with pytest.raises(ValueError, match="request 4"):
        prepare_inputs([context], [_gen(backend, 4, state=RequestState.CONTEXT_INIT)], out=out)
    assert all((array == 77).all() for array in out.arrays)
    # and the holder still works afterwards
    assert prepare_inputs([context], [], out=out).input_ids.tolist() == [1, 2, 3]


def test_out_arrays_are_checked(backend):
    good = {name: array for name, array in zip(
        ("input_ids", "position_ids", "gather_ids", "seq_lens", "num_cached_tokens", "prompt_lens", "cu_seqlens",
         "request_ids", "draft_tokens", "draft_lens", "device_token_slots"), HostBuffers(8, 4, 1).arrays)}
    with pytest.raises(TypeError, match="request_ids"):
        HostBuffers.from_arrays(**{**good, "request_ids": np.zeros(4, dtype=np.int32)})
    with pytest.raises(TypeError, match="input_ids"):
        HostBuffers.from_arrays(**{**good, "input_ids": np.zeros(8, dtype=np.int64)})
    with pytest.raises(ValueError, match="position_ids"):
        HostBuffers.from_arrays(**{**good, "position_ids": np.zeros(16, dtype=np.int32)[::2]})
    with pytest.raises(TypeError, match="missing"):
        HostBuffers.from_arrays(input_ids=good["input_ids"])
    small = HostBuffers.from_arrays(**{**good, "gather_ids": np.zeros(1, dtype=np.int32)})
    requests = [_gen(backend, 1), _gen(backend, 2)]
    with pytest.raises(ValueError, match="gathered rows"):
        prepare_inputs([], requests, out=small)


def misaligned(dtype, count):
    """A writable, C-contiguous 1-D array of ``dtype`` whose entries are not aligned to their
    size (half an entry into a bytearray: numpy allows it, and flags it not aligned)."""
    size = np.dtype(dtype).itemsize
    array = np.ndarray((count,), dtype, buffer=bytearray((count + 1) * size), offset=size // 2)
    assert not array.flags.aligned and array.flags.writeable and array.flags.c_contiguous
    return array


@pytest.mark.parametrize("name", ["request_ids", "input_ids"])
def test_misaligned_out_arrays_are_refused(backend, name):
    """The compiled core writes each entry through a typed C pointer, which must be aligned
    (the sanitizer build reported such a store): both backends refuse the array, naming it."""
    good = dict(zip(ARRAY_FIELDS, HostBuffers(8, 4, 1).arrays))
    bad = misaligned(np.int64 if name == "request_ids" else np.int32, len(good[name]))
    with pytest.raises(ValueError, match=f"out array {name} must be 1-D, C-contiguous, aligned and writable"):
        HostBuffers.from_arrays(**{**good, name: bad})


def test_misaligned_metadata_arrays_are_refused(backend):
    holder = MetadataBuffers(8, 4, 4)
    arrays = dict(zip(("kv_lens", "cu_kv_seqlens"), (holder.kv_lens, holder.cu_kv_seqlens)))
    slots = misaligned(np.int64, 8)
    with pytest.raises(ValueError, match="slot_mapping must be a 1-D, C-contiguous, writable, aligned int64"):
        MetadataBuffers.from_arrays(4, arrays["kv_lens"], arrays["cu_kv_seqlens"], [slots], [holder.kv_indptr[0]],
                                    [holder.kv_last_page_len[0]]).bound(backend)


# ------------------------------------------------------------------ cost by counting
def counting_batch(module, length):
    """The same batch shape at sequence length ``length``: a 64-token chunk at the end of
    the prompt, 8 generation requests (3 with 2 drafts), 2 first-draft, 2 device rows."""
    descs = {"context": [{"kind": "context", "id": 0, "prompt": list(range(length)), "cursor": length - 64,
                          "chunk": 64}]}
    descs["generation"] = [{"kind": "generation", "id": 1 + i, "prompt": list(range(length)), "generated": [[5]],
                            "drafts": [1, 2] if i < 3 else None} for i in range(8)]
    descs["first_draft"] = [{"kind": "first_draft", "id": 20 + i, "prompt": list(range(length))} for i in range(2)]
    descs["device"] = [{"kind": "device", "id": 30 + i, "prompt": list(range(length)), "slot": i} for i in range(2)]
    return {group: [make_request(module, desc) for desc in items] for group, items in descs.items()}


def test_cost_is_flat_in_sequence_length(backend):
    """Tokens copied = tokens emitted (64 + 3*3 + 5 + 2*4), the same at L=256 and L=65,536."""
    copied = []
    for length in (256, 65_536):
        batch = counting_batch(backend, length)
        out = HostBuffers(256, 32, 3)
        writer = out.writer()
        result = prepare_inputs(batch["context"], batch["generation"], first_draft_requests=batch["first_draft"],
                                device_token_requests=batch["device"], max_draft_len=3, out=out)
        expected = reference(batch["context"], batch["generation"], batch["first_draft"], batch["device"], 3, None)
        np.testing.assert_array_equal(result.input_ids, expected[0]["input_ids"])
        copied.append(writer.tokens_copied)
        assert writer.tokens_copied == result.num_tokens - len(result.device_token_slots)
    assert copied == [64 + 3 * 3 + 5 + 2 * 4] * 2


@pytest.mark.parametrize("group", ["context_requests", "generation_requests", "first_draft_requests",
                                   "device_token_requests"])
@pytest.mark.parametrize("where", ["allocated", "out", "out with metadata"])
@pytest.mark.parametrize("given", ["a Request", "an int"])
def test_a_group_that_is_not_iterable_is_named(backend, group, where, given):
    """A single Request (or an int) where a list of them goes: a TypeError naming the
    argument and what it got, worded alike on both backends, and nothing written."""
    request = backend.Request(1, [5, 6, 7])
    value = request if given == "a Request" else 7
    groups = {"context_requests": [], "generation_requests": []}
    groups[group] = value
    out = None if where == "allocated" else HostBuffers(16, 4, 2, max_blocks_per_seq=None if where == "out" else 4)
    options = {"block_size": 4} if where == "out with metadata" else {}
    before = None if out is None else [array.copy() for array in out.arrays]
    with pytest.raises(TypeError) as caught:
        prepare_inputs(**groups, max_draft_len=2, out=out, **options)
    name = "Request" if given == "a Request" else "int"
    assert str(caught.value) == f"{group} must be a list (or another iterable) of Requests, not a {name}"
    if out is not None:
        assert all(np.array_equal(array, old) for array, old in zip(out.arrays, before))
    assert request.get_tokens(0) == [5, 6, 7] and request.context_current_position == 0


@pytest.mark.parametrize("group", ["context_requests", "generation_requests", "first_draft_requests",
                                   "device_token_requests"])
def test_a_groups_own_type_error_from_iter_is_raised_as_it_is(backend, group):
    """An iterable whose ``__iter__`` raises TypeError: that error, as raised (not the
    message for a group that is not iterable at all), on both backends."""
    groups = {"context_requests": [], "generation_requests": [], group: RefusesIteration()}
    with pytest.raises(TypeError, match="^this batch is not ready$"):
        prepare_inputs(**groups, max_draft_len=2)
