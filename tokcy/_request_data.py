"""What both backends' ``RequestData`` rows share: the field list, ``as_dict``, equality,
``repr`` and pickling, written once in terms of the fields each backend reads."""

from collections import namedtuple

import numpy as np

_GivenColumns = namedtuple("_GivenColumns", (
    "request_ids", "is_new", "computed_positions", "num_scheduled_tokens", "num_replaced_tokens", "token_offsets",
    "tokens", "group_offsets", "block_offsets", "block_ids", "num_replaced_blocks", "num_released_blocks",
))
COLUMNS = _GivenColumns._fields
"""``SchedulerOutput``'s columns, in the order of its constructor's arguments."""

_GivenColumns.__doc__ = """The columns of a ``SchedulerOutput`` made by hand, as given (a manager's
report holds its backend's ``ReportColumns`` instead): both are read by column name."""

FIELDS = (
    "request_id", "is_new", "new_tokens", "new_block_ids_by_group", "computed_position", "num_scheduled_tokens",
    "num_replaced_tokens", "num_replaced_blocks_by_group", "num_released_blocks_by_group",
)
"""The fields ``as_dict`` gives, in its order (``new_block_ids`` and ``num_layer_groups``
follow from ``new_block_ids_by_group``)."""

MADE_BY_REPORT = "a RequestData is made by its SchedulerOutput, not by hand"

READ_ONLY = "a RequestData is read-only: {!r} cannot be set or deleted"

CHANGED = "a SchedulerOutput's arrays were changed in place (their dtype or shape)"

OUTSIDE = "the SchedulerOutput's offsets of row {} lie outside its columns"
"""The ValueError's text when a row's offsets leave the columns (either backend)."""


def column_copy(column, dtype, name):
    """A private 1-D copy of the column ``name`` of a report made by hand, in ``dtype``:
    the rows of such a report read these, on both backends (so nothing else can change or
    resize them, and no attribute of a caller's array can lead back to a row). Only values
    that ``dtype`` holds exactly are taken: integers in its range (0 or 1 for ``is_new``);
    a float, an object or a value out of range is refused, never rounded or wrapped."""
    values = np.asarray(column)
    if values.ndim > 1:
        raise ValueError("a SchedulerOutput's columns are one-dimensional")
    if values.size:  # (an empty list is float64 to numpy: any dtype holds no values)
        if values.dtype.kind not in "biu":
            raise TypeError(f"a SchedulerOutput's {name} column must hold integers, not {values.dtype}")
        low, high = (0, 1) if dtype is np.bool_ else (np.iinfo(dtype).min, np.iinfo(dtype).max)
        smallest, largest = values.min(), values.max()
        if smallest < low or largest > high:
            bad = smallest if smallest < low else largest
            raise ValueError(f"a SchedulerOutput's {name} column holds {int(bad)}, outside [{low}, {high}]")
    return np.array(values, dtype=dtype, copy=True, order="C", ndmin=1)


def is_row_type(cls):
    """True for a backend's row class (each sets ``_is_request_data``)."""
    return getattr(cls, "_is_request_data", False) is True


def as_dict(data):
    """Every field of ``data``, as plain Python values (each list a new one)."""
    return {name: getattr(data, name) for name in FIELDS}


def equal(data, other):
    """``data == other``: the same fields, whichever backend made either row."""
    if not is_row_type(type(other)):
        return NotImplemented
    return as_dict(data) == as_dict(other)


def not_equal(data, other):
    same = equal(data, other)
    return same if same is NotImplemented else not same


def describe(data):
    fields = ", ".join(f"{key}={value!r}" for key, value in as_dict(data).items())
    return f"RequestData({fields})"


def reduce(data):
    """A row pickles as its fields and unpickles as the one row of a new one-row report."""
    return rebuild, (as_dict(data),)


def rebuild(fields):
    from tokcy.connector.output import SchedulerOutput  # here: that module imports this one

    groups = fields["new_block_ids_by_group"]
    block_offsets = np.cumsum([0] + [len(ids) for ids in groups], dtype=np.int64)
    output = SchedulerOutput(
        0,
        np.array([fields["request_id"]], dtype=np.int64),
        np.array([fields["is_new"]], dtype=np.bool_),
        np.array([fields["computed_position"]], dtype=np.int64),
        np.array([fields["num_scheduled_tokens"]], dtype=np.int64),
        np.array([fields["num_replaced_tokens"]], dtype=np.int64),
        np.array([0, len(fields["new_tokens"])], dtype=np.int64),
        np.array(fields["new_tokens"], dtype=np.int32),
        np.array([0, len(groups)], dtype=np.int64),
        block_offsets,
        np.array([block for ids in groups for block in ids], dtype=np.int32),
        np.array(fields["num_replaced_blocks_by_group"], dtype=np.int64),
        np.array(fields["num_released_blocks_by_group"], dtype=np.int64),
    )
    return output.request_data(0)
