# Types of tokcy/executor/_memory.py.
from typing import Any

import numpy as np
import numpy.typing as npt

def zeros(*specs: tuple[int | tuple[int, ...], Any]) -> list[npt.NDArray[Any]]: ...
