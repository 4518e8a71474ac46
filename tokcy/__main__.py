"""``python -m tokcy`` (also the ``tokcy`` console script): ``bench``, ``demo`` or ``--version``."""

from __future__ import annotations

import sys

MODULE_PROG = "python -m tokcy"

USAGE = """usage: {prog} {{bench,demo}} [options]
       {prog} --version

  bench      time tokcy against the patterns it replaces, on this machine (--help for options)
  demo       run a small continuous-batching engine on tokcy and check it against a reference
             (needs torch: pip install torch==2.13.0)
  --version  print tokcy's version and the live backend
"""


def program_name(argv0: str | None = None) -> str:
    """How tokcy was started, for the usage lines: the console script's name ("tokcy") when
    ``argv0`` (default ``sys.argv[0]``) is that script, else "python -m tokcy"."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    name = argv0.replace("\\", "/").rpartition("/")[2]  # (a Windows path too)
    for suffix in (".exe", "-script.py"):  # the Windows launchers
        name = name.removesuffix(suffix)
    return name if name == "tokcy" else MODULE_PROG


def version_line() -> str:
    """``tokcy 0.1.0 (backend cython)``, with the reason when the pure twin is live."""
    import tokcy
    from tokcy import _backend

    line = f"tokcy {tokcy.__version__} (backend {tokcy.BACKEND}"
    if _backend.WHY_PURE:
        line += f": {_backend.WHY_PURE}"
    return line + ")"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = program_name() if prog is None else prog
    usage = USAGE.format(prog=prog)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage, end="")
        return 0
    if argv[0] in ("-V", "--version"):
        print(version_line())
        return 0
    command, rest = argv[0], argv[1:]
    if command == "bench":
        from tokcy.bench.cli import main as run
    elif command == "demo":
        from tokcy.demo.cli import main as run
    else:
        print(f"unknown command {command!r}\n{usage}", end="", file=sys.stderr)
        return 2
    return run(rest, prog=f"{prog} {command}")


if __name__ == "__main__":
    sys.exit(main(prog=MODULE_PROG))
