"""Hot loop 1, input preparation, in plain Python/numpy (filled in by the executor work)."""

__all__ = []
