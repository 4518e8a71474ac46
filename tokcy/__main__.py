"""``python -m tokcy`` (also the ``tokcy`` console script): ``bench`` or ``demo``."""

import sys

USAGE = """usage: python -m tokcy {bench,demo} [options]

  bench   time tokcy against the patterns it replaces, on this machine (--help for options)
  demo    run a small continuous-batching engine on tokcy and check it against a reference
"""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
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
