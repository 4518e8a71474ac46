"""Input preparation: the per-iteration pass from the requests to the model's flat inputs.

``prepare_inputs`` fills the model's flat host arrays for one iteration (numpy), and
``InputPreparer`` feeds them to persistent device tensors through pinned staging memory.
torch is imported only when an ``InputPreparer`` is created.
"""

from tokcy.executor._device import DeviceInputs, InputPreparer
from tokcy.executor._host import ARRAY_FIELDS, COUNT_FIELDS, HostBuffers, PreparedInputs, prepare_inputs

__all__ = [
    "ARRAY_FIELDS",
    "COUNT_FIELDS",
    "DeviceInputs",
    "HostBuffers",
    "InputPreparer",
    "PreparedInputs",
    "prepare_inputs",
]
