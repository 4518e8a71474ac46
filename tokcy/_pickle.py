"""Backend-neutral pickle constructors.

A pickled ``Request`` or ``BlockTable`` names these functions, never a backend's class,
so a pickle made by one backend loads in the other. Python subclasses are pickled by
their own class, which itself derives from whichever backend was live.
"""


def restore_request(cls, state):
    """Rebuild a Request (or subclass ``cls``) from the plain state of ``__reduce__``."""
    if cls is None:
        from tokcy import Request as cls
    return cls._from_state(state)


def restore_block_table(cls, block_ids, num_released, dirty_from=0, table_dirty_from=0):
    """Rebuild a BlockTable (or subclass ``cls``) from its ids, released count and the
    change marks of its two readers: the lowest position changed since the connector,
    and since the device block table, last read it. Older pickles carry fewer fields; a
    missing mark is 0 (the reader sees the whole table as changed). The device table's
    row stamp is not carried: a restored table is sent to its device row whole, once."""
    if cls is None:
        from tokcy import BlockTable as cls
    table = cls.__new__(cls)
    table._restore(block_ids, num_released, dirty_from, table_dirty_from)
    return table
