"""What the table header says about where the figures were taken."""

from __future__ import annotations

import datetime
import os
import platform
import sys


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
        "tokcy": getattr(tokcy, "__version__", "?"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
