"""Hot loop 2, the KV-connector report, in plain Python/numpy (filled in by the connector work)."""

__all__ = []
