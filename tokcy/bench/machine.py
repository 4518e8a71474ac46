"""What the table header says about where the figures were taken."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import importlib.util
import os
import platform
import sys

# torch's intra-op threads during the bench: an engine's host path runs small tensor ops (a
# few hundred entries), which one thread does in microseconds; a pool of threads per op only
# adds its wake-ups, and on a busy machine a step then waits for them to be scheduled (the
# torch rows read whole multiples of the 4 ms scheduler tick instead of about 150 us).
TORCH_THREADS = 1


def cpu_model() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def usable_cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


@contextlib.contextmanager
def torch_threads(count: int = TORCH_THREADS):
    """torch's intra-op thread count set to ``count`` inside the block and restored after it;
    yields the count, or None when torch is not installed (nothing is set)."""
    if not torch_available():
        yield None
        return
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)


def torch_version() -> str | None:
    """The installed torch's version (without importing it), or None."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def describe() -> dict:
    """Machine, Python and library versions, and the date, as plain JSON-able values."""
    import numpy

    import tokcy

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "system": f"{platform.system()} {platform.machine()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "python_executable": sys.executable,
        "numpy": numpy.__version__,
        "torch": torch_version() if torch_available() else None,
        "tokcy": getattr(tokcy, "__version__", "?"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
