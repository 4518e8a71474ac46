# Types of tokcy/executor/_memory.py.
from typing import Any

import numpy as np
import numpy.typing as npt

def zeros(shape: int | tuple[int, ...], dtype: Any) -> npt.NDArray[Any]: ...
