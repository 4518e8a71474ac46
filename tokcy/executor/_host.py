"""The host side of input preparation: ``prepare_inputs``, its result and its output holder.

The backend (``tokcy._backend.module``, looked up at call time) provides ``InputWriter``,
the one-pass loop; this module validates the arguments that are the same for both
backends, owns the arrays and wraps the counts.
"""

import operator

import numpy as np

from tokcy import _backend
from tokcy._prepare_checks import BIND_ARRAYS, GROUP_NAMES, owned_batch_sizes, request_group
from tokcy.executor._metadata import (
    METADATA_FIELDS,
    MetadataBuffers,
    _made_fields,
    _metadata_property,
    attach,
    block_sizes_arg,
)
from tokcy.executor._memory import zeros
from tokcy.executor._read_only import read_only

#: The array attributes of ``PreparedInputs``, in the order ``InputWriter.bind`` takes them.
ARRAY_FIELDS = BIND_ARRAYS
#: The integer attributes of ``PreparedInputs``.
COUNT_FIELDS = (
    "num_context_requests",
    "num_context_tokens",
    "num_generation_tokens",
    "num_tokens",
    "num_sequences",
    "padded_batch_size",
    "device_token_row_start",
)
_REQUEST_IDS = ARRAY_FIELDS.index("request_ids")
_new_object = object.__new__
_NUM_ARRAYS = len(ARRAY_FIELDS)  # an inputs object's views, one slot per array field


def _count(value, name, minimum=0):
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}") from None
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def capacity_lengths(max_num_tokens, max_batch_size, max_draft_len):
    """{array name: entries it needs} for a batch within these capacities."""
    return {
        "input_ids": max_num_tokens,
        "position_ids": max_num_tokens,
        "gather_ids": max_num_tokens,
        "seq_lens": max_batch_size,
        "num_cached_tokens": max_batch_size,
        "prompt_lens": max_batch_size,
        "cu_seqlens": max_batch_size + 1,
        "request_ids": max_batch_size,
        "draft_tokens": max_batch_size * max_draft_len,
        "draft_lens": max_batch_size,
        "device_token_slots": max_batch_size,
    }


# Used length of each array (ARRAY_FIELDS order) as (index into a writer's counts tuple,
# added): num_tokens is counts[3], padded_batch_size counts[5], then the writer's extra
# counts (gather rows, draft tokens, draft requests, device-token rows) at 7..10.
_USED_LENGTH = ((3, 0), (3, 0), (7, 0), (5, 0), (5, 0), (5, 0), (5, 1), (5, 0), (8, 0), (9, 0), (10, 0))


def _used_length(index, counts):
    """Used length of array ``index`` (ARRAY_FIELDS order) from a writer's counts tuple."""
    position, added = _USED_LENGTH[index]
    return counts[position] + added


class PreparedInputs:
    """The host arrays of one iteration (numpy views of exactly the used length) and its counts.

    Arrays: ``input_ids``, ``position_ids`` (one entry per token row, padding included),
    ``gather_ids`` (rows whose logits are computed), per sequence ``seq_lens``,
    ``num_cached_tokens``, ``prompt_lens``, ``request_ids`` (int64, -1 for padding) and
    ``cu_seqlens`` (sequences + 1 entries from 0), the flat ``draft_tokens`` of the
    generation requests that carry drafts with their ``draft_lens``, and the
    ``device_token_slots`` of the device-token rows. Counts: see ``COUNT_FIELDS``.

    With a block size, also the attention metadata (``METADATA_FIELDS``: ``kv_lens``,
    ``cu_kv_seqlens``, ``max_query_len``, ``max_kv_len``, group 0's ``slot_mapping``,
    ``block_table``, ``kv_indptr``, ``kv_indices``, ``kv_last_page_len``, and ``groups``,
    one ``LayerGroupInputs`` per layer group); without one these read None.

    With ``out=`` the arrays are views of the holder's buffers: the next call overwrites them.
    """

    __slots__ = ("_arrays", "_counts", "_metadata", "_views")

    # Every field is a read-only property (defined below the class). An array's view is
    # made on its first read and kept, and the metadata fields are made together on the
    # first read of any: a step pays only for what it reads. (Unset slots with a
    # __getattr__ fallback would cost a formatted AttributeError on every first read, and
    # slow every other attribute read too.)
    def __init__(self, arrays, counts):
        self._arrays = arrays if type(arrays) in (list, tuple) else tuple(arrays)
        self._counts = counts
        self._metadata = None
        self._views = [None] * _NUM_ARRAYS

    def _metadata_fields(self):
        return _made_fields(self, attach)  # from (buffers, results, block sizes, tokens, padded)

    def _set_metadata(self, buffers, results, block_sizes):
        """The metadata attributes come from ``buffers`` (views of the used lengths) when read."""
        self._metadata = (buffers, results, block_sizes, self._counts[3], self._counts[5])

    def __repr__(self):
        counts = ", ".join(f"{name}={getattr(self, name)}" for name in COUNT_FIELDS)
        return f"PreparedInputs({counts})"

    def asdict(self):
        """Every field as a dict (arrays are the same views, not copies); the metadata
        fields only when the call wrote them."""
        names = ARRAY_FIELDS + COUNT_FIELDS + (METADATA_FIELDS if self.groups is not None else ())
        return {name: getattr(self, name) for name in names}

    def __reduce__(self):
        # the arrays of the used lengths (a pickle holds copies of them: the inputs as they
        # are now, not the holder's buffers, which the next call overwrites and which bind
        # writers), the counts, and the metadata fields made from them
        arrays = tuple(getattr(self, name) for name in ARRAY_FIELDS)
        return _restored_inputs, (arrays, self._counts, None if self._metadata is None else self._metadata_fields())


def _restored_inputs(arrays, counts, metadata):
    inputs = PreparedInputs(arrays, counts)
    inputs._metadata = metadata  # None, or the fields themselves (a _MetadataFields)
    return inputs


def _array_property(index, name):
    def read(self):
        views = self._views
        view = views[index]
        if view is None:
            view = views[index] = self._arrays[index][: _used_length(index, self._counts)]
        return view

    read.__name__ = name
    return property(read, doc=f"``{name}``: a numpy view of exactly the used length (made on first read).")


def _count_property(index, name, what):
    def read(self):
        return self._counts[index]

    read.__name__ = name
    return property(read, doc=f"``{name}`` ({what}).")


def _install_fields(cls, array_property, count_is):
    """Give an inputs class (``PreparedInputs``, ``DeviceInputs``) its read-only fields:
    ``array_property(index, name)`` per array, per count a property reading
    ``self._counts[index]`` (documented as ``count_is``), in ``ARRAY_FIELDS`` /
    ``COUNT_FIELDS`` order, and the metadata's properties."""
    for index, name in enumerate(ARRAY_FIELDS):
        setattr(cls, name, array_property(index, name))
    for index, name in enumerate(COUNT_FIELDS):
        setattr(cls, name, _count_property(index, name, count_is))
    for name in METADATA_FIELDS:
        setattr(cls, name, _metadata_property(name))


_install_fields(PreparedInputs, _array_property, "an int")


HOST_BUFFER_FIELDS = ("arrays", "max_num_tokens", "max_batch_size", "max_draft_len", "max_beam_width", "metadata")


class HostBuffers:
    """Preallocated output arrays for ``prepare_inputs(..., out=...)``: capacities
    ``max_num_tokens`` token rows and ``max_batch_size`` sequences (beams and padding
    included), ``max_batch_size * max_draft_len`` draft tokens; ``max_beam_width`` (None:
    no limit beyond the sequences) caps a plain generation request's beams.

    ``max_blocks_per_seq`` (None: no metadata) sizes the attention metadata for calls with
    a block size: that many blocks per block table, ``num_layer_groups`` layer groups.
    Every field (``arrays``, the capacities, ``metadata``) is read-only.
    """

    __slots__ = tuple("_" + name for name in HOST_BUFFER_FIELDS) + ("_writers",)

    def __init__(self, max_num_tokens, max_batch_size, max_draft_len=0, *, max_beam_width=None,
                 max_blocks_per_seq=None, num_layer_groups=1):
        max_num_tokens = _count(max_num_tokens, "max_num_tokens")
        max_batch_size = _count(max_batch_size, "max_batch_size")
        max_draft_len = _count(max_draft_len, "max_draft_len")
        metadata = None
        if max_blocks_per_seq is not None:
            metadata = MetadataBuffers(max_num_tokens, max_batch_size,
                                       _count(max_blocks_per_seq, "max_blocks_per_seq", 1),
                                       _count(num_layer_groups, "num_layer_groups", 1))
        arrays = capacity_lengths(max_num_tokens, max_batch_size, max_draft_len)
        arrays = dict(zip(arrays, zeros(*((size, np.int64 if name == "request_ids" else np.int32)
                                          for name, size in arrays.items()))))
        self._setup(arrays, max_draft_len, max_beam_width, metadata)

    @classmethod
    def from_arrays(cls, *, max_draft_len=0, max_beam_width=None, metadata=None, **arrays):
        """A holder over caller-owned arrays (each 1-D, C-contiguous, aligned, writable; int32,
        and int64 for ``request_ids``), e.g. views of one packed staging buffer.
        TypeError for a wrong type or dtype, ValueError for a wrong shape or layout."""
        missing = [name for name in ARRAY_FIELDS if name not in arrays]
        extra = [name for name in arrays if name not in ARRAY_FIELDS]
        if missing or extra:
            raise TypeError(f"from_arrays() needs exactly the arrays {ARRAY_FIELDS}; missing {missing}, unknown {extra}")
        self = cls.__new__(cls)
        self._setup(arrays, _count(max_draft_len, "max_draft_len"), max_beam_width, metadata)
        return self

    def _setup(self, arrays, max_draft_len, max_beam_width, metadata=None):
        for name in ARRAY_FIELDS:
            array = arrays[name]
            dtype = np.dtype(np.int64 if name == "request_ids" else np.int32)
            if not isinstance(array, np.ndarray):
                raise TypeError(f"out array {name} must be a numpy array, not {type(array).__name__}")
            if array.dtype != dtype:
                raise TypeError(f"out array {name} must have dtype {dtype}, got {array.dtype}")
            if array.ndim != 1 or not array.flags.c_contiguous or not array.flags.writeable or not array.flags.aligned:
                raise ValueError(f"out array {name} must be 1-D, C-contiguous, aligned and writable")
        if len(arrays["cu_seqlens"]) < 1:
            raise ValueError("out array cu_seqlens needs at least one entry")
        self._arrays = tuple(arrays[name] for name in ARRAY_FIELDS)
        self._max_num_tokens = min(len(arrays["input_ids"]), len(arrays["position_ids"]))
        per_sequence = ("seq_lens", "num_cached_tokens", "prompt_lens", "request_ids")
        self._max_batch_size = min(min(len(arrays[name]) for name in per_sequence), len(arrays["cu_seqlens"]) - 1)
        self._max_draft_len = max_draft_len
        self._max_beam_width = None if max_beam_width is None else _count(max_beam_width, "max_beam_width", 1)
        self._metadata = metadata
        self._writers = {}

    def __repr__(self):
        return (f"HostBuffers(max_num_tokens={self.max_num_tokens}, max_batch_size={self.max_batch_size}, "
                f"max_draft_len={self.max_draft_len}, max_beam_width={self.max_beam_width})")

    def __reduce__(self):
        raise TypeError("a HostBuffers cannot be pickled or copied: its arrays are bound to its writers (a copy "
                        "would be a second writer over them); make another with the same capacities")

    def writer(self, module=None):
        """The backend's ``InputWriter`` bound to these arrays (one per backend, made once)."""
        module = _backend.module if module is None else module
        writer = self._writers.get(module)
        if writer is None:
            writer = module.InputWriter()
            writer.bind(*self.arrays)
            if self.metadata is not None:
                writer.set_metadata(self.metadata.bound(module))
            # the first one kept wins: two threads' first calls share one writer (and its
            # busy guard) even when both made one
            writer = self._writers.setdefault(module, writer)
        return writer


read_only(HostBuffers, HOST_BUFFER_FIELDS)


def _capacity_array_property(index, name):
    def read(self):
        return self._arrays[index]

    read.__name__ = name
    return property(read, doc=f"``{name}``: the whole array (its full capacity).")


# the full-capacity arrays by name (holder.input_ids, ...), as properties: a __getattr__
# would slow every other attribute read of a holder, and let any name type-check
for _index, _name in enumerate(ARRAY_FIELDS):
    setattr(HostBuffers, _name, _capacity_array_property(_index, _name))
del _index, _name


def prepare_inputs(context_requests, generation_requests, *, first_draft_requests=(), device_token_requests=(),
                   max_draft_len=0, cuda_graph_batch_sizes=None, out=None, block_size=None, block_sizes=None,
                   max_blocks_per_seq=None):
    """Build the model inputs of one iteration in one pass over the requests.

    Row order: ``context_requests`` (chunk [p, p + c) of beam 0), then the requests of
    ``generation_requests`` that carry draft tokens (last token + k drafts), then
    ``first_draft_requests`` (the last max_draft_len + 1 tokens), then the other
    ``generation_requests`` (a row per beam), then ``device_token_requests`` (a
    placeholder row the device fills from the previous step, at the request's
    ``seq_slot``), then padding rows up to the smallest of ``cuda_graph_batch_sizes``
    that holds the batch (only for batches without context and first-draft requests).

    ``block_size`` (one layer group) or ``block_sizes`` (one per group): also write the
    attention metadata (docs/attention.md); ``max_blocks_per_seq`` is the dense table's
    width without ``out`` (default: the longest block table of the batch).

    ``out``: a ``HostBuffers`` to write into (no allocation); without it, arrays are
    allocated to fit. Returns a ``PreparedInputs``. Cost O(batch + emitted tokens), plus
    O(blocks held) for the host block tables.
    Raises TypeError / ValueError, before writing anything, for a bad batch.
    """
    if type(max_draft_len) is not int or max_draft_len < 0:
        max_draft_len = _count(max_draft_len, "max_draft_len")
    sizes_per_group = None if block_size is None and block_sizes is None else block_sizes_arg(block_size, block_sizes)
    module = _backend.module
    if out is None:
        if sizes_per_group is not None:  # planned twice below: each plan reads what the first read
            # (as a writer's plan orders it: the groups that are not lists or tuples iterated,
            # then the batch sizes converted; the lists given are read after both)
            groups = [group if type(group) in (list, tuple) else request_group(group, name) for group, name in
                      zip((context_requests, generation_requests, first_draft_requests, device_token_requests),
                          GROUP_NAMES)]
            cuda_graph_batch_sizes = owned_batch_sizes(cuda_graph_batch_sizes)
            context_requests, generation_requests, first_draft_requests, device_token_requests = (
                tuple(group) for group in groups)
        writer = module.InputWriter()
        num_tokens, num_gather, padded, num_drafts, num_draft_requests, num_device = writer.plan(
            context_requests, generation_requests, first_draft_requests, device_token_requests, max_draft_len,
            cuda_graph_batch_sizes, 0)
        sizes = (num_tokens, num_tokens, num_gather, padded, padded, padded, padded + 1, padded, num_drafts,
                 num_draft_requests, num_device)
        arrays = [np.empty(size, dtype=np.int64 if index == _REQUEST_IDS else np.int32)
                  for index, size in enumerate(sizes)]
        writer.bind(*arrays)
        if sizes_per_group is None:
            return PreparedInputs(arrays, writer.write())
        # the token sizes are known: make the metadata arrays, then plan again with them
        requests = (context_requests, generation_requests, first_draft_requests, device_token_requests)
        if max_blocks_per_seq is None:
            max_blocks_per_seq = max([len(table) for group in requests for request in group
                                      for table in request.block_tables] + [1])
        metadata = MetadataBuffers(num_tokens, padded, _count(max_blocks_per_seq, "max_blocks_per_seq", 1),
                                   len(sizes_per_group))
        writer.set_metadata(metadata.bound(module))
        writer.plan(*requests, max_draft_len, cuda_graph_batch_sizes, 0, sizes_per_group)
        prepared = PreparedInputs(arrays, writer.write())
        prepared._set_metadata(metadata, metadata.bound(module).results(), sizes_per_group)
        return prepared
    if not isinstance(out, HostBuffers):
        raise TypeError(f"out must be a tokcy.executor.HostBuffers, not {type(out).__name__}")
    return prepare_into(out, module, context_requests, generation_requests, first_draft_requests,
                        device_token_requests, max_draft_len, cuda_graph_batch_sizes, sizes_per_group)


def prepare_into(out, module, context_requests, generation_requests, first_draft_requests, device_token_requests,
                 max_draft_len, cuda_graph_batch_sizes, sizes_per_group):
    """``prepare_inputs(..., out=out)`` with its arguments already checked (``sizes_per_group``:
    a tuple of block sizes or None)."""
    writer = out._writers.get(module) or out.writer(module)

    def inputs_of(counts):
        # made while the writer still holds its guard (and its metadata's): a call that got
        # in before (a collection's callback at an allocation here) would rewrite the rows
        # and the metadata these counts and results describe
        results = None
        if sizes_per_group is not None:
            metadata = out.metadata
            results = (metadata._writers.get(module) or metadata.bound(module)).results()  # bound()'s cache first
        return written_inputs(out, counts, results, sizes_per_group)

    return writer.prepare(context_requests, generation_requests, first_draft_requests, device_token_requests,
                          max_draft_len, cuda_graph_batch_sizes, out.max_beam_width or 0, sizes_per_group,
                          make_result=inputs_of)


def written_inputs(out, counts, results, sizes_per_group):
    """The ``PreparedInputs`` of a call that wrote ``counts`` into ``out``, with the metadata
    writer's ``results()`` when the call gave block sizes (``DeviceInputs.host`` makes
    its staging buffer's this way when first read)."""
    prepared = _new_object(PreparedInputs)  # PreparedInputs(out.arrays, counts) without the __init__ call
    prepared._arrays = out.arrays
    prepared._counts = counts
    prepared._metadata = None
    prepared._views = [None] * _NUM_ARRAYS
    if sizes_per_group is not None:
        prepared._set_metadata(out.metadata, results, sizes_per_group)
    return prepared


# the backend chosen at import gives the function users call: the compiled one runs the
# common step (a HostBuffers, with or without block sizes) in C and hands every other
# call, and every call while another backend is live, to the function above; the twin
# gives that function
prepare_inputs = _backend.module.prepare_inputs_entry(prepare_inputs, HostBuffers, PreparedInputs, _backend)
