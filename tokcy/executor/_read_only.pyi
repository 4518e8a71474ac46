# Types of tokcy/executor/_read_only.py.
from collections.abc import Iterable

def read_only(cls: type, names: Iterable[str]) -> None: ...
