"""Read-only fields for the executor's holders (``HostBuffers``, ``MetadataBuffers``,
``InputPreparer``), whose writers are bound to what they were made with."""

import operator


def read_only(cls, names):
    """Give ``cls`` a read-only property per name, reading the slot ``_name``: a holder's
    writers are bound to its arrays when made, so an array or size replaced afterwards
    would no longer be the one written."""
    for name in names:
        def refuse(self, value, name=name):
            raise AttributeError(f"{type(self).__name__}.{name} is read-only: it is fixed when the object is made")

        setattr(cls, name, property(operator.attrgetter("_" + name), refuse, doc=f"``{name}`` (read-only)."))
