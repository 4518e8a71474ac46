#!/usr/bin/env bash
# Benchmark checks for CI (called by .ci/run after the package is installed):
#   1. the asv suite is well-formed and imports against the installed package;
#   2. every asv benchmark runs once (--quick --dry-run: seconds, no timing judged or saved);
#   3. the README's main job, `python -m tokcy bench --quick`, runs and prints its tables.
# Needs asv and virtualenv (pip install '.[bench]'); PYTHON picks the interpreter (default: python).
set -euo pipefail
PYTHON=${PYTHON:-python}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

cd "$ROOT/asv_bench"
"$PYTHON" -m asv machine --yes
"$PYTHON" -m asv check --python=same
"$PYTHON" -m asv run --python=same --quick --dry-run --show-stderr

# Run the main job from outside the source tree so the installed package is the one timed.
cd "$(mktemp -d)"
"$PYTHON" -m tokcy bench --quick
