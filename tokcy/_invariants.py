"""The invariants of ``Request`` and ``BlockTable``, checked wherever state enters.

Both backends call these functions from their constructors and restore paths (pickles
of either backend, ``restore_request``, ``restore_block_table``, ``Request._from_state``),
so a bad value raises the same ValueError / TypeError, naming the field, before anything
is created. ``docs/invariants.md`` is the written-down list; the hot loops rely on it and
re-check, at their boundary, what each copy needs.
"""

import gc
import weakref

import numpy as np

from tokcy._state import RequestState
from tokcy._tokens import INT32_MAX, as_int32_array, as_integer

MAX_BEAM_WIDTH = 1024
MAX_LAYER_GROUPS = 1024
MAX_TOKENS = INT32_MAX  # positions and prompt lengths travel as int32
MAX_PAUSES = 2**62  # pause() counts up: a restored count leaves room to never overflow int64

REQUEST_FIELDS = (
    "request_id",
    "beams",
    "dirty_from",
    "prompt_len",
    "orig_prompt_len",
    "max_new_tokens",
    "state",
    "seq_slot",
    "context_current_position",
    "context_chunk_size",
    "draft_tokens",
    "block_tables",
    "num_pauses",
    "dict",
)


def _bounded(value, name, low, high):
    number = as_integer(value, name)
    if not low <= number <= high:
        raise ValueError(f"{name} {number} is outside [{low}, {high}]")
    return number


def _count(value, name, maximum):
    number = as_integer(value, name)
    if number < 1:
        raise ValueError(f"{name} must be >= 1, got {number}")
    if number > maximum:
        raise ValueError(f"{name} {number} exceeds the maximum of {maximum}")
    return number


def check_beam_width(value):
    """``beam_width`` as an int in [1, MAX_BEAM_WIDTH]."""
    return _count(value, "beam_width", MAX_BEAM_WIDTH)


def check_num_layer_groups(value):
    """``num_layer_groups`` as an int in [1, MAX_LAYER_GROUPS]."""
    return _count(value, "num_layer_groups", MAX_LAYER_GROUPS)


def check_prompt(tokens):
    """A new request's validated prompt array: at most MAX_TOKENS tokens."""
    if len(tokens) > MAX_TOKENS:
        raise ValueError(f"prompt holds {len(tokens)} tokens, above {MAX_TOKENS}")
    return tokens


def check_change_mark(name, mark, size):
    """A restored change mark (lowest position changed since a reader's last read: the
    connector's or the device block table's): an int in [0, size]. The one place a
    restored mark is validated."""
    return _bounded(mark, name, 0, size)


def _owned_sequence(value, name):
    """A caller's sequence copied into a tuple once, so later checks see what is used."""
    if isinstance(value, (str, bytes, bytearray, dict)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a sequence, not {type(value).__name__}")
    return tuple(value)


def checked_block_table(block_ids, num_released, dirty_from, table_dirty_from=0):
    """Validated (ids array, num_released, dirty_from, table_dirty_from) of a restored
    BlockTable: the first ``num_released`` ids are -1 (released), the others >= 0, both
    readers' marks in [0, len]."""
    ids = as_int32_array(block_ids, "block_ids", "block")
    released = _bounded(num_released, "num_released", 0, len(ids))
    if released and (ids[:released] != -1).any():
        raise ValueError(f"block_ids: the first {released} entries are released and must read -1")
    if (ids[released:] < 0).any():
        bad = int(ids[released:][ids[released:] < 0][0])
        raise ValueError(f"block_ids: block id {bad} is negative")
    return (ids, released, check_change_mark("dirty_from", dirty_from, len(ids)),
            check_change_mark("table_dirty_from", table_dirty_from, len(ids)))


def _optional(value, name, low, high):
    return None if value is None else _bounded(value, name, low, high)


def checked_request_state(state):
    """A validated copy of a Request's plain state (the dict ``__reduce__`` makes).

    Token lists become owned int32 arrays, block tables ``(ids, released, mark)`` triples;
    ValueError / TypeError name the first field that breaks an invariant.
    """
    if not isinstance(state, dict):
        raise TypeError(f"Request state must be a dict, not {type(state).__name__}")
    missing = [name for name in REQUEST_FIELDS if name not in state]
    if missing:
        raise ValueError(f"Request state lacks the field(s) {', '.join(missing)}")
    raw = {name: state[name] for name in REQUEST_FIELDS}  # read each field once
    beams = _owned_sequence(raw["beams"], "beams")
    if not 1 <= len(beams) <= MAX_BEAM_WIDTH:
        raise ValueError(f"beams: {len(beams)} beams is outside [1, {MAX_BEAM_WIDTH}]")
    beams = tuple(as_int32_array(tokens, f"beams[{beam}]") for beam, tokens in enumerate(beams))
    for beam, tokens in enumerate(beams):
        if len(tokens) > MAX_TOKENS:
            raise ValueError(f"beams[{beam}] holds {len(tokens)} tokens, above {MAX_TOKENS}")
    marks = _owned_sequence(raw["dirty_from"], "dirty_from")
    if len(marks) != len(beams):
        raise ValueError(f"dirty_from has {len(marks)} entries for {len(beams)} beams")
    marks = tuple(check_change_mark(f"dirty_from[{b}]", mark, len(beams[b])) for b, mark in enumerate(marks))
    prompt_len = _bounded(raw["prompt_len"], "prompt_len", 0, min(len(tokens) for tokens in beams))
    position = _bounded(raw["context_current_position"], "context_current_position", 0, prompt_len)
    tables = _owned_sequence(raw["block_tables"], "block_tables")
    if len(tables) > MAX_LAYER_GROUPS:
        raise ValueError(f"block_tables: {len(tables)} layer groups is above {MAX_LAYER_GROUPS}")
    checked_tables = []
    for group, table in enumerate(tables):
        table = _owned_sequence(table, f"block_tables[{group}]")
        if len(table) not in (2, 3, 4):
            raise ValueError(f"block_tables[{group}] must be (block_ids, num_released[, dirty_from[, table_dirty_from]])")
        checked_tables.append(checked_block_table(*table))
    extra = raw["dict"]
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(f"dict must be a dict or None, not {type(extra).__name__}")
    return {
        "request_id": as_integer(raw["request_id"], "request_id"),
        "beams": beams,
        "dirty_from": marks,
        "prompt_len": prompt_len,
        "orig_prompt_len": _bounded(raw["orig_prompt_len"], "orig_prompt_len", 0, prompt_len),
        "max_new_tokens": _optional(raw["max_new_tokens"], "max_new_tokens", 0, 2**63 - 1),
        "state": checked_state(raw["state"]),
        "seq_slot": _optional(raw["seq_slot"], "seq_slot", 0, INT32_MAX),
        "context_current_position": position,
        "context_chunk_size": _bounded(raw["context_chunk_size"], "context_chunk_size", 0, prompt_len - position),
        "draft_tokens": as_int32_array(raw["draft_tokens"], "draft_tokens"),
        "block_tables": tuple(checked_tables),
        "num_pauses": _bounded(raw["num_pauses"], "num_pauses", 0, MAX_PAUSES),
        "dict": extra,
    }


def checked_state(value):
    """A RequestState member; ValueError for an int that names none."""
    number = as_integer(value, "state")
    try:
        return RequestState(number)
    except ValueError:
        raise ValueError(f"state must be a RequestState, got {value!r}") from None


def no_deleter(obj, name):
    """Deleting a settable property: the same AttributeError on both backends."""
    raise AttributeError(f"property {name!r} of {type(obj).__name__!r} object has no deleter")


def no_item_deletion(obj):
    """``del table[i]``: the same TypeError on both backends."""
    raise TypeError(f"{type(obj).__name__} entries cannot be deleted: use truncate() or release_front()")


def refuse_pickling(obj):
    """The ``__reduce__`` of the twin's private objects that the compiled core's refuse to
    pickle or copy (a writer, its metadata, a report's state and columns): the same TypeError,
    naming the class."""
    cls = type(obj)
    raise TypeError(f"cannot pickle '{cls.__module__}.{cls.__qualname__}' object")


def changed_during(call, change="re-initialised or paused"):
    """Code that ran while ``call`` made what it writes (a weakref callback as old storage
    was dropped, a collection's callbacks) made ``change`` to the request: the same
    RuntimeError on both backends, nothing written (writing would lose or misplace tokens
    or block ids)."""
    raise RuntimeError(f"the request was {change} by code that ran during {call}: nothing was changed")


def reinitialised_during(argument):
    """The request was re-initialised (``__init__`` again, or a restore) by code that ran
    while ``argument`` was converted: the same RuntimeError on both backends, nothing
    written."""
    raise RuntimeError(f"the request was re-initialised while {argument} was converted: nothing was changed")


# numpy's own accounts of an array (a subclass's properties may say anything)
_real_base = np.ndarray.base.__get__
_real_flags = np.ndarray.flags.__get__
_real_dtype = np.ndarray.dtype.__get__
_real_size = np.ndarray.size.__get__
_real_ctypes = np.ndarray.ctypes.__get__
# what np.lib.stride_tricks.as_strided gives the array it makes as its base: an object that shows
# numpy the memory of the array it keeps in its ``base`` attribute (which numpy's ``base`` chain
# then does not reach)
_STRIDED_BASE: type = type(np.lib.stride_tricks.as_strided(np.zeros(1)).base)


def _data_address(array):
    """Where ``array``'s memory starts, by numpy's ``ctypes`` (its ``__array_interface__``
    crashes the interpreter when one of its allocations fails)."""
    return _real_ctypes(array).data or 0  # (None for a NULL pointer)


def _watched(name, array):
    """One entry of ``bound_memory``'s ``watched``: ``(name, array, data, dtype, size)``, an
    owner's data address, dtype and element count now."""
    return (name, array, _data_address(array), _real_dtype(array), _real_size(array))


def bound_memory(arrays, names):
    """``(guards, watched, taken)`` for the output ``arrays`` a writer binds (numpy arrays,
    named ``names``; None entries skipped): what keeps their memory where it is while the
    writer keeps pointers into it, what each of its calls checks before it writes, and
    where each array's memory started when its guards were made.

    ``guards``:

    - each array itself (a writer may write through plain views of it, whose ``base`` a
      caller's ``__setstate__`` on such a view would drop);
    - a weak reference to each array and to every numpy array its memory comes from (its
      bases): numpy refuses to resize an array that has a weak reference, even with
      ``refcheck=False``, which otherwise frees the memory whatever exports are alive;
    - every numpy array among those that owns its memory: ``__setstate__`` on a view drops
      its base, which may have held the owner's last reference;
    - for a base that is a memoryview (``np.frombuffer`` of a bytearray, say), a memoryview
      of our own over the same export: it outlives a caller's ``release()`` of numpy's, so
      the exporter keeps the memory and refuses to resize it (ValueError here if that
      export was already released). The compiled core also holds a buffer export of that
      memoryview in C (``pinned()``), so that not even code that reaches it, through the
      collector's introspection, can release it;
    - the object ``np.lib.stride_tricks.as_strided`` makes the base of its array, and the
      numpy array that object keeps (walked as a base: its memory is that array's);
    - what owns that memory when it is no numpy array (a bytearray, or the compiled core's
      memory behind the holders' own arrays), which then outlives any ``__setstate__`` of
      the arrays; and, where numpy holds no export of it (``np.ndarray(..., buffer=owner)``,
      a memmap's mmap) but it exports a buffer, a memoryview of it, so that it refuses to
      resize or close (pinned as above by the compiled core).

    ``watched`` (``_watched`` entries, each named by the first bound array whose memory
    it owns): each numpy array that owns the memory of a bound array (the array itself, or
    a base), once. numpy's ``__setstate__`` frees an owner's memory whatever is alive and
    gives it other memory; nothing can stop it, so each call compares every entry with the
    array as it is before it writes (the compiled core in C, the twin with
    ``moved_array``): an owner must still own as many entries, of the same dtype, at the
    same address (the same block, or a new one that holds as much there: either way alive
    and its own). ``__setstate__`` on an array that owns no memory frees none: the writer
    keeps writing the memory it was bound to, which that array no longer shows.

    ``taken``: ``(array, data)`` for each bound array, its data address read before its
    guards and owners are: the pointer (or plain view) a writer then takes into it must
    start there (``check_taken``). Code that runs in between (a collection's callback) may
    give the array memory of its own with ``__setstate__``, which neither ``guards`` nor
    ``watched`` cover: a pointer into that would be freed by its next ``__setstate__``."""
    guards, watched, taken = [], [], []
    # paused: a collection's callback between reading an array's address and recording its
    # owner could give the owner other memory (a smaller block at that address), which the
    # records would then take for what the array shows
    with collector_paused():
        _record_memory(arrays, names, guards, watched, taken)
    return tuple(guards), tuple(watched), tuple(taken)


def _record_memory(arrays, names, guards, watched, taken):
    """``bound_memory``'s walk from each array to what owns its memory, appending to its
    lists; run with the collector paused."""
    owners = set()
    for array, name in zip(arrays, names):
        if isinstance(array, np.ndarray):
            guards.append(array)
        given = True
        while isinstance(array, np.ndarray):
            guards.append(weakref.ref(array))
            if given:  # read first: a change of its memory after this is seen by check_taken
                given = False
                taken.append((array, _data_address(array)))
            if _real_flags(array).owndata and id(array) not in owners:
                owners.add(id(array))
                guards.append(array)
                watched.append(_watched(name, array))
            array = _real_base(array)  # numpy's own: a subclass's base property may say anything
            if type(array) is _STRIDED_BASE:  # (as_strided's) its memory is that of the array it keeps
                guards.append(array)
                array = vars(array).get("base")
            if isinstance(array, memoryview):
                try:
                    guards.append(memoryview(array))
                except ValueError:
                    raise ValueError("an array's memory comes from a memoryview that was released: numpy no "
                                     "longer holds it, and nothing keeps it where it is") from None
                array = array.obj
        if array is not None:
            guards.append(array)
            if not isinstance(array, memoryview):
                # an owner numpy holds no export of (np.ndarray(..., buffer=bytearray), a
                # memmap's mmap): an export of our own, so it refuses to resize or close
                try:
                    guards.append(memoryview(array))
                except TypeError:  # no buffer to export (the compiled core's own memory)
                    pass


def check_taken(taken, views):
    """The twin's check of the plain ``views`` it took of the bound arrays (one per
    ``taken`` entry of ``bound_memory``, in its order): each starts where its array's
    memory started when its guards were made (RuntimeError otherwise, as the compiled
    core's; an empty view is never written)."""
    for (_, data), view in zip(taken, views, strict=True):
        if _real_size(view) and _data_address(view) != data:
            raise RuntimeError("an output array was given other memory by code that ran while it was bound: "
                               "nothing was bound")


def moved_array(watched):
    """The name of the first ``watched`` entry (``bound_memory``) whose array no longer owns
    the memory it owned, None if none: the twin's check before each write (and the
    compiled core's where it cannot read the arrays' fields)."""
    for name, array, data, dtype, size in watched:
        if (not _real_flags(array).owndata or _real_dtype(array) is not dtype or _real_size(array) < size
                or _data_address(array) != data):
            return name
    return None


class collector_paused:  # (named as the function it stands for: ``with collector_paused():``)
    """The garbage collector paused for the ``with`` block (as it was, if already paused):
    no collection, hence none of its callbacks, runs inside. Allocating may otherwise start
    one anywhere, and a callback can change what the block reads or writes."""

    __slots__ = ("enabled",)

    def __enter__(self):
        self.enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc_info):
        if self.enabled:
            gc.enable()


def released_below(num_released, already):
    """``release_front`` asked to shrink the released count: the same ValueError on both backends."""
    raise ValueError(f"num_released {num_released} is below the {already} blocks already released")


def released_past(num_released, size):
    """``release_front`` past the table's end: the same ValueError on both backends."""
    raise ValueError(f"num_released {num_released} exceeds the {size} blocks in the table")
