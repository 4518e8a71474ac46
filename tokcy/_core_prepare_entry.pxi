# tokcy.executor.prepare_inputs on the compiled backend: the common step (a HostBuffers,
# with or without block sizes) in C, every other call handed to the Python function it
# stands in for (tokcy/executor/_host.py, which binds it, see prepare_inputs_entry).
#
# Why compiled: a Python function with prepare_inputs' signature costs ~1,400 instructions
# per call before its first line (CPython looks up each of its eight keyword-only
# defaults in a dict), and the Python steps around the pass (prepare_into, the
# PreparedInputs) cost twice that again; this function parses the same arguments in C.

cdef object PYTHON_PREPARE_INPUTS = None  # tokcy.executor._host.prepare_inputs
cdef object HOST_BUFFERS = None           # tokcy.executor.HostBuffers
cdef object PREPARED_INPUTS = None        # tokcy.executor.PreparedInputs
cdef object BACKEND_CHOICE = None         # tokcy._backend (whose .module is the live backend)
cdef object BLOCK_SIZES_ARG = None        # tokcy.executor._metadata.block_sizes_arg
cdef object THIS_MODULE = None            # tokcy._core
cdef object new_object = object.__new__   # an instance without its __init__ call
cdef object MISSING = object()            # a positional argument not given


def prepare_inputs_entry(python_prepare_inputs, host_buffers, prepared_inputs, backend_choice):
    """Bind the compiled ``prepare_inputs`` to tokcy.executor's classes and return it
    (tokcy.executor._host calls this once, when it loads): it has the Python function's
    name, signature and docstring."""
    global PYTHON_PREPARE_INPUTS, HOST_BUFFERS, PREPARED_INPUTS, BACKEND_CHOICE, THIS_MODULE, BLOCK_SIZES_ARG
    import inspect
    import sys

    from tokcy.executor._metadata import block_sizes_arg

    BLOCK_SIZES_ARG = block_sizes_arg
    PYTHON_PREPARE_INPUTS = python_prepare_inputs
    HOST_BUFFERS = host_buffers
    PREPARED_INPUTS = prepared_inputs
    BACKEND_CHOICE = backend_choice
    THIS_MODULE = sys.modules[__name__]
    for name in ("__name__", "__qualname__", "__module__", "__doc__"):
        setattr(_prepare_inputs, name, getattr(python_prepare_inputs, name))
    _prepare_inputs.__signature__ = inspect.signature(python_prepare_inputs)
    return _prepare_inputs


def prepare_inputs(context_requests=MISSING, generation_requests=MISSING, *more_positional, first_draft_requests=(),
                   device_token_requests=(), max_draft_len=0, cuda_graph_batch_sizes=None, out=None, block_size=None,
                   block_sizes=None, max_blocks_per_seq=None):
    # the two positional arguments have a default here only so that a call with another
    # number of them reaches the Python function, which raises CPython's own message
    cdef InputWriter writer
    cdef bint two_positional = (context_requests is not MISSING and generation_requests is not MISSING
                                and not more_positional)
    if (two_positional and type(out) is HOST_BUFFERS and type(max_draft_len) is int and max_draft_len >= 0
            and BACKEND_CHOICE.module is THIS_MODULE):
        found = out._writers.get(THIS_MODULE)  # HostBuffers.writer()'s cache, without its call
        sizes = metadata = meta = None
        if type(found) is InputWriter and (block_size is not None or block_sizes is not None):
            # the holder's metadata (read-only) and its writer from MetadataBuffers.bound()'s
            # cache, which HostBuffers.writer() filled (none: the Python function says so);
            # looked up before the block sizes are converted, so that a call handed on gets
            # them unread
            metadata = out._metadata
            meta = None if metadata is None else metadata._writers.get(THIS_MODULE)
            if type(meta) is AttentionMetadata:
                sizes = plain_block_sizes(block_size, block_sizes)
                if sizes is None:  # anything else: the Python check's tuple, or its error
                    sizes = BLOCK_SIZES_ARG(block_size, block_sizes)
            else:
                found = None
        if type(found) is InputWriter:
            writer = <InputWriter>found
            max_beam_width = out._max_beam_width
            # the writer's guard held until the inputs are made: a call that got in before
            # (a collection's callback at one of their allocations) would rewrite the rows
            # and the metadata these counts and results describe
            writer._enter()
            try:
                counts = writer._plan_and_write(context_requests, generation_requests, first_draft_requests,
                                                device_token_requests, max_draft_len, cuda_graph_batch_sizes,
                                                0 if max_beam_width is None else max_beam_width, sizes, -1)
                # PreparedInputs(out.arrays, counts), without its __init__ call (prepare_into's too)
                arrays = out._arrays
                prepared = new_object(PREPARED_INPUTS)
                prepared._arrays = arrays
                prepared._counts = counts
                prepared._metadata = None
                prepared._views = [None] * len(arrays)
                if sizes is not None:
                    prepared._set_metadata(metadata, (<AttentionMetadata>meta).results(), sizes)
            finally:
                writer._leave()
            return prepared
    if PYTHON_PREPARE_INPUTS is None:
        raise RuntimeError("tokcy._core._prepare_inputs is not bound: call tokcy.executor.prepare_inputs")
    if two_positional:  # every argument by name: no default for CPython to look up
        return PYTHON_PREPARE_INPUTS(
            context_requests, generation_requests, first_draft_requests=first_draft_requests,
            device_token_requests=device_token_requests, max_draft_len=max_draft_len,
            cuda_graph_batch_sizes=cuda_graph_batch_sizes, out=out, block_size=block_size, block_sizes=block_sizes,
            max_blocks_per_seq=max_blocks_per_seq)
    # another number of positional arguments: the Python function raises CPython's own
    # message for the arguments given (a keyword one counts as given unless it is its
    # default object)
    options = {name: value for name, value, default in (
        ("first_draft_requests", first_draft_requests, ()), ("device_token_requests", device_token_requests, ()),
        ("max_draft_len", max_draft_len, 0), ("cuda_graph_batch_sizes", cuda_graph_batch_sizes, None),
        ("out", out, None), ("block_size", block_size, None), ("block_sizes", block_sizes, None),
        ("max_blocks_per_seq", max_blocks_per_seq, None)) if value is not default}
    if more_positional:  # then both were given by position
        return PYTHON_PREPARE_INPUTS(context_requests, generation_requests, *more_positional, **options)
    if context_requests is not MISSING:
        options["context_requests"] = context_requests
    if generation_requests is not MISSING:
        options["generation_requests"] = generation_requests
    return PYTHON_PREPARE_INPUTS(**options)


cdef tuple plain_block_sizes(object block_size, object block_sizes):
    """The block sizes of a call that gives one ``int`` >= 1 as ``block_size`` or a tuple of
    them as ``block_sizes`` (what block_sizes_arg() returns for them, without its checks'
    cost), else None."""
    if block_sizes is None:
        if type(block_size) is int and block_size >= 1:
            return (block_size,)
        return None
    if block_size is not None or type(block_sizes) is not tuple or not block_sizes:
        return None
    for value in <tuple>block_sizes:
        if type(value) is not int or value < 1:
            return None
    return <tuple>block_sizes


# named prepare_inputs above for its error messages; kept under a private name, since it
# works only once bound (tokcy.executor's prepare_inputs is the public one)
_prepare_inputs = prepare_inputs
del prepare_inputs
