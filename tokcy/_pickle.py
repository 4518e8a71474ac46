"""Backend-neutral pickle constructors.

A pickled ``Request`` or ``BlockTable`` names these functions, never a backend's class,
so a pickle made by one backend loads in the other. Python subclasses are pickled by
their own class, which itself derives from whichever backend was live; what a subclass
adds (its ``__dict__`` and its own ``__slots__``) travels with them.
"""

import types

from tokcy._invariants import collector_paused


def read_whole(read):
    """``read()`` (an object's state, read one field after another) with the garbage
    collector paused: reading allocates, which could start a collection whose callbacks
    change the object between two fields, and the state would then be torn between two
    objects. The compiled core pauses it the same way around its reads (PyGC_Disable)."""
    with collector_paused():
        return read()


def restore_request(cls, state):
    """Rebuild a Request (or subclass ``cls``) from the plain state of ``__reduce__``."""
    if cls is None:
        from tokcy import Request as cls
    return cls._from_state(state)


def subclass_attributes(obj, base):
    """The attributes a Python subclass of ``base`` gave ``obj``: the values of the
    ``__slots__`` the subclasses declare (those set; a slot declared twice, the one an
    attribute read finds) and its ``__dict__``, as one dict, or None when there are none.
    ``base``'s own fields are pickled by name, never from here."""
    found = {}
    for cls in type(obj).__mro__:
        if cls is base:
            break
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{cls.__name__.lstrip('_')}{name}"  # as Python mangles a private slot
            member = cls.__dict__.get(name)
            if type(member) is types.MemberDescriptorType and name not in found and not _own_field(base, name):
                try:
                    found[name] = member.__get__(obj, cls)
                except AttributeError:  # declared, never set
                    pass
    for name, value in (getattr(obj, "__dict__", None) or {}).items():
        found.setdefault(name, value)
    return found or None


def restore_subclass_attributes(obj, base, attributes):
    """Give a restored ``obj`` what ``subclass_attributes`` took: each slot a subclass of
    ``base`` declares through its member descriptor, the rest into its ``__dict__`` (no
    subclass code runs, neither its ``__setattr__`` nor its properties). A name that is one
    of ``base``'s own fields (or methods) is refused: they are restored by name alone."""
    for name in attributes:
        if not isinstance(name, str):
            raise TypeError(f"a subclass attribute's name must be a str, not {type(name).__name__}")
        if _own_field(base, name):
            raise ValueError(f"subclass attribute {name!r} is one of {base.__name__}'s own fields")
    for name, value in attributes.items():
        member = _subclass_slot(type(obj), base, name)
        if member is not None:
            member.__set__(obj, value)
        else:
            vars(obj)[name] = value


def _own_field(base, name):
    """Whether ``name`` is a field or method of ``base`` (a backend's ``Request`` or
    ``BlockTable``) on either backend: the twin's class declares every field as a slot,
    so both refuse the same names."""
    from tokcy._pure.block_table import BlockTable
    from tokcy._pure.request import Request

    twin = BlockTable if base.__name__ == "BlockTable" else Request
    return hasattr(base, name) or hasattr(twin, name)


def _subclass_slot(cls, base, name):
    for klass in cls.__mro__:
        if klass is base:
            return None
        member = klass.__dict__.get(name)
        if member is not None:
            return member if type(member) is types.MemberDescriptorType else None
    return None


def restore_block_table(cls, block_ids, num_released, dirty_from=0, table_dirty_from=0, attributes=None):
    """Rebuild a BlockTable (or subclass ``cls``) from its ids, released count and the
    change marks of its two readers: the lowest position changed since the connector,
    and since the device block table, last read it. Older pickles carry fewer fields; a
    missing mark is 0 (the reader sees the whole table as changed). The device table's
    row stamp is not carried: a restored table is sent to its device row whole, once.
    ``attributes``: what a subclass added (``subclass_attributes``), or None."""
    if cls is None:
        from tokcy import BlockTable as cls
    table = cls.__new__(cls)
    table._restore(block_ids, num_released, dirty_from, table_dirty_from, attributes)
    return table
