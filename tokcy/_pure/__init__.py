"""The pure-Python twin of ``tokcy._core``: same classes, same loops, same errors."""

from tokcy._pure.block_table import BlockTable  # noqa: F401
from tokcy._pure.metadata import AttentionMetadata, DeviceTableRows  # noqa: F401
from tokcy._pure.prepare import *  # noqa: F401,F403  (names listed in its __all__)
from tokcy._pure.report import *  # noqa: F401,F403
from tokcy._pure.request import Request  # noqa: F401
from tokcy._pure.request_data import RequestData, RowColumns, request_rows  # noqa: F401
