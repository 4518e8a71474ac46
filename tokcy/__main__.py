"""``python -m tokcy`` (also the ``tokcy`` console script): ``bench``, ``demo`` or ``--version``."""

from __future__ import annotations

import sys

USAGE = """usage: python -m tokcy {bench,demo} [options]
       python -m tokcy --version

  bench      time tokcy against the patterns it replaces, on this machine (--help for options)
  demo       run a small continuous-batching engine on tokcy and check it against a reference
             (needs torch: pip install 'tokcy[torch]')
  --version  print tokcy's version and the live backend
"""


def version_line() -> str:
    """``tokcy 0.1.0 (backend cython)``, with the reason when the pure twin is live."""
    import tokcy
    from tokcy import _backend

    line = f"tokcy {tokcy.__version__} (backend {tokcy.BACKEND}"
    if _backend.WHY_PURE:
        line += f": {_backend.WHY_PURE}"
    return line + ")"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
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
        print(f"unknown command {command!r}\n{USAGE}", end="", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
